"""OpenAI-compatible routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``
(bodies parsed in ``serving.openai.requests``)."""

from __future__ import annotations

import dataclasses
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import jaxgen
from serving.common import ERROR_STATUS, accept, answer_tokens, error_response, prepare
from serving.generation import Generation, GenerationAborted, GenerationFailed, merge, run_all
from serving.json_bodies import SlicedJSONResponse
from serving.openai.beam_search_requests import BeamGeneration
from serving.openai.format import ChatFormat, CompletionFormat, usage
from serving.openai.requests import parse_chat, parse_chat_batch, parse_completion
from serving.openai.tool_calls import constraint_param
from serving.streaming import EventStreamResponse, run_until_disconnect, sse_event
from serving.structured_output_requests import constraint_field
from serving.validation import RequestError

ERROR_CODES = {"model_not_found": "model_not_found"}  # OpenAI's string codes; others: the status
ERROR_TYPES = {
    "overloaded": "overloaded_error",
    "unavailable": "service_unavailable",
    "generation": "server_error",
    "internal": "server_error",
}


def openai_error(error: RequestError) -> JSONResponse:
    """OpenAI's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    return error_response(error, openai_error_body(error))


def openai_error_body(error: RequestError) -> dict:
    status = ERROR_STATUS.get(error.kind, 400)
    return {
        "error": {
            "message": error.message,
            "type": ERROR_TYPES.get(error.kind, "invalid_request_error"),
            "param": error.param,
            "code": ERROR_CODES.get(error.kind, status),
        }
    }


async def completions(request: Request) -> Response:
    """``POST /v1/completions``."""
    return await serve(request, parse_completion, CompletionFormat)


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``."""
    return await serve(request, parse_chat, ChatFormat)


async def chat_completions_batch(request: Request) -> Response:
    """``POST /v1/chat/completions/batch`` (vLLM's): a list of conversations, one answer."""
    return await serve(request, parse_chat_batch, ChatFormat)


def check_model(state, model) -> None:
    """A ``model`` the server does not serve is a 404 (``model_not_found``), as OpenAI's API."""
    served = state.settings.serves_model(model) or state.loras.get(model) is not None
    if isinstance(model, str) and not served:
        raise RequestError(
            f"The model `{model}` does not exist.", param="model", kind="model_not_found"
        )


async def admitted(request: Request):
    """Reads the body, checks its ``model`` and admits the request (429 past the limit):
    ``(state, body, ticket)``. Raises ``RequestError``."""
    state, body = await accept(request)
    check_model(state, body.get("model"))
    ticket = await state.admit_or_wait()
    ticket.label = request_id_of(request)
    return state, body, ticket


async def answer(request: Request, respond) -> Response:
    """Admits an OpenAI request and answers it with ``await respond(state, body, ticket)``. A
    ``RequestError``, an aborted or a failed generation becomes an OpenAI error body. The ticket
    is released once the answer is made; a stream (``EventStreamResponse``) releases it when it
    ends."""
    try:
        state, body, ticket = await admitted(request)
    except RequestError as error:
        return openai_error(error)
    response = None
    try:
        response = await respond(state, body, ticket)
    except RequestError as error:
        return openai_error(error)
    except GenerationAborted as error:
        return openai_error(RequestError(f"request aborted: {error}", kind="unavailable"))
    except GenerationFailed as error:
        return openai_error(RequestError(f"generation failed: {error}", kind="generation"))
    finally:
        if not isinstance(response, EventStreamResponse):
            ticket.release()
    return response


async def serve(request: Request, parse, format_class) -> Response:
    """A completions or chat completions request: its prompts run as ``Generation``s (or
    ``BeamGeneration``s), answered by ``format_class``."""

    async def respond(state, body, ticket) -> Response:
        parsed, grammar = await prepare(request, state, body, parse, openai_constraint(body))
        lora = state.loras.get(body.get("model"))  # a LoRA adapter's name: the base with it
        if lora is not None:
            if parsed.beams is not None:
                raise RequestError("use_beam_search with a LoRA adapter", param="model")
            parsed = dataclasses.replace(parsed, model=lora.lora_name)
        generations = [
            Generation(state, ticket, prompt, params, grammar, lora, parsed.priority)
            for prompt, params in zip(parsed.prompts, parsed.params, strict=True)
        ]
        if parsed.beams is not None:  # use_beam_search: n best beams per prompt
            generations = [
                BeamGeneration(state, ticket, prompt, beam, parsed.n)
                for prompt, beam in zip(parsed.prompts, parsed.beams, strict=True)
            ]
        formatter = format_class(
            state,
            parsed,
            request_id=f"{format_class.prefix}-{request_id_of(request)}",
            created=int(time.time()),
        )
        formatter.generations = generations  # streamed echo reads the prompt logprobs
        if parsed.stream:
            return EventStreamResponse(stream_chunks(formatter, generations), ticket.release)
        results = await run_until_disconnect(request.receive, run_all(generations))
        return await state.workers.respond(answer_tokens(results), answer_json, formatter, results)

    return await answer(request, respond)


