"""The server's shared state: the engine, its limits, admission control and draining."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import time

from jaxgen.quantization.stats import weight_stats
from serving.generation import TokenTexts
from serving.lora_adapters import LoRAAdapters
from serving.metrics import ServerMetrics
from serving.openai.response_store import ResponseStore
from serving.settings.parsers import SettingsError
from serving.settings.resolve import ServerSettings
from serving.structured_output_requests import compiler_of
from serving.validation import RequestError, sleeping_error
from serving.workers import Workers

logger = logging.getLogger("serving")

LOADING, READY, DRAINING, STOPPED, FAILED = "loading", "ready", "draining", "stopped", "failed"


@dataclasses.dataclass(frozen=True)
class Limits:
    """Per-request limits, resolved against the loaded engine."""

    max_input_tokens: int
    max_total_tokens: int
    max_concurrent_requests: int
    max_stop_sequences: int
    max_best_of: int
    max_body_bytes: int
    vocab_size: int
    max_logit_bias: int
    # A prompt of more characters than this cannot fit max_input_tokens: each token covers at
    # most the longest vocabulary entry. Longer prompts are refused without tokenizing them.
    max_prompt_chars: int
    # The engine's: under "fcfs" a request's non-zero ``priority`` is refused.
    scheduling_policy: str = "fcfs"

    @classmethod
    def resolve(cls, settings: ServerSettings, llm) -> Limits:
        """Defaults: ``max_total_tokens`` = the engine's max_model_len, input = total - 1."""
        model_len = llm.max_model_len
        total = settings.max_total_tokens or model_len
        if total > model_len:
            raise SettingsError(
                f"max_total_tokens ({total}) exceeds the engine's max_model_len ({model_len})"
            )
        max_input = settings.max_input_tokens or total - 1
        if max_input >= total:
            raise SettingsError(
                f"max_input_tokens ({max_input}) must be < max_total_tokens ({total})"
            )
        vocab = min(llm.model_config.vocab_size, len(llm.tokenizer))
        return cls(
            max_input,
            total,
            settings.max_concurrent_requests,
            settings.max_stop_sequences,
            settings.max_best_of,
            settings.max_body_bytes,
            vocab,
            vocab if settings.max_logit_bias is None else min(settings.max_logit_bias, vocab),
            max_input * longest_token(llm.tokenizer),
            scheduling_policy=getattr(llm, "scheduling_policy", "fcfs"),
        )


def longest_token(tokenizer) -> int:
    """Characters of the longest vocabulary entry (byte-level entries: one per byte, so at
    least the characters the token covers); 1024 if the tokenizer cannot list its vocabulary."""
    try:
        return max((len(token) for token in tokenizer.get_vocab()), default=1)
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab
        return 1024


class Ticket:
    """One admitted HTTP request's slot; ``release()`` is idempotent."""

    def __init__(self, state: ServerState):
        self.state = state
        self.released = False
        self.request_ids: set[str] = set()
        self.label: str | None = None  # the client's X-Request-Id, leading its engine ids

    def new_request_id(self) -> str:
        request_id = self.state.new_request_id()
        if self.label:
            request_id = f"{self.label}-{request_id}"
        self.request_ids.add(request_id)
        self.state.active_request_ids.add(request_id)
        return request_id

    def hand_over(self) -> Ticket:
        """A ticket holding this one's slot and request ids, for work that outlives the HTTP
        request (a background response); this one's ``release()`` then does nothing."""
        successor = Ticket(self.state)
        successor.request_ids = self.request_ids
        successor.label = self.label
        self.released = True
        return successor

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        self.state.active_request_ids.difference_update(self.request_ids)
        waiters = self.state.waiters
        while waiters:  # the slot goes to the oldest request waiting for one
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(Ticket(self.state))
                return
        self.state.in_flight -= 1
        if self.state.in_flight == 0:
            self.state.idle.set()


