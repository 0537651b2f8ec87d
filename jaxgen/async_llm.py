"""``AsyncLLM``: the engine on a background thread, for servers.

``async for out in llm.generate(prompt, params, request_id=...)`` streams a request's progress;
``await llm.abort(request_id)`` stops it and frees its pages within a step. The engine thread owns
the engine; other threads talk to it through a command queue, so nothing is shared unlocked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import queue
import threading
import time
from collections.abc import AsyncIterator

from jaxgen.config.engine_config import EngineConfig
from jaxgen.create_engine import create_engine
from jaxgen.engine.errors import EngineDeadError, EngineSleepingError, StepFailed
from jaxgen.engine.llm_engine import LLMEngine
from jaxgen.engine.scheduling.policy import check_priority
from jaxgen.engine.structured.grammar_masks import grammar_compiler
from jaxgen.engine.structured.grammar_threads import default_grammar_threads
from jaxgen.engine.thread_results import concurrent_result
from jaxgen.loaders.checkpoint_weights import read_checkpoint_weights
from jaxgen.outputs import CompletionOutput, RequestOutput
from jaxgen.sampling_params import SamplingParams

_FINISHED = object()


class AsyncLLM:
    """Asynchronous front end over one ``LLMEngine`` running on its own thread.

    Args:
        model, dtype, revision, gguf_file, **engine_knobs: as for ``LLM``. Or pass ``engine=``
            an existing engine.
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        dtype: str = "float32",
        revision: str | None = None,
        gguf_file: str | None = None,
        engine: LLMEngine | None = None,
        **engine_knobs,
    ):
        if engine is None:
            unknown = set(engine_knobs) - set(EngineConfig.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown AsyncLLM argument(s): {', '.join(sorted(unknown))}")
            config = EngineConfig(**engine_knobs)
            engine = create_engine(  # TP mesh / replicas
                model, dtype=dtype, config=config, revision=revision, gguf_file=gguf_file
            )
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.model_config = engine.loaded.config
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stopped = threading.Event()
        self._stats: dict = engine.stats()
        # The LoRA adapters the engine knows, by lora_int_id (``add_lora``, ``remove_lora``).
        self.loras: dict = {}
        self.dead: EngineDeadError | None = None  # set once the engine cannot step any more
        # Set as ``sleep`` is asked for (new requests are refused from then on), cleared once
        # ``wake_up`` has woken every part: what the server's admission reads.
        self.sleeping = engine.is_sleeping()
        self._thread = threading.Thread(target=self._loop, name="jaxgen-engine", daemon=True)
        self._thread.start()

    # -- public API -------------------------------------------------------------------------------
    def encode(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        """Prompt text and token ids (a list of ids passes through)."""
        if isinstance(prompt, str):
            return prompt, self.tokenizer.encode(prompt, add_special_tokens=True)
        if isinstance(prompt, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            return None, list(prompt)
        raise ValueError("prompt must be a str or a list of token ids")

    def grammar_compiler(self):
        """The compiler of structured-output constraints for this model's tokenizer (one per
        tokenizer, with its cache of compiled matchers): ``build(constraint, limits)`` raises
        ``ValueError`` for a constraint that cannot run. The server compiles on its own threads
        with it."""
        config = self.model_config
        return grammar_compiler(self.tokenizer, config.vocab_size, config.eos_token_ids)

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        delta: bool = True,
        prompt_token_ids: list[int] | None = None,
        compiled_grammar=None,
        lora_request=None,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Streams a request: each item holds the new text/tokens (``delta=True``) or all so far.

        The last item has ``finished=True``. Invalid input raises ``ValueError`` before anything
        is queued. Cancelling the consumer (or leaving the loop) aborts the request.
        ``compiled_grammar``: ``params.structured_outputs``' matcher, compiled already
        (``GrammarCompiler.compile``); without it the constraint is compiled here, off the
        engine's thread. ``lora_request``: a ``jaxgen.lora.LoRARequest`` (read and checked
        here, off the engine's thread, when new: ``add_lora``). ``priority``: an int, lower
        first (vLLM's); a non-zero one needs ``scheduling_policy="priority"``.
        """
        if self._stopped.is_set():
            raise RuntimeError("AsyncLLM is shut down")
        if self.dead is not None:
            raise self.dead
        if self.sleeping:
            raise EngineSleepingError("the engine is asleep: await wake_up() before generating")
        priority = check_priority(priority, self.scheduling_policy)
        params = params or SamplingParams()
        request_id = request_id or f"req-{next(self._ids)}"
        if prompt_token_ids is None:
            text, prompt_token_ids = self.encode(prompt)
        else:
            text = prompt if isinstance(prompt, str) else None
        if params.structured_outputs is not None and compiled_grammar is None:
            compiler = self.grammar_compiler()  # compiled here, never on the engine thread
            compiled_grammar = compiler.cached(params.structured_outputs)
            if compiled_grammar is None:
                compiled_grammar = await asyncio.wrap_future(
                    default_grammar_threads().submit(compiler.build, params.structured_outputs)
                )
        if lora_request is not None and self.loras.get(lora_request.lora_int_id) != lora_request:
            await self.add_lora(lora_request)
        loop = asyncio.get_running_loop()
        stream: asyncio.Queue = asyncio.Queue()
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already running")
        self._streams[request_id] = (loop, stream)
        done = concurrent_result(loop)
        self._commands.put(
            (
                "add",
                request_id,
                text,
                prompt_token_ids,
                params,
                time.monotonic(),
                compiled_grammar,
                done,
                lora_request,
                priority,
            )
        )
        try:
            await done  # raises the engine's ValueError for a bad request
        except BaseException:
            self._streams.pop(request_id, None)
            raise
        sent = {}  # index -> (chars, tokens, logprobs) already yielded
        finished = False
        try:
            while True:
                item = await stream.get()
                if item is _FINISHED:
                    break
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                yield _delta(item, sent) if delta else item
                if finished:
                    break
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._commands.put(("abort", request_id))

    async def add_lora(self, lora_request) -> None:
        """Makes the engine know ``lora_request``'s adapter, read and checked off the engine's
        thread; ``ValueError`` when it does not fit (nothing loaded then)."""
        lora = getattr(self.engine, "lora", None)
        adapter = None
        if lora is not None:
            adapter = await asyncio.get_running_loop().run_in_executor(
                None, lora.read, lora_request
            )
        await self._call(self.engine.add_lora, lora_request, adapter)
        self.loras[lora_request.lora_int_id] = lora_request

    async def remove_lora(self, lora_int_id: int) -> None:
        """Forgets an adapter; ``ValueError`` when unknown or in use by unfinished requests."""
        await self._call(self.engine.remove_lora, lora_int_id)
        self.loras.pop(lora_int_id, None)

    # -- weights that change, and sleep mode (``LLM``'s, on the engine thread; docs/rl.md) --------
    async def update_weights(self, params) -> None:
        """``LLM.update_weights``, between two steps (``EngineBusyError`` while requests run)."""
        await self._call(self.engine.update_weights, params)

    async def update_weights_from_path(self, path: str) -> None:
        """Reads the checkpoint off the engine's thread, then swaps it in (``update_weights``)."""
        loop = asyncio.get_running_loop()
        params = await loop.run_in_executor(None, read_checkpoint_weights, path, self.engine.loaded)
        await self.update_weights(params)

    async def sleep(self, level: int = 1) -> None:
        """``LLM.sleep``: new requests are refused from the call on (``EngineSleepingError``)."""
        self.sleeping = True
        try:
            await self._call(self.engine.sleep, level)
        finally:
            self.sleeping = self.engine.is_sleeping()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """``LLM.wake_up``; requests are taken again once every part is awake."""
        try:
            await self._call(self.engine.wake_up, tags)
        finally:
            self.sleeping = self.engine.is_sleeping()

    async def is_sleeping(self) -> bool:
        return self.sleeping

    async def _call(self, function, *args):
        """Runs ``function(*args)`` on the engine thread, between steps, and waits for it (its
        result returned, its error raised here)."""
        if self.dead is not None:
            raise self.dead
        done = concurrent_result(asyncio.get_running_loop())
        self._commands.put(("call", function, args, done))
        return await done

    async def abort(self, request_id: str) -> None:
        """Stops a request and frees its pages (no-op if it already finished)."""
        self._commands.put(("abort", request_id))
        entry = self._streams.get(request_id)
        if entry is not None:
            entry[0].call_soon_threadsafe(entry[1].put_nowait, _FINISHED)

    @property
    def scheduling_policy(self) -> str:
        """The engine's ``scheduling_policy``: "fcfs" or "priority"."""
        return self.engine.config.scheduling_policy

    def stats(self) -> dict:
        """The engine's counters as of its last step."""
        return dict(self._stats)

    @property
    def num_unfinished(self) -> int:
        return self._stats.get("num_running", 0) + self._stats.get("num_waiting", 0)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stops the engine thread (in-flight requests are aborted)."""
        self._stopped.set()
        self._commands.put(("wake",))
        self._thread.join(timeout)

    # -- engine thread ----------------------------------------------------------------------------
    def _loop(self) -> None:
        engine = self.engine
        while not self._stopped.is_set():
            block = not engine.has_unfinished()
            try:
                command = self._commands.get(timeout=0.05) if block else self._commands.get_nowait()
            except queue.Empty:
                command = None
            while command is not None:
                self._handle(command)
                try:
                    command = self._commands.get_nowait()
                except queue.Empty:
                    command = None
            if engine.has_unfinished():
                steps = engine.num_steps
                for out in self._step():
                    self._deliver(out.request_id, out)
                if engine.num_steps == steps and engine.has_unfinished():
                    time.sleep(0.001)  # no step ran: dynamic batching waiting for its batch
            self._stats = engine.stats()
        for request_id in list(engine.requests):
            engine.abort(request_id)
        self._stats = engine.stats()

    def _step(self) -> list:
        """One engine step; a failure ends the requests it concerns and returns no outputs."""
        try:
            return self.engine.step()
        except StepFailed as e:  # the engine recovered; only that step's requests failed
            self._stats = self.engine.stats()  # counted before anyone hears of the failure
            for request_id in e.request_ids:
                self._deliver(request_id, RuntimeError(str(e)))
            return e.outputs  # what other replicas produced in the same step
        except EngineDeadError as e:
            self.dead = e
            self._stats = self.engine.stats()
            for request_id in e.request_ids:
                self._deliver(request_id, RuntimeError(str(e)))
            self._fail_all(e)
        except BaseException as e:  # a broken step fails its requests, not the server
            self._fail_all(e)
        return []

    def _handle(self, command) -> None:
        kind = command[0]
        if kind == "add":
            _, request_id, text, token_ids, params, arrival, grammar, done, lora, priority = command
            if self.dead is not None:
                done.set_exception(self.dead)
                return
            try:
                self.engine.add_request(
                    request_id,
                    text,
                    token_ids,
                    params,
                    arrival_time=arrival,
                    compiled_grammar=grammar,
                    lora_request=lora,
                    priority=priority,
                )
            except BaseException as e:
                done.set_exception(e)
            else:
                done.set_result(None)
        elif kind == "abort":
            self.engine.abort(command[1])
        elif kind == "call":  # adapters, weights, sleep mode: between two steps
            _, function, args, done = command
            try:
                result = function(*args)
            except BaseException as e:
                done.set_exception(e)
            else:
                done.set_result(result)

    def _deliver(self, request_id: str, item) -> None:
        entry = self._streams.get(request_id)
        if entry is not None:
            loop, stream = entry
            try:
                loop.call_soon_threadsafe(stream.put_nowait, item)
            except RuntimeError:  # the consumer's loop closed
                self.engine.abort(request_id)

    def _fail_all(self, error: BaseException) -> None:
        message = (
            str(error) if isinstance(error, EngineDeadError) else f"engine step failed: {error!r}"
        )
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
            self._deliver(request_id, RuntimeError(message))


def _delta(out: RequestOutput, sent: dict) -> RequestOutput:
    outs = []
    for c in out.outputs:
        chars, tokens, logprobs = sent.get(c.index, (0, 0, 0))
        outs.append(
            dataclasses.replace(
                c,
                text=c.text[chars:],
                token_ids=c.token_ids[tokens:],
                logprobs=None if c.logprobs is None else c.logprobs[logprobs:],
            )
        )
        sent[c.index] = (len(c.text), len(c.token_ids), len(c.logprobs or []))
    return dataclasses.replace(out, outputs=outs)


__all__ = ["AsyncLLM", "CompletionOutput", "EngineDeadError"]