def answer_json(formatter, results) -> Response:
    """The whole answer (``formatter.response``) as JSON; on the format lane when it is large
    (``Workers.respond``): echoed prompts, logprobs and token texts grow with the tokens."""
    return SlicedJSONResponse(formatter.response(results))


def openai_constraint(body: dict):
    """``constraint_of`` for ``prepare``: a parsed request's constraint and its field."""

    def constraint_of(parsed) -> tuple:
        param = constraint_param(parsed.tools) or constraint_field(body)
        return parsed.params[0].structured_outputs, param

    return constraint_of


def request_id_of(request: Request) -> str:
    """The client's ``X-Request-Id`` (``RequestIdMiddleware``) or a new id."""
    return getattr(request.state, "request_id", None) or uuid.uuid4().hex


async def stream_chunks(formatter, generations: list[Generation]):
    """The chunks of a streamed response. A stream the server cuts short (drain, engine
    failure) ends with a chunk giving each unfinished choice ``finish_reason`` "abort" or
    "error", then an error event with the status a non-streaming request would get, and no
    ``[DONE]``: a client that waits for ``[DONE]`` must not take the cut text as whole."""
    try:
        for chunk in formatter.first_chunks():
            yield sse_event(chunk)
        workers = formatter.state.workers
        async for index, deltas in merge([g.stream() for g in generations]):
            size = formatter.chunk_tokens(index, deltas)  # a prompt's echo with its logprobs
            for event in await workers.respond(size, chunk_events, formatter, index, deltas):
                yield event
        if formatter.parsed.include_usage:
            yield sse_event(formatter.usage_chunk([g.result for g in generations]))
    except RequestError as error:
        yield sse_event(openai_error_body(error))
    except (GenerationAborted, GenerationFailed) as error:
        for index, generation in enumerate(generations):
            for chunk in formatter.chunks(index, generation.cut_deltas()):
                yield sse_event(chunk)
        kind = "unavailable" if isinstance(error, GenerationAborted) else "generation"
        yield sse_event(openai_error_body(RequestError(f"generation stopped: {error}", kind=kind)))
        return
    yield sse_event("[DONE]")


def chunk_events(formatter, index: int, deltas) -> list[bytes]:
    """The events of ``formatter.chunks(index, deltas)``."""
    return [sse_event(chunk) for chunk in formatter.chunks(index, deltas)]


def model_card(state) -> dict:
    """The served model as OpenAI's (and vLLM's) model object."""
    return {
        "id": state.settings.model_name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "jaxgen",
        "root": state.settings.model,
        "parent": None,
        "max_model_len": state.limits.max_total_tokens if state.limits else None,
    }


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: the served model, then its LoRA adapters (``parent``: it)."""
    state = request.app.state.server
    adapters = state.loras.cards(state.settings.model_name, int(state.started_at))
    return JSONResponse({"object": "list", "data": [model_card(state), *adapters]})


async def retrieve_model(request: Request) -> Response:
    """``GET /v1/models/{model}``: the served model under its name or an alias, else 404."""
    state = request.app.state.server
    name = request.path_params["model"]
    for card in state.loras.cards(state.settings.model_name, int(state.started_at)):
        if card["id"] == name:
            return JSONResponse(card)
    if name != state.settings.model_name and name not in state.settings.model_aliases:
        return openai_error(
            RequestError(
                f"The model `{name}` does not exist.", param="model", kind="model_not_found"
            )
        )
    return JSONResponse(model_card(state))


async def version(request: Request) -> Response:
    """``GET /version``: the server's version, as vLLM's."""
    return JSONResponse({"version": jaxgen.__version__})


ROUTES = [
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    Route("/version", version, methods=["GET"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/chat/completions/batch", chat_completions_batch, methods=["POST"]),
]

__all__ = ["ROUTES", "openai_error", "usage"]
