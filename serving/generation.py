"""Running admitted prompts through ``AsyncLLM``: per-step deltas, final results, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import math
from collections.abc import AsyncIterator

from jaxgen.engine.errors import EngineSleepingError
from jaxgen.outputs import RequestOutput
from jaxgen.sampling_params import SamplingParams
from serving.validation import RequestError, sleeping_error


class TokenTexts:
    """Cached per-token strings and the special-token set of one tokenizer."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", []) or [])
        self.text = functools.lru_cache(maxsize=65536)(self._decode)

    def _decode(self, token_id: int) -> str:
        try:
            return self.tokenizer.decode(
                [token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
        except Exception:  # an id the tokenizer does not know
            return ""

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_ids


def top_logprobs(entry: dict[int, float] | None, count: int) -> list[tuple[int, float | None]]:
    """The ``count`` most likely (token, logprob) pairs of one step's logprob dict."""
    if not entry or count <= 0:
        return []
    ranked = sorted(
        entry.items(), key=lambda item: -item[1] if math.isfinite(item[1]) else math.inf
    )
    return [(token, finite(logprob)) for token, logprob in ranked[:count]]


def token_logprob(entry: dict[int, float] | None, token_id: int) -> float | None:
    """The sampled token's logprob from one step's dict (None if absent or not finite)."""
    return finite(entry.get(token_id)) if entry else None


def finite(value: float | None) -> float | None:
    """JSON has no NaN or infinity: such values become null."""
    return value if value is not None and math.isfinite(value) else None


class GenerationAborted(Exception):
    """The engine dropped the request (server draining) before it finished."""


class GenerationFailed(Exception):
    """The engine failed after the request was accepted."""


@dataclasses.dataclass
class Delta:
    """What one completion gained in one engine step."""

    index: int
    text: str
    token_ids: list[int]
    token_texts: list[str]  # the step's text, attributed to its last token
    logprobs: list[dict[int, float]] | None
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclasses.dataclass
class Completion:
    """One completion, accumulated."""

    index: int
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    token_texts: list[str] = dataclasses.field(default_factory=list)
    logprobs: list[dict[int, float]] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None


@dataclasses.dataclass
class GenerationResult:
    """A finished request: its prompt, completions and engine timings."""

    prompt_token_ids: list[int]
    completions: list[Completion]
    metrics: dict | None = None
    prompt_logprobs: list[dict[int, float] | None] | None = None  # with params.prompt_logprobs


class Generation:
    """One prompt's engine request, streamed as deltas and accumulated as it goes.

    Args:
        state: the ``ServerState`` (engine, metrics).
        ticket: the admitted request's ``Ticket`` (request ids are registered on it for draining).
        prompt_token_ids: the checked prompt.
        params: the request's ``SamplingParams``.
        grammar: ``params.structured_outputs``' compiled matcher (``prepare``), or None.
        lora_request: the ``jaxgen.lora.LoRARequest`` the request's ``model`` names, or None.
        priority: the request's ``priority`` (checked), lower first.
    """

    def __init__(
        self,
        state,
        ticket,
        prompt_token_ids: list[int],
        params: SamplingParams,
        grammar=None,
        lora_request=None,
        priority: int = 0,
    ):
        self.state = state
        self.lora_request = lora_request
        self.priority = priority
        self.ticket = ticket
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.grammar = grammar
        self.completions = [Completion(index=i) for i in range(params.n)]
        self.metrics: dict | None = None
        self.finished = False
        self.cut: list[int] = []  # completions ended early (finish_reason "abort" or "error")
        self._pending_text = [""] * params.n
        self.prompt_logprobs: list[dict[int, float] | None] | None = None

    @property
    def result(self) -> GenerationResult:
        return GenerationResult(
            self.prompt_token_ids, self.completions, self.metrics, self.prompt_logprobs
        )

    async def stream(self) -> AsyncIterator[list[Delta]]:
        """Yields each step's deltas; raises ``GenerationAborted``/``GenerationFailed`` (also
        when a completion ends with ``finish_reason`` "error": its grammar failed)."""
        llm = self.state.llm
        request_id = self.ticket.new_request_id()
        outcome = "abort"
        try:
            async for output in llm.generate(
                None,
                self.params,
                request_id=request_id,
                delta=True,
                prompt_token_ids=self.prompt_token_ids,
                compiled_grammar=self.grammar,
                lora_request=self.lora_request,
                priority=self.priority,
            ):
                failed = [piece for piece in output.outputs if piece.finish_reason == "error"]
                if failed:  # never a normal answer with an invented finish reason
                    outcome = "error"
                    raise GenerationFailed(failed[0].error or "the engine failed the request")
                deltas = self._add(output)
                if output.finished:
                    self._finish(output)
                yield deltas
                if output.finished:
                    return
        except ValueError as error:  # the engine refused the request (checks missed by validation)
            outcome = "rejected"
            raise RequestError(str(error)) from None
        except EngineSleepingError as error:  # put to sleep after this request was admitted
            outcome = "rejected"
            raise sleeping_error(str(error)) from None
        except RuntimeError as error:
            if "shut down" in str(error):
                raise GenerationAborted("the engine is shut down") from None
            outcome = "error"
            raise GenerationFailed(str(error)) from None
        finally:
            if not self.finished:
                await llm.abort(request_id)
                if outcome == "abort":
                    self.state.metrics.success.labels(finish_reason="abort").inc()
                elif outcome == "error":
                    self.state.metrics.failed.inc()
                reason = "error" if outcome == "error" else "abort"
                for completion in self.completions:
                    if completion.finish_reason is None:
                        completion.finish_reason = reason
                        self.cut.append(completion.index)
        raise GenerationAborted("the request was aborted before it finished")

    def cut_deltas(self) -> list[Delta]:
        """A last, empty delta for each completion the stream ended early, giving its reason."""
        return [Delta(i, "", [], [], None, self.completions[i].finish_reason) for i in self.cut]

    async def run(self) -> GenerationResult:
        """Runs to the end and returns the accumulated result."""
        async for _ in self.stream():
            pass
        return self.result

    def _add(self, output: RequestOutput) -> list[Delta]:
        if output.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = output.prompt_logprobs
        deltas = []
        for piece in output.outputs:
            completion = self.completions[piece.index]
            if completion.finish_reason is not None:  # finished in an earlier output (n > 1)
                continue
            text = self._pending_text[piece.index] + piece.text
            tokens = list(piece.token_ids)
            if tokens:
                texts = [""] * (len(tokens) - 1) + [text]
                self._pending_text[piece.index] = ""
            else:
                texts = []
                self._pending_text[piece.index] = text
                text = ""
            logprobs = list(piece.logprobs) if piece.logprobs is not None else None
            completion.text += text
            completion.token_ids += tokens
            completion.token_texts += texts
            if logprobs:
                completion.logprobs += logprobs
            if piece.finish_reason is not None:
                completion.finish_reason = piece.finish_reason
                completion.stop_reason = piece.stop_reason
                leftover = self._pending_text[piece.index]
                if leftover:  # text without a token at the very end: give it to the last token
                    completion.text += leftover
                    if completion.token_texts:
                        completion.token_texts[-1] += leftover
                    text += leftover
                    self._pending_text[piece.index] = ""
            elif piece.finish_reason is None and not tokens and not text:
                continue
            deltas.append(
                Delta(
                    piece.index,
                    text,
                    tokens,
                    texts,
                    logprobs,
                    completion.finish_reason,
                    piece.stop_reason,
                )
            )
        return deltas

    def _finish(self, output: RequestOutput) -> None:
        self.finished = True
        self.metrics = output.metrics
        reason = self.completions[0].finish_reason
        generated = sum(len(c.token_ids) for c in self.completions)
        self.state.metrics.observe_finished(output.metrics, reason, generated)


async def run_all(generations: list) -> list:
    """Runs the generations together; if one fails, the others are cancelled (and aborted)."""
    tasks = [asyncio.ensure_future(generation.run()) for generation in generations]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def merge(streams: list[AsyncIterator]) -> AsyncIterator[tuple[int, object]]:
    """Interleaves several async iterators as ``(index, item)``; errors propagate."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as stream:
            async for item in stream:
                yield 0, item
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
        except Exception as error:  # re-raised by the consumer
            await queue.put((index, error))
            return
        await queue.put((index, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
