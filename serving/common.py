"""Helpers both route families use: admission around a handler, error responses, prompts,
token texts."""

from __future__ import annotations

import asyncio
import random
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from jaxgen.structured_outputs.relaxations import relaxed_keywords
from serving.state import ServerState
from serving.streaming import ClientDisconnected, run_until_disconnect
from serving.structured_output_requests import compile_constraint, look_up
from serving.validation import RequestError, check_content_type, parse_json_object, read_body
from serving.workers import LARGE_BODY_BYTES

# A request error's HTTP status by its kind (OpenAI's; TGI answers "validation" with 422).
ERROR_STATUS = {
    "validation": 400,
    "invalid_json": 400,
    "too_large": 413,
    "unsupported_media_type": 415,
    "timeout": 408,
    "overloaded": 429,
    "unavailable": 503,
    "conflict": 409,
    "not_found": 404,
    "model_not_found": 404,
    "generation": 500,
    "internal": 500,
}


def error_response(
    error: RequestError, body: dict, statuses: dict[str, int] = ERROR_STATUS
) -> JSONResponse:
    """``body`` (the protocol's error shape) answering ``error``: the status its kind maps to in
    ``statuses`` (400 if none) and its headers (``Retry-After``)."""
    return JSONResponse(body, status_code=statuses.get(error.kind, 400), headers=error.headers)


def server_state(request: Request) -> ServerState:
    return request.app.state.server


async def accept(request: Request) -> tuple[ServerState, dict]:
    """The state and JSON body of a generation request; refuses it while not ready. A body
    over ``LARGE_BODY_BYTES`` is decoded on the large parse lane, off the event loop."""
    state = server_state(request)
    if state.status != "ready":
        state.admit()  # raises the right 503
    body = getattr(request.state, "json_body", None)
    if body is None:
        check_content_type(request.headers.get("content-type"))
        try:
            raw = await asyncio.wait_for(
                read_body(request, state.limits.max_body_bytes),
                state.settings.body_read_timeout,
            )
        except ClientDisconnect:
            raise ClientDisconnected() from None
        except asyncio.TimeoutError:
            raise RequestError(
                f"the request body took over {state.settings.body_read_timeout:g} s to arrive",
                kind="timeout",
            ) from None
        request.state.body_bytes = len(raw)
        if len(raw) > LARGE_BODY_BYTES:
            body = await state.workers.parse(len(raw), parse_json_object, raw)
        else:
            body = parse_json_object(raw)
        request.state.json_body = body
    return state, body


async def prepare(request: Request, state: ServerState, body: dict, parse, constraint_of):
    """Prepares an admitted request off the event loop: ``parse(state, body)`` (checks,
    chat template, tokenising) on a parse lane, then its constraint (``constraint_of(parsed)``
    gives it and the field it came from) compiled on a compile lane. Returns the parsed
    request and the compiled matcher (or None); the JSON Schema keywords that matcher does not
    enforce go to ``request.state.relaxed_keywords`` (the response's
    ``x-structured-output-relaxed`` header, ``serving.middleware``). Raises ``RequestError``,
    or ``ClientDisconnected`` if the client leaves first (the work still queued is
    cancelled)."""
    size = getattr(request.state, "body_bytes", 0)

    def parse_and_look_up():
        parsed = parse(state, body)
        constraint, param = constraint_of(parsed)
        return parsed, constraint, param, look_up(state, constraint)

    async def work():
        parsed, constraint, param, (grammar, constraint_bytes) = await state.workers.parse(
            size, parse_and_look_up
        )
        if constraint is not None and grammar is None:
            grammar = await compile_constraint(state, constraint, param, constraint_bytes)
        if grammar is not None:
            request.state.relaxed_keywords = relaxed_keywords(grammar)
        return parsed, grammar

    return await run_until_disconnect(request.receive, work())


def encode_text(
    state: ServerState, text: str, param: str = "prompt", check: bool = True
) -> list[int]:
    """Prompt text to token ids (with the tokenizer's special tokens, like ``AsyncLLM.encode``).
    With ``check``, text too long to fit ``max_input_tokens`` whatever its tokens is refused
    without tokenizing it (``check_text_length``)."""
    if check:
        check_text_length(state, len(text), param)
    try:
        return state.llm.tokenizer.encode(text, add_special_tokens=True)
    except Exception as error:  # the tokenizer refused the text
        raise RequestError(f"cannot tokenize the prompt: {error}"[:300]) from None


def check_text_length(state: ServerState, num_chars: int, param: str) -> None:
    """Refuses ``num_chars`` of prompt text that cannot fit ``max_input_tokens`` tokens (no
    token covers more characters than the vocabulary's longest entry)."""
    limits = state.limits
    if num_chars > limits.max_prompt_chars:
        raise RequestError(
            f"`{param}` has {num_chars} characters: more than {limits.max_input_tokens} tokens "
            f"(max_input_tokens) can hold, at most {limits.max_prompt_chars} characters",
            param=param,
        )


def answer_tokens(results) -> int:
    """The tokens a generation's answer covers, prompts and outputs (``GenerationResult``s):
    the size ``Workers.respond`` picks its lane by."""
    return sum(
        len(result.prompt_token_ids) + sum(len(c.token_ids) for c in result.completions)
        for result in results
    )


def random_seed() -> int:
    return random.getrandbits(63)


def timing_headers(
    metrics: dict | None, num_prompt: int, num_generated: int, received: float
) -> dict[str, str]:
    """TGI's ``x-*`` timing headers (milliseconds) from a request's engine metrics."""
    headers = {
        "x-prompt-tokens": str(num_prompt),
        "x-generated-tokens": str(num_generated),
        "x-total-time": str(int((time.monotonic() - received) * 1000)),
    }
    if not metrics:
        return headers
    arrival = metrics.get("arrival_time")
    scheduled = metrics.get("first_scheduled_time") or arrival
    finish = metrics.get("finish_time")
    if arrival is not None and scheduled is not None:
        headers["x-queue-time"] = str(int(max(scheduled - arrival, 0.0) * 1000))
    if scheduled is not None and finish is not None:
        inference = max(finish - scheduled, 0.0)
        headers["x-inference-time"] = str(int(inference * 1000))
        headers["x-time-per-token"] = str(int(inference * 1000 / max(num_generated, 1)))
    if arrival is not None:
        headers["x-validation-time"] = str(int(max(arrival - received, 0.0) * 1000))
    return headers


__all__ = [
    "ClientDisconnected",
    "RequestError",
    "accept",
    "answer_tokens",
    "check_text_length",
    "encode_text",
    "prepare",
    "random_seed",
    "server_state",
    "timing_headers",
]
