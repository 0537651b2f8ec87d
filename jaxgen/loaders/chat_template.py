"""Chat templates rendered with jinja2 exactly as transformers renders them
(``transformers.utils.chat_template_utils``: the same sandboxed environment, globals, filters and
message normalisation), without importing transformers.

tests/loaders/test_gguf_tokenizer.py checks the rendered text against transformers'.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from datetime import datetime

# Names a message's reasoning is passed under; the first is the one templates read.
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def select_template(
    templates: str | dict | None, chat_template: str | None, tools: list | None
) -> str:
    """The template to render: ``chat_template`` (a template, or the name of one of a dict of
    ``templates``), else the tokenizer's own ("tool_use" when tools are offered, "default")."""
    if isinstance(templates, dict):
        if chat_template is not None and chat_template in templates:
            return templates[chat_template]
        if chat_template is None:
            if tools is not None and "tool_use" in templates:
                return templates["tool_use"]
            if "default" in templates:
                return templates["default"]
            raise ValueError(
                "this model has several chat templates and none is the default; pass "
                f"`chat_template` (one of {sorted(templates)})"
            )
    elif chat_template is None:
        if templates is None:
            raise ValueError("the tokenizer has no chat template and no `chat_template` was given")
        return templates
    return chat_template


def render_chat_template(
    template: str,
    messages: list,
    *,
    tools: list[dict] | None = None,
    documents: list[dict] | None = None,
    add_generation_prompt: bool = False,
    continue_final_message: bool | str = False,
    **variables,
) -> str:
    """``messages`` rendered by ``template``; ``variables`` (the tokenizer's special tokens and
    the caller's extra ones) are visible to it."""
    if continue_final_message and add_generation_prompt:
        raise ValueError(
            "continue_final_message and add_generation_prompt are not compatible: the final "
            "message is either continued or followed by a new assistant turn"
        )
    if isinstance(messages, (list, tuple)) and not messages:
        raise ValueError("cannot apply a chat template to an empty conversation")
    chat = [
        {key: value for key, value in message.items() if value is not None}
        for message in _checked_messages(getattr(messages, "messages", messages))
    ]
    if tools is not None:
        for tool in tools:
            if not isinstance(tool, dict):
                raise ValueError("tools must be JSON schemas (dicts)")
    if documents is not None and not all(isinstance(d, dict) for d in documents):
        raise TypeError("documents must be a list of dicts with 'title' and 'text' keys")
    chat = _alias_reasoning_fields(_plain(chat))
    final_message = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final_message, chat = _tag_final_message(chat, field, template)
    rendered = _compiled(template).render(
        messages=chat,
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **_plain(variables),
    )
    if continue_final_message:
        rendered = _cut_at_tag(rendered, final_message)
    return rendered


def _checked_messages(messages) -> list[dict]:
    out = []
    for message in messages:
        if dataclasses.is_dataclass(message) and not isinstance(message, type):
            message = {f.name: getattr(message, f.name) for f in dataclasses.fields(message)}
        elif callable(getattr(message, "model_dump", None)):
            message = message.model_dump()
        if not isinstance(message, dict):
            raise TypeError(f"chat messages must be dicts, got {message!r}")
        out.append(message)
    return out


def _tag_final_message(chat: list[dict], field: str, template: str) -> tuple[str, list[dict]]:
    """Appends ``CONTINUE_TAG`` to the final message's ``field`` (the reasoning's aliases too)."""
    final = chat[-1].get(field)
    if final is None:
        raise ValueError(f'continue_final_message is set but the final message has no "{field}"')
    fields = [field]
    if field in REASONING_FIELDS:
        fields = [name for name in REASONING_FIELDS if chat[-1].get(name) == final]
    if not any(name in template for name in fields):
        raise ValueError(
            f'continue_final_message is set to "{field}" but the chat template does not read it'
        )
    if isinstance(final, (list, tuple)):
        for block in reversed(final):
            if "text" in block:
                final = block["text"]
                block["text"] = block["text"] + CONTINUE_TAG
                break
        else:
            raise ValueError("continue_final_message is set but the final message has no text")
    else:
        for name in fields:
            chat[-1][name] = chat[-1][name] + CONTINUE_TAG
    return final, chat


def _cut_at_tag(rendered: str, final_message: str) -> str:
    if final_message.strip() not in rendered or CONTINUE_TAG.strip() not in rendered:
        raise ValueError(
            "continue_final_message is set but the final message does not appear in the "
            "rendered chat (the chat template drops part of it)"
        )
    at = rendered.rindex(CONTINUE_TAG.strip())
    if rendered[at : at + len(CONTINUE_TAG)] == CONTINUE_TAG:
        return rendered[:at]
    return rendered[:at].rstrip()  # the template trimmed the message's trailing spacing


def _alias_reasoning_fields(chat: list[dict]) -> list[dict]:
    out = []
    for message in chat:
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def _plain(value):
    """``value`` rebuilt from plain JSON types (transformers' ``_plain_template_data``): the
    sandbox never sees an object's methods."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_plain(item) for item in value)
    if callable(getattr(value, "item", None)) and type(value).__module__ == "numpy":
        return _plain(value.item())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


@functools.lru_cache(maxsize=64)
def _compiled(template: str):
    return _environment().from_string(template)


@functools.cache
def _environment():
    import jinja2
    import jinja2.exceptions
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with
        it): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_body")
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # Not jinja's own filter: that one escapes HTML characters.
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore-prefixed names (no way to CPython internals)."""

        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"chat templates cannot store underscore-prefixed attributes, got {name!r}"
                )

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    environment.globals["dict"] = TemplateDict()
    environment.globals["namespace"] = TemplateNamespace
    return environment
