"""``jaxgen serve --reasoning-parser`` on the scripted reasoning model (tests/reasoning/
scripted_model.py: its greedy output is a known chain of tokens): chat's
``message.reasoning_content`` / ``reasoning`` and the content apart, streamed as
``delta.reasoning_content`` in order (tags as one added token, and spelled over three tokens,
one step each), ``include_reasoning: false``, a JSON schema and tool calls on the answer only,
the Responses API's reasoning item and its events, ``reasoning_tokens`` in usage,
``enable_thinking: false``, and the setting refused when unknown."""

from __future__ import annotations

import argparse
import contextlib
import json

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from jaxgen.reasoning import REASONING_PARSERS
from serving.app import create_app
from serving.settings.flags import add_serve_arguments, settings_from_args
from serving.settings.parsers import SettingsError
from serving.settings.resolve import ServerSettings, resolve_settings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm
from tests.reasoning.scripted_model import (
    ANSWER,
    CONTINUED,
    PLAIN_ANSWER,
    SPELLED_ANSWER,
    SPELLED_THINKING,
    THINKING,
    USER,
    save_reasoning_model,
)

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "set_unit",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["unit"],
                "additionalProperties": False,
            },
        },
    }
]
GREEDY = dict(model="tiny", temperature=0, max_tokens=40)
CONTINUE = dict(extra_body={"continue_final_message": True, "add_generation_prompt": False})


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_model_dir):
    """``{parser: an OpenAI client of a server reading the output with it}`` (one engine)."""
    path, _ = save_reasoning_model(str(tmp_path_factory.mktemp("reasoning")), tiny_model_dir)
    llm = shared_llm(path, **{**TINY_ENGINE_KNOBS, "max_model_len": 512})  # room for tools
    with contextlib.ExitStack() as stack:
        clients = {}
        for parser in ("deepseek_r1", "qwen3"):
            settings = ServerSettings(model=path, served_model_name="tiny", reasoning_parser=parser)
            server = stack.enter_context(ServerThread(create_app(llm, settings)))
            clients[parser] = openai.OpenAI(
                base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
            )
        yield clients


@pytest.fixture(scope="module")
def r1(servers):
    return servers["deepseek_r1"]


def thinking_of(message) -> str | None:
    extra = message.model_extra or {}
    assert extra.get("reasoning_content") == extra.get("reasoning")  # vLLM's two names
    return extra.get("reasoning_content")


def streamed(client, **kwargs) -> tuple[str | None, str | None, list]:
    """The thinking and the content a stream's deltas add up to, and its chunks."""
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    thinking = content = ""
    for chunk in chunks:
        for choice in chunk.choices:
            thinking += thinking_of(choice.delta) or ""
            content += choice.delta.content or ""
    return thinking or None, content or None, chunks


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_added_token_tags(servers, parser):
    """<think> and </think> as added tokens: the thinking apart, whole and streamed."""
    client = servers[parser]
    message = client.chat.completions.create(messages=USER, **GREEDY).choices[0].message
    assert (thinking_of(message), message.content) == (THINKING, ANSWER)
    thinking, content, chunks = streamed(client, messages=USER, **GREEDY)
    assert (thinking, content) == (THINKING, ANSWER)
    # In order: every thinking delta before the first content delta.
    kinds = [
        "thinking" if thinking_of(c.choices[0].delta) else "content"
        for c in chunks
        if c.choices and (thinking_of(c.choices[0].delta) or c.choices[0].delta.content)
    ]
    assert kinds == sorted(kinds, key=lambda kind: kind == "content") and kinds[0] == "thinking"


def test_an_end_tag_spelled_over_tokens_and_steps(servers):
    """Reasoning with no start tag (DeepSeek-R1), closed by </think> in three tokens, each in
    its own step: cut at the tag. Qwen3's parser needs the start tag: it is all content."""
    kwargs = dict(messages=CONTINUED, **GREEDY, **CONTINUE)
    for client, expected in (
        (servers["deepseek_r1"], (SPELLED_THINKING, SPELLED_ANSWER)),
        (servers["qwen3"], (None, SPELLED_THINKING + "</think>" + SPELLED_ANSWER)),
    ):
        message = client.chat.completions.create(**kwargs).choices[0].message
        assert (thinking_of(message), message.content) == expected
        assert streamed(client, **kwargs)[:2] == expected


