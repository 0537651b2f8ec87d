"""Step layouts: every token a row of the native attention kernel (``token_rows``) against the
decode/prefill split, and precompiling every step shape up front."""

from __future__ import annotations

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.engine.page_allocator import SCRATCH_PAGE
from jaxgen.engine.scheduler import ScheduledSequence, SchedulerOutput
from jaxgen.engine.sequence import Sequence
from jaxgen.engine.step_layout import StepLayout
from tests.conftest import save_tiny_model


def _sequence(prompt_len: int, computed: int, pages: list[int], outputs: int = 0) -> Sequence:
    seq = Sequence(list(range(100, 100 + prompt_len)), max_tokens=64)
    seq.output_token_ids = list(range(900, 900 + outputs))
    seq.num_computed_tokens = computed
    seq.block_table = pages
    return seq


def test_token_rows_layout_places_every_token():
    layout = StepLayout(page_size=4, max_num_seqs=4, max_num_batched_tokens=32, max_model_len=32)
    decode = _sequence(6, 8, [7, 3, 9], outputs=3)  # 9 tokens, the 9th is new
    chunk = _sequence(10, 4, [5, 2, 8])  # a middle chunk: tokens 4..9, straddles two pages
    first = _sequence(3, 0, [6])  # a whole short prompt
    out = SchedulerOutput(
        [ScheduledSequence(decode, 1), ScheduledSequence(chunk, 6), ScheduledSequence(first, 3)],
        [],
    )
    inputs = layout.token_rows(out)
    md = inputs.metadata
    assert inputs.token_ids.shape == (16,)  # 10 tokens -> the 16 bucket
    assert md.decode_block_tables.shape == (16, layout.full_width)
    assert md.prefill_query_index.shape[0] == 0 and md.prefill_kv_lens.shape == (0,)

    positions = [8, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert inputs.positions[:10].tolist() == positions
    assert md.decode_lengths.tolist() == [p + 1 for p in positions] + [0] * 6
    assert inputs.token_ids[:10].tolist() == [decode.token_at(8)] + list(range(104, 110)) + [
        100,
        101,
        102,
    ]
    tables = {0: decode.block_table, 1: chunk.block_table, 7: first.block_table}
    for row, pos in enumerate(positions):
        table = tables[max(k for k in tables if k <= row)]
        assert md.slot_mapping[row] == table[pos // 4] * 4 + pos % 4
        assert md.decode_block_tables[row, : len(table)].tolist() == table
    assert (md.slot_mapping[10:] == SCRATCH_PAGE * 4).all()
    assert md.live_rows.tolist() == [[0, 10], [16, 16]]
    # One logits row per scheduled sequence, at its last token; padded to min(16, max seqs).
    assert inputs.logits_indices.tolist() == [0, 6, 9, 0]
    assert inputs.logits_live.tolist() == [[0, 3], [4, 4]]
    assert inputs.rows[:3] == out.scheduled and inputs.rows[3] is None


def test_token_rows_shape_depends_only_on_the_token_bucket():
    layout = StepLayout(page_size=16, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    shapes, buckets = set(), set()
    for lengths in ([1, 1, 1], [1, 12], [14], [1] * 8, [3, 5, 2, 6], [1, 2, 1]):
        seqs = [_sequence(n + 4, 4, [1, 2, 3]) for n in lengths]
        out = SchedulerOutput(
            [ScheduledSequence(s, n) for s, n in zip(seqs, lengths, strict=True)], []
        )
        inputs = layout.token_rows(out)
        arrays = [inputs.token_ids, inputs.logits_indices, *vars(inputs.metadata).values()]
        shapes.add(tuple(a.shape for a in arrays))
        buckets.add(len(inputs.token_ids))
    assert buckets == {4, 8, 16} and len(shapes) == 3  # nothing but the token bucket varies
    assert layout.token_buckets == [2, 4, 8, 16, 32, 64]


@pytest.fixture(scope="module")
def sliding_model_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    return save_tiny_model(
        str(tmp_path_factory.mktemp("tiny-mistral")),
        smollm2_tokenizer,
        arch="mistral",
        sliding_window=12,
        seed=3,
    )


@pytest.mark.parametrize("model", ["tiny", "sliding"])
def test_token_rows_matches_split_layout(model, tiny_model_dir, sliding_model_dir):
    """The native backend (token rows) and the XLA reference (split layout) agree token for
    token and in log-probabilities, with chunked prefill and prompts past the sliding window."""
    path = tiny_model_dir if model == "tiny" else sliding_model_dir
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 1000, int(n)).tolist() for n in (5, 40, 23, 61, 9, 33)]
    params = [
        SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True, logprobs=2)
        for m in (9, 4, 12, 6, 10, 7)
    ]
    knobs = dict(max_model_len=128, max_rolling_batch_size=4, max_rolling_batch_prefill_tokens=24)
    native = LLM(path, attention_backend="cpu", **knobs)
    assert native.engine.runner.token_rows
    reference = LLM(path, attention_backend="reference", **knobs)
    assert not reference.engine.runner.token_rows
    got = native.generate(prompts, params, use_tqdm=False)
    want = reference.generate(prompts, params, use_tqdm=False)
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        for lp_a, lp_b in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert lp_a.keys() == lp_b.keys()
            np.testing.assert_allclose(list(lp_a.values()), list(lp_b.values()), atol=2e-4)


def test_precompile_covers_every_shape(tiny_model_dir):
    """After precompiling, a workload of mixed lengths, chunked prefills and staggered finishes
    compiles nothing, and outputs (seeded or not) are what an engine without it gives."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(3, 90, 12)]
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=7, ignore_eos=True)
    params = [
        SamplingParams(max_tokens=int(m), temperature=0.0, ignore_eos=True)
        for m in rng.integers(1, 20, 12)
    ]
    knobs = dict(max_model_len=128, max_rolling_batch_size=8, max_rolling_batch_prefill_tokens=64)
    llm = LLM(tiny_model_dir, precompile=True, **knobs)
    stats = llm.stats()
    buckets = llm.engine.runner.layout.token_buckets
    assert stats["precompile_compiles"] == len(buckets) == 6  # 2 .. 64
    assert llm.precompile(sampled) == len(buckets)  # the sampling variant of each shape
    before = llm.stats()["compiles"]
    greedy_out = llm.generate(prompts, params, use_tqdm=False)
    sampled_out = llm.generate(prompts[:5], sampled, use_tqdm=False)
    assert llm.stats()["compiles"] == before
    plain = LLM(tiny_model_dir, **knobs)
    assert [o.token_ids for o in greedy_out] == [
        o.token_ids for o in plain.generate(prompts, params, use_tqdm=False)
    ]
    assert [o.token_ids for o in sampled_out] == [
        o.token_ids for o in plain.generate(prompts[:5], sampled, use_tqdm=False)
    ]


def test_precompile_split_layout_covers_decode_steps(tiny_model_dir):
    llm = LLM(tiny_model_dir, attention_backend="reference", max_model_len=64)
    layout = llm.engine.runner.layout
    assert llm.precompile() == len(layout.decode_buckets) * len(layout.width_buckets)
