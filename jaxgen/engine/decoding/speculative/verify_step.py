"""One speculative engine step: drafts appended, one ragged step verifies them, the accepted
tokens are kept and the rejected ones' KV slots rolled back.

A draft of k tokens turns its sequence's decode row into a prefill-like row of k + 1 tokens (the
last accepted token, then the draft), scheduled, paged and bucketed like any chunk, so
speculating and other rows share the step. Every draft position is one more logits row of
the step, after its sequences' own, sampled with the request's own sampling parameters in the
step's one sampler call (``verify_sampling``); the sequence's own row, at the draft's end,
samples the token after a wholly accepted draft. Acceptance keeps the longest draft prefix
equal to the sampled tokens, then the sampled token at the first mismatch: for greedy rows
the longest prefix equal to the argmax (the output decoding without speculation gives), for
sampled rows the target's own draws, so the target's distribution (exact rejection sampling
of a point-mass draft; for a sampled draft a coupling through shared noise,
``verify_sampling``). A constrained sequence's draft is cut to what its grammar accepts, and
each position sampled under the grammar's mask there (``grammar_drafts``). The rows' tokens
then go through the engine's postprocessing one at a time (stop strings, stop tokens, the
grammar, ``max_tokens``, logprobs), so nothing past a stop is kept. Everything comes back in
one device-to-host transfer.
"""

from __future__ import annotations

import time

from jaxgen.engine.compiled.compile_counter import compile_count
from jaxgen.engine.decoding.speculative.grammar_drafts import constrain_drafts, with_bonus_masks
from jaxgen.engine.decoding.speculative.speculator import Draft
from jaxgen.engine.decoding.speculative.verify_sampling import (
    VerifyRows,
    accept,
    draft_rows,
    position_logprobs,
)
from jaxgen.engine.sampling.prompt_logprobs import unpack_prompt_logprobs
from jaxgen.engine.step.step_batch import StepBatch, unpack
from jaxgen.outputs import RequestOutput


def speculative_step(engine) -> list[RequestOutput]:
    """``LLMEngine.step`` with speculation (synchronous; one step per call)."""
    scheduler = engine.scheduler
    drafts = engine.speculator.propose(
        scheduler.running,
        scheduler.allocator,
        scheduler.config.max_num_batched_tokens,
        engine.max_model_len,
    )
    drafts, masks = constrain_drafts(drafts, engine.grammars)
    for draft in drafts:
        draft.seq.output_token_ids.extend(draft.tokens)
    try:
        scheduled = scheduler.schedule()
    except BaseException:
        _strip(drafts)
        raise
    if scheduled.is_empty:
        _strip(drafts)
        return []
    start, compiles = time.perf_counter(), compile_count()
    try:
        batch = with_bonus_masks(engine.build_batch(scheduled), masks)
        verify = _verify_rows(engine, batch, drafts, masks)
        offset = 0  # the logits row of the first draft position
        if verify is not None:
            batch, offset = engine.verify_shapes.merged(batch, verify)
        step = engine.executor.launch(batch, scheduled, start).step
        output, prompt_output = engine.runner.fetch(step)
    except Exception as error:
        _strip(drafts)
        raise engine.recover(scheduled, error) from error
    seconds = time.perf_counter() - start
    engine.record_step(start, len(scheduled.scheduled), mode="verify")
    if compile_count() == compiles:  # a step that compiled says nothing of its cost
        _observe_cost(engine, scheduled, drafts, seconds)
    try:
        return _hand_on(engine, scheduled, drafts, batch, (verify, output, offset, prompt_output))
    except Exception as error:  # its sequences were left part-way: they fail, not kept
        _strip(drafts)  # a draft not verified yet leaves its sequence (preempted, cut)
        raise engine.recover(scheduled, error) from error


def _hand_on(engine, scheduled, drafts, batch: StepBatch, verified) -> list[RequestOutput]:
    """The read verify step's tokens handed on (``verified``: its ``VerifyRows``, sampler
    output, first draft row and prompt logprobs): each draft's accepted prefix kept and the
    rejected tokens' slots rolled back, then one token at a time through ``advance``."""
    verify, output, offset, prompt_output = verified
    tokens, logprobs = unpack(batch, output)
    if batch.prompt is not None and batch.prompt.spans:
        for seq_id, entries in unpack_prompt_logprobs(batch.prompt, prompt_output).items():
            engine.seq_to_request[seq_id].on_prompt_logprobs(entries)
    drafted = {draft.seq.seq_id: draft for draft in drafts}
    plain = {seq_id: token for seq_id, token in tokens.items() if seq_id not in drafted}
    got_token = engine.scheduler.postprocess(scheduled, plain)
    kept = {}
    for draft in drafts:
        kept[draft.seq.seq_id] = _accept(engine, draft, verify, (output, offset), tokens, logprobs)
    return _deliver(engine, got_token, logprobs, drafts, kept)


