"""Tool-call parsers on outputs in each model family's trained format: text around calls,
several calls, malformed output (plain content, never an error) and streaming, whose pieces must
add up to the whole-output answer however the text is split."""

from __future__ import annotations

import json
import random

import pytest

from jaxgen.tool_calling import ToolCallStream, detect_parser, parse_tool_calls

WEATHER = ("get_weather", {"city": "Paris", "unit": "celsius"})
TIME = ("get_time", {"timezone": "Europe/Paris"})

# (parser, model output, expected content, expected [(name, arguments)])
CASES = [
    # Hermes 2 Pro / Qwen2.5 / Qwen3: one <tool_call> block per call.
    (
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
        "\n</tool_call>",
        None,
        [WEATHER],
    ),
    (
        "hermes",
        "Let me look both up.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}\n</tool_call>',
        "Let me look both up.\n",
        [WEATHER, TIME],
    ),
    (  # arguments given as a JSON string, and an unclosed last block
        "hermes",
        '<tool_call>\n{"name": "get_time", "arguments": "{\\"timezone\\": \\"Europe/Paris\\"}"}\n',
        None,
        [TIME],
    ),
    ("hermes", "The weather in Paris is sunny.", "The weather in Paris is sunny.", []),
    (  # malformed JSON inside the block: all plain content
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        [],
    ),
    (  # a block without a name
        "hermes",
        'ok <tool_call>{"arguments": {}}</tool_call>',
        'ok <tool_call>{"arguments": {}}</tool_call>',
        [],
    ),
    ("hermes", "a < b and <tool_ is not a tag", "a < b and <tool_ is not a tag", []),
    # Llama 3.1 / 3.2 / 3.3 JSON tool calls, with or without <|python_tag|>.
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        None,
        [WEATHER],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": '
        '"celsius"}}; {"name": "get_time", "parameters": {"timezone": "Europe/Paris"}}',
        None,
        [WEATHER, TIME],
    ),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"',
        '{"name": "get_weather", "parameters": {"city": "Paris"',
        [],
    ),
    ("llama3_json", "It is sunny in Paris.", "It is sunny in Paris.", []),
    # Mistral: [TOOL_CALLS] then a JSON list (v3 tokenizers) or name[ARGS]{...} (v11+).
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": '
        '"celsius"}}, {"name": "get_time", "arguments": {"timezone": "Europe/Paris"}}]',
        None,
        [WEATHER, TIME],
    ),
    (
        "mistral",
        'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}'
        '[TOOL_CALLS]get_time[ARGS]{"timezone": "Europe/Paris"}',
        "Sure. ",
        [WEATHER, TIME],
    ),
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, oops]',
        "oops]",  # the calls read before the bad entry stand; the rest is content
        [("get_weather", {"city": "Paris"})],
    ),
    ("mistral", "[TOOL_CALLS] not json", "[TOOL_CALLS] not json", []),
    # Pythonic (Llama 3.2 / Llama 4 / ToolACE): a Python list of calls with keyword arguments.
    (
        "pythonic",
        '[get_weather(city="Paris", unit="celsius"), get_time(timezone="Europe/Paris")]',
        None,
        [WEATHER, TIME],
    ),
    (
        "pythonic",
        "<|python_start|>[get_weather(city='Paris', unit='celsius')]<|python_end|>",
        None,
        [WEATHER],
    ),
    (
        "pythonic",
        '[search(query="a]b", limit=3, exact=True, tags=["x", None], opts={"k": false})]',
        None,
        [
            (
                "search",
                {
                    "query": "a]b",
                    "limit": 3,
                    "exact": True,
                    "tags": ["x", None],
                    "opts": {"k": False},
                },
            )
        ],
    ),
    (  # brackets and quotes inside strings, a tuple value
        "pythonic",
        """[f(a="x]\\"y", b='[', c=(1, 2))]""",
        None,
        [("f", {"a": 'x]"y', "b": "[", "c": [1, 2]})],
    ),
    ("pythonic", "[f(a=1), g(b=2)] and more", " and more", [("f", {"a": 1}), ("g", {"b": 2})]),
    ("pythonic", "[1, 2] are numbers", "[1, 2] are numbers", []),
    ("pythonic", "[get_weather('Paris')]", "[get_weather('Paris')]", []),  # positional
    ("pythonic", "[get_weather(city=Paris)]", "[get_weather(city=Paris)]", []),  # a variable
    ("pythonic", "The answer is [x].", "The answer is [x].", []),
]


