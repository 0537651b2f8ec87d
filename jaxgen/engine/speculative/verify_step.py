"""One speculative engine step: drafts appended, one ragged step verifies them, the accepted
tokens are kept and the rejected ones' KV slots rolled back.

A draft of k tokens turns its sequence's decode row into a prefill-like row of k + 1 tokens (the
last accepted token, then the draft), scheduled, paged and bucketed like any chunk, so
speculating and other rows share the step and its executable. The step's LM head runs on every
token row through the prompt-logprobs path (``runner.jitted_step``: targets on the draft rows),
whose top-1 is each row's argmax; the sampling row at the draft's end samples the token after a
fully accepted draft. Greedy acceptance keeps the longest draft prefix equal to the argmax, then
the target's own token, so the output is the one decoding without speculation gives. The rows'
tokens then go through the engine's postprocessing one at a time (stop strings, stop tokens,
``max_tokens``), so nothing past a stop is kept.
"""

from __future__ import annotations

import time

import numpy as np

from jaxgen.engine.prompt_logprobs import PROMPT_TOP, PromptLogprobsBatch, unpack_prompt_logprobs
from jaxgen.engine.speculative.speculator import Draft
from jaxgen.engine.step_batch import StepBatch, unpack
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
    start = time.perf_counter()
    try:
        batch = _with_verify_targets(engine._build_batch(scheduled), drafts)
        step = engine.executor.launch(batch, scheduled, start)
        output, prompt_output = engine.runner.fetch(step.step)
    except Exception as error:
        _strip(drafts)
        raise engine._recover(scheduled, error) from error
    engine.consecutive_failed_steps = 0
    now = time.perf_counter()
    engine.step_time += now - max(start, engine._last_read)
    engine._last_read = now
    engine.num_steps += 1
    engine.last_batch_size = len(scheduled.scheduled)
    tokens, logprobs = unpack(batch, output)
    if batch.prompt is not None and batch.prompt.spans:
        for seq_id, entries in unpack_prompt_logprobs(batch.prompt, prompt_output).items():
            engine.seq_to_request[seq_id].on_prompt_logprobs(entries)
    drafted = {draft.seq.seq_id: draft for draft in drafts}
    plain = {seq_id: token for seq_id, token in tokens.items() if seq_id not in drafted}
    rows = _draft_rows(batch, drafted)  # before postprocess advances the computed counts
    got_token = scheduler.postprocess(scheduled, plain)
    top_ids = np.asarray(prompt_output.top_token_ids)[:, 0] if drafts else None  # [T]: argmax
    accepted_tokens = {}
    for draft in drafts:
        row = rows.get(draft.seq.seq_id)
        accepted_tokens[draft.seq.seq_id] = _accept(
            engine, draft, row, top_ids, tokens.get(draft.seq.seq_id)
        )
    return _deliver(engine, got_token, logprobs, drafts, accepted_tokens)


def _strip(drafts: list[Draft]) -> None:
    """Takes the draft tokens off their sequences (before anything read them)."""
    for draft in drafts:
        del draft.seq.output_token_ids[draft.num_tokens - draft.seq.num_prompt_tokens :]


def _with_verify_targets(batch: StepBatch, drafts: list[Draft]) -> StepBatch:
    """``batch`` computing every token row's top logprobs: each draft row targets its draft
    token (any target >= 0 turns the LM head on for every row); prompt logprobs asked for by
    other sequences keep their targets and spans."""
    if not drafts:
        return batch
    num_rows = len(batch.inputs.token_ids)
    if batch.prompt is None:
        prompt = PromptLogprobsBatch(np.full(num_rows, -1, np.int32), PROMPT_TOP, [])
    else:
        prompt = PromptLogprobsBatch(batch.prompt.targets.copy(), PROMPT_TOP, batch.prompt.spans)
    rows = _draft_rows(batch, {d.seq.seq_id: d for d in drafts})
    for draft in drafts:
        row = rows.get(draft.seq.seq_id)
        if row is not None:
            prompt.targets[row : row + len(draft.tokens)] = draft.tokens
    batch.prompt = prompt
    return batch


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


def _accept(engine, draft: Draft, row: int | None, top_ids, last_token) -> list[int]:
    """The tokens ``draft.seq`` keeps (the accepted draft prefix, then the target's token);
    rolls its computed count and pages back to them. [] when its verify row was not run whole
    (preempted, or cut by the token budget): it decodes again next step."""
    seq = draft.seq
    _strip([draft])
    if row is None or seq.is_finished or last_token is None:
        seq.num_computed_tokens = min(seq.num_computed_tokens, draft.num_tokens - 1)
        engine.scheduler.allocator.truncate(seq, seq.num_computed_tokens)
        engine.speculator.pause(seq)  # it decodes plainly next step: no row is cut twice
        return []
    accepted = 0
    for i, token in enumerate(draft.tokens):
        if int(top_ids[row + i]) != token:
            break
        accepted += 1
    engine.speculator.record(draft, accepted)
    if accepted == len(draft.tokens):
        bonus = last_token
    else:
        bonus = int(top_ids[row + accepted])
    # Computed: the tokens before the draft and the accepted ones; ``bonus`` decodes next.
    seq.num_computed_tokens = draft.num_tokens + accepted
    engine.scheduler.allocator.truncate(seq, seq.num_computed_tokens)
    return draft.tokens[:accepted] + [bonus]


def _deliver(engine, got_token, logprobs, drafts, accepted_tokens) -> list[RequestOutput]:
    """Hands each sequence's new tokens to the engine's postprocessing one token at a time (a
    stop ends the sequence; its later tokens are dropped); the latest output per request."""
    outputs: dict[str, RequestOutput] = {}
    round_seqs = list(got_token)
    for draft in drafts:
        new = accepted_tokens[draft.seq.seq_id]
        if new:
            draft.seq.output_token_ids.append(new[0])
            round_seqs.append(draft.seq)
    position = 1
    while round_seqs:
        for out in engine._on_tokens(round_seqs, logprobs):
            outputs[out.request_id] = out
        round_seqs = []
        for draft in drafts:
            new = accepted_tokens[draft.seq.seq_id]
            if position < len(new) and not draft.seq.is_finished:
                draft.seq.output_token_ids.append(new[position])
                round_seqs.append(draft.seq)
        position += 1
    return list(outputs.values())
