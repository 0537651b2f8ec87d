"""The public stages of one engine step, which every step mode composes
(``step_modes.plain_step`` and ``step_ahead``, ``speculative.verify_step``, beam search):
``build_batch`` and ``launch`` a step, ``read`` its tokens (``record_step`` tells the
observers), ``postprocess`` them (``advance`` each sequence, ``report`` the outputs), and
``recover`` from a step that failed at any of those points.

``StepStages`` is ``LLMEngine``'s base: its methods work on the engine's state (``scheduler``,
``executor``, ``runner``, ``grammars``, ``requests`` and ``seq_to_request``, the counters), which
``LLMEngine.__init__`` sets up; the façade itself (``jaxgen.engine.llm_engine``) keeps requests
in, ``step()`` and outputs out.
"""

from __future__ import annotations

import time

from jaxgen.engine.compiled.compile_counter import compile_count
from jaxgen.engine.errors import EngineDeadError, StepFailed
from jaxgen.engine.scheduling.request import Request
from jaxgen.engine.step.executor import DispatchedStep, StepResult, merged
from jaxgen.engine.step.step_batch import StepBatch, build_step_batch
from jaxgen.engine.step_observers import StepEvent
from jaxgen.outputs import RequestOutput
from jaxgen.sampling_params import RequestOutputKind

# Steps that fail in a row, each recovered from, before the engine gives up: a fault that
# survives a fresh KV pool is the device's, and a restart is the only cure.
MAX_CONSECUTIVE_FAILED_STEPS = 3


