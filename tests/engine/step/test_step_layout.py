"""The ragged step layout every backend reads, and precompiling every step shape up front."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.engine.scheduling.page_allocator import SCRATCH_PAGE
from jaxgen.engine.scheduling.scheduler import ScheduledSequence, SchedulerOutput
from jaxgen.engine.scheduling.sequence import Sequence
from jaxgen.engine.step.step_layout import StepLayout
from tests.family_models import save_tiny_model


def _sequence(prompt_len: int, computed: int, pages: list[int], outputs: int = 0) -> Sequence:
    seq = Sequence(list(range(100, 100 + prompt_len)), max_tokens=64)
    seq.output_token_ids = list(range(900, 900 + outputs))
    seq.num_computed_tokens = computed
    seq.block_table = pages
    return seq


@pytest.mark.parametrize("full_width", [True, False])
def test_ragged_layout_places_every_token(full_width):
    layout = StepLayout(
        page_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=32,
        max_model_len=32,
        full_width_tables=full_width,
    )
    chunk = _sequence(10, 4, [5, 2, 8])  # a middle chunk: tokens 4..9, straddles two pages
    decode = _sequence(6, 8, [7, 3, 9], outputs=3)  # 9 tokens, the 9th is new
    first = _sequence(3, 0, [6])  # a whole short prompt
    scheduled = [ScheduledSequence(chunk, 6), ScheduledSequence(decode, 1)]
    scheduled.append(ScheduledSequence(first, 3))
    inputs = layout.ragged(SchedulerOutput(scheduled, []))
    md = inputs.metadata
    assert inputs.token_ids.shape == (16,)  # 10 tokens -> the 16 bucket
    assert md.block_tables.shape == (4, 8 if full_width else 4)  # 4 sequence slots
    # Decode sequences first, then prefill chunks, then padding.
    assert md.cu_q_lens.tolist() == [0, 1, 7, 10, 10]
    assert md.kv_lens.tolist() == [9, 10, 3, 0]
    assert md.num_seqs.tolist() == [3]
    positions = [8, 4, 5, 6, 7, 8, 9, 0, 1, 2]
    assert inputs.positions[:10].tolist() == positions
    assert inputs.token_ids[:10].tolist() == [decode.token_at(8), *range(104, 110), 100, 101, 102]
    tables = [decode.block_table, chunk.block_table, first.block_table]
    for index, table in enumerate(tables):
        assert md.block_tables[index, : len(table)].tolist() == table
        assert not md.block_tables[index, len(table) :].any()
    for row, pos in enumerate(positions):
        table = tables[np.searchsorted(md.cu_q_lens[1:], row, side="right")]
        assert md.slot_mapping[row] == table[pos // 4] * 4 + pos % 4
    assert (md.slot_mapping[10:] == SCRATCH_PAGE * 4).all()
    assert md.live_rows.tolist() == [[0, 1], [1, 10]]
    # One logits row per sequence slot, at each scheduled sequence's last token.
    assert inputs.logits_indices.tolist() == [0, 6, 9, 0]
    assert inputs.logits_live.tolist() == [[0, 1], [1, 3]]
    assert inputs.rows[:3] == [scheduled[1], scheduled[0], scheduled[2]]
    assert inputs.rows[3] is None


def test_full_width_shape_depends_only_on_the_token_bucket():
    layout = StepLayout(page_size=16, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256)
    shapes, buckets = set(), set()
    for lengths in ([1, 1, 1], [1, 12], [14], [1] * 8, [3, 5, 2, 6], [1, 2, 1]):
        seqs = [_sequence(n + 4, 4, [1, 2, 3]) for n in lengths]
        out = SchedulerOutput(
            [ScheduledSequence(s, n) for s, n in zip(seqs, lengths, strict=True)], []
        )
        inputs = layout.ragged(out)
        arrays = [inputs.token_ids, inputs.logits_indices, *jax.tree.leaves(inputs.metadata)]
        shapes.add(tuple(a.shape for a in arrays))
        buckets.add(len(inputs.token_ids))
    assert buckets == {4, 8, 16} and len(shapes) == 3  # nothing but the token bucket varies
    assert layout.token_buckets == [2, 4, 8, 16, 32, 64]


def test_static_batching_pads_decode_steps():
    layout = StepLayout(
        page_size=4, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=32, min_decode_batch=8
    )
    out = SchedulerOutput([ScheduledSequence(_sequence(3, 5, [1, 2], outputs=3), 1)], [])
    inputs = layout.ragged(out)
    assert inputs.token_ids.shape == (8,) and inputs.metadata.kv_lens.shape == (8,)


@pytest.fixture(scope="module")
def sliding_model_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    return save_tiny_model(
        str(tmp_path_factory.mktemp("tiny-mistral")),
        smollm2_tokenizer,
        arch="mistral",
        sliding_window=12,
        seed=3,
    )


@pytest.mark.parametrize("model", ["tiny", pytest.param("sliding", marks=pytest.mark.slow)])
def test_native_backend_matches_reference(model, tiny_model_dir, sliding_model_dir):
    """The native backend (full-width tables, a kernel row per token) and the XLA reference
    (tight tables, query blocks) read the same ragged layout and agree token for token and in
    log-probabilities, with chunked prefill and prompts past the sliding window."""
    path = tiny_model_dir if model == "tiny" else sliding_model_dir
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 1000, int(n)).tolist() for n in (5, 40, 23, 61, 9, 33)]
    params = [
        SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True, logprobs=2)
        for m in (9, 4, 12, 6, 10, 7)
    ]
    knobs = dict(max_model_len=128, max_rolling_batch_size=4, max_rolling_batch_prefill_tokens=24)
    native = LLM(path, attention_backend="cpu", **knobs)
    assert native.engine.layout.full_width_tables
    reference = LLM(path, attention_backend="reference", **knobs)
    assert not reference.engine.layout.full_width_tables
    got = native.generate(prompts, params, use_tqdm=False)
    want = reference.generate(prompts, params, use_tqdm=False)
    for a, b in zip(got, want, strict=True):
        assert a.token_ids == b.token_ids
        for lp_a, lp_b in zip(a.outputs[0].logprobs, b.outputs[0].logprobs, strict=True):
            assert lp_a.keys() == lp_b.keys()
            np.testing.assert_allclose(list(lp_a.values()), list(lp_b.values()), atol=2e-4)


@pytest.mark.slow  # 13-30 s on 2 cores: the default suite stays near 15 min
def test_precompile_covers_every_shape(tiny_model_dir, fresh_executables):
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
    buckets = llm.engine.layout.token_buckets
    # every step shape (2 .. 64), and the sampler's row buckets besides
    assert stats["precompile_compiles"] > len(buckets) == 6
    assert llm.precompile(sampled) == 0  # every sampling configuration shares those programs
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


@pytest.mark.slow
def test_precompile_tight_tables_covers_decode_steps(tiny_model_dir, fresh_executables):
    llm = LLM(tiny_model_dir, attention_backend="reference", max_model_len=64)
    layout = llm.engine.layout
    decode_buckets = [t for t in layout.token_buckets if t <= layout.seq_cap]
    # each decode shape at every table width, and the sampler's row buckets besides
    assert llm.precompile() > len(decode_buckets) * len(layout.width_buckets)


def test_decode_only_steps_are_marked_where_the_backend_asks():
    """With ``mark_decode_only`` (Pallas GPU), a step whose every row is a decode row, one per
    sequence slot, is marked (a static flag: it compiles apart from a mixed step of its shape),
    and so are the precompiled padding steps up to the sequence cap; a step with a prefill chunk
    is not. Without it nothing is marked."""
    marked = StepLayout(
        page_size=4,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_model_len=64,
        full_width_tables=False,
        mark_decode_only=True,
    )
    plain = dataclasses.replace(marked, mark_decode_only=False)
    decode = [_sequence(9, 8, [1, 2, 3]), _sequence(5, 4, [4, 5])]
    mixed = [_sequence(9, 8, [1, 2, 3]), _sequence(12, 4, [6, 7, 8])]
    decode_out = SchedulerOutput([ScheduledSequence(s, 1) for s in decode], [])
    mixed_out = SchedulerOutput(
        [ScheduledSequence(mixed[0], 1), ScheduledSequence(mixed[1], 3)], []
    )
    assert marked.ragged(decode_out).metadata.decode_only
    assert not marked.ragged(mixed_out).metadata.decode_only
    assert not plain.ragged(decode_out).metadata.decode_only
    assert all(step.metadata.decode_only for step in marked.precompile_shapes())
    assert not any(step.metadata.decode_only for step in plain.precompile_shapes())