def _observe_cost(engine, scheduled, drafts: list[Draft], seconds: float) -> None:
    """Times a step of decode rows only (each one token, or its whole draft and one) for the
    speculator's measure of a drafted token's cost; a step with a prefill chunk or a cut verify
    row is not counted."""
    items = scheduled.scheduled
    drafted = sum(len(draft.tokens) for draft in drafts)
    if (
        all(item.completes for item in items)
        and sum(item.num_new_tokens for item in items) == len(items) + drafted
    ):
        engine.speculator.observe_step(seconds, len(items), drafted)


def _strip(drafts: list[Draft]) -> None:
    """Takes the draft tokens off their sequences (before anything read them)."""
    for draft in drafts:
        del draft.seq.output_token_ids[draft.num_tokens - draft.seq.num_prompt_tokens :]


def _verify_rows(engine, batch: StepBatch, drafts: list[Draft], masks) -> VerifyRows | None:
    """The sampler rows of the draft positions of every verify row the step runs whole."""
    if not drafts:
        return None
    main_rows = {seq.seq_id: row for row, seq in enumerate(batch.seqs) if seq is not None}
    starts = {
        seq_id: row
        for seq_id, row in _draft_rows(batch, {d.seq.seq_id: d for d in drafts}).items()
        if seq_id in main_rows
    }
    eos = {d.seq.seq_id: sorted(engine.seq_to_request[d.seq.seq_id].eos_token_ids) for d in drafts}
    return draft_rows(
        drafts,
        starts,
        batch.sampling,
        main_rows,
        eos,
        base_seed=engine.config.seed,
        step=engine.step_counter - 1,
        masks=masks,
    )


def _draft_rows(batch: StepBatch, drafted: dict[int, Draft]) -> dict[int, int]:
    """seq_id -> the step row of its sequence's first token, for the drafted
    sequences whose whole verify row (k + 1 tokens) is in the step."""
    rows = {}
    cu_q_lens = batch.inputs.metadata.cu_q_lens
    for index, item in enumerate(batch.inputs.rows):
        if item is None or item.seq.seq_id not in drafted:
            continue
        draft = drafted[item.seq.seq_id]
        if item.num_new_tokens == len(draft.tokens) + 1 and item.completes:
            rows[item.seq.seq_id] = int(cu_q_lens[index])
    return rows


def _accept(engine, draft: Draft, verify, verified, tokens, logprobs) -> list[tuple[int, dict]]:
    """The tokens ``draft.seq`` keeps, with their logprobs entries (None when not asked): the
    accepted draft prefix, then the sampled token at the first mismatch or after the draft.
    ``verified``: the step's sampler output and the row of its first draft position.
    Rolls its computed count and pages back to them. [] when its verify row was not run whole
    (preempted, or cut by the token budget): it decodes again next step."""
    seq = draft.seq
    _strip([draft])
    seq_id = seq.seq_id
    if verify is None or seq_id not in verify.first or seq.is_finished or seq_id not in tokens:
        seq.num_computed_tokens = min(seq.num_computed_tokens, draft.num_tokens - 1)
        engine.scheduler.allocator.truncate(seq, seq.num_computed_tokens)
        engine.speculator.pause(seq)  # it decodes plainly next step: no row is cut twice
        return []
    output, offset = verified
    first, k = offset + verify.first[seq_id], len(draft.tokens)
    sampled = [int(token) for token in output.token_ids[first : first + k]] + [tokens[seq_id]]
    new = accept(draft.tokens, sampled)
    accepted = len(new) - 1
    engine.speculator.record(draft, accepted)
    num_top = seq.params.logprobs
    entries = [position_logprobs(output, first + i, num_top) for i in range(min(len(new), k))]
    if accepted == k:
        entries.append(logprobs.get(seq_id))  # the bonus: the sequence's own sampling row
    # Computed: the tokens before the draft and the accepted ones; the last token decodes next.
    seq.num_computed_tokens = draft.num_tokens + accepted
    engine.scheduler.allocator.truncate(seq, seq.num_computed_tokens)
    return list(zip(new, entries, strict=True))


def _deliver(engine, got_token, logprobs, drafts, kept) -> list[RequestOutput]:
    """Hands each sequence's new tokens to the engine's postprocessing one token at a time (a
    stop ends the sequence; its later tokens are dropped); one output per request."""
    moved = {}
    round_seqs = list(got_token)
    position = 0
    while True:
        entries = {seq.seq_id: logprobs.get(seq.seq_id) for seq in round_seqs}
        for draft in drafts:
            new = kept[draft.seq.seq_id]
            if position < len(new) and not draft.seq.is_finished:
                token, entry = new[position]
                draft.seq.output_token_ids.append(token)
                round_seqs.append(draft.seq)
                entries[draft.seq.seq_id] = entry
        if not round_seqs:
            break
        live = {seq_id: entry for seq_id, entry in entries.items() if entry is not None}
        moved |= engine.advance(round_seqs, live)
        round_seqs = []
        position += 1
    return engine.report(moved)
