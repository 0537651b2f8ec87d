"""OpenAI response and stream-chunk shapes for completions and chat completions."""

from __future__ import annotations

from serving.generation import GenerationResult, token_logprob, top_logprobs
from serving.openai.prompt_logprobs import (
    completion_logprobs,
    join_logprobs,
    token_label,
    vllm_prompt_logprobs,
)
from serving.openai.reasoning import (
    ReasoningDeltas,
    reasoning_message,
    reasoning_of,
    with_reasoning_tokens,
)
from serving.openai.tool_calls import ToolDeltas, tool_message


def usage(results: list[GenerationResult]) -> dict:
    """OpenAI's ``usage``, with ``prompt_tokens_details.cached_tokens`` always present: the
    prompt tokens read from the prefix cache rather than computed."""
    prompt = sum(len(r.prompt_token_ids) for r in results)
    completion = sum(len(c.token_ids) for r in results for c in r.completions)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(cached_tokens(r) for r in results)},
    }


def cached_tokens(result: GenerationResult) -> int:
    """Prompt tokens of ``result`` whose K/V came from the prefix cache."""
    return int((result.metrics or {}).get("num_cached_tokens") or 0)


class _Format:
    """Shared bookkeeping: ids, choice indices, usage chunks."""

    prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, state, parsed, *, request_id: str, created: int):
        self.state = state
        self.texts = state.token_texts
        self.parsed = parsed
        self.request_id = request_id
        self.created = created
        self.results: list[GenerationResult] = []  # set by ``response``
        self.generations: list = []  # the running ``Generation``s (streamed echo reads them)
        self.echoed: set[int] = set()  # prompts whose streamed echo chunk went out
        self.generated = 0  # completion tokens streamed so far (continuous usage)
        self.started: set[int] = set()  # choices whose first chunk went out (prompt_token_ids)

    def prompt_logprobs_json(self, prompt_index: int, entries) -> list | None:
        """vLLM's ``prompt_logprobs`` of one prompt, when the request asked for them."""
        if self.parsed.prompt_logprobs is None:
            return None
        ids = self.parsed.prompts[prompt_index]
        return vllm_prompt_logprobs(self.texts, ids, entries, self.parsed.prompt_logprobs)

    def choice_index(self, prompt_index: int, completion_index: int) -> int:
        return prompt_index * self.parsed.n + completion_index

    def envelope(self, object_name: str, choices: list) -> dict:
        return {
            "id": self.request_id,
            "object": object_name,
            "created": self.created,
            "model": self.parsed.model,
            "choices": choices,
        }

    def chunk(self, choices: list) -> dict:
        """A stream chunk; ``usage`` null, or with ``continuous_usage_stats`` the request's
        running totals (all its prompts, the completion tokens streamed so far)."""
        body = self.envelope(self.chunk_object_name, choices)
        if self.parsed.continuous_usage:
            prompt = sum(len(ids) for ids in self.parsed.prompts)
            body["usage"] = {
                "prompt_tokens": prompt,
                "completion_tokens": self.generated,
                "total_tokens": prompt + self.generated,
            }
        elif self.parsed.include_usage:
            body["usage"] = None
        return body

    def label(self, token_id: int) -> str:
        """A token as logprobs name it (``return_tokens_as_token_ids``: ``token_id:N``)."""
        return token_label(self.texts, token_id, self.parsed.tokens_as_ids)

    def ids_or_none(self, ids: list[int]) -> list[int] | None:
        """``ids`` with ``return_token_ids``, else null (vLLM's fields, always present)."""
        return list(ids) if self.parsed.return_token_ids else None

    def with_token_ids(self, choice: dict, prompt_index: int, token_ids: list[int]) -> dict:
        """A streamed choice with ``return_token_ids``: its ``token_ids``, and on the choice's
        first chunk the prompt's ``prompt_token_ids`` (completions; vLLM's shape)."""
        if self.parsed.return_token_ids:
            if choice["index"] not in self.started:
                choice["prompt_token_ids"] = list(self.parsed.prompts[prompt_index])
            choice["token_ids"] = list(token_ids)
        self.started.add(choice["index"])
        return choice

    def nothing_to_send(self, delta) -> bool:
        """Whether a streamed delta gives its choice nothing to send: no text, no finish, and
        neither logprobs nor token ids asked for."""
        return (
            not delta.text
            and not delta.finish_reason
            and self.parsed.logprobs is None
            and not (self.parsed.return_token_ids and delta.token_ids)
        )

    def chunk_tokens(self, prompt_index: int, deltas) -> int:
        """The tokens ``chunks(prompt_index, deltas)`` covers (the size ``Workers.respond``
        picks its lane by)."""
        return sum(len(delta.token_ids) for delta in deltas)

    def count(self, deltas) -> None:
        self.generated += sum(len(delta.token_ids) for delta in deltas)

    def usage_chunk(self, results: list[GenerationResult]) -> dict:
        body = self.envelope(self.chunk_object_name, [])
        body["usage"] = usage(results)
        return body

    def response(self, results: list[GenerationResult]) -> dict:
        self.results = results
        choices = []
        for p, result in enumerate(results):
            for completion in result.completions:
                choices.append(self.choice(p, completion))
        body = self.envelope(self.object_name, choices)
        body["usage"] = usage(results)
        body["system_fingerprint"] = None
        return body

    def first_chunks(self) -> list[dict]:
        return []


