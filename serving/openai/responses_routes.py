"""``POST /v1/responses``: OpenAI's Responses API, as vLLM serves it.

A request is admitted, prepared (parsed as the chat request it amounts to, see
``serving.openai.responses_requests``, and its grammar compiled) and run like a chat completion. The
answer is a ``response`` object whose ``output`` holds a ``message`` item (``output_text``) and
one ``function_call`` item per tool call; streamed, it is Responses' event sequence:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``... ``.done``,
``response.function_call_arguments.delta``/``.done``, ``response.output_item.done``, then
``response.completed`` (or ``response.incomplete`` when ``max_output_tokens`` cut it).
Responses are not stored (``store`` is reported false).
"""

from __future__ import annotations

import json
import time
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving.common import prepare
from serving.generation import Generation, GenerationAborted, GenerationFailed
from serving.openai.format import cached_tokens
from serving.openai.responses_requests import ResponsesRequest, parse_responses, renamed
from serving.openai.routes import answer, openai_error_body, request_id_of
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
        parsed, grammar = await prepare(request, state, body, parse_responses, constraint_of)
        chat = parsed.chat
        generation = Generation(state, ticket, chat.prompts[0], chat.params[0], grammar)
        builder = ResponseBuilder(parsed, f"resp_{request_id_of(request)}", state)
        if parsed.stream:
            return EventStreamResponse(stream_events(builder, generation), ticket.release)
        result = await run_until_disconnect(request.receive, generation.run())
        completion = result.completions[0]
        builder.feed(completion.text)
        builder.finish(completion.finish_reason, result)
        return JSONResponse(builder.response())

    return await answer(request, respond)


async def stream_events(builder: ResponseBuilder, generation: Generation):
    """The streamed response's events; a stream cut short ends with an ``error`` event."""
    yield builder.event("response.created", response=builder.response())
    yield builder.event("response.in_progress", response=builder.response())
    try:
        async for deltas in generation.stream():
            for delta in deltas:
                for event in builder.feed(delta.text):
                    yield event
                if delta.finish_reason is not None:
                    for event in builder.finish(delta.finish_reason, generation.result):
                        yield event
    except RequestError as error:
        yield error_event(builder, error)
    except (GenerationAborted, GenerationFailed) as error:
        kind = "unavailable" if isinstance(error, GenerationAborted) else "generation"
        yield error_event(builder, RequestError(f"generation stopped: {error}", kind=kind))


def error_event(builder: ResponseBuilder, error: RequestError) -> bytes:
    """Responses' ``error`` event: ``{"type": "error", "code", "message", "param"}``."""
    body = openai_error_body(error)["error"]
    return builder.event("error", code=body["code"], message=body["message"], param=body["param"])


