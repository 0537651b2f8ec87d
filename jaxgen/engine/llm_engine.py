"""The engine: add requests, then ``step()`` = schedule -> run -> postprocess."""

from __future__ import annotations

import dataclasses

from jaxgen.config.engine_config import EngineConfig
from jaxgen.engine.compiled.compile_counter import compile_count
from jaxgen.engine.compiled.precompile import precompile_engine
from jaxgen.engine.decoding.speculative.verify_step import speculative_step
from jaxgen.engine.engine_assembly import build_engine_parts
from jaxgen.engine.engine_interface import Engine
from jaxgen.engine.engine_stats import engine_stats
from jaxgen.engine.errors import EngineDeadError
from jaxgen.engine.kv_events import open_cache_event_stream
from jaxgen.engine.scheduling.new_request import NewRequest, takes_request_fields
from jaxgen.engine.scheduling.policy import check_priority
from jaxgen.engine.scheduling.request import Request, check_new_request
from jaxgen.engine.step.executor import DispatchedStep, StepExecutor
from jaxgen.engine.step.step_modes import plain_step, step_ahead
from jaxgen.engine.step.step_stages import StepStages
from jaxgen.engine.step_observers import StepObservers
from jaxgen.engine.weights import SleepMode, WeightLayout, named_values, require_idle
from jaxgen.outputs import RequestOutput
from jaxgen.reasoning import gate_grammar
from jaxgen.sampling_params import SamplingParams
from jaxgen.structured_outputs.relaxations import relaxed_keywords