class CompletionFormat(_Format):
    """``/v1/completions``: ``text`` choices; logprobs as tokens/token_logprobs/top_logprobs."""

    def logprobs(self, token_ids, entries, offset: int) -> dict | None:
        if self.parsed.logprobs is None:
            return None
        return completion_logprobs(
            self.texts,
            token_ids,
            entries,
            self.parsed.logprobs,
            offset=offset,
            as_ids=self.parsed.tokens_as_ids,
        )

    def prompt_text(self, prompt_index: int) -> str:
        text = self.parsed.prompt_texts[prompt_index]
        if text is None:
            ids = self.parsed.prompts[prompt_index]
            text = self.state.llm.tokenizer.decode(ids, skip_special_tokens=False)
        return text

    @property
    def echo_logprobs(self) -> bool:
        return self.parsed.echo and self.parsed.logprobs is not None

    @property
    def streams_prompt_logprobs(self) -> bool:
        """Whether a stream's first chunk of a prompt waits for its prompt logprobs."""
        return self.echo_logprobs or self.parsed.prompt_logprobs is not None

    def chunk_tokens(self, prompt_index: int, deltas) -> int:
        tokens = super().chunk_tokens(prompt_index, deltas)
        if self.streams_prompt_logprobs and prompt_index not in self.echoed:  # the echo leads
            tokens += len(self.parsed.prompts[prompt_index]) * self.parsed.n
        return tokens

    def prompt_logprobs_object(self, prompt_index: int, entries) -> dict:
        ids = self.parsed.prompts[prompt_index]
        return completion_logprobs(
            self.texts, ids, entries, self.parsed.logprobs, as_ids=self.parsed.tokens_as_ids
        )

    def choice(self, prompt_index: int, completion) -> dict:
        prefix = self.prompt_text(prompt_index) if self.parsed.echo else ""
        logprobs = self.logprobs(completion.token_ids, completion.logprobs, len(prefix))
        entries = self.results[prompt_index].prompt_logprobs if self.results else None
        if self.echo_logprobs:
            logprobs = join_logprobs(self.prompt_logprobs_object(prompt_index, entries), logprobs)
        choice = {
            "index": self.choice_index(prompt_index, completion.index),
            "text": prefix + completion.text,
            "logprobs": logprobs,
            "finish_reason": completion.finish_reason,
            "stop_reason": completion.stop_reason,
            "prompt_logprobs": self.prompt_logprobs_json(prompt_index, entries),
            "prompt_token_ids": self.ids_or_none(self.parsed.prompts[prompt_index]),
            "token_ids": self.ids_or_none(completion.token_ids),
        }
        return choice

    def echo_chunks(self, prompt_index: int) -> list[dict]:
        """The streamed echo of a prompt, with its logprobs once they are known: a chunk per
        choice."""
        entries = None
        if prompt_index < len(self.generations):
            entries = self.generations[prompt_index].prompt_logprobs
        choices = []
        for i in range(self.parsed.n):
            choice = {
                "index": self.choice_index(prompt_index, i),
                "text": self.prompt_text(prompt_index) if self.parsed.echo else "",
                "logprobs": self.prompt_logprobs_object(prompt_index, entries)
                if self.echo_logprobs
                else None,
                "finish_reason": None,
            }
            if self.parsed.prompt_logprobs is not None:
                choice["prompt_logprobs"] = self.prompt_logprobs_json(prompt_index, entries)
            choices.append(self.with_token_ids(choice, prompt_index, []))
        return [self.chunk([choice]) for choice in choices]

    def first_chunks(self) -> list[dict]:
        if self.streams_prompt_logprobs:  # ``chunks`` sends it with the prompt logprobs
            return []
        if not self.parsed.echo:
            return []
        return [
            self.chunk(
                [
                    self.with_token_ids(
                        {
                            "index": self.choice_index(p, i),
                            "text": self.prompt_text(p),
                            "logprobs": None,
                            "finish_reason": None,
                        },
                        p,
                        [],
                    )
                ]
            )
            for p in range(len(self.parsed.prompts))
            for i in range(self.parsed.n)
        ]

    def chunks(self, prompt_index: int, deltas) -> list[dict]:
        """One chunk per choice that gained something (as vLLM: a client reads
        ``choices[0]``), after the prompt's echo chunk when it waits for prompt logprobs."""
        self.count(deltas)
        lead = []
        if self.streams_prompt_logprobs and prompt_index not in self.echoed:
            self.echoed.add(prompt_index)
            lead += self.echo_chunks(prompt_index)
        chunks = []
        for delta in deltas:
            if self.nothing_to_send(delta):
                continue
            index = self.choice_index(prompt_index, delta.index)
            choice = {
                "index": index,
                "text": delta.text,
                "logprobs": self.logprobs(delta.token_ids, delta.logprobs, 0),
                "finish_reason": delta.finish_reason,
                "stop_reason": delta.stop_reason if delta.finish_reason else None,
            }
            chunks.append(self.chunk([self.with_token_ids(choice, prompt_index, delta.token_ids)]))
        return lead + chunks


