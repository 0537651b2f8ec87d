"""Sampling at a verify row's draft positions, and which draft tokens are kept.

A draft of k tokens d_0 .. d_{k-1} is scored by one verify row of k + 1 tokens; the logits at
its position i (i < k) give the distribution of the token d_i stands for, the logits at its
end the token after a wholly accepted draft (the bonus, the sequence's normal sampling row).
Each draft position is sampled on the device by the engine's own sampler, as one more sampler
row: the request's temperature, top-k, top-p, min-p, logit bias, ``min_tokens`` bans and
penalties over a history that holds the draft tokens before it (``draft_rows``), and for a
constrained sequence the grammar's mask after the draft tokens before it (``grammar_drafts``),
so position i samples from p_i, exactly the distribution decoding without speculation samples from given
the tokens before it, with the key ``fold_in(key(seed), g + i)`` (g: tokens generated before
the draft) that decoding would use for that token.

Acceptance (``accept``): keep the longest draft prefix equal to the sampled tokens, then the
sampled token at the first mismatch (or the bonus). Every kept token is the target's own draw
t_i ~ p_i at its position, given the kept tokens before it, with a key no earlier kept token
depended on: the output distribution is the target's, whatever the draft. For a draft that is
a point mass on d_i (an n-gram draft, vLLM's ``draft_probs=None``) this is rejection sampling:
d_i is accepted with probability p_i(d_i) = min(1, p_i(d_i) / q_i(d_i)), and a rejected
position's token is drawn from p_i conditioned on differing from d_i, i.e. from
max(p_i - q_i, 0) renormalised, vLLM's recovered distribution. A draft model's sampled draft
d_i ~ q_i is drawn with the same key as t_i (``draft_model``; ``Draft.seed`` for an unseeded
row), and both samplers draw by Gumbel-max, so d_i = t_i whenever the shared noise picks the
same token under q_i and p_i: a coupling of q_i and p_i, accepting d_i with probability
sum_x 1 / sum_y max(p_i(y) / p_i(x), q_i(y) / q_i(x)) over one Gumbel-max (at least
(1 - TV) / (1 + TV), where vLLM's min(1, p / q) rule reaches the maximal 1 - TV, TV the total
variation between q_i and p_i), a rejected position's token then drawn from
p_i(x) - P(d_i = t_i = x) renormalised. It needs no vocabulary-wide q_i on the verify side.

Seeds: a seeded request draws the token at output position m with the key of (seed, m)
whether or not it speculates, and whatever else is in the batch. So for the same seed a
request's output with speculation is the output without it, token for token (up to float
differences between a verify row's logits and a decode row's, which move a draw only at a
near tie); vLLM does not promise this. Unseeded rows take one seed per engine step (their
sequence's sampling row's, or the draft's ``Draft.seed``), distinct per position through the
step count.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from jaxgen.engine.buckets import next_power_of_two
from jaxgen.engine.sampling_shapes import SamplingShapes
from jaxgen.engine.sampling_tensors import (
    SamplerOutput,
    SamplingRow,
    SamplingTensors,
    build_sampling_tensors,
    min_tokens_banned_ids,
)
from jaxgen.engine.speculative.speculator import Draft
from jaxgen.engine.step_layout import spans


@dataclasses.dataclass
class VerifyRows:
    """The draft positions a verify step samples, one sampler row each, on the host."""

    step_rows: np.ndarray  # [D] int32: the step row whose logits each verify row samples
    sampling: SamplingTensors  # [D] rows, numpy
    first: dict[int, int]  # seq_id -> its first verify row (draft position 0)


def draft_rows(
    drafts: list[Draft],
    starts: dict[int, int],
    main: SamplingTensors,
    main_rows: dict[int, int],
    eos_token_ids: dict[int, list[int]],
    *,
    base_seed: int,
    step: int,
    masks: dict[int, np.ndarray] | None = None,
) -> VerifyRows | None:
    """The sampler rows of every draft position whose verify row runs whole this step.

    Args:
        drafts: this step's drafts (their tokens already appended to their sequences).
        starts: seq_id -> the step row of its verify row's first token (``_draft_rows``).
        main: the step's sampling tensors [S], whose row for a drafting sequence samples the
            bonus token; its seed is every draft position's seed.
        main_rows: seq_id -> its row of ``main``.
        eos_token_ids: seq_id -> the end-of-sequence ids ``min_tokens`` bans.
        base_seed, step: as ``build_sampling_tensors`` takes them (seeds are replaced).
        masks: seq_id -> a constrained sequence's grammar masks [k + 1, W] along its draft
            (``grammar_drafts``); its draft position i is sampled under row i.
    """
    masks = masks or {}
    rows, step_rows, seeds, has_seed, first, masked = [], [], [], [], {}, []
    for draft in drafts:
        seq = draft.seq
        if seq.seq_id not in starts:
            continue
        first[seq.seq_id] = len(rows)
        generated = draft.num_tokens - seq.num_prompt_tokens  # tokens before the draft
        params = seq.params
        for position in range(len(draft.tokens)):
            history = seq.output_token_ids[: generated + position]
            banned = min_tokens_banned_ids(params, generated + position, eos_token_ids[seq.seq_id])
            rows.append(SamplingRow(params, seq.prompt_token_ids, history, banned))
            step_rows.append(starts[seq.seq_id] + position)
            seeds.append(main.seeds[main_rows[seq.seq_id]] if draft.seed is None else draft.seed)
            has_seed.append(main.has_seed[main_rows[seq.seq_id]])
            if seq.seq_id in masks:
                masked.append((len(rows) - 1, masks[seq.seq_id][position]))
    if not rows:
        return None
    tensors, _ = build_sampling_tensors(rows, len(rows), base_seed=base_seed, step_counter=step)
    tensors.seeds[:] = seeds
    tensors.has_seed[:] = has_seed
    if masked:
        tensors = _with_masks(tensors, masked)
    return VerifyRows(np.asarray(step_rows, np.int32), tensors, first)


def _with_masks(tensors: SamplingTensors, masked: list[tuple[int, np.ndarray]]) -> SamplingTensors:
    """``tensors`` [D] with the grammar mask [W] of each (row, mask) in ``masked`` (those rows
    flagged ``constrained``; the others allow every token)."""
    num_rows = tensors.temperature.shape[0]
    bitmask = np.full((num_rows, masked[0][1].shape[0]), -1, np.int32)  # [D, W]
    constrained = np.zeros(num_rows, np.bool_)  # [D]
    for row, mask in masked:
        bitmask[row] = mask
        constrained[row] = True
    return dataclasses.replace(tensors, token_bitmask=bitmask, constrained=constrained)


def accept(draft: list[int], sampled: list[int]) -> list[int]:
    """The tokens a sequence keeps: the longest prefix of ``draft`` (k tokens) equal to
    ``sampled`` (k + 1 tokens, drawn at the draft's positions and after it), then the sampled
    token at the first mismatch, or the last one when the whole draft is accepted."""
    accepted = 0
    while accepted < len(draft) and draft[accepted] == sampled[accepted]:
        accepted += 1
    return draft[:accepted] + [sampled[accepted]]


def position_logprobs(output: SamplerOutput, row: int, num_top: int | None) -> dict | None:
    """The logprobs entry of verify row ``row`` as ``step_batch.unpack`` makes a decode row's:
    the sampled token's raw logprob, then the top ``num_top`` (None: the request asked none)."""
    if num_top is None:
        return None
    token = int(output.token_ids[row])
    entry = {token: float(output.logprobs[row])}
    top = zip(output.top_token_ids[row][:num_top], output.top_logprobs[row][:num_top], strict=True)
    for top_token, logprob in top:
        entry.setdefault(int(top_token), float(logprob))
    return entry


class FittedVerify(NamedTuple):
    """Verify rows as the step takes them (``runner.dispatch``'s ``verify``)."""

    step_rows: np.ndarray  # [D] int32: the step row of each draft position, padded
    sampling: SamplingTensors  # [D]
    live: np.ndarray  # [2, 2] int32: the real rows' span, so the LM head skips the padding


class VerifyShapes:
    """Fits verify rows to the sampler's fixed shapes: the step sampler's own row buckets
    (its executables serve both) up to the sequence cap, powers of 4 beyond it up to the
    token budget's bucket; ``runner.dispatch`` samples them with every stage on.
    ``max_draft_rows``: the most draft positions one step can verify (sequences x k)."""

    def __init__(self, step_shapes: SamplingShapes, max_rows: int, max_draft_rows: int):
        self.step_shapes = step_shapes
        self.wide_shapes = dataclasses.replace(
            step_shapes, seq_cap=max(next_power_of_two(max_rows, 4), step_shapes.seq_cap)
        )
        self.max_draft_rows = max_draft_rows

    def padding(self, num_tokens: int) -> list[tuple[np.ndarray, SamplingTensors]]:
        """Greedy padding verify rows, fitted, for every row bucket a step of ``num_tokens``
        token rows can verify (precompiling)."""
        most = min(num_tokens, self.max_draft_rows)
        sizes = {self._shapes(rows).rows_for(rows) for rows in range(1, most + 1)}
        fitted = []
        for size in sorted(sizes):
            tensors, _ = build_sampling_tensors([], size, base_seed=0, step_counter=0)
            rows = VerifyRows(np.zeros(size, np.int32), tensors, {})
            fitted.append(self.fit(rows))
        return fitted

    def _shapes(self, num_rows: int) -> SamplingShapes:
        """The step sampler's shapes up to the sequence cap, the wide ones beyond it."""
        return self.step_shapes if num_rows <= self.step_shapes.seq_cap else self.wide_shapes

    def fit(self, rows: VerifyRows) -> FittedVerify:
        """``rows``' step rows [D] and sampling tensors [D] padded to the row bucket D
        (padding rows read step row 0 and sample greedily; nothing reads them back)."""
        num_rows = rows.step_rows.shape[0]
        sampling = self._shapes(num_rows).fit(rows.sampling)
        step_rows = np.zeros(sampling.temperature.shape[0], np.int32)
        step_rows[:num_rows] = rows.step_rows
        return FittedVerify(step_rows, sampling, spans((0, num_rows), (num_rows, num_rows)))
