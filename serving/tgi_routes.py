"""Text Generation Inference routes: ``/generate``, ``/generate_stream``, ``/``, ``/info``."""

from __future__ import annotations

import contextlib
import dataclasses
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import jaxgen
from serving.common import (
    ERROR_STATUS,
    accept,
    encode_text,
    error_response,
    prepare,
    random_seed,
    timing_headers,
)
from serving.generation import (
    Generation,
    GenerationAborted,
    GenerationFailed,
    TokenTexts,
    token_logprob,
)
from serving.generation import top_logprobs as top_entries
from serving.streaming import EventStreamResponse, run_until_disconnect, sse_event
from serving.structured_output_requests import tgi_grammar
from serving.validation import (
    Fields,
    RequestError,
    build_sampling_params,
    check_lengths,
    check_token_ids,
)

STATUS = {**ERROR_STATUS, "validation": 422}  # TGI's statuses: a validation error is a 422
ERROR_TYPE = {
    "invalid_json": "validation",
    "too_large": "validation",
    "unsupported_media_type": "validation",
}
PARAM_NAMES = {
    "max_tokens": "max_new_tokens",
    "logprobs": "top_n_tokens",
    "presence_penalty": "presence_penalty",
}
MAX_TOP_N_TOKENS = 20
DEFAULT_MAX_NEW_TOKENS = 100  # TGI's default


def tgi_error(error: RequestError) -> JSONResponse:
    """TGI's error body: ``{"error": message, "error_type": kind}``."""
    body = {"error": error.message, "error_type": ERROR_TYPE.get(error.kind, error.kind)}
    return error_response(error, body, STATUS)


@dataclasses.dataclass
class TgiRequest:
    """A checked TGI request."""

    inputs: str
    prompt_token_ids: list[int]
    params: object
    details: bool
    decoder_input_details: bool
    return_full_text: bool
    top_n_tokens: int
    seed: int | None


def parse_request(state, body: dict) -> TgiRequest:
    """Checks a TGI body ``{"inputs", "parameters": {...}}`` against the server's limits."""
    limits = state.limits
    fields = Fields(body)
    inputs = fields.data.get("inputs")
    if not isinstance(inputs, str):
        raise fields.error("inputs", "must be a string")
    p = Fields(fields.data.get("parameters"), "parameters")
    p.unsupported("adapter_id")
    p.unsupported("watermark", allowed=lambda v: v is False)
    p.unsupported("typical_p", allowed=lambda v: isinstance(v, (int, float)) and v >= 1.0)
    p.unsupported("best_of", allowed=lambda v: v == 1)
    max_new_tokens = p.integer("max_new_tokens", minimum=1)
    temperature = p.number("temperature", minimum=0.0)
    top_k = p.integer("top_k", minimum=0)
    top_p = p.number("top_p", minimum=0.0, maximum=1.0, exclusive_minimum=True)
    do_sample = p.boolean("do_sample", False)
    repetition_penalty = p.number("repetition_penalty", minimum=0.0, exclusive_minimum=True)
    frequency_penalty = p.number("frequency_penalty", minimum=-2.0, maximum=2.0)
    stop = p.string_list("stop", max_items=limits.max_stop_sequences)
    seed = p.seed()
    details = p.boolean("details", False)
    decoder_input_details = p.boolean("decoder_input_details", False)
    return_full_text = p.boolean("return_full_text", False)
    truncate = p.integer("truncate", minimum=1)
    top_n_tokens = p.integer("top_n_tokens", 0, minimum=0, maximum=MAX_TOP_N_TOKENS)

    # With ``truncate`` a long input is cut after tokenizing: no length check before.
    prompt_token_ids = encode_text(state, inputs, "inputs", check=truncate is None)
    if truncate is not None:
        prompt_token_ids = prompt_token_ids[-truncate:]
    check_token_ids(prompt_token_ids or [0], limits.vocab_size, "inputs")
    budget = check_lengths(
        len(prompt_token_ids),
        max_new_tokens,
        limits,
        input_name="inputs",
        output_name="max_new_tokens",
    )
    max_new_tokens = min(budget, DEFAULT_MAX_NEW_TOKENS) if max_new_tokens is None else budget
    # TGI samples when asked to or when any sampling knob is set.
    sampling = (
        do_sample
        or (temperature is not None and temperature != 1.0)
        or bool(top_k)
        or (top_p is not None and top_p < 1.0)
    )
    if temperature == 0.0:
        sampling = False
    if sampling and seed is None:
        seed = random_seed()
    params = build_sampling_params(
        PARAM_NAMES,
        max_tokens=max_new_tokens,
        temperature=(temperature if temperature is not None else 1.0) if sampling else 0.0,
        top_k=top_k or 0,
        top_p=top_p if top_p is not None else 1.0,
        repetition_penalty=repetition_penalty or 1.0,
        frequency_penalty=frequency_penalty or 0.0,
        stop=stop,
        seed=seed if sampling else None,
        logprobs=top_n_tokens,
        structured_outputs=tgi_grammar(p),
        prompt_logprobs=0 if decoder_input_details and details else None,
    )
    return TgiRequest(
        inputs,
        prompt_token_ids,
        params,
        details,
        decoder_input_details,
        return_full_text,
        top_n_tokens,
        seed if sampling else None,
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


def finish_reason(completion) -> str:
    if completion.finish_reason == "length":
        return "length"
    return "eos_token" if completion.stop_reason is None else "stop_sequence"


def token_json(texts: TokenTexts, token_id: int, text: str, logprob: float | None) -> dict:
    return {"id": token_id, "text": text, "logprob": logprob, "special": texts.is_special(token_id)}


def top_tokens_json(texts: TokenTexts, entry: dict | None, count: int) -> list[dict]:
    return [token_json(texts, t, texts.text(t), lp) for t, lp in top_entries(entry, count)]


async def generate(request: Request) -> Response:
    """``POST /generate``: the whole completion as one JSON object."""
    received = time.monotonic()
    try:
        state, body = await accept(request)
        ticket = state.admit()
    except RequestError as error:
        return tgi_error(error)
    try:
        parsed, grammar = await prepare(request, state, body, parse_request, tgi_constraint)
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


def prefill_json(texts: TokenTexts, parsed: TgiRequest, prompt_logprobs) -> list[dict]:
    """Prompt tokens with their logprobs given the prefix (the first token's is null)."""
    entries = prompt_logprobs or [None] * len(parsed.prompt_token_ids)
    return [
        {"id": t, "text": texts.text(t), "logprob": token_logprob(entry, t)}
        for t, entry in zip(parsed.prompt_token_ids, entries, strict=True)
    ]


async def generate_stream(request: Request) -> Response:
    """``POST /generate_stream``: one SSE event per token; the last carries the full text."""
    try:
        state, body = await accept(request)
        ticket = state.admit()
    except RequestError as error:
        return tgi_error(error)
    try:
        parsed, grammar = await prepare(request, state, body, parse_stream_request, tgi_constraint)
    except BaseException as error:
        ticket.release()
        if isinstance(error, RequestError):
            return tgi_error(error)
        raise
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
