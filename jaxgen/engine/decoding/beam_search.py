"""Beam search over the engine's scheduler and KV pool, beams sharing pages.

Each step every live beam is one engine sequence whose last token is still to compute; the
engine computes them (with chunked prefill, preemption and the token budget as for any
sequence) and returns each beam's top ``2 * beam_width`` raw logprobs. Per prompt the candidate
extensions are ranked by ``beam_search_score`` (vLLM's ``LLM.beam_search``): those ending with
EOS are complete, the best ``beam_width`` others are the next beams.

Pages: a beam's first surviving extension keeps its sequence (and pages); every other one is a
fork (``PageAllocator.fork``) that shares all of the parent's full pages through their reference
counts and computes the tokens of the parent's last partial page again into a page of its own,
so beams hold the prompt's pages once, and each beam at most its diverging pages plus one.
A beam that no extension continues frees its sequence: pages its forks share stay.
"""

from __future__ import annotations

import dataclasses
import time

from jaxgen.beam_search_params import BeamSearchParams, BeamSearchSequence, beam_search_score
from jaxgen.engine.sampling.sampling_tensors import SamplingRow
from jaxgen.engine.scheduling.sequence import Sequence
from jaxgen.engine.step.step_batch import unpack
from jaxgen.sampling_params import SamplingParams


@dataclasses.dataclass
class _Beam:
    seq: Sequence  # the engine sequence holding its tokens and pages
    cum_logprob: float
    logprobs: list[dict[int, float]]


@dataclasses.dataclass
class _Candidate:
    parent: _Beam
    token: int
    cum_logprob: float
    tokens: list[int]  # the prompt, the parent's tokens and ``token``
    logprobs: list[dict[int, float]]


class _Prompt:
    """One prompt's live beams and completed sequences."""

    def __init__(self, seq: Sequence):
        self.num_prompt_tokens = seq.num_prompt_tokens
        self.beams = [_Beam(seq, 0.0, [])]
        self.completed: list[BeamSearchSequence] = []


def run_beam_search(
    engine, prompts: list[list[int]], params: BeamSearchParams
) -> list[list[BeamSearchSequence]]:
    """The best ``params.beam_width`` sequences of each prompt (token ids), best first.

    ``engine`` is an idle ``LLMEngine``: the beams are its only sequences while this runs."""
    if engine.has_unfinished():
        raise RuntimeError("beam search needs an idle engine")
    eos = set() if params.ignore_eos else set(engine.loaded.config.eos_token_ids)
    # Scores use every EOS id, as a final EOS never counts in a beam's length.
    all_eos = set(engine.loaded.config.eos_token_ids)
    row_params = SamplingParams(temperature=0.0, logprobs=2 * params.beam_width, max_tokens=None)
    groups = []
    for prompt in prompts:
        if len(prompt) >= engine.max_model_len:
            raise ValueError(
                f"prompt has {len(prompt)} tokens; max_model_len is {engine.max_model_len}"
            )
        seq = Sequence(prompt, max_tokens=params.max_tokens, params=row_params)
        engine.scheduler.add(seq)
        groups.append(_Prompt(seq))

    def score(tokens, cum_logprob):
        return beam_search_score(tokens, cum_logprob, all_eos, params.length_penalty)

    try:
        for step in range(params.max_tokens):
            live = [beam for group in groups for beam in group.beams]
            if not live:
                break
            candidates = _candidates(engine, live, row_params)
            last = step == params.max_tokens - 1
            for group in groups:
                chosen = []
                for beam in group.beams:
                    for token, logprob in candidates[beam.seq.seq_id].items():
                        tokens = beam.seq.token_ids + [token]
                        logprobs = beam.logprobs + [candidates[beam.seq.seq_id]]
                        candidate = _Candidate(
                            beam, token, beam.cum_logprob + logprob, tokens, logprobs
                        )
                        if token in eos:
                            group.completed.append(_finished(candidate, group, "stop", token))
                        else:
                            chosen.append(candidate)
                chosen.sort(key=lambda c: score(c.tokens, c.cum_logprob), reverse=True)
                chosen = chosen[: params.beam_width]
                out_of_room = chosen and len(chosen[0].tokens) >= engine.max_model_len
                previous = group.beams
                if last or out_of_room:
                    group.completed.extend(_finished(c, group, "length", None) for c in chosen)
                    group.beams = []
                else:
                    group.beams = _extend(engine, chosen)
                kept = {id(beam.seq) for beam in group.beams}
                for beam in previous:  # continued by no candidate: its pages go (shared stay)
                    if id(beam.seq) not in kept and not beam.seq.is_finished:
                        engine.scheduler.finish(beam.seq, "stop")
    finally:
        for group in groups:
            for beam in group.beams:
                if not beam.seq.is_finished:
                    engine.scheduler.finish(beam.seq, "abort")
            group.beams = []
    results = []
    for group in groups:
        ranked = sorted(group.completed, key=lambda s: score(s.tokens, s.cum_logprob), reverse=True)
        best = ranked[: params.beam_width]
        for sequence in best:
            sequence.text = engine.tokenizer.decode(sequence.tokens)
        results.append(best)
    return results


