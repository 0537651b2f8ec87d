"""Text Generation Inference routes: ``/generate``, ``/generate_stream``, ``/``, ``/info``."""

from __future__ import annotations

import contextlib
import math
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import jaxgen
from serving.common import (
    accept,
    answer_tokens,
    prepare,
    timing_headers,
)
from serving.generation import (
    Generation,
    GenerationAborted,
    GenerationFailed,
    run_all,
    token_logprob,
)
from serving.json_bodies import SlicedJSONResponse
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
    if parsed.best_of != 1:  # as TGI: the best sequence is known only at the end
        raise RequestError(
            "`best_of` != 1 is not supported when streaming tokens", param="parameters.best_of"
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
    ticket = await state.admit_or_wait()
    try:
        parsed, grammar = await prepare(request, state, body, parse, tgi_constraint)
    except BaseException:
        ticket.release()
        raise
    return state, ticket, parsed, grammar


async def generate(request: Request) -> Response:
    """``POST /generate``: the whole completion as one JSON object; with ``best_of`` > 1 the
    sequence of the highest mean token logprob, the others in ``details.best_of_sequences``."""
    received = time.monotonic()
    try:
        state, ticket, parsed, grammar = await admit_and_prepare(request, parse_request)
    except RequestError as error:
        return tgi_error(error)
    try:
        generations = [
            Generation(state, ticket, parsed.prompt_token_ids, params, grammar, parsed.lora_request)
            for params in parsed.sequence_params
        ]
        results = await run_until_disconnect(request.receive, run_all(generations))
    except RequestError as error:
        return tgi_error(error)
    except GenerationAborted as error:
        return tgi_error(RequestError(f"Request aborted: {error}", kind="unavailable"))
    except GenerationFailed as error:
        return tgi_error(RequestError(f"Generation failed: {error}", kind="generation"))
    finally:
        ticket.release()
    return await state.workers.respond(
        answer_tokens(results), generate_answer, state, parsed, results, received
    )


def generate_answer(state, parsed: TgiRequest, results: list, received: float) -> Response:
    """``/generate``'s answer of ``results`` (one per ``best_of`` sequence), with its timing
    headers; on the format lane when it is large (``Workers.respond``): the prefill
    (``decoder_input_details``) and the tokens' details grow with the tokens."""
    sequences = [
        sequence_json(state.token_texts, parsed, result, params.seed)
        for result, params in zip(results, parsed.sequence_params, strict=True)
    ]
    best = max(range(len(results)), key=lambda i: mean_logprob(results[i].completions[0]))
    answer: dict = {"generated_text": sequences[best]["generated_text"]}
    if parsed.details:
        details = {k: v for k, v in sequences[best].items() if k != "generated_text"}
        details["best_of_sequences"] = (
            [s for i, s in enumerate(sequences) if i != best] if parsed.best_of > 1 else None
        )
        answer["details"] = details
    result = results[best]
    headers = timing_headers(
        result.metrics,
        len(parsed.prompt_token_ids),
        len(result.completions[0].token_ids),
        received,
    )
    headers["x-compute-type"] = state.compute_type
    return SlicedJSONResponse(answer, headers=headers)


def mean_logprob(completion) -> float:
    """TGI's rank of a ``best_of`` sequence: its generated tokens' mean logprob."""
    logprobs = [
        token_logprob(entry, token)
        for token, entry in zip(completion.token_ids, completion.logprobs or [], strict=False)
    ]
    if not logprobs or any(lp is None for lp in logprobs):
        return -math.inf
    return sum(logprobs) / len(logprobs)


def sequence_json(texts, parsed: TgiRequest, result, seed: int | None) -> dict:
    """One generated sequence as TGI's details (and ``best_of_sequences`` entries) give it."""
    completion = result.completions[0]
    logprobs = completion.logprobs or [None] * len(completion.token_ids)
    tokens = [
        token_json(texts, t, text, token_logprob(entry, t))
        for t, text, entry in zip(
            completion.token_ids, completion.token_texts, logprobs, strict=True
        )
    ]
    sequence = {
        "generated_text": (parsed.inputs if parsed.return_full_text else "") + completion.text,
        "finish_reason": finish_reason(completion),
        "generated_tokens": len(completion.token_ids),
        "seed": seed,
        "prefill": prefill_json(texts, parsed, result.prompt_logprobs)
        if parsed.decoder_input_details
        else [],
        "tokens": tokens,
    }
    if parsed.top_n_tokens:
        sequence["top_tokens"] = [top_tokens_json(texts, e, parsed.top_n_tokens) for e in logprobs]
    return sequence


async def generate_stream(request: Request) -> Response:
    """``POST /generate_stream``: one SSE event per token; the last carries the full text."""
    try:
        state, ticket, parsed, grammar = await admit_and_prepare(request, parse_stream_request)
    except RequestError as error:
        return tgi_error(error)
    generation = Generation(
        state, ticket, parsed.prompt_token_ids, parsed.params, grammar, parsed.lora_request
    )
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
    """``POST /`` (and ``/invocations`` with a TGI body): ``/generate`` or ``/generate_stream`` by ``stream``."""
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
        "max_best_of": limits.max_best_of if limits else settings.max_best_of,
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
    Route("/info", info, methods=["GET"]),
]
