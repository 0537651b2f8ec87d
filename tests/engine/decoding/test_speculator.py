"""The speculator's plain-Python parts, without a model: n-gram lookup, draft lengths and
back-off by acceptance, a drafted token's measured cost and the drafts that pay."""

from __future__ import annotations

import types

import numpy as np
import pytest

from jaxgen.config.speculative_config import SpeculativeConfig
from jaxgen.engine.decoding.speculative.draft_cost import (
    MIN_DRAFT_STEPS,
    MIN_STEPS,
    DraftCost,
    best_length,
)
from jaxgen.engine.decoding.speculative.ngram import NgramIndex, NgramProposer, propose_ngram
from jaxgen.engine.decoding.speculative.speculator import EXPLORE_EVERY, Draft, Speculator
from jaxgen.engine.scheduling.sequence import Sequence


def test_ngram_index_answers_as_the_search_step_after_step():
    """The incremental index gives ``propose_ngram``'s draft at every length of a growing
    sequence (few distinct tokens, so n-grams recur), for several n ranges and k; a sequence
    whose tokens changed behind it (not append-only) is indexed again."""
    rng = np.random.default_rng(11)
    for min_n, max_n in ((1, 3), (2, 4), (1, 1)):
        prompt = rng.integers(0, 4, 9).tolist()
        seq = Sequence(prompt, max_tokens=200)
        index = NgramIndex(min_n, max_n)
        for _ in range(120):
            k = int(rng.integers(1, 6))
            assert index.propose(seq, k) == propose_ngram(seq.token_ids, k, min_n, max_n)
            seq.output_token_ids.extend(rng.integers(0, 4, int(rng.integers(1, 4))).tolist())
        seq.output_token_ids[-1] = 9  # rewritten: indexed again
        assert index.propose(seq, 3) == propose_ngram(seq.token_ids, 3, min_n, max_n)
        del seq.output_token_ids[-20:]  # shorter: indexed again
        assert index.propose(seq, 3) == propose_ngram(seq.token_ids, 3, min_n, max_n)


def test_ngram_proposer_keeps_an_index_per_live_sequence():
    proposer = NgramProposer(1, 3)
    seq = Sequence([1, 2, 3, 1, 2], max_tokens=8)
    assert proposer.propose([(seq, 2, None)], 64) == [[3, 1]]
    assert len(proposer._indexes) == 1
    del seq
    assert len(proposer._indexes) == 0  # gone with its sequence


def test_propose_ngram():
    tokens = [1, 2, 3, 4, 5, 1, 2, 3]
    assert propose_ngram(tokens, 2, 1, 3) == [4, 5]  # the 3-gram [1, 2, 3] recurs
    assert propose_ngram(tokens, 10, 1, 3) == [4, 5, 1, 2, 3]
    assert propose_ngram([1, 2, 3], 2, 1, 3) == []  # nothing recurs
    assert propose_ngram([5, 9, 5, 7, 5], 1, 1, 2) == [9]  # the earliest occurrence


def test_draft_length_and_backoff_follow_acceptance():
    """A draft cut at a rejection makes the next one accepted + 1 tokens long, a wholly
    accepted one doubles it (up to k); one with nothing accepted backs off 2, then 4 steps."""
    speculator = Speculator(SpeculativeConfig.from_dict({"num_speculative_tokens": 8}))
    seq = types.SimpleNamespace(seq_id=1)
    state = speculator._state_of(1)
    for drafted, accepted, length, skip in [(8, 3, 4, 0), (4, 4, 8, 0), (8, 0, 1, 2), (1, 0, 1, 4)]:
        speculator.record(Draft(seq, [5] * drafted, 10), accepted)
        assert (state.length, state.skip) == (length, skip)
    speculator.record(Draft(seq, [5], 10), 1)
    assert (state.length, state.misses) == (2, 0)
    assert speculator.stats()["spec_decode_num_accepted_tokens"] == 8
    assert speculator.stats()["spec_decode_draft_token_cost"] is None  # no step timed


