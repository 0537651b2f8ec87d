"""The host side of one step: the batch the engine hands the runner, and what it reads back.

The engine builds a ``StepBatch`` from the scheduler's output and each sequence's sampling row:
the step's numpy inputs (``StepLayout``), the sampling tensors and static flags, and which
sequence each logits row samples for. The runner executes the batch's arrays and returns the
sampler's arrays; ``unpack`` turns them into per-sequence tokens and logprobs.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxgen.engine.sampling.prompt_logprobs import PromptLogprobsBatch, build_prompt_logprobs
from jaxgen.engine.sampling.sampling_tensors import (
    SamplerOutput,
    SamplingFlags,
    SamplingRow,
    SamplingTensors,
    build_sampling_tensors,
)
from jaxgen.engine.scheduling.scheduler import SchedulerOutput
from jaxgen.engine.scheduling.sequence import Sequence
from jaxgen.engine.step.step_layout import StepInputs, StepLayout
from jaxgen.sampling_params import SamplingParams

PADDING_ROW = SamplingRow(SamplingParams(temperature=0.0))


@dataclasses.dataclass
class StepBatch:
    """One step's batch, on the host."""

    inputs: StepInputs  # the step's numpy inputs; ``inputs.arrays`` go to the device
    sampling: SamplingTensors  # [S] rows, numpy (the runner fits them to its sampling shapes)
    flags: SamplingFlags  # what the batch's rows use (the device runs every stage it needs)
    seqs: list[Sequence | None]  # [S]: the sequence each logits row samples for; None: none
    prompt: PromptLogprobsBatch | None = None  # None: no sequence of the step wants them

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


def precompile_batch(inputs: StepInputs) -> StepBatch:
    """An all-padding batch of ``inputs``' shape (precompiling): greedy padding rows that touch
    only the scratch page."""
    return _batch(inputs, [PADDING_ROW] * len(inputs.rows), inputs.rows, 0, 0)


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
        if seq.params is not None and seq.params.logprobs is not None:
            entry = {token: float(output.logprobs[row])}
            k = seq.params.logprobs or 0
            top = zip(output.top_token_ids[row][:k], output.top_logprobs[row][:k], strict=True)
            for top_token, logprob in top:
                entry.setdefault(int(top_token), float(logprob))
            logprobs[seq.seq_id] = entry
    return tokens, logprobs
