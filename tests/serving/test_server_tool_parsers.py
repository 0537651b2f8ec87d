"""Tool calling on ``/v1/chat/completions`` without a model: hand-written model outputs through
each parser, as a response and as stream chunks the ``openai`` SDK reads (its types and its
own stream accumulator)."""

from __future__ import annotations

import types

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from jaxgen.sampling_params import SamplingParams
from jaxgen.tool_calling import ToolRequest
from serving.generation import Completion, Delta, GenerationResult
from serving.openai.format import ChatFormat
from serving.openai.requests import OpenAIRequest
from tests.serving.tool_examples import TOOLS, pairs

# Hand-written outputs in each parser's format: (parser, output, content, [(name, arguments)])
OUTPUTS = [
    (
        "hermes",
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
        '"unit": "celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": '
        '{"zone": "CET"}}\n</tool_call>',
        "Checking.\n",
        [("get_weather", {"city": "Paris", "unit": "celsius"}), ("get_time", {"zone": "CET"})],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}',
        None,
        [("get_time", {"zone": "UTC"})],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "unit": '
        '"celsius"}}, {"name": "get_time", "arguments": {"zone": "UTC"}}]',
        None,
        [("get_weather", {"city": "Oslo", "unit": "celsius"}), ("get_time", {"zone": "UTC"})],
    ),
    (
        "pythonic",
        '[get_weather(city="Rome", unit="celsius")]',
        None,
        [("get_weather", {"city": "Rome", "unit": "celsius"})],
    ),
    ("hermes", "It is sunny.", "It is sunny.", []),
    ("hermes", "<tool_call>{broken</tool_call>", "<tool_call>{broken</tool_call>", []),
]


def chat_format(parser: str, stream: bool, choice=None, tools=TOOLS, **fields) -> ChatFormat:
    """A chat formatter for one prompt with ``tools`` under ``parser`` (``fields``: more of the
    ``OpenAIRequest``'s, e.g. ``reasonings``)."""
    parsed = OpenAIRequest(
        "tiny",
        [[1]],
        ["prompt"],
        [SamplingParams()],
        1,
        stream,
        False,
        None,
        tools=ToolRequest.build(tools, choice, tool_call_parser=parser),
        **fields,
    )
    state = types.SimpleNamespace(token_texts=None)
    return ChatFormat(state, parsed, request_id="chatcmpl-test", created=0)


@pytest.mark.parametrize("parser,output,content,calls", OUTPUTS)
def test_auto_response_through_each_parser(parser, output, content, calls):
    formatter = chat_format(parser, stream=False)
    completion = Completion(index=0, text=output, token_ids=[5, 6], finish_reason="stop")
    body = formatter.response([GenerationResult([1], [completion])])
    response = ChatCompletion.model_validate(body)
    choice = response.choices[0]
    assert choice.message.content == content
    assert pairs(choice.message.tool_calls) == calls
    assert choice.finish_reason == ("tool_calls" if calls else "stop")
    assert all(
        c.id.startswith("call_") and c.type == "function" for c in choice.message.tool_calls or []
    )


@pytest.mark.parametrize("parser,output,content,calls", OUTPUTS)
def test_auto_stream_through_each_parser(parser, output, content, calls):
    """Chunks a few characters at a time, accumulated by the SDK's own stream state."""
    formatter = chat_format(parser, stream=True)
    chunks = list(formatter.first_chunks())
    for start in range(0, len(output), 5):
        piece = output[start : start + 5]
        chunks += formatter.chunks(0, [Delta(0, piece, [7], [piece], None)])
    chunks += formatter.chunks(0, [Delta(0, "", [], [], None, "stop")])
    state = ChatCompletionStreamState()
    for chunk in chunks:
        state.handle_chunk(ChatCompletionChunk.model_validate(chunk))
    final = state.get_final_completion().choices[0]
    assert (final.message.content or None) == content
    assert pairs(final.message.tool_calls) == calls
    assert final.finish_reason == ("tool_calls" if calls else "stop")
    tool_deltas = [
        d for c in chunks for ch in c["choices"] for d in ch["delta"].get("tool_calls", [])
    ]
    assert all(d["function"]["name"] and d["id"] for d in tool_deltas)  # whole-call deltas
