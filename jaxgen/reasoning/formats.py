"""The reasoning formats jaxgen reads (vLLM's ``--reasoning-parser`` names), and where a
request's output starts: inside the reasoning, before it, or with no reasoning at all.

A format is its tags and two rules:

- ``implicit_start``: the output may be inside the reasoning without having written the start
  tag (DeepSeek-R1 and its distillations: their templates end the prompt with ``<think>\\n``,
  or the model leaves it out); a start tag at the output's start is dropped. Without it
  (``qwen3``) the output is reasoning only if it opens with the start tag, or if the prompt
  left one open (Qwen3-Thinking-2507's template ends the prompt with ``<think>\\n``);
- ``switch``: the ``chat_template_kwargs`` that turn thinking on or off, and its default
  (``qwen3``: ``enable_thinking``, on; ``deepseek_v3``: ``thinking``, off). Off: no reasoning
  is expected, the whole output is the answer.

Whatever the format, a prompt that ends with a closed reasoning block (Qwen3's template with
``enable_thinking: false`` writes ``<think>\\n\\n</think>\\n\\n``) means the answer comes next.
"""

from __future__ import annotations

import dataclasses

# Where a request's output starts.
IN_REASONING = "reasoning"  # inside the reasoning: the end tag closes it
MAY_OPEN = "start"  # the output is the answer unless it opens with the start tag
NO_REASONING = "content"  # all answer


@dataclasses.dataclass(frozen=True, kw_only=True)
class ReasoningFormat:
    """One ``--reasoning-parser``: the tags around the reasoning and where output starts."""

    name: str
    start: str = "<think>"
    end: str = "</think>"
    implicit_start: bool = True
    switch: tuple[str, ...] = ()  # chat_template_kwargs naming the thinking switch
    thinking_default: bool = True  # the switch's value when no kwarg names it

    def thinking(self, chat_template_kwargs: dict | None) -> bool:
        """Whether the request thinks, by the format's switch in ``chat_template_kwargs``."""
        kwargs = chat_template_kwargs or {}
        for name in self.switch:
            if name in kwargs:
                return bool(kwargs[name])
        return self.thinking_default

    def prompt_state(self, prompt: str) -> str | None:
        """What the prompt's own tags say: ``IN_REASONING`` when it leaves a start tag open (a
        template that opens the reasoning, a continued message that is still thinking),
        ``NO_REASONING`` when it ends with a closed reasoning block, None when neither."""
        opened, closed = prompt.rfind(self.start), prompt.rfind(self.end)
        if opened > closed:
            return IN_REASONING
        if closed >= 0 and not prompt[closed + len(self.end) :].strip():
            return NO_REASONING
        return None

    def output_start(self, prompt: str, chat_template_kwargs: dict | None = None) -> str:
        """Where the output of ``prompt`` starts: ``IN_REASONING``, ``MAY_OPEN`` or
        ``NO_REASONING``."""
        if not self.thinking(chat_template_kwargs):
            return NO_REASONING
        state = self.prompt_state(prompt)
        if state is not None:
            return state
        return IN_REASONING if self.implicit_start else MAY_OPEN


FORMATS = {
    fmt.name: fmt
    for fmt in (
        # DeepSeek-R1 and its distillations (Qwen, Llama), QwQ, Phi-4-reasoning: <think>...</think>,
        # the start tag optional (the template may have written it).
        ReasoningFormat(name="deepseek_r1"),
        # DeepSeek-V3.1's hybrid template: thinking only with chat_template_kwargs thinking=true.
        ReasoningFormat(
            name="deepseek_v3", switch=("thinking", "enable_thinking"), thinking_default=False
        ),
        # Qwen3: the output opens with <think> (or the template opened it); enable_thinking
        # false turns thinking off.
        ReasoningFormat(name="qwen3", implicit_start=False, switch=("enable_thinking",)),
    )
}
REASONING_PARSERS = tuple(FORMATS)


def get_reasoning_format(name: str) -> ReasoningFormat:
    """The format called ``name``; a ``ValueError`` naming ``reasoning_parser`` and the known
    names for any other."""
    fmt = FORMATS.get(name) if isinstance(name, str) else None
    if fmt is None:
        raise ValueError(
            f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, got {name!r}"
        )
    return fmt
