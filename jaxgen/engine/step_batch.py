"""The host side of one step: the batch the engine hands the runner, and what it reads back.

The engine builds a ``StepBatch`` from the scheduler's output and each sequence's sampling row:
the step's numpy inputs (``StepLayout``), the sampling tensors and static flags, and which
sequence each logits row samples for. The runner executes the batch's arrays and returns the
sampler's arrays; ``unpack`` turns them into per-sequence tokens and logprobs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgen.engine.buckets import LOGPROB_BUCKETS, bucket_for
from jaxgen.engine.prompt_logprobs import PROMPT_TOP, PromptLogprobsBatch, build_prompt_logprobs
from jaxgen.engine.sampling_tensors import (
    SamplerOutput,
    SamplingFlags,
    SamplingRow,
    SamplingTensors,
    build_sampling_tensors,
    min_tokens_banned_ids,
)
from jaxgen.engine.scheduler import SchedulerOutput
from jaxgen.engine.sequence import Sequence
from jaxgen.engine.step_layout import StepInputs, StepLayout
from jaxgen.sampling_params import SamplingParams

PADDING_ROW = SamplingRow(SamplingParams(temperature=0.0))


@dataclasses.dataclass
class StepBatch:
    """One step's batch, on the host."""

    inputs: StepInputs  # the step's numpy inputs; ``inputs.arrays`` go to the device
    sampling: SamplingTensors  # [S] rows, numpy
    flags: SamplingFlags  # static: the jitted step specialises on them
    seqs: list[Sequence | None]  # [S]: the sequence each logits row samples for; None: none
    prompt: PromptLogprobsBatch | None = None  # None: no sequence of the step wants them

    @property
    def prompt_top(self) -> int | None:
        """The step's static prompt-logprobs switch: None (off) or the top-k bucket."""
        return None if self.prompt is None else self.prompt.num_top

    @property
    def prompt_targets(self):
        return None if self.prompt is None else self.prompt.targets

    @property
    def arrays(self) -> tuple:
        """What the runner executes: the step's arrays, then the sampling tensors."""
        return (*self.inputs.arrays, self.sampling)


def _batch(
    inputs: StepInputs,
    rows: list[SamplingRow],
    seqs,
    base_seed: int,
    step: int,
    prompt: PromptLogprobsBatch | None = None,
):
    tensors, flags = build_sampling_tensors(
        rows, len(inputs.rows), base_seed=base_seed, step_counter=step
    )
    if flags.num_logprobs:  # a few buckets, not one executable per requested k
        flags = dataclasses.replace(
            flags, num_logprobs=bucket_for(flags.num_logprobs, LOGPROB_BUCKETS)
        )
    return StepBatch(inputs, tensors, flags, seqs, prompt)


def build_step_batch(
    layout: StepLayout,
    scheduled: SchedulerOutput,
    sampling_rows: dict[int, SamplingRow],
    *,
    base_seed: int,
    step: int,
    lookahead: int = 0,
) -> StepBatch:
    """The batch of ``scheduled``.

    Args:
        layout: the engine's bucket sets.
        scheduled: the scheduler's output for this step.
        sampling_rows: seq_id -> ``SamplingRow`` for every sequence this step completes (whose
            sampled token is kept); the other rows sample as padding.
        base_seed: the engine's seed (unseeded rows derive theirs from it and ``step``).
        step: the engine's step number.
        lookahead: tokens decoded after this one in the same call (``StepLayout.ragged``).
    """
    inputs = layout.ragged(scheduled, lookahead)
    seqs = [
        item.seq if item is not None and item.seq.seq_id in sampling_rows else None
        for item in inputs.rows
    ]
    rows = [PADDING_ROW if seq is None else sampling_rows[seq.seq_id] for seq in seqs]
    return _batch(inputs, rows, seqs, base_seed, step, build_prompt_logprobs(inputs))


def precompile_batches(
    layout: StepLayout, sampling_params: list[SamplingParams], eos_token_ids
) -> list[StepBatch]:
    """All-padding batches of every shape ``layout.precompile_shapes`` lists, once per sampling
    variant: each configuration in ``sampling_params``, and the same with its ``min_tokens``
    bans where it has any. A configuration with ``prompt_logprobs`` also compiles the steps
    that compute them: its own row's flags (the step that finishes the prompt) and greedy
    padding flags (earlier prefill chunks), each with the prompt logprobs switched on. Their
    logits rows are padding: they touch only the scratch page."""
    variants = []  # (row, prompt top-k or None): one real row gives the flags and widths
    for params in sampling_params:
        prompt_top = None if params.prompt_logprobs is None else PROMPT_TOP
        if prompt_top is not None:
            variants += [(SamplingRow(params), prompt_top), (PADDING_ROW, prompt_top)]
        variants.append((SamplingRow(params), None))
        banned = min_tokens_banned_ids(params, 0, eos_token_ids)
        if banned:  # while min_tokens is not reached
            variants.append((SamplingRow(params, banned_token_ids=banned), prompt_top))
    shapes = layout.precompile_shapes()
    batches = []
    for row, prompt_top in variants:
        for inputs in shapes:
            padding = len(inputs.rows) - 1
            prompt = None
            if prompt_top is not None:
                targets = np.full(len(inputs.token_ids), -1, np.int32)
                prompt = PromptLogprobsBatch(targets, prompt_top, [])
            batches.append(
                _batch(inputs, [row] + [PADDING_ROW] * padding, inputs.rows, 0, 0, prompt)
            )
    return batches


def unpack(
    batch: StepBatch, output: SamplerOutput
) -> tuple[dict[int, int], dict[int, dict[int, float]]]:
    """Per-sequence results of a step: seq_id -> sampled token, and seq_id -> {token: logprob}
    (the sampled token's, then the top ``params.logprobs``) in steps where any row asked."""
    tokens, logprobs = {}, {}
    token_ids = np.asarray(output.token_ids)  # [S]
    for row, seq in enumerate(batch.seqs):
        if seq is None:
            continue
        token = int(token_ids[row])
        tokens[seq.seq_id] = token
        if batch.flags.num_logprobs or (seq.params is not None and seq.params.logprobs is not None):
            entry = {token: float(output.logprobs[row])}
            k = seq.params.logprobs or 0
            top = zip(output.top_token_ids[row][:k], output.top_logprobs[row][:k], strict=True)
            for top_token, logprob in top:
                entry.setdefault(int(top_token), float(logprob))
            logprobs[seq.seq_id] = entry
    return tokens, logprobs
