"""A Responses ``response`` object and its stream events, built from the output text as it
grows (whole or streamed: the same code).

Output items stream one after the other, as OpenAI's do: with ``--reasoning-parser`` a
``reasoning`` item first (one ``reasoning_text`` part: ``response.reasoning_text.delta`` /
``.done`` events), a ``message`` item (one ``output_text`` part, with its tokens'
``logprobs`` when the request asked for ``top_logprobs``), one ``function_call`` item per tool
call. The response's ``status`` goes
``queued`` (background) / ``in_progress``, then ``completed``, ``incomplete``
(``max_output_tokens``), ``failed`` or ``cancelled``.
"""

from __future__ import annotations

import json
import time
import uuid

from serving.openai.format import ChatFormat, cached_tokens
from serving.openai.reasoning import reasoning_of

RUNNING = ("queued", "in_progress")


class ResponseBuilder:
    """One response's output items, built from its text as it grows (whole or streamed: the
    same code), with the events that announce them."""

    def __init__(self, parsed, response_id: str, state, *, stored: bool = False):
        self.parsed = parsed
        self.id = response_id
        self.state = state
        self.stored = stored
        self.created_at = int(time.time())
        self.sequence = 0
        self.items: list[dict] = []  # in output_index order
        self.message: dict | None = None  # the open message item
        self.calls: dict[int, dict] = {}  # tool-call index -> function_call item
        self.tool_stream = parsed.chat.tools.stream() if parsed.chat.tools is not None else None
        self.reasoning = reasoning_of(parsed.chat, 0)
        self.reasoning_stream = self.reasoning.stream() if self.reasoning is not None else None
        self.reasoning_item: dict | None = None
        self.background = bool(getattr(parsed, "background", False))
        self.status = "queued" if self.background else "in_progress"
        self.error: dict | None = None
        self.incomplete_details = None
        self.usage = None
        wants_logprobs = state is not None and parsed.chat.logprobs is not None
        self.logprobs = (
            ChatFormat(state, parsed.chat, request_id=response_id, created=self.created_at)
            if wants_logprobs
            else None
        )
        self.pending_logprobs: list[dict] = []  # of tokens whose text is not yet shown

    def event(self, kind: str, **fields) -> bytes:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n".encode()

    # -- building --------------------------------------------------------------------------------
    def start(self) -> None:
        """A queued (background) response starts running."""
        if self.status == "queued":
            self.status = "in_progress"

    def fail(self, code: str, message: str) -> None:
        """The response failed (the engine stopped it, or its grammar failed)."""
        if self.status in RUNNING:
            self.status = "failed"
            self.error = {"code": code, "message": message}

    def cancel(self) -> None:
        if self.status in RUNNING:
            self.status = "cancelled"

    def feed(self, text: str, token_ids=(), entries=None) -> list[bytes]:
        """Events for ``text`` (of tokens ``token_ids``, with their logprob ``entries``)
        added to the output."""
        if self.logprobs is not None and token_ids:
            shown = self.logprobs.logprobs(list(token_ids), entries)
            self.pending_logprobs += shown["content"] if shown else []
        if not text:
            return []
        if self.reasoning_stream is None:
            return self._answer(text)
        split = self.reasoning_stream.feed(text)
        if not split.content:  # the tokens so far were the thinking's: no text of the message
            self.pending_logprobs = []
        return self._reasoning(split.reasoning) + self._answer(split.content)

    def finish(self, finish_reason: str | None, result) -> list[bytes]:
        """Events that close the items and the response."""
        events = []
        if self.reasoning_stream is not None:
            end = self.reasoning_stream.finish()
            events += self._reasoning(end.reasoning) + self._answer(end.content)
        if self.tool_stream is not None:
            end = self.tool_stream.finish()
            events += self._content(end.content) + self._calls(end.tool_call_deltas)
        if self.message is None and not self.calls and self.reasoning_item is None:
            events += self._open_message()
        events += self._close_open_items()
        self.usage = usage(result, self.reasoning)
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
        if item["type"] in ("message", "reasoning"):
            item["content"] = []
        return item

    def _answer(self, text: str) -> list[bytes]:
        """Events for answer text: the message's, or tool calls read from it."""
        if self.tool_stream is None or not text:
            return self._content(text)
        update = self.tool_stream.feed(text)
        return self._content(update.content) + self._calls(update.tool_call_deltas)

    def _reasoning(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = []
        if self.reasoning_item is None:
            events = self._close_open_items() + self._open_reasoning()
        part = self.reasoning_item["content"][0]
        part["text"] += text
        events.append(
            self.event(
                "response.reasoning_text.delta",
                item_id=self.reasoning_item["id"],
                output_index=self.items.index(self.reasoning_item),
                content_index=0,
                delta=text,
            )
        )
        return events

    def _open_reasoning(self) -> list[bytes]:
        part = {"type": "reasoning_text", "text": ""}
        self.reasoning_item = {
            "type": "reasoning",
            "id": f"rs_{uuid.uuid4().hex}",
            "summary": [],
            "content": [part],
            "encrypted_content": None,
            "status": "in_progress",
        }
        self.items.append(self.reasoning_item)
        index = len(self.items) - 1
        return [
            self.event("response.output_item.added", output_index=index, item=self._shown(index)),
            self.event(
                "response.content_part.added",
                item_id=self.reasoning_item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            ),
        ]

    def _close_reasoning(self) -> list[bytes]:
        index = self.items.index(self.reasoning_item)
        part = self.reasoning_item["content"][0]
        self.reasoning_item["status"] = "completed"
        common = dict(item_id=self.reasoning_item["id"], output_index=index, content_index=0)
        return [
            self.event("response.reasoning_text.done", text=part["text"], **common),
            self.event("response.content_part.done", part=dict(part), **common),
            self.event("response.output_item.done", output_index=index, item=self.reasoning_item),
        ]

    def _content(self, text: str) -> list[bytes]:
        if not text:
            return []
        events = []
        if self.message is None or self.message["status"] != "in_progress":
            events = self._close_open_items() + self._open_message()
        part = self.message["content"][0]
        part["text"] += text
        logprobs, self.pending_logprobs = self.pending_logprobs, []
        part["logprobs"] += logprobs
        events.append(
            self.event(
                "response.output_text.delta",
                item_id=self.message["id"],
                output_index=self.items.index(self.message),
                content_index=0,
                delta=text,
                logprobs=logprobs,
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
            if item is self.reasoning_item:
                events += self._close_reasoning()
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
            self.event(
                "response.output_text.done", text=part["text"], logprobs=part["logprobs"], **common
            ),
            self.event("response.content_part.done", part=part, **common),
            self.event("response.output_item.done", output_index=index, item=self.message),
        ]

    def _calls(self, deltas: list[dict]) -> list[bytes]:
        events = []
        if deltas:  # the tokens so far were a call's: no text of the message
            self.pending_logprobs = []
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
            "error": self.error,
            "incomplete_details": self.incomplete_details,
            "instructions": parsed.instructions,
            "max_output_tokens": parsed.max_output_tokens,
            "model": parsed.chat.model,
            "output": [dict(item) for item in self.items] if self.status not in RUNNING else [],
            "parallel_tool_calls": parsed.parallel_tool_calls,
            "previous_response_id": parsed.previous_response_id,
            "reasoning": None,
            "store": self.stored,
            "background": self.background,
            "temperature": parsed.temperature,
            "text": {"format": parsed.text_format},
            "tool_choice": parsed.tool_choice,
            "tools": parsed.tools,
            "top_p": parsed.top_p,
            "top_logprobs": parsed.top_logprobs,
            "truncation": "disabled",
            "usage": self.usage,
            "user": parsed.user,
            "metadata": parsed.metadata,
        }


def usage(result, reasoning=None) -> dict:
    """Responses' ``usage``: input and output tokens, cached input tokens, the output's
    reasoning tokens (``reasoning``: the request's ``ReasoningRequest``, or None)."""
    prompt = len(result.prompt_token_ids)
    output = sum(len(c.token_ids) for c in result.completions)
    thinking = 0
    if reasoning is not None:
        thinking = sum(reasoning.count_tokens(c.token_texts) for c in result.completions)
    return {
        "input_tokens": prompt,
        # cache_write_tokens (the openai SDK's field): prompt tokens computed into the KV cache.
        "input_tokens_details": {
            "cached_tokens": cached_tokens(result),
            "cache_write_tokens": prompt - cached_tokens(result),
        },
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": thinking},
        "total_tokens": prompt + output,
    }