class ServerState:
    """What every route needs: the engine, limits, metrics, admission and the server phase."""

    def __init__(self, settings: ServerSettings, metrics: ServerMetrics):
        self.settings = settings
        self.metrics = metrics
        self.llm = None
        self.limits: Limits | None = None
        self.phase = LOADING
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.active_request_ids: set[str] = set()
        self.load_error: BaseException | None = None
        self.token_texts: TokenTexts | None = None
        self.compute_type = "jaxgen"
        self.started_at = time.time()
        self._ids = itertools.count()
        self._prefix = f"srv{id(self) & 0xFFFF:04x}"
        self.workers = Workers(
            settings.grammar_compile_workers,
            settings.max_queued_grammar_compiles,
            admitted=settings.max_concurrent_requests,
        )
        self.loras = LoRAAdapters(settings.lora_modules)  # adapters offered as models, by name
        self.responses = ResponseStore(settings.responses_store_size, settings.responses_store_ttl)
        self.waiters: collections.deque[asyncio.Future] = collections.deque()  # for a slot

    def attach(self, llm) -> None:
        """Makes the server ready around a loaded engine."""
        import jax

        self.limits = Limits.resolve(self.settings, llm)
        self.token_texts = TokenTexts(llm.tokenizer)
        self.compute_type = f"jaxgen-{jax.default_backend()}"
        self.llm = llm
        # The grammar compiler's llguidance tokenizer takes a second or two to build: built now,
        # in the background, so the first constrained request does not wait for it.
        compiler = compiler_of(self)
        self.workers.compile_small.submit(lambda: compiler.llg_tokenizer)
        if self.phase == LOADING:
            self.phase = READY

    @property
    def engine_error(self) -> BaseException | None:
        """Why the model cannot serve: it failed to load, or its engine died."""
        return self.load_error or getattr(self.llm, "dead", None)

    @property
    def status(self) -> str:
        """The phase clients see: ``failed`` once the engine is dead, whatever the phase."""
        return FAILED if getattr(self.llm, "dead", None) is not None else self.phase

    def new_request_id(self) -> str:
        return f"{self._prefix}-{next(self._ids)}"

    def engine_summary(self) -> dict:
        """The engine's configuration, for ``/info``."""
        engine = getattr(self.llm, "engine", None)
        config = getattr(engine, "config", None)
        summary = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {}
        if self.llm is not None:
            summary["max_model_len"] = self.llm.max_model_len
        loaded = getattr(engine, "loaded", None)
        if loaded is not None:  # weight kinds and parameter bytes, as ``LLM.stats()``
            summary.update(weight_stats(loaded))
        return summary

    async def admit_or_wait(self) -> Ticket:
        """A slot for one request: at once while one is free, else after waiting in a first
        come, first served queue of at most ``max_waiting_requests`` (a 429 once it is full;
        a 503 when the server drains meanwhile)."""
        full = self.limits is not None and self.in_flight >= self.limits.max_concurrent_requests
        if not full or self.status != READY:
            return self.admit()
        if len(self.waiters) >= self.settings.max_waiting_requests:
            return self.admit()  # raises the 429
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                waiter.result().release()  # handed a slot as it left: pass it on
            raise

    def admit(self) -> Ticket:
        """A slot for one request, or a ``RequestError`` (503 not ready or asleep, 429
        overloaded)."""
        if self.status != READY:
            self.metrics.rejected.labels(reason="unavailable").inc()
            if self.load_error is not None:
                message = "Model failed to load"
            elif self.status == FAILED:
                message = "The engine failed; the server is shutting down"
            else:
                message = "Model is loading" if self.phase == LOADING else "Server is shutting down"
            raise RequestError(message, kind="unavailable")
        if getattr(self.llm, "sleeping", False):  # sleep mode (serving/admin_routes.py)
            self.metrics.rejected.labels(reason="sleeping").inc()
            raise sleeping_error()
        if self.in_flight >= self.limits.max_concurrent_requests:
            self.metrics.rejected.labels(reason="overloaded").inc()
            raise RequestError("Model is overloaded", kind="overloaded")
        self.in_flight += 1
        self.idle.clear()
        return Ticket(self)

    async def drain(self, timeout: float) -> None:
        """Stops admitting, waits up to ``timeout`` s for in-flight requests, then aborts the rest."""
        if self.phase in (READY, LOADING):
            self.phase = DRAINING
            logger.info("draining: %d request(s) in flight, up to %.1f s", self.in_flight, timeout)
        while self.waiters:  # those waiting for a slot are refused: the server is going
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_exception(RequestError("Server is shutting down", kind="unavailable"))
        try:
            await asyncio.wait_for(self.idle.wait(), timeout)
        except asyncio.TimeoutError:
            logger.warning("drain timeout: aborting %d request(s)", len(self.active_request_ids))
            if self.llm is not None:
                for request_id in list(self.active_request_ids):
                    await self.llm.abort(request_id)
            try:  # aborted streams end at once; give their responses a moment to finish
                await asyncio.wait_for(self.idle.wait(), 5.0)
            except asyncio.TimeoutError:
                logger.warning("%d response(s) still open after abort", self.in_flight)
        self.phase = STOPPED
