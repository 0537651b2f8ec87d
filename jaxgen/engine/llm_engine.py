"""The engine: add requests, then ``step()`` = schedule -> run -> postprocess."""

from __future__ import annotations

import time

from jaxgen.config.engine_config import EngineConfig
from jaxgen.engine.compiled.compile_counter import compile_count
from jaxgen.engine.compiled.precompile import precompile_engine
from jaxgen.engine.decoding.speculative.verify_step import speculative_step
from jaxgen.engine.engine_assembly import build_engine_parts
from jaxgen.engine.engine_interface import Engine
from jaxgen.engine.engine_stats import engine_stats
from jaxgen.engine.errors import EngineDeadError, StepFailed
from jaxgen.engine.scheduling.new_request import NewRequest, takes_request_fields
from jaxgen.engine.scheduling.request import Request, check_new_request
from jaxgen.engine.step.executor import DispatchedStep, StepExecutor, StepResult, merged
from jaxgen.engine.step.step_batch import StepBatch, build_step_batch
from jaxgen.engine.step.step_modes import plain_step, step_ahead
from jaxgen.engine.step_observers import StepEvent, StepObservers
from jaxgen.outputs import RequestOutput
from jaxgen.sampling_params import RequestOutputKind, SamplingParams
from jaxgen.structured_outputs.relaxations import relaxed_keywords

# Steps that fail in a row, each recovered from, before the engine gives up: a fault that
# survives a fresh KV pool is the device's, and a restart is the only cure.
MAX_CONSECUTIVE_FAILED_STEPS = 3