class ChatFormat(_Format):
    """``/v1/chat/completions``: assistant messages; logprobs as ``content`` entries."""

    prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    tool_deltas: ToolDeltas | None = None
    reasoning_deltas: ReasoningDeltas | None = None

    def response(self, results: list[GenerationResult]) -> dict:
        body = super().response(results)
        body["usage"] = with_reasoning_tokens(body["usage"], self.parsed, results)
        # vLLM's, beside the choices (null unless asked for)
        body["prompt_logprobs"] = self.prompt_logprobs_json(0, results[0].prompt_logprobs)
        body["prompt_token_ids"] = self.ids_or_none(self.parsed.prompts[0])
        return body

    def usage_chunk(self, results: list[GenerationResult]) -> dict:
        body = super().usage_chunk(results)
        body["usage"] = with_reasoning_tokens(body["usage"], self.parsed, results)
        return body

    def echoed_content(self, prompt_index: int) -> str:
        """Chat ``echo``: the text leading prompt ``prompt_index``'s answer (none when the
        request echoes nothing)."""
        contents = self.parsed.echoed_contents
        return contents[prompt_index] if contents else ""

    def entry(self, token_id: int, logprob: float | None) -> dict:
        text = self.label(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def logprobs(self, token_ids, entries) -> dict | None:
        if self.parsed.logprobs is None:
            return None
        content = []
        for token_id, entry in zip(token_ids, entries or [None] * len(token_ids), strict=True):
            item = self.entry(token_id, token_logprob(entry, token_id))
            item["top_logprobs"] = [
                self.entry(t, lp) for t, lp in top_logprobs(entry, self.parsed.logprobs)
            ]
            content.append(item)
        return {"content": content}

    def choice(self, prompt_index: int, completion) -> dict:
        text, finish_reason, thinking = completion.text, completion.finish_reason, {}
        reasoning = reasoning_of(self.parsed, prompt_index)
        if reasoning is not None:  # the thinking apart: the rest is the content
            thinking, text = reasoning_message(reasoning, text, self.parsed.include_reasoning)
        message = {"role": "assistant", "content": text}
        if self.parsed.tools is not None and text is not None:  # content and tool_calls
            message, finish_reason = tool_message(self.parsed.tools, text, finish_reason)
        message.update(thinking)
        echoed = self.echoed_content(prompt_index)
        if echoed:  # ``echo``: the continued message leads the answer
            message["content"] = echoed + (message["content"] or "")
        return {
            "index": self.choice_index(prompt_index, completion.index),
            "message": message,
            "logprobs": self.logprobs(completion.token_ids, completion.logprobs),
            "finish_reason": finish_reason,
            "stop_reason": completion.stop_reason,
            "token_ids": self.ids_or_none(completion.token_ids),
        }

    def first_chunks(self) -> list[dict]:
        """Each choice's opening chunk (its role); the first carries ``prompt_token_ids`` with
        ``return_token_ids`` (vLLM: that chunk only)."""
        chunks = []
        for i in range(self.parsed.n):
            chunk = self.chunk(
                [
                    {
                        "index": self.choice_index(0, i),
                        "delta": {"role": "assistant", "content": self.echoed_content(0)},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
            if self.parsed.return_token_ids and not chunks:
                chunk["prompt_token_ids"] = list(self.parsed.prompts[0])
            chunks.append(chunk)
        return chunks

    def chunks(self, prompt_index: int, deltas) -> list[dict]:
        """One chunk per choice that gained something (as vLLM)."""
        self.count(deltas)
        if self.reasoning_deltas is None and self.parsed.reasonings:
            self.reasoning_deltas = ReasoningDeltas(self.parsed)
        chunks = []
        for delta in deltas:
            index = self.choice_index(prompt_index, delta.index)
            text, finish_reason, body = delta.text, delta.finish_reason, {}
            if self.reasoning_deltas is not None:  # the thinking split from the answer
                body, text = self.reasoning_deltas.split(prompt_index, index, text, finish_reason)
            if self.parsed.tools is not None:  # content and tool_calls split as they come
                if self.tool_deltas is None:
                    self.tool_deltas = ToolDeltas(self.parsed.tools)
                calls, finish_reason = self.tool_deltas.delta(index, text, finish_reason)
                body.update(calls)
            elif text or not (finish_reason or self.reasoning_deltas is not None):
                body["content"] = text
            held = self.parsed.logprobs is None and not self.parsed.return_token_ids
            if not body and not finish_reason and held:  # held back: nothing to send yet
                continue
            if self.nothing_to_send(delta):
                continue
            choice = {
                "index": index,
                "delta": body,
                "logprobs": self.logprobs(delta.token_ids, delta.logprobs),
                "finish_reason": finish_reason,
                "stop_reason": delta.stop_reason if delta.finish_reason else None,
            }
            if self.parsed.return_token_ids:
                choice["token_ids"] = list(delta.token_ids)
            chunks.append(self.chunk([choice]))
        return chunks
