"""Drafts of sequences with structured output (a JSON schema, regex, choice or grammar).

A constrained sequence's draft d_0 .. d_{k-1} is cut at the first token its grammar refuses,
and after a token that ends the grammar (nothing after it would be kept). Its verify row
samples k + 1 positions; position i is sampled under the grammar's mask after d_0 .. d_{i-1},
the mask decoding without speculation uses for that token once it kept those before it: the
draft positions through their verify sampler rows (``verify_sampling.draft_rows``), the last
(the bonus) through the sequence's own sampling row (``with_bonus_masks``). The matcher is
advanced through the draft to compute the masks and rolled back at once
(``GrammarMasks.draft_masks``); it then advances on the tokens the sequence keeps, one at a
time, as without speculation, so a grammar that ends on an accepted token ends the request
there. Plain numpy: never imports jax.
"""

from __future__ import annotations

import numpy as np

from jaxgen.engine.decoding.speculative.speculator import Draft
from jaxgen.engine.step.step_batch import StepBatch
from jaxgen.engine.structured.grammar_masks import GrammarMasks


def constrain_drafts(
    drafts: list[Draft], grammars: GrammarMasks
) -> tuple[list[Draft], dict[int, np.ndarray]]:
    """``drafts`` with each constrained sequence's cut to what its grammar accepts (dropped
    when that is nothing: the sequence decodes plainly), and seq_id -> the masks [n + 1, W]
    of a kept constrained draft of n tokens (row i: after its first i tokens)."""
    kept, masks = [], {}
    for draft in drafts:
        seq_id = draft.seq.seq_id
        if seq_id not in grammars.matchers:
            kept.append(draft)
            continue
        draft_masks = grammars.draft_masks(seq_id, draft.tokens)
        num_tokens = draft_masks.shape[0] - 1
        if num_tokens < 1:
            continue
        kept.append(draft if num_tokens == len(draft.tokens) else draft.cut(num_tokens))
        masks[seq_id] = draft_masks
    return kept, masks


def with_bonus_masks(batch: StepBatch, masks: dict[int, np.ndarray]) -> StepBatch:
    """``batch`` (its grammar bitmask attached) with the sampling row of each constrained
    drafting sequence masked as the token after its whole draft (the last of its ``masks``)
    instead of the token after its matcher's state; in place."""
    if not masks:
        return batch
    bitmask = batch.sampling.token_bitmask  # [S, W]: every constrained sequence's row filled
    for row, seq in enumerate(batch.seqs):
        if seq is not None and seq.seq_id in masks:
            bitmask[row] = masks[seq.seq_id][-1, : bitmask.shape[1]]
    return batch
