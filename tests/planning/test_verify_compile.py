"""Speculative decoding's verify step compiled ahead of time for a TPU slice beside the decode
step (``jaxgen plan --target ... --compile --num-speculative-tokens k``): compiler counts."""

from __future__ import annotations

import importlib.util

import pytest

from jaxgen.cli import main
from jaxgen.config import ModelConfig
from jaxgen.planning.verify_compile import verify_step_inputs

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="needs the tpu extra"
)


def small_llama() -> ModelConfig:
    return ModelConfig.from_hf_dict(
        dict(
            model_type="llama", vocab_size=32000, hidden_size=1024, intermediate_size=2816,
            num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
            max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False,
        )
    )  # fmt: skip


def test_verify_step_inputs_are_every_sequence_with_its_whole_draft():
    inputs = verify_step_inputs(
        32000, page_size=16, max_num_seqs=16, max_model_len=1024, num_speculative_tokens=4
    )
    token_ids, logits_indices, logits_live = inputs.arrays[0], inputs.arrays[3], inputs.arrays[4]
    assert token_ids.shape == (16 * 5,) == (inputs.token_rows,)
    # the 16 sampling rows, then the 16 x 4 draft positions, padded to the row bucket
    assert logits_indices.shape == (inputs.sample_rows,) and inputs.sample_rows >= 16 * 5
    assert logits_live.shape == (2, 2)


@needs_libtpu
@pytest.mark.tpu_compile
def test_verify_step_compiles_beside_the_decode_step():
    from jaxgen.planning.ahead_of_time import compile_decode_step, report_lines

    result = compile_decode_step(
        small_llama(), "v5e-1", max_model_len=1024, max_num_seqs=16, num_speculative_tokens=4
    )
    decode, verify = result["decode_step"], result["verify_step"]
    assert (verify["token_rows"], verify["num_speculative_tokens"]) == (80, 4)
    # Five times the token rows: about five times the flops, the same weights read once.
    assert 4 * decode["flops"] < verify["flops"] < 6 * decode["flops"]
    assert decode["bytes_accessed"] <= verify["bytes_accessed"] < 2 * decode["bytes_accessed"]
    assert any(line.startswith("verify step, 16 sequences x 4") for line in report_lines(result))


@pytest.mark.parametrize("value", [0, 17, True, "4"])
def test_num_speculative_tokens_out_of_range_is_refused_before_compiling(value):
    from jaxgen.planning.ahead_of_time import compile_decode_step

    with pytest.raises(ValueError, match="num_speculative_tokens"):
        compile_decode_step(small_llama(), "v5e-1", num_speculative_tokens=value)


def test_plan_command_refuses_a_bad_draft_length(capsys):
    assert main(["plan", "--target", "v5e-1", "--compile", "--num-speculative-tokens", "0"]) == 2
    assert "num_speculative_tokens" in capsys.readouterr().err
