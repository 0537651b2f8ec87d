"""The torch-free GGUF tokenizer against transformers' GGUF tokenizer: the same vocabulary,
special tokens and chat templates, the same ids where llama.cpp (the reference for ids:
test_llama_cpp_tokenization.py) agrees with transformers; and its transformers form
(``to_transformers``, ``save_pretrained``) is what transformers builds for the file.

Files: the default model's (byte-level BPE, ``tokenizer.ggml.pre = smollm``) and tiny files
written here with the ``gguf`` package as llama.cpp lays them out: a byte-level BPE vocabulary
with the Llama-3 split and a SentencePiece vocabulary with byte fallback and no merges.
"""

from __future__ import annotations

import os
import unicodedata

import pytest

from jaxgen.loaders.tokenizer import load_tokenizer
from tests.loaders.gguf_tokenizer_files import (
    CORPUS,
    PIECES,
    random_strings,
    special_texts,
    write_tokenizer_gguf,
)

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Write a haiku about pages."},
        {"role": "assistant", "content": "Pages turn\nkeys and values rest\nin order"},
        {"role": "user", "content": "日本語で? 🚀"},
    ],
    [{"role": "user", "content": "  spaces\t and\n\nnew lines  "}],
    [{"role": "user", "content": "code: `def f(x): return x**2` <|im_end|> inside"}],
]


# A template in the style of Qwen's: tools as JSON, a namespace, raise_exception, tool calls and
# results, reasoning, extra variables.
TOOL_TEMPLATE = (
    "{%- set ns = namespace(system=none) %}"
    "{%- if messages[0].role == 'system' %}{%- set ns.system = messages[0].content %}{%- endif %}"
    "{%- if tools %}<|im_start|>system\n{{ ns.system or 'You may call tools.' }}\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n"
    "{%- elif ns.system %}<|im_start|>system\n{{ ns.system }}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}{%- continue %}{%- endif %}"
    "{%- if message.role not in ['user', 'assistant', 'tool'] %}"
    "{{ raise_exception('unknown role ' + message.role) }}{%- endif %}"
    "<|im_start|>{{ message.role }}\n"
    "{%- if message.reasoning_content %}<think>{{ message.reasoning_content }}</think>{%- endif %}"
    "{{ message.content | default('', true) }}"
    "{%- for call in message.tool_calls | default([]) %}\n<tool_call>"
    "{{ call.function | tojson(indent=2) }}</tool_call>{%- endfor %}"
    "{%- if not (loop.last and continue_final) %}<|im_end|>\n{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>{%- endif %}"
    "{%- endif %}{{ bos_token if greet is defined else '' }}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city — «today»",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }
]
TOOL_CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris <b>&</b>?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning": "Call the tool.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "It is 21 °C and"},
]


def assert_same_chat_templates(ours, reference) -> None:
    """Tools, a system message, reasoning, tool calls, extra variables, a continued message,
    a template named in ``chat_template``: rendered as transformers renders them."""
    cases = [
        dict(conversation=TOOL_CONVERSATION[:2], tools=TOOLS, add_generation_prompt=True),
        dict(conversation=TOOL_CONVERSATION[:4], tools=TOOLS, add_generation_prompt=True),
        dict(
            conversation=TOOL_CONVERSATION[1:2], add_generation_prompt=True, enable_thinking=False
        ),
        dict(conversation=TOOL_CONVERSATION, tools=TOOLS, continue_final_message=True),
        dict(conversation=TOOL_CONVERSATION[:2], add_generation_prompt=False, greet=True),
    ]
    for case in cases:
        got = ours.apply_chat_template(chat_template=TOOL_TEMPLATE, tokenize=False, **case)
        want = reference.apply_chat_template(chat_template=TOOL_TEMPLATE, tokenize=False, **case)
        assert got == want, case
    bad = [{"role": "robot", "content": "beep"}]
    for tokenizer in (ours, reference):
        with pytest.raises(Exception, match="unknown role robot"):
            tokenizer.apply_chat_template(bad, chat_template=TOOL_TEMPLATE, tokenize=False)
    conversation = CONVERSATIONS[1]
    assert ours.apply_chat_template(conversation, return_dict=False) == (
        reference.apply_chat_template(conversation, return_dict=False)
    )


def has_number(text: str) -> bool:
    return any(unicodedata.category(c)[0] == "N" for c in text)


def assert_same_tokenizer(ours, reference, texts: list[str]) -> None:
    assert len(ours) == len(reference)
    assert ours.get_vocab() == reference.get_vocab()
    assert ours.get_added_vocab() == reference.get_added_vocab()
    assert sorted(ours.all_special_ids) == sorted(reference.all_special_ids)
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id"):
        assert getattr(ours, name) == getattr(reference, name), name
    mismatches = []
    for text in texts:
        for add_special in (True, False):
            ids = ours.encode(text, add_special_tokens=add_special)
            expected = reference.encode(text, add_special_tokens=add_special)
            if ids != expected:
                mismatches.append((text, add_special, ids, expected))
                continue
            for skip in (True, False):
                got = ours.decode(ids, skip_special_tokens=skip)
                want = reference.decode(expected, skip_special_tokens=skip)
                if got != want:
                    mismatches.append((text, f"decode skip={skip}", got, want))
    assert not mismatches, f"{len(mismatches)} of {len(texts)} differ, first: {mismatches[:3]}"
    if reference.chat_template is not None:
        for conversation in CONVERSATIONS:
            for prompt in (True, False):
                kwargs = dict(tokenize=False, add_generation_prompt=prompt)
                text = ours.apply_chat_template(conversation, **kwargs)
                assert text == reference.apply_chat_template(conversation, **kwargs)
                assert ours.encode(text, add_special_tokens=False) == reference.encode(
                    text, add_special_tokens=False
                )