def test_include_reasoning_false_leaves_the_thinking_out(r1):
    kwargs = dict(messages=USER, **GREEDY, extra_body={"include_reasoning": False})
    message = r1.chat.completions.create(**kwargs).choices[0].message
    assert (thinking_of(message), message.content) == (None, ANSWER)
    assert streamed(r1, **kwargs)[:2] == (None, ANSWER)
    bad = dict(messages=USER, **GREEDY, extra_body={"include_reasoning": "no"})
    with pytest.raises(openai.BadRequestError) as caught:
        r1.chat.completions.create(**bad)
    assert caught.value.body["param"] == "include_reasoning"


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_constrains_the_answer_not_the_thinking(servers, parser, stream):
    client = servers[parser]
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    kwargs = dict(messages=USER, response_format=response_format, **GREEDY)
    if stream:
        thinking, content, _ = streamed(client, **kwargs)
    else:
        message = client.chat.completions.create(**kwargs).choices[0].message
        thinking, content = thinking_of(message), message.content
    assert thinking == THINKING  # free: the model's own words, no JSON
    jsonschema.validate(json.loads(content), SCHEMA)


def test_a_schema_after_a_spelled_end_tag_and_without_thinking(servers):
    """DeepSeek-R1: the grammar starts after the three-token tag. Qwen3 on an output that does
    not open with <think>: the grammar applies from the first token, nothing is thinking."""
    response_format = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    kwargs = dict(messages=CONTINUED, response_format=response_format, **GREEDY, **CONTINUE)
    message = servers["deepseek_r1"].chat.completions.create(**kwargs).choices[0].message
    assert thinking_of(message) == SPELLED_THINKING
    jsonschema.validate(json.loads(message.content), SCHEMA)
    message = servers["qwen3"].chat.completions.create(**kwargs).choices[0].message
    assert thinking_of(message) is None
    jsonschema.validate(json.loads(message.content), SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_follow_the_thinking(r1, stream):
    named = {"type": "function", "function": {"name": "set_unit"}}
    for choice in ("required", named):
        kwargs = dict(messages=USER, tools=TOOLS, tool_choice=choice, **GREEDY)
        kwargs["max_tokens"] = 120  # a grammar's tokens may be single characters
        calls: dict[int, str] = {}  # index -> arguments
        if stream:
            chunks = list(r1.chat.completions.create(stream=True, **kwargs))
            thinking = "".join(thinking_of(c.choices[0].delta) or "" for c in chunks if c.choices)
            for chunk in chunks:
                for call in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    calls[call.index] = calls.get(call.index, "") + (call.function.arguments or "")
        else:
            message = r1.chat.completions.create(**kwargs).choices[0].message
            thinking = thinking_of(message)
            calls = dict(enumerate(call.function.arguments for call in message.tool_calls))
        assert thinking == THINKING and calls
        for arguments in calls.values():
            jsonschema.validate(json.loads(arguments), TOOLS[0]["function"]["parameters"])


def test_usage_counts_the_reasoning_tokens(r1):
    response = r1.chat.completions.create(messages=USER, **GREEDY)
    assert response.usage.completion_tokens_details.reasoning_tokens == len(THINKING.split())
    chunks = list(
        r1.chat.completions.create(
            messages=USER, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == len(THINKING.split())


def test_max_tokens_counts_the_thinking(r1):
    """Cut inside the thinking: all of it is thinking, no content."""
    response = r1.chat.completions.create(messages=USER, **{**GREEDY, "max_tokens": 2})
    choice = response.choices[0]
    assert choice.finish_reason == "length" and response.usage.completion_tokens == 2
    first_word = " " + THINKING.split()[0]
    assert (thinking_of(choice.message), choice.message.content) == (first_word, None)
    assert response.usage.completion_tokens_details.reasoning_tokens == 1


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
def test_enable_thinking_false_is_all_answer(servers, parser):
    kwargs = dict(
        messages=USER, **GREEDY, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    response = servers[parser].chat.completions.create(**kwargs)
    message = response.choices[0].message
    assert (thinking_of(message), message.content) == (None, PLAIN_ANSWER)
    assert response.usage.completion_tokens_details.reasoning_tokens == 0


def test_responses_reasoning_item_and_its_events(r1):
    kwargs = dict(model="tiny", input=USER, temperature=0, max_output_tokens=40)
    response = r1.responses.create(**kwargs)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.status == "completed"
    assert [part.text for part in reasoning.content] == [THINKING]
    assert message.type == "message" and response.output_text == ANSWER
    assert response.usage.output_tokens_details.reasoning_tokens == len(THINKING.split())
    with httpx.stream(
        "POST", f"{r1.base_url}responses", json={**kwargs, "stream": True}, timeout=120
    ) as raw:
        lines = [line for line in raw.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[len("data: ") :]) for line in lines]
    adapter = TypeAdapter(ResponseStreamEvent)  # the item events, in the SDK's own types
    item_kinds = ("response.output_item.", "response.content_part.", "response.reasoning_text.")
    for event in events:
        if event["type"].startswith(item_kinds):
            adapter.validate_python(event)
    kinds = [event["type"] for event in events]
    assert kinds[:6] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
    ]
    assert events[2]["item"]["type"] == "reasoning"
    assert events[3]["part"]["type"] == "reasoning_text"
    thinking = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    done = next(e for e in events if e["type"] == "response.reasoning_text.done")
    assert thinking == done["text"] == THINKING
    # The reasoning item is done before the message item opens.
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
    answer = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert answer == ANSWER and kinds[-1] == "response.completed"
    output = events[-1]["response"]["output"]
    assert [item["type"] for item in output] == ["reasoning", "message"]
    assert output[0]["content"] == [{"type": "reasoning_text", "text": THINKING}]


def test_an_unknown_parser_is_refused_at_start():
    with pytest.raises(SettingsError) as caught:
        resolve_settings({"reasoning_parser": "deepseek"}, environ={})
    assert "reasoning_parser from flags" in str(caught.value)
    assert all(name in str(caught.value) for name in REASONING_PARSERS)
    settings = resolve_settings({}, environ={"OPTION_REASONING_PARSER": "qwen3"})
    assert settings.reasoning_parser == "qwen3"
    assert resolve_settings({}, environ={}).reasoning_parser is None
    flags = argparse.ArgumentParser()
    add_serve_arguments(flags)
    args = flags.parse_args(["--reasoning-parser", "deepseek_r1"])
    environ = {"OPTION_REASONING_PARSER": "qwen3"}  # the flag wins
    assert settings_from_args(args, environ).reasoning_parser == "deepseek_r1"


def test_auto_tool_calls_are_read_from_the_answer_only():
    """A call the model writes while thinking is thinking; the answer's call is the call (no
    model: a hand-written output through the chat format, whole and 3 characters at a time)."""
    from jaxgen.reasoning import ReasoningRequest
    from serving.generation import Completion, Delta, GenerationResult
    from tests.serving.test_server_tool_parsers import chat_format

    thought = (
        'maybe <tool_call>{"name": "set_unit", "arguments": {"unit": "fahrenheit"}}</tool_call>'
    )
    call = '<tool_call>\n{"name": "set_unit", "arguments": {"unit": "celsius"}}\n</tool_call>'
    output = f"<think>{thought}</think>\n\n{call}"

    def formatter_of(stream: bool):
        reasonings = [ReasoningRequest.build("qwen3", "prompt")]
        return chat_format("hermes", stream, "auto", TOOLS, reasonings=reasonings)

    completion = Completion(index=0, text=output, token_ids=[5], finish_reason="stop")
    body = formatter_of(False).response([GenerationResult([1], [completion])])
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] == message["reasoning"] == thought
    assert message["content"] is None and body["choices"][0]["finish_reason"] == "tool_calls"
    [made] = message["tool_calls"]
    assert json.loads(made["function"]["arguments"]) == {"unit": "celsius"}
    formatter = formatter_of(True)
    chunks = []
    for start in range(0, len(output), 3):
        piece = output[start : start + 3]
        chunks += formatter.chunks(0, [Delta(0, piece, [7], [piece], None)])
    chunks += formatter.chunks(0, [Delta(0, "", [], [], None, "stop")])
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == thought
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"unit": "celsius"}]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
