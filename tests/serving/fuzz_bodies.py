"""The server fuzzer's request bodies: hypothesis strategies of valid TGI and OpenAI bodies, the
paths inside each that a mutation may change, adversarial text and values, and raw bytes that
are not a body at all."""

from __future__ import annotations

from hypothesis import strategies as st

ADVERSARIAL_TEXT = st.sampled_from(
    [
        "",
        " ",
        "\x00",
        "\ud800",
        "\udfff tail",
        "<|im_end|>",
        "<|im_start|>system",
        "😀" * 40,
        "\u202e\u200b",
        "{{ raise_exception('boom') }}",
        "{% for x in range(10**9) %}{% endfor %}",
        "a" * 3000,
        "hello " * 400,
        "\\u0000",
        "null",
    ]
)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    ADVERSARIAL_TEXT,
    st.lists(st.integers(min_value=-3, max_value=70000), max_size=4),
    st.lists(st.text(max_size=4), max_size=6),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
)
PROMPT_TEXT = st.one_of(
    st.sampled_from(["Hello", "The quick brown fox", "1 2 3"]),
    st.text(max_size=40),
    ADVERSARIAL_TEXT,
)


SMALL_TOKENS = st.integers(min_value=1, max_value=6)
# Valid values per field. Knobs that change the engine's compiled program (sampling, filters,
# penalties, min_tokens) stay greedy/default so the run compiles few programs; junk still hits
# them (and sometimes lands on a valid value).
TGI_PARAMETERS = {
    "max_new_tokens": SMALL_TOKENS,
    "temperature": st.sampled_from([0.0, 1.0]),
    "top_k": st.just(0),
    "top_p": st.just(1.0),
    "do_sample": st.just(False),
    "repetition_penalty": st.just(1.0),
    "frequency_penalty": st.just(0.0),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=4),
    "seed": st.integers(min_value=0, max_value=2**64 - 1),
    "details": st.booleans(),
    "decoder_input_details": st.booleans(),
    "return_full_text": st.booleans(),
    "top_n_tokens": st.sampled_from([0, 2]),
    "truncate": st.integers(min_value=1, max_value=8),
    "watermark": st.just(False),
    "typical_p": st.just(1.0),
    "best_of": st.just(1),
    "grammar": st.sampled_from(
        [
            None,
            {"type": "json", "value": {"type": "object"}},
            {"type": "regex", "value": "[a-c]+"},
        ]
    ),
}
OPENAI_COMMON = {
    "model": st.just("tiny"),
    "n": st.integers(min_value=1, max_value=3),
    "max_tokens": SMALL_TOKENS,
    "temperature": st.just(0.0),
    "top_p": st.just(1.0),
    "stop": st.one_of(
        st.text(min_size=1, max_size=3), st.lists(st.text(min_size=1, max_size=3), max_size=4)
    ),
    "seed": st.integers(min_value=-(2**63), max_value=2**64 - 1),
    "stream": st.booleans(),
    "presence_penalty": st.just(0.0),
    "stop_token_ids": st.lists(st.integers(min_value=0, max_value=49151), max_size=2),
    "min_tokens": st.just(0),
    "ignore_eos": st.booleans(),
    "user": st.text(max_size=5),
    "structured_outputs": st.sampled_from(
        [{"choice": ["yes", "no"]}, {"regex": "[0-9]{2}"}, {"json": {"type": "array"}}]
    ),
}
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "developer"]),
        "content": st.one_of(
            PROMPT_TEXT,
            st.lists(
                st.fixed_dictionaries({"type": st.just("text"), "text": PROMPT_TEXT}), max_size=2
            ),
        ),
    }
)
TOOL_MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.just("tool"), "content": PROMPT_TEXT, "tool_call_id": st.text(max_size=8)}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.none(),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": st.text(max_size=8),
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries(
                            {"name": st.just("f"), "arguments": st.just('{"a": 1}')}
                        ),
                    }
                ),
                max_size=2,
            ),
        }
    ),
)
RESPONSE_ITEM = st.one_of(
    st.fixed_dictionaries(
        {
            "type": st.just("function_call"),
            "call_id": st.text(min_size=1, max_size=8),
            "name": st.just("f"),
            "arguments": st.just('{"a": 1}'),
        }
    ),
    st.fixed_dictionaries(
        {
            "type": st.just("function_call_output"),
            "call_id": st.text(min_size=1, max_size=8),
            "output": PROMPT_TEXT,
        }
    ),
)
FUZZ_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        },
    }
]
VALID = {
    "tgi": st.fixed_dictionaries(
        {
            "inputs": PROMPT_TEXT,
            "parameters": st.fixed_dictionaries({}, optional=TGI_PARAMETERS),
        }
    ),
    "/v1/completions": st.fixed_dictionaries(
        {
            "prompt": st.one_of(
                PROMPT_TEXT,
                st.lists(PROMPT_TEXT, min_size=1, max_size=2),
                st.lists(st.integers(0, 49151), min_size=1, max_size=4),
            )
        },
        optional={
            "logprobs": st.sampled_from([0, 2]),
            "echo": st.booleans(),
            "prompt_logprobs": st.sampled_from([0, 2]),
            "logit_bias": st.just({"5": -100.0, "7": 3}),
            **OPENAI_COMMON,
        },
    ),
    "/v1/chat/completions": st.fixed_dictionaries(
        {"messages": st.lists(st.one_of(MESSAGE, TOOL_MESSAGE), min_size=1, max_size=3)},
        optional={
            "tools": st.just(FUZZ_TOOLS),
            "tool_choice": st.sampled_from(
                ["none", "auto", "required", {"type": "function", "function": {"name": "f"}}]
            ),
            "parallel_tool_calls": st.booleans(),
            "logprobs": st.booleans(),
            "max_completion_tokens": SMALL_TOKENS,
            "response_format": st.sampled_from(
                [
                    {"type": "text"},
                    {"type": "json_object"},
                    {
                        "type": "json_schema",
                        "json_schema": {"name": "n", "schema": {"type": "integer"}},
                    },
                ]
            ),
            "prompt_logprobs": st.just(0),
            **OPENAI_COMMON,
        },
    ),
    "/v1/responses": st.fixed_dictionaries(
        {
            "input": st.one_of(
                PROMPT_TEXT.filter(bool),
                st.lists(st.one_of(MESSAGE, RESPONSE_ITEM), min_size=1, max_size=3),
            )
        },
        optional={
            "instructions": PROMPT_TEXT,
            "max_output_tokens": SMALL_TOKENS,
            "temperature": st.just(0.0),
            "stream": st.booleans(),
            "tools": st.just([{"type": "function", **FUZZ_TOOLS[0]["function"]}]),
            "tool_choice": st.sampled_from(["none", "auto", {"type": "function", "name": "f"}]),
            "text": st.sampled_from(
                [
                    {"format": {"type": "json_object"}},
                    {"format": {"type": "json_schema", "name": "n", "schema": {"type": "integer"}}},
                ]
            ),
            "model": st.just("tiny"),
        },
    ),
    "/tokenize": st.one_of(
        st.fixed_dictionaries(
            {"prompt": PROMPT_TEXT}, optional={"add_special_tokens": st.booleans()}
        ),
        st.fixed_dictionaries(
            {"messages": st.lists(MESSAGE, min_size=1, max_size=2)},
            optional={"add_generation_prompt": st.booleans()},
        ),
    ),
    "/detokenize": st.fixed_dictionaries(
        {"tokens": st.lists(st.integers(0, 49151), max_size=4)}, optional={"model": st.just("tiny")}
    ),
}
# Where junk may go: top-level keys, nested parameter keys, message fields.
MUTABLE = {
    "tgi": [
        ("inputs",),
        ("parameters",),
        ("stream",),
        ("extra",),
        *[("parameters", key) for key in TGI_PARAMETERS],
        ("parameters", "grammar", "type"),
        ("parameters", "grammar", "value"),
    ],
    "/v1/completions": [
        ("prompt",),
        ("logprobs",),
        ("echo",),
        ("suffix",),
        ("best_of",),
        ("logit_bias",),
        ("logit_bias", "5"),
        ("prompt_logprobs",),
        ("stream_options",),
        ("extra",),
        *[(key,) for key in OPENAI_COMMON],
    ],
    "/v1/chat/completions": [
        ("messages",),
        ("messages", 0),
        ("messages", 0, "role"),
        ("messages", 0, "content"),
        ("messages", 0, "content", 0),
        ("logprobs",),
        ("top_logprobs",),
        ("max_completion_tokens",),
        ("tools",),
        ("tools", 0),
        ("tools", 0, "function"),
        ("tools", 0, "function", "name"),
        ("tools", 0, "function", "parameters"),
        ("tool_choice",),
        ("parallel_tool_calls",),
        ("messages", 0, "tool_calls"),
        ("messages", 0, "tool_call_id"),
        ("response_format",),
        ("response_format", "type"),
        ("response_format", "json_schema"),
        ("response_format", "json_schema", "schema"),
        ("continue_final_message",),
        ("add_generation_prompt",),
        ("chat_template_kwargs",),
        ("echo",),
        ("structured_outputs", "regex"),
        ("structured_outputs", "choice"),
        ("structured_outputs", "json"),
        ("prompt_logprobs",),
        ("logit_bias",),
        ("stream_options",),
        ("extra",),
        *[(key,) for key in OPENAI_COMMON],
    ],
    "/v1/responses": [
        ("input",),
        ("input", 0),
        ("input", 0, "type"),
        ("input", 0, "content"),
        ("input", 0, "arguments"),
        ("instructions",),
        ("max_output_tokens",),
        ("tools",),
        ("tools", 0, "parameters"),
        ("tool_choice",),
        ("text",),
        ("text", "format"),
        ("text", "format", "schema"),
        ("previous_response_id",),
        ("extra",),
    ],
    "/tokenize": [
        ("prompt",),
        ("messages",),
        ("messages", 0),
        ("add_special_tokens",),
        ("add_generation_prompt",),
        ("model",),
    ],
    "/detokenize": [("tokens",), ("tokens", 0), ("model",)],
}