class StepStages:
    """The stages of a step (see the module docstring)."""

    def launch(
        self, scheduled, num_steps: int = 1, *, after: DispatchedStep | None = None
    ) -> DispatchedStep:
        """Builds and launches the step of ``scheduled`` (``num_steps`` decode steps); its rows
        holding a pending token take it from ``after``'s feed. A failure recovers and raises as
        ``step`` does."""
        start = time.perf_counter()
        if self.speculator is not None:  # a step without drafts: back-offs count it
            self.speculator.tick(item.seq for item in scheduled.scheduled)
        try:
            batch = self.build_batch(scheduled, lookahead=num_steps - 1)
            return self.executor.launch(batch, scheduled, start, num_steps, after=after)
        except Exception as error:
            raise self.recover(merged(scheduled, after), error) from error

    def read(self, current: DispatchedStep) -> StepResult:
        """Reads ``current``'s tokens and records the step (``record_step``); a failure
        recovers (the step still in flight, if any, fails with it) and raises as ``step``
        does."""
        try:
            result = self.executor.read(current)
        except Exception as error:
            raise self.recover(merged(current.scheduled, self.executor.take()), error) from error
        mode = "ahead" if self.config.async_scheduling else "plain"
        self.record_step(current.start, len(current.scheduled.scheduled), current.num_steps, mode)
        return result

    def record_step(
        self, start: float, batch_size: int, num_steps: int = 1, mode: str = "plain"
    ) -> None:
        """Counts a step that ran (launched at ``start``, read now) and tells the observers
        (``StepEvent``). Every mode's steps come through here."""
        self.consecutive_failed_steps = 0
        now = time.perf_counter()
        seconds = now - max(start, self._last_read)
        self.step_time += seconds
        self._last_read = now
        self.num_steps += num_steps
        self.last_batch_size = batch_size
        if num_steps > 1:
            self.multi_step_calls += 1
        count = compile_count()
        compiles, self._compiles_seen = count - self._compiles_seen, count
        if self.observers:
            self.observers.emit(StepEvent(batch_size, num_steps, seconds, compiles, mode))

    def build_batch(self, scheduled, lookahead: int = 0, rows: dict | None = None) -> StepBatch:
        """The step's host batch: a sampling row for each sequence the step completes (its
        request's, unless ``rows`` gives them by seq_id), block tables covering ``lookahead``
        tokens more (multi-step decoding), the grammars' masks attached."""
        if self.fault_hook is not None:
            self.fault_hook("launch")
        allocator = self.scheduler.allocator
        if allocator.host is not None:  # the host tier's copies, before the step reads pages
            self.runner.move_pages(*allocator.take_page_moves())
        if rows is None:
            rows = {
                item.seq.seq_id: self.seq_to_request[item.seq.seq_id].sampling_row(item.seq)
                for item in scheduled.scheduled
                if item.completes
            }
        if self.lora is not None:  # each sequence's adapter in a device slot
            running = {seq.lora_int_id for seq in self.scheduler.running}
            self.lora.assign((item.seq for item in scheduled.scheduled), running)
        self.step_counter += 1
        batch = build_step_batch(
            self.layout,
            scheduled,
            rows,
            base_seed=self.config.seed,
            step=self.step_counter - 1,
            lookahead=lookahead,
        )
        return self.grammars.attach(batch)

    def recover(self, scheduled, error: Exception) -> StepFailed | EngineDeadError:
        """After a failed step: fails the requests in it, gets the runner a live KV pool and,
        if the pool had to be replaced, recomputes the other running sequences from their
        tokens (their cached K/V went with the old pool). Returns the error for ``step`` to
        raise: ``StepFailed``, or ``EngineDeadError`` once recovery fails or steps keep failing."""
        self.failed_steps += 1
        self.consecutive_failed_steps += 1
        failed = []
        for item in scheduled.scheduled:
            request = self.seq_to_request.get(item.seq.seq_id)
            if request is not None and request.request_id not in failed:
                failed.append(request.request_id)
        for request_id in failed:
            self._fail(request_id)
        try:
            if self.runner.recover():
                self.scheduler.requeue_all()
                self.scheduler.allocator.reset_prefix_cache()
        except Exception as recovery_error:
            self.dead = recovery_error
        else:
            if self.consecutive_failed_steps >= MAX_CONSECUTIVE_FAILED_STEPS:
                self.dead = error
        if self.dead is not None:
            return EngineDeadError(f"the engine is dead: {self.dead!r}", failed)
        return StepFailed(error, failed)

    def _fail(self, request_id: str) -> None:
        """Ends a request with ``finish_reason="error"`` and frees its pages."""
        request = self.requests.pop(request_id)
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "error")
                request.finalize(seq)
            self.seq_to_request.pop(seq.seq_id, None)
            self.grammars.release(seq.seq_id)

    def postprocess(
        self, result: StepResult, current: DispatchedStep, got_token: list | None = None
    ) -> list[RequestOutput]:
        """Hands ``current``'s tokens on, step by step for a multi-step call, as that many
        single steps would (stops, finishes; a sequence's tokens after its stop are dropped).
        ``got_token``: the sequences the scheduler advanced with a pending token before the
        step was read (asynchronous scheduling); their tokens are put in place. Sequences that
        ended meanwhile are skipped. Returns the outputs ``report`` gives. A failure recovers
        (the step still in flight, if any, fails with it) and raises as ``step`` does: the
        step's requests were left part-way, so they are failed, not kept."""
        try:
            return self._hand_on(result, current, got_token)
        except Exception as error:
            raise self.recover(merged(current.scheduled, self.executor.take()), error) from error

    def _hand_on(self, result: StepResult, current: DispatchedStep, got_token) -> list:
        """``postprocess``' work."""
        for seq_id, entries in result.prompt_logprobs.items():
            if seq_id in self.seq_to_request:  # not aborted while its step was in flight
                self.seq_to_request[seq_id].on_prompt_logprobs(entries)
        if got_token is not None:
            (sampled,) = result.steps
            for seq in got_token:
                seq.output_token_ids[-1] = sampled.tokens[seq.seq_id]
            live = [seq for seq in got_token if not seq.is_finished]
            return self.report(self.advance(live, sampled.logprobs))
        moved: dict[str, Request] = {}
        for sampled in result.steps:
            scheduled = current.live_items()
            if scheduled.is_empty:
                break
            got_token = self.scheduler.postprocess(scheduled, sampled.tokens)
            moved |= self.advance(got_token, sampled.logprobs)
        return self.report(moved)

    def advance(self, got_token, logprobs) -> dict[str, Request]:
        """Each sequence's new token to its request: stops, grammar, length. Returns the
        requests that moved, by id."""
        if self.fault_hook is not None:
            self.fault_hook("postprocess")
        moved: dict[str, Request] = {}
        seq_to_request, matchers = self.seq_to_request, self.grammars.matchers
        for seq in got_token:
            request = seq_to_request.get(seq.seq_id)
            if request is None:
                continue
            self.generation_tokens_total += 1
            reason = request.on_token(seq, logprobs.get(seq.seq_id) if logprobs else None)
            grammar_reason = (
                self.grammars.advance(seq.seq_id, seq.output_token_ids[-1]) if matchers else None
            )
            if grammar_reason == "error":
                request.errors[seq.index] = f"structured output: {self.grammars.error(seq.seq_id)}"
            if reason is None or grammar_reason == "error":
                reason = grammar_reason
            if reason is None and seq.num_tokens >= self.max_model_len:
                reason = "length"
            if reason is not None:
                self.scheduler.finish(seq, reason)
                request.finalize(seq)
            moved[request.request_id] = request
        return moved

    def report(self, moved: dict[str, Request]) -> list[RequestOutput]:
        """The outputs of the requests that moved in a step (once each; a ``FINAL_ONLY``
        request's only when it finished); finished requests are let go, once every output is
        made (a failure before leaves them all to ``recover``, none let go unheard)."""
        outputs = []
        for request in moved.values():
            if request.finished or request.params.output_kind != RequestOutputKind.FINAL_ONLY:
                outputs.append(request.output())
        for request in moved.values():
            if request.finished:
                self.requests.pop(request.request_id, None)
                for seq in request.seqs:
                    self.seq_to_request.pop(seq.seq_id, None)
                    self.grammars.release(seq.seq_id)
        return outputs
