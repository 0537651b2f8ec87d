"""OpenAI's Responses API, as vLLM serves it: ``POST /v1/responses``, and the stored ones'
``GET`` / ``DELETE /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``.

A request is admitted, prepared (parsed as the chat request it amounts to, see
``serving.openai.responses_requests``, and its grammar compiled) and run like a chat completion. The
answer is a ``response`` object whose ``output`` holds, with ``--reasoning-parser``, a
``reasoning`` item (``reasoning_text``), a ``message`` item (``output_text``) and one
``function_call`` item per tool call; streamed, it is Responses' event sequence:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.reasoning_text.delta``... ``.done``,
``response.output_text.delta``... ``.done``,
``response.function_call_arguments.delta``/``.done``, ``response.output_item.done``, then
``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` cut it).

``store`` (true unless the request says false) keeps the response in the server's
``ResponseStore`` (``--responses-store-size``, ``--responses-store-ttl``; a size of 0 stores
nothing and reports ``store`` false). ``previous_response_id`` continues a stored response's
conversation. ``background: true`` (with ``store``) answers at once with the ``queued``
response and runs it detached, holding its admission slot until it ends; ``GET`` shows how far
it got (``?stream=true&starting_after=N`` replays its events and follows them), ``cancel``
stops it.
"""

from __future__ import annotations

import functools
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving.common import answer_tokens, prepare, server_state
from serving.generation import Generation, GenerationAborted, GenerationFailed
from serving.json_bodies import SlicedJSONResponse
from serving.openai.response_builder import ResponseBuilder
from serving.openai.response_store import StoredResponse
from serving.openai.responses_requests import (
    ResponsesRequest,
    output_messages,
    parse_responses,
    renamed,
)
from serving.openai.routes import answer, openai_error, openai_error_body
from serving.openai.tool_calls import constraint_param
from serving.streaming import EventStreamResponse, run_until_disconnect
from serving.validation import RequestError


def constraint_of(parsed: ResponsesRequest) -> tuple:
    """``prepare``'s constraint and the Responses field it came from."""
    tool_param = constraint_param(parsed.chat.tools)
    if tool_param is not None:
        param = renamed(RequestError("", param=tool_param)).param
    elif parsed.text_format["type"] == "json_schema":
        param = "text.format.schema"
    else:
        param = "text.format"
    return parsed.chat.params[0].structured_outputs, param


async def responses(request: Request) -> Response:
    """``POST /v1/responses``."""

    async def respond(state, body, ticket) -> Response:
        store = state.responses
        history = previous_conversation(store, body.get("previous_response_id"))
        parse = functools.partial(parse_responses, history=history)
        parsed, grammar = await prepare(request, state, body, parse, constraint_of)
        stored = parsed.store and store.enabled
        if parsed.background and not stored:
            raise RequestError(
                "`background` needs `store`: "
                + ("set store true" if store.enabled else "this server stores no responses"),
                param="background",
            )
        chat = parsed.chat
        generation = Generation(
            state, ticket, chat.prompts[0], chat.params[0], grammar, priority=chat.priority
        )
        builder = ResponseBuilder(parsed, f"resp_{uuid.uuid4().hex}", state, stored=stored)
        if parsed.background:
            entry = StoredResponse(builder, parsed.messages, background=True)
            store.put(entry)
            entry.run(stream_events(builder, generation), ticket.hand_over().release)
            if parsed.stream:
                return EventStreamResponse(entry.replay(), lambda: None)
            return JSONResponse(builder.response())

        def keep() -> None:  # the response has ended
            if stored:
                store.put(StoredResponse(builder, parsed.messages))

        if parsed.stream:
            return EventStreamResponse(stream_events(builder, generation, keep), ticket.release)
        result = await run_until_disconnect(request.receive, generation.run())
        reply = await state.workers.respond(
            answer_tokens([result]), finished_reply, builder, result
        )
        keep()
        return reply

    return await answer(request, respond)


def finished_reply(builder: ResponseBuilder, result) -> Response:
    """The finished response of ``result``, its output fed to ``builder``; on the format lane
    when it is large (``Workers.respond``): the output's logprobs grow with its tokens."""
    completion = result.completions[0]
    builder.feed(completion.text, completion.token_ids, completion.logprobs)
    builder.finish(completion.finish_reason, result)
    return SlicedJSONResponse(builder.response())


