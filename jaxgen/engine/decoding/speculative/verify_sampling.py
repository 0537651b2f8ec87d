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

import numpy as np

from jaxgen.engine.decoding.speculative.speculator import Draft
from jaxgen.engine.sampling.sampling_shapes import SamplingShapes
from jaxgen.engine.sampling.sampling_tensors import (
    SamplerOutput,
    SamplingRow,
    SamplingTensors,
    build_sampling_tensors,
    concat_rows,
    min_tokens_banned_ids,
    take_rows,
)
from jaxgen.engine.step.step_batch import StepBatch
from jaxgen.engine.step.step_layout import spans


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


class VerifyShapes:
    """A verify step's logits rows: its sequences' own sampling rows, then every draft position
    (``merged``), sampled in the step's one sampler call. Row counts up to the sequence cap
    take the step sampler's buckets (its executables serve both), beyond it powers of 2 (a
    single stream's 5-row verify step samples 8 rows, not 16: each padding row costs a row of
    the LM head's output and of the sampler) and the most a step can have: its sampling rows and draft positions never outnumber its
    tokens (``max_rows``, the token budget's bucket) nor the sequence cap plus
    ``max_draft_rows`` (sequences x k), and a step with every draft whole fills the last
    bucket exactly."""

    def __init__(self, step_shapes: SamplingShapes, max_rows: int, max_draft_rows: int):
        self.step_shapes = step_shapes
        most = min(max_rows, step_shapes.seq_cap + max_draft_rows)
        self.wide_shapes = dataclasses.replace(
            step_shapes, seq_cap=max(most, step_shapes.seq_cap), growth=2
        )
        self.max_draft_rows = max_draft_rows

    def shapes(self, num_rows: int) -> SamplingShapes:
        """The step sampler's shapes up to the sequence cap, the wide ones beyond it."""
        return self.step_shapes if num_rows <= self.step_shapes.seq_cap else self.wide_shapes

    def rows_for(self, num_rows: int) -> int:
        """The logits rows (the sampler's row bucket) of ``num_rows`` sampled rows."""
        return self.shapes(num_rows).rows_for(num_rows)

    def merged(self, batch: StepBatch, rows: VerifyRows) -> tuple[StepBatch, int]:
        """``batch`` with ``rows``' draft positions as logits rows after its sequences' own
        (padding after them, to the row bucket); and the first draft position's row."""
        inputs = batch.inputs
        live = int(inputs.logits_live[1, 1])  # the sequences' rows: [0, live)
        total = live + rows.step_rows.shape[0]
        indices = np.zeros(self.rows_for(total), np.int32)
        indices[:live] = inputs.logits_indices[:live]
        indices[live:total] = rows.step_rows
        merged_inputs = dataclasses.replace(
            inputs, logits_indices=indices, logits_live=spans((0, total), (total, total))
        )
        sampling = concat_rows(take_rows(batch.sampling, live), rows.sampling)
        seqs = batch.seqs[:live] + [None] * (indices.shape[0] - live)
        return dataclasses.replace(batch, inputs=merged_inputs, sampling=sampling, seqs=seqs), live

    def padding(self, batch: StepBatch) -> list[StepBatch]:
        """All-padding verify batches of ``batch``'s shape (precompiling), one for every logits
        row bucket a verify step of its tokens can reach."""
        num_tokens = batch.inputs.token_ids.shape[0]
        most = min(num_tokens, len(batch.seqs) + self.max_draft_rows)
        batches = []
        for size in sorted({self.rows_for(rows) for rows in range(2, most + 1)}):
            tensors, _ = build_sampling_tensors([], size, base_seed=0, step_counter=0)
            inputs = dataclasses.replace(
                batch.inputs,
                logits_indices=np.zeros(size, np.int32),
                logits_live=spans((0, 0), (size, size)),
            )
            batches.append(
                dataclasses.replace(batch, inputs=inputs, sampling=tensors, seqs=[None] * size)
            )
        return batches
