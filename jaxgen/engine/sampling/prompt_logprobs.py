"""Prompt logprobs: each prompt token's logprob given its prefix, computed during prefill.

A step that holds a sequence asking for them (``SamplingParams.prompt_logprobs``) runs the LM
head on every token row, not only the sampling rows, and reads for each row the logprob of the
prompt token that follows it (``targets``, -1 for rows nobody asked about) and the top ``k``.
Both have one shape: the step always reads the top ``PROMPT_TOP`` (20, the most a request may
ask; ``top_k`` costs about the same for 1 or 20 next to the LM head on every row) and the row
count is the step's token bucket. Every step's executable holds this work behind a
``lax.cond`` on whether any row has a target (``step_function.jitted_step``), so a prompt-logprobs step
compiles nothing of its own and a step without one skips it. Chunked prefill needs nothing
special: a chunk's last row targets the first token of the next chunk, which is known.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.engine.scheduling.sequence import Sequence
from jaxgen.engine.step.step_layout import StepInputs

# Top logprobs every prompt-logprobs step computes (a request keeps its own k of them): one
# executable per token bucket instead of one per top-k bucket. On a 2-core CPU, top_k over
# [512, 49152] takes 0.15 s for k=1 and 0.17 s for k=20; the LM head on those rows 1.9 s.
PROMPT_TOP = 20


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PromptLogprobsOutput:
    """Per token row of a step: the logprob of the prompt token that follows it, and the top k."""

    logprobs: jax.Array  # [T] f32; 0 for rows whose target is -1
    top_token_ids: jax.Array  # [T, k] i32
    top_logprobs: jax.Array  # [T, k] f32; descending


@dataclasses.dataclass(frozen=True)
class PromptLogprobsBatch:
    """The host side of one step's prompt logprobs: the targets and who asked for which rows."""

    targets: np.ndarray  # [T] int32: the next prompt token of each row, -1 if not asked
    num_top: int  # static: top logprobs computed per row (``PROMPT_TOP``)
    # (sequence, first step row, first target position, count) per asking sequence
    spans: list[tuple[Sequence, int, int, int]]


def prompt_logprobs(logits: jax.Array, targets: jax.Array, num_top: int) -> PromptLogprobsOutput:
    """Log-softmax of every row's raw logits at its target, and the top ``num_top``.

    Args:
        logits: [T, V] raw logits of every token row of the step.
        targets: [T] int32 token ids (-1: not asked; gives 0).
        num_top: static number of top logprobs per row.
    """
    logits = logits.astype(jnp.float32)
    peak = jnp.max(logits, axis=-1, keepdims=True)
    log_normalizer = jnp.log(jnp.sum(jnp.exp(logits - peak), axis=-1)) + peak[:, 0]  # [T]
    safe = jnp.clip(targets, 0, logits.shape[1] - 1)
    target_logits = jnp.take_along_axis(logits, safe[:, None], axis=-1)[:, 0]
    logprobs = jnp.where(targets >= 0, target_logits - log_normalizer, 0.0)
    if num_top > 0:
        top_logits, top_ids = jax.lax.top_k(logits, min(num_top, logits.shape[1]))
        top_logprobs = top_logits - log_normalizer[:, None]
    else:
        top_ids = jnp.zeros((logits.shape[0], 0), jnp.int32)
        top_logprobs = jnp.zeros((logits.shape[0], 0), jnp.float32)
    return PromptLogprobsOutput(logprobs, top_ids.astype(jnp.int32), top_logprobs)


def build_prompt_logprobs(inputs: StepInputs) -> PromptLogprobsBatch | None:
    """The step's targets, or None when no scheduled sequence wants prompt logprobs (then the
    step computes none). A sequence wants them while ``seq.wants_prompt_logprobs``."""
    spans = []
    targets = None
    for index, item in enumerate(inputs.rows):
        if item is None or not item.seq.wants_prompt_logprobs:
            continue
        seq = item.seq
        start = seq.num_computed_tokens  # the chunk's first position
        # Row at position p targets prompt token p + 1: positions up to len(prompt) - 2.
        count = min(item.num_new_tokens, seq.num_prompt_tokens - 1 - start)
        if count <= 0:
            continue
        if targets is None:
            targets = np.full(len(inputs.token_ids), -1, np.int32)
        row = int(inputs.metadata.cu_q_lens[index])
        targets[row : row + count] = seq.prompt_token_ids[start + 1 : start + 1 + count]
        spans.append((seq, row, start + 1, count))
    if targets is None:
        return None
    return PromptLogprobsBatch(targets, PROMPT_TOP, spans)


def unpack_prompt_logprobs(
    batch: PromptLogprobsBatch, output: PromptLogprobsOutput
) -> dict[int, list[tuple[int, dict[int, float]]]]:
    """seq_id -> [(prompt position, {token: logprob})]: the prompt token's own logprob first,
    then the top ``params.prompt_logprobs``."""
    logprobs = np.asarray(output.logprobs)
    top_ids = np.asarray(output.top_token_ids)
    top_logprobs = np.asarray(output.top_logprobs)
    result: dict[int, list[tuple[int, dict[int, float]]]] = {}
    for seq, row, position, count in batch.spans:
        k = seq.params.prompt_logprobs
        entries = []
        for offset in range(count):
            r = row + offset
            entry = {int(batch.targets[r]): float(logprobs[r])}
            for token, logprob in zip(top_ids[r, :k], top_logprobs[r, :k], strict=True):
                entry.setdefault(int(token), float(logprob))
            entries.append((position + offset, entry))
        result[seq.seq_id] = entries
    return result