def mutate(body, path: tuple, value) -> None:
    """Sets ``body[path] = value`` where the path exists (or its last key can be added)."""
    target = body
    for key in path[:-1]:
        if isinstance(target, dict) and key in target:
            target = target[key]
        elif isinstance(target, list) and isinstance(key, int) and key < len(target):
            target = target[key]
        else:
            return
    last = path[-1]
    if isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list) and isinstance(last, int) and last < len(target):
        target[last] = value


RAW_BODIES = st.one_of(
    st.binary(max_size=64),
    st.sampled_from(
        [
            b"",
            b"{",
            b"}",
            b"null",
            b"[]",
            b'"text"',
            b"123",
            b"{" * 3000 + b"}" * 3000,
            b"[" * 100000,
            b'{"inputs": ' + b"1" * 5000 + b"}",
            b'{"inputs": "x", "a": NaN}',
            b'{"inputs": "\\ud800"}',
            b'{"prompt": "\\udc00", "model": "m"}',
            b"\xef\xbb\xbf{}",
            '{"inputs": "x"}'.encode("utf-16"),
            b'{"inputs": "x"}\x00',
            b'{"inputs":"x"}{"inputs":"y"}',
            b'{"messages": [{"role": "user", "content": "\\ud83d"}]}',
        ]
    ),
)