class LLMEngine(StepStages, Engine):
    """Continuous batching (or a simpler strategy) over a KV pool, driven one step at a time:
    requests in (``add_request``, ``abort``), one ``step()`` at a time, outputs out. The step's
    stages (``launch``, ``read``, ``postprocess``, ...) are ``StepStages``' public methods, which
    the step modes compose."""

    def __init__(self, loaded, config: EngineConfig, *, kv_sharding=None, data_parallel_rank=None):
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
        self.lora = parts.lora  # multi-LoRA's LoRAManager (enable_lora), or None
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
        # The prefix cache's changes, published after each step (``kv_events_config``), or None.
        self.cache_events = open_cache_event_stream(
            config.kv_events_config, self.scheduler.allocator, data_parallel_rank
        )
        if self.cache_events is not None:
            self.observers.add(self.cache_events.after_step)
        # Called with a host stage's name, "launch" as a step's batch is built and "postprocess"
        # as its tokens are handed on: a hook for tests and fault matrices to fail a step there
        # as a host error would (it may raise). The device's: the runner's after_step and
        # before_fetch.
        self.fault_hook = None
        self._compiles_seen = compile_count()
        # What new weights must match (``update_weights``), and what sleeps (``sleep``).
        self.weight_layout = WeightLayout.of(loaded.params)
        self.sleep_mode = SleepMode()
        if config.precompile:
            self.precompile()

    def precompile(self, sampling_params: list[SamplingParams] | None = None) -> int:
        """Compiles the step for every batch shape the engine can meet and the sampler for
        every row bucket (``precompile.precompile_engine``); every sampling configuration runs
        those executables, so ``sampling_params`` changes nothing (accepted for compatibility).
        Call it before requests arrive. Returns the compiles it took."""
        self.sleep_mode.check_awake("precompile()")
        return precompile_engine(self)

    # -- requests --------------------------------------------------------------------------------
    @takes_request_fields
    def add_request(self, new: NewRequest) -> Request:
        """Queues a request; raises ``ValueError`` for an empty, too long or invalid prompt, a
        constraint that does not compile, or a ``priority`` that is no int (or not 0 under
        the ``fcfs`` scheduling policy). ``compiled_grammar``: the matcher of
        ``params.structured_outputs`` compiled already (``GrammarCompiler``; the server and
        ``AsyncLLM`` compile off the engine's thread), else it is compiled here; a constraint's
        ``reasoning`` span puts it behind a ``jaxgen.reasoning.ReasoningGate``."""
        request_id, prompt_token_ids, params = new.request_id, new.prompt_token_ids, new.params
        self.sleep_mode.check_awake("adding requests")
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already running")
        priority = check_priority(new.priority, self.config.scheduling_policy)
        check_new_request(
            prompt_token_ids,
            params,
            vocab_size=self.loaded.config.vocab_size,
            max_model_len=self.max_model_len,
        )
        lora_key = None if new.lora_request is None else self.add_lora(new.lora_request)
        grammar = None
        constraint = params.structured_outputs
        if constraint is not None:  # compiled before the request is queued
            grammar = new.compiled_grammar or self.grammars.compiler.compile(constraint)
            # With a reasoning span, the grammar waits for the reasoning's end tag.
            grammar = gate_grammar(grammar, constraint.reasoning, self.tokenizer)
        request = Request(
            request_id,
            new.prompt,
            prompt_token_ids,
            params,
            self.tokenizer,
            self.loaded.config.eos_token_ids,
            self.max_model_len,
            new.arrival_time,
            priority,
        )
        for seq in request.seqs:
            if lora_key is not None:
                seq.lora_int_id, seq.lora_key = new.lora_request.lora_int_id, lora_key
            self.scheduler.add(seq)
            self.seq_to_request[seq.seq_id] = request
        if grammar is not None:
            self.grammars.add([seq.seq_id for seq in request.seqs], grammar)
            request.relaxed_keywords = relaxed_keywords(grammar)
        self.requests[request_id] = request
        self.prompt_tokens_total += len(prompt_token_ids)
        return request

    # -- LoRA adapters (enable_lora) --------------------------------------------------------------
    def add_lora(self, lora_request, adapter=None) -> tuple:
        """Knows the adapter of ``lora_request`` (a ``jaxgen.lora.LoRARequest``; read and
        checked now unless ``adapter``, its ``PeftAdapter``, is given). Returns its prefix-cache
        key. ``ValueError`` for an adapter that does not fit or an engine without LoRA."""
        if self.lora is None:
            raise ValueError("lora_request needs an engine with enable_lora=True")
        return self.lora.register(lora_request, adapter)

    def remove_lora(self, lora_int_id: int) -> None:
        """Forgets an adapter; ``ValueError`` when unknown or used by an unfinished request."""
        if self.lora is None:
            raise ValueError("remove_lora needs an engine with enable_lora=True")
        in_use = {seq.lora_int_id for r in self.requests.values() for seq in r.seqs}
        self.lora.remove(lora_int_id, in_use)

    def list_loras(self) -> list:
        """The adapters the engine knows (``LoRARequest``s)."""
        return [] if self.lora is None else self.lora.loaded

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

    # -- the step: one call of a mode, composed of StepStages' stages ----------------------------
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> run -> postprocess. Returns outputs of requests that moved.

        The step runs in the mode ``step_mode()`` picks (``jaxgen.engine.step.step_modes``):
        plain or multi-step, asynchronous step-ahead, or speculative verify; each is made of
        the public stages of ``StepStages`` (``jaxgen.engine.step.step_stages``). If launching,
        reading or post-processing the step raises, the engine recovers (``recover``) and raises
        ``StepFailed`` naming the requests of that step (and of the step in flight), which it
        has failed and freed; the others go on.
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

    @property
    def params(self):
        """The placed parameter pytree (an ``nnx.State``) as loaded."""
        return self.runner.params

    def reset_prefix_cache(self) -> None:
        self.scheduler.allocator.reset_prefix_cache()
        if self.cache_events is not None:
            self.cache_events.after_step()

    # -- weights that change, and sleep mode (``jaxgen.engine.weights``; docs/rl.md) -------------
    def update_weights(self, params) -> None:
        """Runs on ``params`` from the next step: a tree in the model's naming
        (``WeightLayout.place``: every parameter is checked before any is placed, a
        ``ValueError`` names the first that does not fit and the old weights stay). No
        compile; device arrays of the engine's shardings are held as given. The prefix cache
        is emptied. After ``sleep(level=2)`` this is how weights come back."""
        require_idle(self, "update_weights")
        self.sleep_mode.check_update()
        asleep = self.sleep_mode.weights_asleep
        kept = self.sleep_mode.buffers if asleep else named_values(self.runner.params)
        self._run_on(self.weight_layout.place(params, kept))
        self.sleep_mode.weights_restored()
        self.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Frees the KV pool and the weights on the devices (``sleep_mode``): level 1 keeps
        the weights on the host, level 2 discards them. ``EngineBusyError`` while requests
        are unfinished, ``SleepModeError`` when asleep already."""
        self.sleep_mode.check_sleep(level)
        require_idle(self, "sleep")
        self.sleep_mode.fall_asleep(level, self.runner.params, self.weight_layout)
        self.runner.release_pool()
        self.runner.release_params(self.weight_layout.abstract_state())
        self.loaded = dataclasses.replace(self.loaded, params=self.runner.params)
        self.reset_prefix_cache()  # the pages' K/V are gone
        draft = None if self.speculator is None else self.speculator.draft_engine
        if draft is not None:  # offloaded at either level: new weights are the target's
            draft.sleep(1)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Takes back what ``sleep`` freed: ``tags`` ("weights", "kv_cache"; None: both).
        ``SleepModeError`` when awake, or for weights ``sleep(level=2)`` discarded."""
        weights, kv_cache = self.sleep_mode.check_wake(tags)
        if weights:
            self._run_on(self.weight_layout.place(self.sleep_mode.host_weights))
            self.sleep_mode.weights_restored()
        if kv_cache:
            self.runner.allocate_pool()
            self.sleep_mode.kv_restored()
        draft = None if self.speculator is None else self.speculator.draft_engine
        if draft is not None and not self.is_sleeping() and draft.is_sleeping():
            draft.wake_up()

    def is_sleeping(self) -> bool:
        """Whether the weights or the KV pool sleep (requests are refused meanwhile)."""
        return self.sleep_mode.asleep

    def _run_on(self, params) -> None:
        self.runner.set_params(params)
        self.loaded = dataclasses.replace(self.loaded, params=params)

    def shutdown(self) -> None:
        """Closes the KV events' publisher, the one thread an engine may hold."""
        if self.cache_events is not None:
            self.cache_events.close()

    # -- introspection ----------------------------------------------------------------------------
    def stats(self) -> dict:
        """Pool, queue and step counters (``engine_stats``)."""
        return engine_stats(self)