def transformers_gguf_tokenizer(path: str):
    from transformers import AutoTokenizer  # its GGUF reader imports torch (a dev dependency)

    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


def test_default_model_matches_transformers(smollm2_gguf):
    """Where llama.cpp and transformers agree: texts without numbers (SmolLM's split, in
    llama.cpp, isolates every digit; transformers' keeps runs of them)."""
    ours = load_tokenizer(smollm2_gguf)
    reference = transformers_gguf_tokenizer(smollm2_gguf)
    texts = [t for t in random_strings(2500, special_texts(reference)) if not has_number(t)]
    assert_same_tokenizer(ours, reference, texts)
    assert_same_chat_templates(ours, reference)
    assert "transformers" not in type(ours).__module__


def test_default_model_saved_as_transformers_loads_the_same(smollm2_tokenizer, tmp_path):
    """``save_pretrained`` writes a directory transformers' ``AutoTokenizer`` loads to the same
    tokenizer (the tests' tiny HF models carry it)."""
    from transformers import AutoTokenizer

    smollm2_tokenizer.save_pretrained(str(tmp_path))
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path))
    texts = random_strings(300, special_texts(reloaded), seed=2)
    assert_same_tokenizer(smollm2_tokenizer.to_transformers(), reloaded, texts)


def test_default_model_llguidance_tokenizer_is_the_transformers_one(smollm2_tokenizer):
    """Structured outputs' llguidance tokenizer, built without transformers from llama.cpp's
    token bytes and tokenization, has the vocabulary ``llguidance.hf`` builds from
    transformers' tokenizer, and tokenizes as the GGUF tokenizer does."""
    import llguidance.hf

    from jaxgen.engine.structured.grammar_masks import llguidance_tokenizer

    n_vocab = len(smollm2_tokenizer) + 20
    ours = llguidance_tokenizer(smollm2_tokenizer, n_vocab, [2])
    reference = llguidance.hf.from_tokenizer(
        smollm2_tokenizer.to_transformers(), n_vocab=n_vocab, eos_token=[2]
    )
    assert ours.vocab_size == reference.vocab_size
    assert ours.eos_token == reference.eos_token
    for text in CORPUS + PIECES:
        ids = smollm2_tokenizer.encode(text, add_special_tokens=False, parse_special=False)
        assert ours.tokenize_str(text) == ids
        assert ours.decode_bytes(ids) == reference.decode_bytes(ids) == text.encode()
        if not has_number(text):
            assert reference.tokenize_str(text) == ids
    specials = [i for i in range(n_vocab) if reference.is_special_token(i)]
    assert [i for i in range(n_vocab) if ours.is_special_token(i)] == specials


@pytest.mark.parametrize("kind", ["byte_level_gguf", "sentencepiece_gguf"])
def test_tiny_gguf_transformers_form_is_transformers(kind, request):
    """``to_transformers`` (what ``save_pretrained`` writes) is transformers' GGUF tokenizer,
    and the chat templates render as transformers renders them."""
    path = request.getfixturevalue(kind)
    ours = load_tokenizer(path).to_transformers()
    reference = transformers_gguf_tokenizer(path)
    texts = random_strings(2000, special_texts(reference) + ["<s>", "</s>"], seed=1)
    assert_same_tokenizer(ours, reference, texts)
    assert_same_chat_templates(ours, reference)


def test_unsupported_tokenizer_kind_names_the_field(tmp_path):
    path = write_tokenizer_gguf(
        str(tmp_path / "t5.gguf"),
        model="t5",
        tokens=["<pad>", "</s>", "a"],
        token_types=[3, 3, 1],
        scores=[0.0, 0.0, -1.0],
        bos=0,
        eos=1,
    )
    with pytest.raises(ValueError, match="tokenizer.ggml.model 't5'"):
        load_tokenizer(path)


def test_load_model_refuses_the_tokenizer_before_any_weight(tmp_path, monkeypatch):
    """A GGUF whose tokenizer jaxgen cannot reproduce is a ValueError naming the field before
    a single weight is read."""
    import jaxgen.loaders as loaders

    path = write_tokenizer_gguf(
        str(tmp_path / "bad-pre.gguf"),
        model="gpt2",
        pre="no-such-pre",
        tokens=["a", "b", "ab"],
        token_types=[1, 1, 1],
        merges=["a b"],
        bos=0,
        eos=1,
    )

    def no_weights(*args, **kwargs):
        raise AssertionError("weights loaded before the tokenizer was checked")

    monkeypatch.setattr(loaders, "params_from_hf_tensors", no_weights)
    with pytest.raises(ValueError, match="tokenizer.ggml.pre 'no-such-pre'"):
        loaders.load_model(path, dtype="float32")