class LLMEngine(Engine):
    """Continuous batching (or a simpler strategy) over a KV pool, driven one step at a time."""

    def __init__(self, loaded, config: EngineConfig, *, kv_sharding=None):
        self.loaded = loaded
        self.config = config
        self.tokenizer = loaded.tokenizer
        parts = build_engine_parts(loaded, config, kv_sharding=kv_sharding, engine_class=LLMEngine)
        self.max_model_len = parts.max_model_len
        self.batching = parts.batching
        self.kv_bytes_per_token = parts.pool.kv_bytes_per_token
        self.kv_bytes_per_token_per_device = parts.pool.kv_bytes_per_token_per_device
        self.scheduler = parts.scheduler
        self.layout = parts.layout
        self.runner = parts.runner
        self.grammars = parts.grammars
        # Speculative decoding (``speculative/``); with async_scheduling a step that may carry
        # drafts runs synchronously (``step_mode``).
        self.speculator = parts.speculator
        self.verify_shapes = parts.verify_shapes
        self.requests: dict[str, Request] = {}
        self.seq_to_request: dict[int, Request] = {}
        self.num_steps = 0  # steps that ran (a failed one does not count)
        self.step_counter = 0  # batches built: with ``config.seed``, unseeded rows' seeds
        self.step_time = 0.0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.last_batch_size = 0
        self.failed_steps = 0
        self.consecutive_failed_steps = 0
        self.dead: BaseException | None = None  # why the engine cannot step any more
        self.precompile_compiles = 0
        self.precompile_seconds = 0.0
        # Launches steps and holds the one in flight (asynchronous scheduling).
        self.executor = StepExecutor(
            self.runner, async_feed=config.async_scheduling, feed_width=self.layout.seq_cap
        )
        self.async_steps = 0  # steps dispatched before the previous one's tokens were read
        self.multi_step_calls = 0  # calls that ran num_scheduler_steps decode steps
        self._last_read = 0.0
        self.observers = StepObservers()  # told of each step that ran (``StepEvent``)
        # Called with a host stage's name, "launch" as a step's batch is built and "postprocess"
        # as its tokens are handed on: a hook for tests and fault matrices to fail a step there
        # as a host error would (it may raise). The device's: the runner's after_step and
        # before_fetch.
        self.fault_hook = None
        self._compiles_seen = compile_count()
        if config.precompile:
            self.precompile()

    def precompile(self, sampling_params: list[SamplingParams] | None = None) -> int:
        """Compiles the step for every batch shape the engine can meet and the sampler for
        every row bucket (``precompile.precompile_engine``); every sampling configuration runs
        those executables, so ``sampling_params`` changes nothing (accepted for compatibility).
        Call it before requests arrive. Returns the compiles it took."""
        return precompile_engine(self)

    # -- requests --------------------------------------------------------------------------------
    @takes_request_fields
    def add_request(self, new: NewRequest) -> Request:
        """Queues a request; raises ``ValueError`` for an empty, too long or invalid prompt, or
        a constraint that does not compile. ``compiled_grammar``: the matcher of
        ``params.structured_outputs`` compiled already (``GrammarCompiler``; the server and
        ``AsyncLLM`` compile off the engine's thread), else it is compiled here."""
        request_id, prompt_token_ids, params = new.request_id, new.prompt_token_ids, new.params
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already running")
        check_new_request(
            prompt_token_ids,
            params,
            vocab_size=self.loaded.config.vocab_size,
            max_model_len=self.max_model_len,
        )
        grammar = None
        if params.structured_outputs is not None:  # compiled before the request is queued
            grammar = new.compiled_grammar or self.grammars.compiler.compile(
                params.structured_outputs
            )
        request = Request(
            request_id,
            new.prompt,
            prompt_token_ids,
            params,
            self.tokenizer,
            self.loaded.config.eos_token_ids,
            self.max_model_len,
            new.arrival_time,
        )
        for seq in request.seqs:
            self.scheduler.add(seq)
            self.seq_to_request[seq.seq_id] = request
        if grammar is not None:
            self.grammars.add([seq.seq_id for seq in request.seqs], grammar)
            request.relaxed_keywords = relaxed_keywords(grammar)
        self.requests[request_id] = request
        self.prompt_tokens_total += len(prompt_token_ids)
        return request

    def check_prompt(self, prompt_token_ids: list[int]) -> None:
        """Raises ``ValueError`` for an empty prompt, a token outside the vocabulary, or a
        prompt that leaves no room to generate within ``max_model_len``."""
        check_new_request(
            prompt_token_ids,
            SamplingParams(),
            vocab_size=self.loaded.config.vocab_size,
            max_model_len=self.max_model_len,
        )

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stops a request and frees its pages; returns its final output (or None if unknown)."""
        request = self.requests.pop(request_id, None)
        if request is None:
            return None
        for seq in request.seqs:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
                request.finalize(seq)
            self.seq_to_request.pop(seq.seq_id, None)
            self.grammars.release(seq.seq_id)
        return request.output()

    @property
    def in_flight(self) -> DispatchedStep | None:
        """The step on the device whose tokens the host has not read (asynchronous
        scheduling), else None."""
        return self.executor.in_flight

    def has_unfinished(self) -> bool:
        """Whether a request is queued or running, or a step is still to be read."""
        return self.scheduler.has_unfinished() or self.in_flight is not None

    # -- the step: one call of a mode, composed of the stages below -------------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> run -> postprocess. Returns outputs of requests that moved.

        The step runs in the mode ``step_mode()`` picks (``jaxgen.engine.step.step_modes``): plain or
        multi-step, asynchronous step-ahead, or speculative verify; each is made of the public
        stages below. If launching, reading or post-processing the step raises, the engine
        recovers (``recover``) and raises ``StepFailed`` naming the requests of that step (and of
        the step in flight), which it has failed and freed; the others go on.
        ``EngineDeadError`` means it could not recover: every later step raises it too.
        """
        if self.dead is not None:
            raise EngineDeadError(f"the engine is dead: {self.dead!r}") from self.dead
        return self.step_mode()(self)

    def step_mode(self):
        """The function the next ``step()`` runs: ``speculative_step`` when drafts may come
        (with asynchronous scheduling, only with nothing in flight: drafts need the sequences'
        last tokens on the host), ``step_ahead`` with asynchronous scheduling, else
        ``plain_step``."""
        if not self.config.async_scheduling:
            return plain_step if self.speculator is None else speculative_step
        speculator = self.speculator
        if speculator is not None and self.executor.in_flight is None:
            if speculator.may_draft(self.scheduler.running):
                return speculative_step
        return step_ahead

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
        if rows is None:
            rows = {
                item.seq.seq_id: self.seq_to_request[item.seq.seq_id].sampling_row(item.seq)
                for item in scheduled.scheduled
                if item.completes
            }
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

    @property
    def params(self):
        """The placed parameter pytree (an ``nnx.State``) as loaded."""
        return self.runner.params

    def reset_prefix_cache(self) -> None:
        self.scheduler.allocator.reset_prefix_cache()

    def shutdown(self) -> None:
        """Nothing to release: the engine holds no thread."""

    # -- introspection ----------------------------------------------------------------------------
    def stats(self) -> dict:
        """Pool, queue and step counters (``engine_stats``)."""
        return engine_stats(self)