class ResponseBuilder:
    """One response's output items, built from its text as it grows (whole or streamed: the
    same code), with the events that announce them."""

    def __init__(self, parsed: ResponsesRequest, response_id: str, state):
        self.parsed = parsed
        self.id = response_id
        self.state = state
        self.created_at = int(time.time())
        self.sequence = 0
        self.items: list[dict] = []  # in output_index order
        self.message: dict | None = None  # the open message item
        self.calls: dict[int, dict] = {}  # tool-call index -> function_call item
        self.tool_stream = parsed.chat.tools.stream() if parsed.chat.tools is not None else None
        self.status = "in_progress"
        self.incomplete_details = None
        self.usage = None

    def event(self, kind: str, **fields) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    # -- building --------------------------------------------------------------------------------
    def feed(self, text: str) -> list[bytes]:
        """Events for ``text`` added to the output."""
        if not text:
            return []
        if self.tool_stream is None:
            return self._content(text)
        update = self.tool_stream.feed(text)
        return self._content(update.content) + self._calls(update.tool_call_deltas)

    def finish(self, finish_reason: str | None, result) -> list[bytes]:
        """Events that close the items and the response."""
        events = []
        if self.tool_stream is not None:
            end = self.tool_stream.finish()
            events += self._content(end.content) + self._calls(end.tool_call_deltas)
        if self.message is None and not self.calls:
            events += self._open_message()
        events += self._close_open_items()
        self.usage = usage(result)
        if finish_reason == "length":
            self.status = "incomplete"
            self.incomplete_details = {"reason": "max_output_tokens"}
        else:
            self.status = "completed"
        kind = "response.completed" if self.status == "completed" else "response.incomplete"
        return events + [self.event(kind, response=self.response())]

    def _open_message(self) -> list[bytes]:
        self.message = {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex}",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        self.items.append(self.message)
        index = len(self.items) - 1
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        self.message["content"].append(part)
        return [
            self.event("response.output_item.added", output_index=index, item=self._shown(index)),
            self.event(
                "response.content_part.added",
                item_id=self.message["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            ),
        ]

    def _shown(self, index: int) -> dict:
        item = dict(self.items[index])
        if item["type"] == "message":
            item["content"] = []
        return item

    def _content(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = []
        if self.message is None or self.message["status"] != "in_progress":
            events = self._close_open_items() + self._open_message()
        self.message["content"][0]["text"] += text
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=self.message["id"],
                output_index=self.items.index(self.message),
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _close_open_items(self) -> list[bytes]:
        """Closes every item still open (before the next one opens: items stream one after
        the other, as OpenAI's do)."""
        events = []
        for item in self.items:
            if item["status"] != "in_progress":
                continue
            if item is self.message:
                events += self._close_message()
                continue
            index = self.items.index(item)
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            item["status"] = "completed"
            events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events

    def _close_message(self) -> list[bytes]:
        index = self.items.index(self.message)
        part = self.message["content"][0]
        self.message["status"] = "completed"
        common = dict(item_id=self.message["id"], output_index=index, content_index=0)
        return [
            self.event("response.output_text.done", text=part["text"], logprobs=[], **common),
            self.event("response.content_part.done", part=part, **common),
            self.event("response.output_item.done", output_index=index, item=self.message),
        ]

    def _calls(self, deltas: list[dict]) -> list[bytes]:
        events = []
        for delta in deltas:
            function = delta.get("function") or {}
            item = self.calls.get(delta["index"])
            if item is None:
                events += self._close_open_items()
                item = {
                    "type": "function_call",
                    "id": f"fc_{uuid.uuid4().hex}",
                    "call_id": delta.get("id") or f"call_{uuid.uuid4().hex[:24]}",
                    "name": function.get("name", ""),
                    "arguments": "",
                    "status": "in_progress",
                }
                self.calls[delta["index"]] = item
                self.items.append(item)
                index = len(self.items) - 1
                events.append(
                    self.event("response.output_item.added", output_index=index, item=dict(item))
                )
            fragment = function.get("arguments") or ""
            if fragment:
                item["arguments"] += fragment
                events.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=self.items.index(item),
                        delta=fragment,
                    )
                )
        return events

    # -- the response object -------------------------------------------------------------------
    def response(self) -> dict:
        parsed = self.parsed
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": self.status,
            "error": None,
            "incomplete_details": self.incomplete_details,
            "instructions": parsed.instructions,
            "max_output_tokens": parsed.max_output_tokens,
            "model": parsed.chat.model,
            "output": [dict(item) for item in self.items] if self.status != "in_progress" else [],
            "parallel_tool_calls": parsed.parallel_tool_calls,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "temperature": parsed.temperature,
            "text": {"format": parsed.text_format},
            "tool_choice": parsed.tool_choice,
            "tools": parsed.tools,
            "top_p": parsed.top_p,
            "truncation": "disabled",
            "usage": self.usage,
            "user": parsed.user,
            "metadata": parsed.metadata,
        }


def usage(result) -> dict:
    """Responses' ``usage``: input and output tokens, cached input tokens."""
    prompt = len(result.prompt_token_ids)
    output = sum(len(c.token_ids) for c in result.completions)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached_tokens(result)},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


ROUTES = [Route("/v1/responses", responses, methods=["POST"])]
