"""Reasoning on the chat routes (``--reasoning-parser``): each prompt's reasoning, its
constraint waiting out the thinking, and the message fields, stream deltas and usage that carry
the thinking apart from the answer.

The splitting lives in ``jaxgen.reasoning`` (shared with ``LLM.chat``); this module shapes the
answers as vLLM does: the message's ``reasoning_content`` and its newer name ``reasoning`` (both
present with a parser, null without thinking), the same keys on stream deltas (only on the
deltas that carry thinking, in order), ``usage.completion_tokens_details.reasoning_tokens``.
vLLM's ``include_reasoning: false`` leaves the thinking out (it is still cut from the content).
Tool calls and constraints apply to the content only.
"""

from __future__ import annotations

from jaxgen.reasoning import ReasoningRequest

REASONING_KEYS = ("reasoning_content", "reasoning")


def reasoning_request(state, prompt: str, options) -> ReasoningRequest | None:
    """The reasoning of one rendered chat prompt under the server's parser (None without one);
    ``options``: the request's ``ChatTemplateOptions`` (its ``enable_thinking``)."""
    return ReasoningRequest.build(
        state.settings.reasoning_parser,
        prompt,
        chat_template_kwargs=options.kwargs,
        tokenizer=state.llm.tokenizer,
    )


def reasoning_params(params: list, reasoning: ReasoningRequest | None, body: dict) -> list:
    """Sampling parameters whose constraint starts after the thinking, with special tokens kept
    in the text when a tag is one (unless the request set ``skip_special_tokens``)."""
    if reasoning is None:
        return params
    chosen = body.get("skip_special_tokens") is not None
    return [reasoning.constrain(p, keep_skip_special_tokens=chosen) for p in params]


def reasoning_of(parsed, prompt_index: int) -> ReasoningRequest | None:
    """Prompt ``prompt_index``'s reasoning (None: no parser)."""
    reasonings = getattr(parsed, "reasonings", None)
    return reasonings[prompt_index] if reasonings else None


def reasoning_fields(text: str | None, include: bool) -> dict:
    """The message's reasoning keys for ``text`` (null when left out)."""
    value = text if include else None
    return dict.fromkeys(REASONING_KEYS, value)


def reasoning_message(reasoning: ReasoningRequest, text: str, include: bool):
    """A whole output's message fields for its thinking, and its content (None when the
    output ended inside the thinking)."""
    thinking, content = reasoning.parse(text)
    return reasoning_fields(thinking, include), content


class ReasoningDeltas:
    """Per-choice splitters for a streamed response."""

    def __init__(self, parsed):
        self.parsed = parsed
        self.streams: dict[int, object] = {}

    def split(self, prompt_index: int, choice: int, text: str, reason) -> tuple[dict, str]:
        """The reasoning keys of one choice's new text (when it holds thinking to send) and the
        content that follows; ``reason``: its finish reason (the end settles held text)."""
        stream = self.streams.get(choice)
        if stream is None:
            stream = self.streams[choice] = reasoning_of(self.parsed, prompt_index).stream()
        split = stream.feed(text)
        if reason is not None:
            end = stream.finish()
            split.reasoning += end.reasoning
            split.content += end.content
        if not (split.reasoning and self.parsed.include_reasoning):
            return {}, split.content
        return reasoning_fields(split.reasoning, True), split.content


def with_reasoning_tokens(usage: dict, parsed, results) -> dict:
    """``usage`` with ``completion_tokens_details.reasoning_tokens`` when a parser reads the
    output: the tokens inside the thinking, its tags not counted (as vLLM)."""
    if not parsed.reasonings:
        return usage
    count = 0
    for index, result in enumerate(results):
        reasoning = reasoning_of(parsed, index)
        count += sum(reasoning.count_tokens(c.token_texts) for c in result.completions)
    usage["completion_tokens_details"] = {"reasoning_tokens": count}
    return usage