def _candidates(engine, beams: list[_Beam], row_params) -> dict[int, dict[int, float]]:
    """Runs engine steps until every beam's last token is computed; seq_id -> the top
    ``2 * beam_width`` {token: raw logprob} after it."""
    pending = {beam.seq.seq_id for beam in beams}
    found: dict[int, dict[int, float]] = {}
    while pending:
        scheduled = engine.scheduler.schedule()
        if scheduled.is_empty:
            raise RuntimeError("beam search: the scheduler scheduled nothing")
        rows = {
            item.seq.seq_id: SamplingRow(
                row_params, item.seq.prompt_token_ids, item.seq.output_token_ids
            )
            for item in scheduled.scheduled
            if item.completes
        }
        start = time.perf_counter()
        batch = engine.build_batch(scheduled, rows=rows)
        output, _ = engine.runner.fetch(engine.runner.dispatch(batch.arrays, None))
        engine.record_step(start, len(scheduled.scheduled), mode="beam")
        _, logprobs = unpack(batch, output)
        engine.scheduler.postprocess(scheduled, {})  # counts advance; the beams pick the tokens
        for seq_id, entry in logprobs.items():
            found[seq_id] = entry
            pending.discard(seq_id)
    return found


def _extend(engine, chosen: list[_Candidate]) -> list[_Beam]:
    """The next beams: each chosen candidate appended to its parent's sequence (the first
    child of a parent) or to a fork of it; parents continued by none are finished."""
    taken: set[int] = set()
    beams = []
    forks = []
    for candidate in chosen:
        parent = candidate.parent.seq
        if parent.seq_id in taken:
            child = Sequence(
                parent.prompt_token_ids,
                max_tokens=parent.max_tokens,
                params=parent.params,
            )
            child.output_token_ids = list(parent.output_token_ids)
            engine.scheduler.allocator.fork(parent, child)
            forks.append((child, candidate))
        else:
            taken.add(parent.seq_id)
            child = parent
        beams.append(_Beam(child, candidate.cum_logprob, candidate.logprobs))
    # Forks first took their references; now the parents' own new tokens may be appended.
    for beam, candidate in zip(beams, chosen, strict=True):
        beam.seq.output_token_ids.append(candidate.token)
    for child, _ in forks:
        engine.scheduler.add(child)
    return beams


def _finished(candidate: _Candidate, group: _Prompt, reason: str, eos_token) -> BeamSearchSequence:
    return BeamSearchSequence(
        tokens=candidate.tokens,
        logprobs=candidate.logprobs,
        cum_logprob=candidate.cum_logprob,
        finish_reason=reason,
        stop_reason=eos_token,
        num_prompt_tokens=group.num_prompt_tokens,
    )