def test_draft_cost_is_measured_from_decode_steps():
    """A step with drafts in steps of the same rows without: unknown until MIN_STEPS plain
    steps and MIN_DRAFT_STEPS of a drafted length ran; between measured lengths a line, past
    the longest its mean cost a token, for other rows the mean cost a token of all."""
    cost = DraftCost()
    for _ in range(MIN_STEPS):
        cost.observe(0.010, rows=1, drafted_tokens=2)  # no plain step to compare yet
    for _ in range(MIN_STEPS - 1):
        cost.observe(0.005, rows=1, drafted_tokens=0)
    assert cost.relative(1, 2) is None and cost.ratio is None
    cost.observe(0.005, rows=1, drafted_tokens=0)
    assert cost.relative(1, 2) == pytest.approx(2.0)  # 10 ms / 5 ms
    assert cost.relative(1, 1) == pytest.approx(1.5)  # between (0, 1) and (2, 2)
    assert cost.relative(1, 4) == pytest.approx(3.0)  # 2 + 2 tokens at 0.5
    assert cost.ratio == pytest.approx(0.5)
    for _ in range(MIN_DRAFT_STEPS):
        cost.observe(0.011, rows=1, drafted_tokens=3)
    assert cost.relative(1, 3) == pytest.approx(2.2)
    assert cost.relative(1, 4) == pytest.approx(2.6)  # 2.2 + 1.2 / 3
    assert cost.ratio == pytest.approx(0.45)  # the mean of 1.0 / 2 and 1.2 / 3
    assert cost.relative(2, 2) == pytest.approx(1.9)  # rows not measured: ratio a token
    assert cost.relative(1, 0) == 1.0
    cost.observe(0.5, rows=1, drafted_tokens=0)  # a paused step moves the plain mean little
    assert cost.seconds[(1, 0)] < 0.0055


def _cpu_like() -> DraftCost:
    """One row's steps as the default model's on the 2-core CPU: 4 tokens in one tile, a
    fifth in a second one."""
    cost = DraftCost()
    for drafted, ms in [(0, 4.9), (1, 5.4), (2, 6.4), (3, 6.6), (4, 9.4)]:
        for _ in range(MIN_STEPS):
            cost.observe(ms / 1000, rows=1, drafted_tokens=drafted)
    return cost


def test_drafts_are_as_long_as_gives_most_tokens_per_second():
    cost = _cpu_like()
    # 0.9: 1.9 / 1.10, 2.71 / 1.31, 3.44 / 1.35 (the best), 4.10 / 1.92 tokens a step's time
    assert best_length(0.9, cost, 1, 4) == 3
    assert best_length(0.99, cost, 1, 2) == 2
    assert best_length(0.1, cost, 1, 4) == 0  # 1.1 / 1.10 < 1: no length pays
    flat = DraftCost()  # a GPU's: a verify row nearly free
    for drafted in range(9):
        for _ in range(MIN_STEPS):
            flat.observe(0.0051 if drafted else 0.005, rows=1, drafted_tokens=drafted)
    assert best_length(0.5, flat, 1, 8) == 8
    assert best_length(0.1, DraftCost(), 1, 4) == 4  # cost unknown: as long as it may be


def test_optimistic_costs_price_little_measured_lengths_at_the_cheapest_token():
    """``optimistic``: a length measured fewer than ``below`` times costs at most the cheapest
    per-token cost measured over the well-measured lengths; the others keep theirs."""
    cost = _cpu_like()  # lengths 1-4 measured MIN_STEPS times
    for _ in range(MIN_DRAFT_STEPS):
        cost.observe(0.040, rows=1, drafted_tokens=8)  # an 8-long draft's slow first runs
    optimistic = cost.optimistic(1, MIN_STEPS)
    cheapest = 5.4 / 4.9 - 1.0  # 1 drafted token: the least a token
    assert optimistic.relative(1, 8) == pytest.approx(1.0 + 8 * cheapest)
    assert optimistic.relative(1, 6) == pytest.approx(1.0 + 6 * cheapest)  # a line priced it higher
    assert optimistic.relative(1, 4) == pytest.approx(cost.relative(1, 4))  # well measured
    assert best_length(0.95, cost, 1, 8) == 3  # 8 looks dear: never tried again
    assert best_length(0.95, optimistic, 1, 8) == 8
    assert DraftCost().optimistic(1, MIN_STEPS).relative(1, 2) is None  # nothing measured


