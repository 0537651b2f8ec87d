"""Results returned by ``LLM.generate`` and streamed by ``AsyncLLM.generate``."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class CompletionOutput:
    """One generated sequence (``n > 1`` gives several per request)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort", "error" or None while running
    logprobs: list[dict[int, float]] | None = None
    stop_reason: str | int | None = None  # the stop string or token that ended it
    # ``LLM.chat(..., tools=...)``: the calls read from ``text`` (``jaxgen.tool_calling.ToolCall``)
    tool_calls: list | None = None
    error: str | None = None  # why ``finish_reason`` is "error", when the engine knows
    # ``LLM(..., reasoning_parser=...)``'s ``chat``: ``text`` split into the thinking and the
    # answer (the chat message's ``reasoning_content`` and ``content``; ``text`` stays whole).
    # None: none of it (``content`` None: the output ended inside the reasoning).
    reasoning_content: str | None = None
    content: str | None = None

    @property
    def reasoning(self) -> str | None:
        """``reasoning_content`` under vLLM's newer name."""
        return self.reasoning_content


@dataclasses.dataclass
class RequestOutput:
    """A request's state: prompt plus its completions (cumulative; ``delta`` fields for streaming)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False
    metrics: dict | None = None
    # With ``SamplingParams.prompt_logprobs``: per prompt token, None for the first, then
    # {token: logprob} (the prompt token's own first, then the top k), vLLM's layout.
    prompt_logprobs: list[dict[int, float] | None] | None = None
    # Structured output: the JSON Schema keywords its grammar does not enforce (llguidance's
    # lenient reading, ``jaxgen.structured_outputs.relaxations``); empty when it enforces all.
    relaxed_keywords: list[str] = dataclasses.field(default_factory=list)

    # Convenience accessors for the common n=1 case (vLLM-style single completion).
    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def num_cached_tokens(self) -> int:
        """Prompt tokens whose K/V came from the prefix cache (vLLM's name; ``metrics``')."""
        return int((self.metrics or {}).get("num_cached_tokens") or 0)

    @property
    def logprobs(self) -> list[dict[int, float]] | None:
        return self.outputs[0].logprobs

    @property
    def tool_calls(self) -> list | None:
        return self.outputs[0].tool_calls
