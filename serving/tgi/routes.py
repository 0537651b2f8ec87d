"""Text Generation Inference routes: ``/generate``, ``/generate_stream``, ``/``, ``/info``."""

from __future__ import annotations

import contextlib
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import jaxgen
from serving.common import (
    accept,
    prepare,
    timing_headers,
)
from serving.generation import (
    Generation,
    GenerationAborted,
    GenerationFailed,
    token_logprob,
)
from serving.streaming import EventStreamResponse, run_until_disconnect, sse_event
from serving.tgi.format import finish_reason, prefill_json, tgi_error, token_json, top_tokens_json
from serving.tgi.requests import TgiRequest, parse_request
from serving.validation import (
    Fields,
    RequestError,
)


def parse_stream_request(state, body: dict) -> TgiRequest:
    """``parse_request`` for ``/generate_stream``, which refuses ``decoder_input_details``."""
    parsed = parse_request(state, body)
    if parsed.decoder_input_details:  # as TGI: the prefill goes with the whole answer only
        raise RequestError(
            "`decoder_input_details` == true is not supported when streaming tokens",
            param="parameters.decoder_input_details",
        )
    return parsed


def tgi_constraint(parsed: TgiRequest) -> tuple:
    """``constraint_of`` for ``prepare``: the request's grammar and its field."""
    return parsed.params.structured_outputs, "parameters.grammar"


async def admit_and_prepare(request: Request, parse) -> tuple:
    """Reads the body, admits the request (429 past the limit) and prepares it (``prepare``
    with ``parse``): ``(state, ticket, parsed, grammar)``. Raises ``RequestError``; the ticket
    is released when preparing fails."""
    state, body = await accept(request)
    ticket = state.admit()
    try:
        parsed, grammar = await prepare(request, state, body, parse, tgi_constraint)
    except BaseException:
        ticket.release()
        raise
    return state, ticket, parsed, grammar


async def generate(request: Request) -> Response:
    """``POST /generate``: the whole completion as one JSON object."""
    received = time.monotonic()
    try:
        state, ticket, parsed, grammar = await admit_and_prepare(request, parse_request)
    except RequestError as error:
        return tgi_error(error)
    try:
        generation = Generation(state, ticket, parsed.prompt_token_ids, parsed.params, grammar)
        result = await run_until_disconnect(request.receive, generation.run())
    except RequestError as error:
        return tgi_error(error)
    except GenerationAborted as error:
        return tgi_error(RequestError(f"Request aborted: {error}", kind="unavailable"))
    except GenerationFailed as error:
        return tgi_error(RequestError(f"Generation failed: {error}", kind="generation"))
    finally:
        ticket.release()
    texts = state.token_texts
    completion = result.completions[0]
    generated_text = (parsed.inputs if parsed.return_full_text else "") + completion.text
    answer: dict = {"generated_text": generated_text}
    if parsed.details:
        logprobs = completion.logprobs or [None] * len(completion.token_ids)
        tokens = [
            token_json(texts, t, text, token_logprob(entry, t))
            for t, text, entry in zip(
                completion.token_ids, completion.token_texts, logprobs, strict=True
            )
        ]
        details = {
            "finish_reason": finish_reason(completion),
            "generated_tokens": len(completion.token_ids),
            "seed": parsed.seed,
            "prefill": prefill_json(texts, parsed, result.prompt_logprobs)
            if parsed.decoder_input_details
            else [],
            "tokens": tokens,
            "best_of_sequences": None,
        }
        if parsed.top_n_tokens:
            details["top_tokens"] = [
                top_tokens_json(texts, e, parsed.top_n_tokens) for e in logprobs
            ]
        answer["details"] = details
    headers = timing_headers(
        result.metrics, len(parsed.prompt_token_ids), len(completion.token_ids), received
    )
    headers["x-compute-type"] = state.compute_type
    return JSONResponse(answer, headers=headers)