def previous_conversation(store, previous_id) -> list[dict] | None:
    """The conversation ``previous_response_id`` continues (``RequestError``: 404 if it is not
    stored, 400 while it is still running)."""
    if previous_id is None:
        return None
    if not isinstance(previous_id, str):
        raise RequestError("`previous_response_id` must be a string", param="previous_response_id")
    entry = stored_response(store, previous_id, "previous_response_id")
    if entry.running:
        raise RequestError(
            f"response '{previous_id}' is still {entry.status}: wait until it ends",
            param="previous_response_id",
        )
    return entry.conversation(output_messages)


def stored_response(store, response_id: str, param: str = "response_id") -> StoredResponse:
    entry = store.get(response_id)
    if entry is None:
        raise RequestError(
            f"Response with id '{response_id}' not found.", param=param, kind="not_found"
        )
    return entry


async def stream_events(builder: ResponseBuilder, generation: Generation, on_end=None):
    """The streamed response's events; a stream cut short ends with an ``error`` event (and the
    response ``failed``). ``on_end()`` runs once the response has ended."""
    yield builder.event("response.created", response=builder.response())
    builder.start()
    yield builder.event("response.in_progress", response=builder.response())
    try:
        async for deltas in generation.stream():
            for delta in deltas:
                for event in builder.feed(delta.text, delta.token_ids, delta.logprobs):
                    yield event
                if delta.finish_reason is not None:
                    for event in builder.finish(delta.finish_reason, generation.result):
                        yield event
    except RequestError as error:
        yield error_event(builder, error)
    except (GenerationAborted, GenerationFailed) as error:
        kind = "unavailable" if isinstance(error, GenerationAborted) else "generation"
        yield error_event(builder, RequestError(f"generation stopped: {error}", kind=kind))
    if on_end is not None:
        on_end()


def error_event(builder: ResponseBuilder, error: RequestError) -> bytes:
    """Responses' ``error`` event: ``{"type": "error", "code", "message", "param"}``; the
    response is ``failed``."""
    body = openai_error_body(error)["error"]
    builder.fail(str(body["code"]), body["message"])
    return builder.event("error", code=body["code"], message=body["message"], param=body["param"])


# -- stored responses ----------------------------------------------------------------------------
async def retrieve_response(request: Request) -> Response:
    """``GET /v1/responses/{id}``: the stored response as it stands; with ``stream=true`` (a
    background response) its events after ``starting_after``, then the live ones."""
    try:
        entry = stored_response(server_state(request).responses, request.path_params["id"])
        query = request.query_params
        if query.get("stream", "false").lower() not in ("true", "1"):
            return JSONResponse(entry.response())
        if not entry.background:
            raise RequestError("only a background response can be streamed again", param="stream")
        after = query.get("starting_after", "-1")
        if not after.lstrip("-").isdigit():
            raise RequestError("`starting_after` must be an integer", param="starting_after")
        return EventStreamResponse(entry.replay(int(after)), lambda: None)
    except RequestError as error:
        return openai_error(error)


async def delete_response(request: Request) -> Response:
    """``DELETE /v1/responses/{id}``: forgets it (a running one is cancelled first)."""
    store = server_state(request).responses
    try:
        entry = stored_response(store, request.path_params["id"])
    except RequestError as error:
        return openai_error(error)
    await entry.cancel()
    store.pop(entry.id)
    return JSONResponse({"id": entry.id, "object": "response", "deleted": True})


async def cancel_response(request: Request) -> Response:
    """``POST /v1/responses/{id}/cancel``: stops a queued or running background response
    (``cancelled``, with what it had output); cancelling a cancelled one answers it again."""
    try:
        entry = stored_response(server_state(request).responses, request.path_params["id"])
        status = entry.status
        if not entry.background:
            raise RequestError("only a background response can be cancelled")
        if not entry.running and status != "cancelled":
            raise RequestError(f"response '{entry.id}' is {status}: it cannot be cancelled")
    except RequestError as error:
        return openai_error(error)
    await entry.cancel()
    return JSONResponse(entry.response())


ROUTES = [
    Route("/v1/responses", responses, methods=["POST"]),
    Route("/v1/responses/{id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{id}", delete_response, methods=["DELETE"]),
    Route("/v1/responses/{id}/cancel", cancel_response, methods=["POST"]),
]