def expected_calls(calls):
    return [(name, arguments) for name, arguments in calls]


def as_pairs(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("parser,text,content,calls", CASES)
def test_whole_output(parser, text, content, calls):
    got_content, got_calls = parse_tool_calls(text, parser=parser)
    assert got_content == content
    assert as_pairs(got_calls) == expected_calls(calls)
    assert all(
        c.id.startswith("call_") and len(c.id) > 10 and c.type == "function" for c in got_calls
    )
    assert len({c.id for c in got_calls}) == len(got_calls)


def split_points(text: str, seed: int) -> list[str]:
    if seed == 0:
        return list(text)  # one character at a time
    rng = random.Random(seed)
    pieces, i = [], 0
    while i < len(text):
        size = rng.randint(1, 12)
        pieces.append(text[i : i + size])
        i += size
    return pieces


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("parser,text,content,calls", CASES)
def test_streaming_adds_up(parser, text, content, calls, seed):
    stream = ToolCallStream("auto", parser=parser)
    streamed, deltas = "", []
    for piece in split_points(text, seed):
        update = stream.feed(piece)
        streamed += update.content
        deltas += update.tool_call_deltas
    update = stream.finish()
    streamed += update.content
    deltas += update.tool_call_deltas
    assert streamed == (content or "")
    # whole-call deltas: each once, in order, with id, type, name and the complete arguments
    assert [d["index"] for d in deltas] == list(range(len(calls)))
    assert [(d["function"]["name"], json.loads(d["function"]["arguments"])) for d in deltas] == (
        expected_calls(calls)
    )
    assert all(d["id"].startswith("call_") and d["type"] == "function" for d in deltas)


def test_streaming_sends_content_and_calls_early():
    """Content goes out as soon as it cannot be a marker; a call as soon as it is closed."""
    stream = ToolCallStream("auto", parser="hermes")
    assert stream.feed("Checking").content == "Checking"
    assert stream.feed(" now <tool").content == " now "  # "<tool" may begin a marker
    update = stream.feed('_call>{"name": "get_time", "arguments": {}}')
    assert update.content == "" and update.tool_call_deltas == []
    update = stream.feed("</tool_call>")
    assert [d["function"]["name"] for d in update.tool_call_deltas] == ["get_time"]
    assert stream.feed("\n").content == ""  # whitespace after a call is held
    assert stream.feed("Done.").content == "\nDone."
    assert stream.finish().content == ""


def test_required_and_named_modes():
    content, calls = parse_tool_calls(
        '[{"name": "get_weather", "parameters": {"city": "Paris"}}, '
        '{"name": "get_time", "parameters": {}}]',
        "required",
    )
    assert content is None and as_pairs(calls) == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    stream = ToolCallStream("named", tool_name="get_weather")
    first = stream.feed('{"city": ')
    assert first.tool_call_deltas[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert first.tool_call_deltas[1] == {"index": 0, "function": {"arguments": '{"city": '}}
    assert stream.feed('"Paris"}').tool_call_deltas == [
        {"index": 0, "function": {"arguments": '"Paris"}'}}
    ]
    assert stream.finish().tool_call_deltas == []
    assert stream.content is None and stream.calls[0].arguments == '{"city": "Paris"}'
    assert stream.calls[0].id == first.tool_call_deltas[0]["id"]


def test_max_calls_keeps_the_first():
    text = '<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b"}</tool_call>'
    stream = ToolCallStream("auto", parser="hermes", max_calls=1)
    update = stream.feed(text)
    stream.finish()
    assert [c.name for c in stream.calls] == ["a"] and len(update.tool_call_deltas) == 1


def test_detect_parser_from_template_markers():
    assert detect_parser("{{ '<tool_call>' }}{% if tools %}{% endif %}") == "hermes"
    assert detect_parser("{{ '[TOOL_CALLS]' + tool_calls|tojson }}") == "mistral"
    assert detect_parser("Use exact format: [func_name1(param1=value1, param2=value2)]") == (
        "pythonic"
    )
    assert detect_parser('{"name": function name, "parameters": dictionary}') == "llama3_json"
    assert detect_parser("{{ '<|python_tag|>' }}") == "llama3_json"
    assert detect_parser("{{ messages }}") == "hermes"
    assert detect_parser(None) == "hermes"