async def generate_stream(request: Request) -> Response:
    """``POST /generate_stream``: one SSE event per token; the last carries the full text."""
    try:
        state, ticket, parsed, grammar = await admit_and_prepare(request, parse_stream_request)
    except RequestError as error:
        return tgi_error(error)
    generation = Generation(state, ticket, parsed.prompt_token_ids, parsed.params, grammar)
    return EventStreamResponse(
        stream_events(state, parsed, generation),
        ticket.release,
        headers={"x-compute-type": state.compute_type},
    )


async def stream_events(state, parsed: TgiRequest, generation: Generation):
    """TGI's stream: one event per token; errors after acceptance end it with an error event."""
    index = 0
    try:
        async with contextlib.aclosing(generation.stream()) as deltas_stream:
            async for deltas in deltas_stream:
                for delta in deltas:
                    for event in token_events(state, parsed, generation, delta, index):
                        index += 1
                        yield sse_event(event)
    except RequestError as error:
        yield sse_event({"error": error.message, "error_type": "validation"})
    except GenerationAborted as error:
        yield sse_event({"error": f"Request aborted: {error}", "error_type": "generation"})
    except GenerationFailed as error:
        yield sse_event({"error": f"Generation failed: {error}", "error_type": "generation"})


def token_events(state, parsed: TgiRequest, generation: Generation, delta, index: int):
    """The events for one step's tokens; the last token of a finished request carries the
    full text and details."""
    texts = state.token_texts
    logprobs = delta.logprobs or [None] * len(delta.token_ids)
    tokens = list(zip(delta.token_ids, delta.token_texts, logprobs, strict=True))
    for k, (token_id, text, entry) in enumerate(tokens, start=1):
        event = {
            "index": index + k,
            "token": token_json(texts, token_id, text, token_logprob(entry, token_id)),
            "top_tokens": top_tokens_json(texts, entry, parsed.top_n_tokens)
            if parsed.top_n_tokens
            else None,
            "generated_text": None,
            "details": None,
        }
        if delta.finish_reason is not None and k == len(tokens):
            completion = generation.completions[0]
            prefix = parsed.inputs if parsed.return_full_text else ""
            event["generated_text"] = prefix + completion.text
            event["details"] = {
                "finish_reason": finish_reason(completion),
                "generated_tokens": len(completion.token_ids),
                "seed": parsed.seed,
                "input_length": len(parsed.prompt_token_ids),
            }
        yield event


async def compat_generate(request: Request) -> Response:
    """``POST /`` (and ``/invocations``): ``/generate`` or ``/generate_stream`` by ``stream``."""
    try:
        state, body = await accept(request)
    except RequestError as error:
        return tgi_error(error)
    stream = body.get("stream")
    stream = False if stream is None else stream
    if not isinstance(stream, bool):
        return tgi_error(Fields(body).error("stream", "must be a boolean"))
    return await (generate_stream(request) if stream else generate(request))


async def info(request: Request) -> Response:
    """``GET /info``: model and limits, as TGI reports them."""
    state = request.app.state.server
    limits = state.limits
    settings = state.settings
    answer = {
        "model_id": settings.model_name,
        "model_sha": None,
        "model_dtype": settings.dtype,
        "model_device_type": state.compute_type,
        "model_pipeline_tag": "text-generation",
        "max_concurrent_requests": settings.max_concurrent_requests,
        "max_best_of": 1,
        "max_stop_sequences": settings.max_stop_sequences,
        "max_input_tokens": limits.max_input_tokens if limits else settings.max_input_tokens,
        "max_total_tokens": limits.max_total_tokens if limits else settings.max_total_tokens,
        "max_input_length": limits.max_input_tokens if limits else settings.max_input_tokens,
        "validation_workers": 1,
        "max_client_batch_size": 1,
        "router": "jaxgen",
        "version": jaxgen.__version__,
        "sha": None,
        "docker_label": None,
        "status": state.status,
        "engine": state.engine_summary(),
    }
    return JSONResponse(answer)


ROUTES = [
    Route("/generate", generate, methods=["POST"]),
    Route("/generate_stream", generate_stream, methods=["POST"]),
    Route("/", compat_generate, methods=["POST"]),
    Route("/invocations", compat_generate, methods=["POST"]),
    Route("/info", info, methods=["GET"]),
]
