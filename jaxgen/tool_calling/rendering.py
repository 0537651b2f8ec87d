"""Rendering a conversation with tools through a model's chat template.

A template that reads ``tools`` (Qwen, Llama 3.1+, Mistral, Hermes...) gets the tools and the
messages as they are, with each call's ``arguments`` as an object (as templates index them).
A template that does not (SmolLM2's, for one) gets the Hermes form spelled out in plain messages,
as vLLM's fallback tool templates do:

- a system message listing the tools in ``<tools></tools>`` and asking for
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (``TOOLS_PROMPT``),
  appended to the conversation's own system message, or else its first message;
- an assistant message's ``tool_calls`` appended to its content as such blocks;
- ``tool`` messages (consecutive ones merged) as a user message of
  ``<tool_response>...</tool_response>`` blocks.

The model's output is then read with the ``hermes`` parser.
"""

from __future__ import annotations

import functools
import json

TOOLS_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    "{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@functools.lru_cache(maxsize=16)
def template_supports_tools(template: str | None) -> bool:
    """Whether a Jinja chat template reads the ``tools`` variable."""
    if not template:
        return False
    import jinja2
    import jinja2.meta

    try:
        parsed = jinja2.Environment().parse(template)
    except jinja2.TemplateSyntaxError:
        return "tools" in template
    return "tools" in jinja2.meta.find_undeclared_variables(parsed)


def chat_template_of(tokenizer, chat_template: str | None = None) -> str | None:
    """The template ``apply_chat_template`` would use (one named "tool_use" when tools are
    involved and the tokenizer has several)."""
    if chat_template is not None:
        return chat_template
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return template.get("tool_use") or template.get("default")
    return template


def has_tool_parts(messages: list[dict]) -> bool:
    return any(m.get("tool_calls") or m.get("role") == "tool" for m in messages)


def render_chat(
    tokenizer,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    options=None,
) -> str:
    """The prompt text for ``messages`` (checked, see ``requests``) offering ``tools``.
    ``options``: a ``ChatTemplateOptions`` (its controls replace ``add_generation_prompt``)."""
    template = chat_template_of(tokenizer, chat_template)
    if options is not None:
        kwargs = dict(tokenize=False, **options.template_arguments())
    else:
        kwargs = dict(tokenize=False, add_generation_prompt=add_generation_prompt)
    if chat_template is not None:
        kwargs["chat_template"] = chat_template
    if not tools and not has_tool_parts(messages):
        return tokenizer.apply_chat_template(messages, **kwargs)
    if template_supports_tools(template):
        if isinstance(getattr(tokenizer, "chat_template", None), dict):
            kwargs["chat_template"] = template
        return tokenizer.apply_chat_template(
            [_arguments_as_objects(m) for m in messages], tools=tools or None, **kwargs
        )
    return tokenizer.apply_chat_template(hermes_messages(messages, tools), **kwargs)


def _arguments_as_objects(message: dict) -> dict:
    calls = message.get("tool_calls")
    if not calls:
        return message
    converted = []
    for call in calls:
        function = dict(call["function"])
        try:
            function["arguments"] = json.loads(function["arguments"])
        except (ValueError, TypeError):
            pass  # not JSON: the template gets the text
        converted.append({**call, "function": function})
    return {**message, "tool_calls": converted}


def tools_prompt(tools: list[dict]) -> str:
    """The system text that offers ``tools`` in Hermes form."""
    listed = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return TOOLS_PROMPT.format(tools=listed)


def hermes_messages(messages: list[dict], tools: list[dict] | None) -> list[dict]:
    """The conversation in plain role/content messages, tools and calls in Hermes form."""
    plain: list[dict] = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if role == "tool":
            block = f"<tool_response>\n{content}\n</tool_response>"
            if plain and plain[-1].get("tool_results"):
                plain[-1]["content"] += "\n" + block
            else:
                plain.append({"role": "user", "content": block, "tool_results": True})
            continue
        calls = message.get("tool_calls") or []
        blocks = [_call_block(call) for call in calls]
        plain.append({"role": role, "content": "\n".join(([content] if content else []) + blocks)})
    for message in plain:
        message.pop("tool_results", None)
    if tools:
        prompt = tools_prompt(tools)
        if plain and plain[0]["role"] == "system":
            plain[0]["content"] = plain[0]["content"] + "\n\n" + prompt
        else:
            plain.insert(0, {"role": "system", "content": prompt})
    return plain


def _call_block(call: dict) -> str:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except (ValueError, TypeError):
        arguments = function["arguments"]
    body = json.dumps({"name": function["name"], "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"
