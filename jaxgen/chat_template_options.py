"""vLLM's chat-template controls: ``add_generation_prompt``, ``continue_final_message`` and
``chat_template_kwargs``, checked once for ``LLM.chat`` and the server.

- ``add_generation_prompt`` (default: true unless the final message is continued) ends the
  prompt with the template's opening of an assistant turn;
- ``continue_final_message`` leaves the final message (the assistant's) open, so the model
  continues its text where it stops instead of starting a new turn (a prefill). It cannot be
  combined with ``add_generation_prompt`` and needs an assistant message last;
- ``chat_template_kwargs`` are extra variables for the template (``{"enable_thinking": false}``
  for Qwen3's).
"""

from __future__ import annotations

import dataclasses

# Arguments ``apply_chat_template`` takes itself: not template variables.
RESERVED_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


class ChatTemplateError(ValueError):
    """A bad chat-template control; ``param`` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(f"`{param}` {message}")
        self.param = param


@dataclasses.dataclass(frozen=True)
class ChatTemplateOptions:
    """The checked controls of one chat request."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False
    kwargs: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def build(
        cls,
        messages: list[dict],
        *,
        add_generation_prompt: bool | None = None,
        continue_final_message: bool | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> ChatTemplateOptions:
        """Checks the controls against ``messages`` (``ChatTemplateError`` names a bad one)."""
        for name, value in (
            ("add_generation_prompt", add_generation_prompt),
            ("continue_final_message", continue_final_message),
        ):
            if value is not None and not isinstance(value, bool):
                raise ChatTemplateError(name, f"must be a boolean, got {value!r}"[:120])
        continued = bool(continue_final_message)
        if add_generation_prompt is None:
            add_generation_prompt = not continued
        if continued and add_generation_prompt:
            raise ChatTemplateError(
                "continue_final_message",
                "cannot be combined with `add_generation_prompt: true` (the final message is "
                "either continued or followed by a new assistant turn)",
            )
        if continued and (not messages or messages[-1].get("role") != "assistant"):
            raise ChatTemplateError(
                "continue_final_message",
                "needs an assistant message last (the message to continue)",
            )
        kwargs = chat_template_kwargs if chat_template_kwargs is not None else {}
        if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise ChatTemplateError(
                "chat_template_kwargs", "must be an object of template variables"
            )
        reserved = sorted(RESERVED_KWARGS & set(kwargs))
        if reserved:
            raise ChatTemplateError(
                "chat_template_kwargs",
                f"may not set {', '.join(reserved)} (a request field or a tokenizer argument)",
            )
        return cls(add_generation_prompt, continued, dict(kwargs))

    def template_arguments(self) -> dict:
        """The keyword arguments for ``apply_chat_template``."""
        arguments = dict(self.kwargs)
        arguments["add_generation_prompt"] = self.add_generation_prompt
        if self.continue_final_message:
            arguments["continue_final_message"] = True
        return arguments
