"""``jaxgen plan --target SLICE --sweep-tp``: replicas against tensor parallelism on a slice.

The sweep's arithmetic is checked without libtpu (datasheet mode, milliseconds); one slow test
compiles a small model for every degree of a v5e-4 and checks that the compiler's counts are
what the rows read.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from jaxgen.config import ModelConfig
from jaxgen.planning.hardware import CHIPS
from jaxgen.planning.tp_sweep import divisor_degrees, slice_spec, sweep_lines, sweep_tp


def llama3(**overrides) -> ModelConfig:
    fields = dict(
        model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False,
    )  # fmt: skip
    return ModelConfig.from_hf_dict({**fields, **overrides})


LLAMA3_8B = llama3()
LLAMA3_70B = llama3(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                    num_attention_heads=64)  # fmt: skip


def test_slice_spec_and_degrees():
    spec = slice_spec("v5e-8")
    assert spec.num_chips == 8 and spec.chip == CHIPS["v5e"]
    assert slice_spec("v6e:2x2").num_chips == 4
    with pytest.raises(ValueError, match="v5e-1"):
        slice_spec("h100-8")
    assert divisor_degrees(8, LLAMA3_8B) == [1, 2, 4, 8]
    assert divisor_degrees(8, llama3(num_attention_heads=12, num_key_value_heads=4)) == [1, 2, 4]


def test_rows_hold_the_capacity_arithmetic():
    sweep = sweep_tp(LLAMA3_8B, "v6e-8", context=2048, page_size=16, memory_utilization=0.9)
    hbm = CHIPS["v6e"].memory_bytes
    assert [r.tensor_parallel_degree for r in sweep.rows] == [1, 2, 4, 8]
    for row in sweep.rows:
        degree = row.tensor_parallel_degree
        assert row.replicas * degree == 8
        assert row.weight_bytes_per_chip == int(LLAMA3_8B.num_params * 2 / degree)
        assert row.kv_bytes_per_token_per_chip == 2 * 32 * 8 * 128 * 2 // degree
        page = 16 * row.kv_bytes_per_token_per_chip
        free = 0.9 * hbm - row.weight_bytes_per_chip
        assert row.kv_pages_per_chip * page <= free < (row.kv_pages_per_chip + 1) * page
        assert row.max_sequences_per_replica == row.kv_pages_per_chip // (2048 // 16)
        # A slice batch is present exactly when the copies hold it.
        for batch in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            fits = -(-batch // row.replicas) <= row.max_sequences_per_replica
            assert (batch in row.tokens_per_s) == fits
            if fits:
                assert row.tokens_per_s[batch] == pytest.approx(batch / row.step_seconds[batch])
    # Larger degrees leave each chip more room: more sequences per copy.
    seqs = [r.max_sequences_per_replica for r in sweep.rows]
    assert seqs == sorted(seqs) and seqs[0] < seqs[-1]


def test_tensor_parallelism_wins_latency_and_the_best_marks_are_the_maxima():
    sweep = sweep_tp(LLAMA3_8B, "v6e-8", context=2048, latency_target_s=0.010)
    batch1 = [r.step_seconds[1] for r in sweep.rows]
    assert batch1 == sorted(batch1, reverse=True)  # each doubling of TP cuts batch-1 latency
    cells = [
        (row.tokens_per_s[b], row.step_seconds[b], row.tensor_parallel_degree, b)
        for row in sweep.rows
        for b in row.tokens_per_s
    ]
    assert sweep.best_throughput == max(cells)[2:]
    within = [c for c in cells if c[1] <= 0.010]
    assert within and sweep.best_latency == max(within)[2:]
    text = "\n".join(sweep_lines(sweep))
    assert "best for latency within 10 ms/token" in text and "not measurements" in text


def test_costly_collectives_make_copies_win_throughput():
    """With an all-reduce as slow as 1 ms, the 8 copies (no collectives) out-serve TP 8 at
    batch 8, and TP no longer wins every batch-1 latency: the collective term is in the model."""
    cheap = sweep_tp(LLAMA3_8B, "v6e-8", context=512)
    costly = sweep_tp(LLAMA3_8B, "v6e-8", context=512, collective_latency_s=1e-3)
    copies, tp8 = costly.rows[0], costly.rows[-1]
    assert copies.tokens_per_s[8] > tp8.tokens_per_s[8]
    assert cheap.rows[0].tokens_per_s[8] < cheap.rows[-1].tokens_per_s[8]
    assert copies.step_seconds == cheap.rows[0].step_seconds  # TP 1 has no collectives


def test_a_model_too_large_for_the_slice_fits_nowhere_until_quantised():
    bf16 = sweep_tp(LLAMA3_70B, "v5e-8", context=2048)
    assert not any(row.fits for row in bf16.rows)
    assert bf16.best_latency is None and bf16.best_throughput is None
    assert "does not fit a chip" in "\n".join(sweep_lines(bf16))
    int8 = sweep_tp(
        LLAMA3_70B, "v5e-8", context=2048, weight_bytes_per_param=1 + 2 / 32, weights_label="int8"
    )
    assert [r.tensor_parallel_degree for r in int8.rows if r.fits] == [8]
    assert int8.dtype == "int8 weights, bfloat16 KV"


def test_bad_arguments_name_the_parameter():
    for kwargs, name in [
        (dict(dtype="int3"), "dtype"),
        (dict(context=0), "context"),
        (dict(memory_utilization=1.5), "memory_utilization"),
        (dict(latency_target_s=0), "latency_target_s"),
        (dict(weight_bytes_per_param=-1), "weight_bytes_per_param"),
    ]:
        with pytest.raises(ValueError, match=name):
            sweep_tp(LLAMA3_8B, "v5e-8", **kwargs)


def test_command_line_sweep_json_and_errors(tmp_path, capsys):
    from jaxgen.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_hf(LLAMA3_8B)))
    args = ["plan", "--model", str(path), "--target", "v6e-8", "--sweep-tp", "--context", "2048"]
    assert main(args + ["--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [row["tensor_parallel_degree"] for row in result["rows"]] == [1, 2, 4, 8]
    assert result["rows"][0]["step_bytes_source"] == "datasheet model"
    assert result["best_throughput"] is not None
    assert main(args) == 0
    assert "best for throughput" in capsys.readouterr().out
    assert main(["plan", "--model", str(path), "--sweep-tp"]) == 2
    assert "--sweep-tp needs --target" in capsys.readouterr().err


def _hf(config: ModelConfig) -> dict:
    return dict(
        model_type="llama", vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, max_position_embeddings=8192, rope_theta=500000.0,
        tie_word_embeddings=config.tie_word_embeddings,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.tpu_compile
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs the tpu extra")
def test_compiled_sweep_reads_the_compiler_counts():
    from jaxgen.planning.ahead_of_time import compile_decode_step

    small = llama3(num_hidden_layers=2, vocab_size=32000)
    compiled = {
        degree: compile_decode_step(small, "v5e-4", max_model_len=1024, max_num_seqs=16,
                                    tensor_parallel_degree=degree)
        for degree in divisor_degrees(4, small)
    }  # fmt: skip
    sweep = sweep_tp(small, "v5e-4", context=1024, compiled=compiled)
    for row in sweep.rows:
        step = compiled[row.tensor_parallel_degree]["decode_step"]
        assert row.step_bytes_source == "compiler" and row.step_bytes_batch == 16
        # The row's bytes at the compiled batch: the compiler's fixed part + the model's KV.
        fixed = step["bytes_accessed"] - step["live_kv_bytes"]
        kv = 16 * 1024 * row.kv_bytes_per_token_per_chip
        assert row.step_bytes_per_chip == pytest.approx(fixed + kv)
        assert fixed > 0.5 * row.weight_bytes_per_chip  # the compiler reads the weights
    assert "c  " in "\n".join(sweep_lines(sweep))