def test_every_few_proposals_try_the_length_optimistic_costs_pick():
    """Every EXPLORE_EVERY-th length the speculator gives a sequence is the optimistic one: a
    length whose first runs were slow is drafted again, and its faster steps re-measure it."""
    speculator = Speculator(SpeculativeConfig.from_dict({"num_speculative_tokens": 8}))
    for drafted, ms in [(0, 4.9), (1, 5.4), (2, 6.4), (3, 6.6), (4, 9.4)]:
        for _ in range(MIN_STEPS):
            speculator.observe_step(ms / 1000, 1, drafted)
    for _ in range(MIN_DRAFT_STEPS):
        speculator.observe_step(0.040, 1, 8)
    state = speculator._state_of(1)
    state.accepted, state.trials = 50.0, 51.0  # a sequence that copies: nearly all accepted
    lengths = [speculator._length(state, 8) for _ in range(2 * EXPLORE_EVERY)]
    assert lengths.count(8) == 2 and lengths[EXPLORE_EVERY - 1] == 8
    assert set(lengths) == {3, 8}
    speculator.observe_step(0.0095, 1, 8)  # tried again: far faster, the mean resets
    assert speculator.cost.relative(1, 8) < 2.0
    assert best_length(speculator.acceptance(state), speculator.cost, 1, 8) == 8


def test_unpaid_drafts_back_off_four_times_longer():
    """Once a drafted token's cost is known, drafts whose sequence accepts less than that
    share back off 2, 8, 32, ... steps (up to 256), even when a token was accepted; paying
    drafts reset the back-off."""
    speculator = Speculator(SpeculativeConfig.from_dict({"num_speculative_tokens": 4}))
    for drafted, seconds in [(0, 0.005)] * MIN_STEPS + [(1, 0.008)] * MIN_STEPS:
        speculator.observe_step(seconds, 1, drafted)
    assert speculator.stats()["spec_decode_draft_token_cost"] == pytest.approx(0.6)
    seq = types.SimpleNamespace(seq_id=1)
    state = speculator._state_of(1)
    skips = []
    for accepted in [0, 0, 1, 0, 0, 0]:
        speculator.record(Draft(seq, [5], 10), accepted)
        skips.append(state.skip)
    assert skips == [2, 8, 32, 128, 256, 256]
    assert speculator.acceptance(state) < 0.6
    for _ in range(6):  # a run of accepted drafts: the sequence pays again
        speculator.record(Draft(seq, [5, 6], 10), 2)
    assert speculator.acceptance(state) > 0.6 and (state.misses, state.skip) == (0, 256)


def test_measured_costs_set_the_length_and_a_miss_that_pays_does_not_back_off():
    """Once drafts' costs are measured, a sequence whose acceptance pays drafts again at the
    next step after a miss, as long as pays (here 3 of k = 4: a fifth token costs a tile)."""
    speculator = Speculator(SpeculativeConfig.from_dict({"num_speculative_tokens": 4}))
    speculator.cost = _cpu_like()
    seq = types.SimpleNamespace(seq_id=1)
    state = speculator._state_of(1)
    for _ in range(8):
        speculator.record(Draft(seq, [5, 6, 7], 10), 3)
    speculator.record(Draft(seq, [5, 6, 7], 10), 0)  # a miss, at a high acceptance
    assert (state.skip, state.misses, state.length) == (0, 0, 4)
    assert best_length(speculator.acceptance(state), speculator.cost, 1, state.length) == 3
