"""Helpers both route families use: admission around a handler, prompts, token texts."""

from __future__ import annotations

import asyncio
import random
import time

from starlette.requests import ClientDisconnect, Request

from serving.state import ServerState
from serving.streaming import ClientDisconnected
from serving.validation import RequestError, check_content_type, read_json_object


def server_state(request: Request) -> ServerState:
    return request.app.state.server


async def accept(request: Request) -> tuple[ServerState, dict]:
    """The state and JSON body of a generation request; refuses it while not ready."""
    state = server_state(request)
    if state.status != "ready":
        state.admit()  # raises the right 503
    body = getattr(request.state, "json_body", None)
    if body is None:
        check_content_type(request.headers.get("content-type"))
        try:
            body = await asyncio.wait_for(
                read_json_object(request, state.limits.max_body_bytes),
                state.settings.body_read_timeout,
            )
        except ClientDisconnect:
            raise ClientDisconnected() from None
        except asyncio.TimeoutError:
            raise RequestError(
                f"the request body took over {state.settings.body_read_timeout:g} s to arrive",
                kind="timeout",
            ) from None
        request.state.json_body = body
    return state, body


def encode_text(state: ServerState, text: str) -> list[int]:
    """Prompt text to token ids (with the tokenizer's special tokens, like ``AsyncLLM.encode``)."""
    try:
        return state.llm.tokenizer.encode(text, add_special_tokens=True)
    except Exception as error:  # the tokenizer refused the text
        raise RequestError(f"cannot tokenize the prompt: {error}"[:300]) from None


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
    "encode_text",
    "random_seed",
    "server_state",
    "timing_headers",
]
