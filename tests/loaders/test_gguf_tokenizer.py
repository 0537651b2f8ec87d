"""The torch-free GGUF tokenizer tokenizes, decodes and applies chat templates exactly as
transformers' GGUF tokenizer (the reference; it needs torch, which only the tests have).

Files: the default model's (byte-level BPE, ``tokenizer.ggml.pre = smollm``) and tiny files
written here with the ``gguf`` package as llama.cpp lays them out: a byte-level BPE vocabulary
with the Llama-3 split and a SentencePiece vocabulary with byte fallback and no merges.
"""

from __future__ import annotations

import os
import random

import gguf
import pytest

from jaxgen.loaders.tokenizer import load_tokenizer

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 12:45 and we'll see 3.14159 soon!",
    "def main(argv):\n    for i in range(10):\n        print(f'{i:>4}', end='')\n    return 0\n",
    "Tokenizers split text into pieces; pieces become ids. Ids become vectors, vectors logits.",
    "日本語のテキスト、中文文本和한국어 텍스트. Ünïcödé àccents — “quotes” ½ … ñandú",
    "Emoji 🚀🔥 and 👩‍👩‍👧‍👦 families; flags 🇫🇷🇯🇵. Numbers 1234567890 and 0x1F4A9.",
    "   indented\n\n\ttabs\t\tand   runs   of    spaces     end.   \n",
]
PIECES = [
    "hello", "world", " the", "The", "tokenizer", "don't", "we'll", "I'M", "ça", "naïve",
    "東京", "中文", "한국어", "😀", "👍🏽", "👩‍💻", "🇯🇵", "e\u0301", "a\u0308\u0304", "ﬁ",
    "   ", "\t", "\n", "\n\n", "\r\n", "  \n ", "0", "7", "42", "1234567", "3.14", "-1e9",
    "def", "(x)", "{}", "[1, 2]", "==", "->", "//", "/*", "*/", "#include", "<b>", "</b>",
    "&amp;", "\\n", "'", '"', "`", "~", "|", "\u00a0", "\u200b", "\u2581", "Ġ", "ÿ", "\x7f",
]  # fmt: skip


def random_strings(count: int, specials: list[str], seed: int = 0) -> list[str]:
    """Strings mixing scripts, emoji, combining marks, whitespace runs, digits, code, and the
    vocabulary's special and added tokens."""
    rng = random.Random(seed)
    out = [""] + [piece for piece in PIECES] + list(specials) + CORPUS
    pool = PIECES + specials
    while len(out) < count:
        kind = rng.random()
        if kind < 0.6:
            parts = [rng.choice(pool) for _ in range(rng.randint(1, 12))]
            out.append("".join(p if rng.random() < 0.5 else " " + p for p in parts))
        elif kind < 0.8:
            text = rng.choice(CORPUS)
            start = rng.randrange(len(text))
            out.append(text[start : start + rng.randint(1, 40)])
        elif kind < 0.9:
            out.append(" " * rng.randint(1, 20) + rng.choice(pool) + "\n" * rng.randint(0, 3))
        else:
            out.append("".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 8))))
    return out


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
    assert ours.apply_chat_template(conversation) == reference.apply_chat_template(
        conversation, return_dict=False
    )


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


def special_texts(tokenizer) -> list[str]:
    return sorted(tokenizer.get_added_vocab())


def test_default_model_matches_transformers(smollm2_gguf):
    ours = load_tokenizer(smollm2_gguf)
    reference = transformers_gguf_tokenizer(smollm2_gguf)
    texts = random_strings(2500, special_texts(reference))
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
    assert_same_tokenizer(smollm2_tokenizer, reloaded, texts)


def test_default_model_llguidance_tokenizer_is_the_transformers_one(smollm2_tokenizer):
    """Structured outputs' llguidance tokenizer, built from the backend's JSON without
    transformers, is the one ``llguidance.hf`` builds from transformers' tokenizer."""
    import llguidance.hf

    from jaxgen.engine.grammar_masks import llguidance_tokenizer

    n_vocab = len(smollm2_tokenizer) + 20
    ours = llguidance_tokenizer(smollm2_tokenizer, n_vocab, [2])
    reference = llguidance.hf.from_tokenizer(
        smollm2_tokenizer.to_transformers(), n_vocab=n_vocab, eos_token=[2]
    )
    assert ours.vocab_size == reference.vocab_size
    assert ours.eos_token == reference.eos_token
    for text in CORPUS + PIECES:
        ids = reference.tokenize_str(text)
        assert ours.tokenize_str(text) == ids
        assert ours.decode_bytes(ids) == reference.decode_bytes(ids)
    specials = [i for i in range(n_vocab) if reference.is_special_token(i)]
    assert [i for i in range(n_vocab) if ours.is_special_token(i)] == specials


def write_tokenizer_gguf(path: str, *, model: str, tokens, token_types, **fields) -> str:
    """A GGUF holding a tokenizer and the few ``llama.*`` keys transformers reads, no tensors."""
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_tokenizer_model(model)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    if "pre" in fields:
        writer.add_tokenizer_pre(fields["pre"])
    if "merges" in fields:
        writer.add_token_merges(fields["merges"])
    if "scores" in fields:
        writer.add_token_scores(fields["scores"])
    writer.add_bos_token_id(fields["bos"])
    writer.add_eos_token_id(fields["eos"])
    if "unk" in fields:
        writer.add_unk_token_id(fields["unk"])
    if "add_bos" in fields:
        writer.add_add_bos_token(fields["add_bos"])
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def byte_level_gguf(tmp_path_factory) -> str:
    """A byte-level BPE vocabulary trained here, written as llama.cpp's ``gpt2`` kind."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 20 + PIECES * 5, trainer)
    state = bpe.model.__getstate__()
    import json

    model = json.loads(state)
    vocab = sorted(model["vocab"].items(), key=lambda item: item[1])
    tokens = [token for token, _ in vocab] + ["<think>"]
    token_types = [3 if token in specials else 1 for token, _ in vocab] + [4]
    merges = [" ".join(pair) if isinstance(pair, list) else pair for pair in model["merges"]]
    path = str(tmp_path_factory.mktemp("gguf-bpe") / "bpe.gguf")
    return write_tokenizer_gguf(
        path,
        model="gpt2",
        pre="llama-bpe",
        tokens=tokens,
        token_types=token_types,
        merges=merges,
        bos=1,
        eos=2,
        add_bos=True,
    )


@pytest.fixture(scope="module")
def sentencepiece_gguf(tmp_path_factory) -> str:
    """A SentencePiece BPE vocabulary with byte fallback trained here, written as llama.cpp's
    ``llama`` kind (tokens, scores, types; no merges)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

    directory = tmp_path_factory.mktemp("gguf-spm")
    prefix = str(directory / "spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 20 + PIECES * 5),
        model_prefix=prefix,
        model_type="bpe",
        vocab_size=600,
        byte_fallback=True,
        character_coverage=1.0,
        user_defined_symbols=["<think>"],
        control_symbols=["<|im_start|>", "<|im_end|>"],
        minloglevel=2,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    with open(prefix + ".model", "rb") as f:
        proto.ParseFromString(f.read())
    # sentencepiece piece types -> llama.cpp token types (NORMAL 1, UNKNOWN 2, CONTROL 3,
    # USER_DEFINED 4, BYTE 6), as llama.cpp's converter maps them.
    types = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6}
    tokens = [piece.piece for piece in proto.pieces]
    return write_tokenizer_gguf(
        str(directory / "spm.gguf"),
        model="llama",
        tokens=tokens,
        token_types=[types[piece.type] for piece in proto.pieces],
        scores=[piece.score for piece in proto.pieces],
        bos=tokens.index("<s>"),
        eos=tokens.index("</s>"),
        unk=tokens.index("<unk>"),
    )


@pytest.mark.parametrize("kind", ["byte_level_gguf", "sentencepiece_gguf"])
def test_tiny_gguf_matches_transformers(kind, request):
    path = request.getfixturevalue(kind)
    ours = load_tokenizer(path)
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


# -- the tokenizer cache (jaxgen.loaders.gguf_tokenizer_cache) --------------------------------


@pytest.fixture
def tokenizer_cache_dir(tmp_path, monkeypatch):
    """The cache in ``tmp_path``, for files of any size."""
    from jaxgen.config import array_cache

    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    return tmp_path / "cache" / "tokenizers"


def assert_same_plain_tokenizer(ours, built) -> None:
    assert ours.backend_tokenizer.to_str() == built.backend_tokenizer.to_str()
    assert ours.special_tokens_map == built.special_tokens_map
    assert (ours.add_bos_token, ours.add_eos_token) == (built.add_bos_token, built.add_eos_token)
    assert ours.chat_template == built.chat_template
    texts = random_strings(200, special_texts(built), seed=3)
    assert [ours.encode(text) for text in texts] == [built.encode(text) for text in texts]


def no_build(monkeypatch):
    from jaxgen.loaders import gguf_tokenizer_cache

    def fail(*args):
        raise AssertionError("built, not read from the cache")

    monkeypatch.setattr(gguf_tokenizer_cache, "gguf_tokenizer", fail)


@pytest.mark.parametrize("kind", ["byte_level_gguf", "sentencepiece_gguf"])
def test_second_load_reads_the_cached_tokenizer(kind, request, tokenizer_cache_dir, monkeypatch):
    path = request.getfixturevalue(kind)
    built = load_tokenizer(path)
    assert len(list(tokenizer_cache_dir.glob("gguf-*.json"))) == 1
    with monkeypatch.context() as patch:
        no_build(patch)
        assert_same_plain_tokenizer(load_tokenizer(path), built)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "other key"])
def test_corrupt_tokenizer_entry_warns_and_is_rebuilt(byte_level_gguf, tokenizer_cache_dir, damage):
    built = load_tokenizer(byte_level_gguf)
    (entry,) = tokenizer_cache_dir.glob("gguf-*.json")
    data = entry.read_bytes()
    body = data.split(b"\n", 1)[1]
    entry.write_bytes(
        {
            "truncated": data[: len(data) // 2],
            "garbage": os.urandom(300),
            "empty": b"",
            "other key": b'{"description": "another file", "options": {}}\n' + body,
        }[damage]
    )
    with pytest.warns(UserWarning, match="unreadable"):
        assert_same_plain_tokenizer(load_tokenizer(byte_level_gguf), built)
    assert entry.read_bytes() == data  # rewritten whole


def test_unwritable_tokenizer_cache_warns_and_loads(byte_level_gguf, tmp_path, monkeypatch):
    from jaxgen.config import array_cache

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(blocker / "cache"))  # a directory under a file
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    with pytest.warns(UserWarning, match="cannot write"):
        tokenizer = load_tokenizer(byte_level_gguf)
    assert tokenizer.encode("hello <|im_start|>", add_special_tokens=False)


def test_tokenizer_cache_off_and_small_files(byte_level_gguf, tmp_path, monkeypatch):
    from jaxgen.config import array_cache

    monkeypatch.setenv("JAXGEN_CACHE_DIR", str(tmp_path / "cache"))
    load_tokenizer(byte_level_gguf)  # under array_cache.MIN_BYTES: not cached
    monkeypatch.setattr(array_cache, "MIN_BYTES", 0)
    monkeypatch.setenv(array_cache.ENV_SWITCH, "0")
    load_tokenizer(byte_level_gguf)
    assert not (tmp_path / "cache").exists()


def test_reader_string_arrays_match_gguf(byte_level_gguf, tmp_path):
    """String arrays (decoded when read) hold what the ``gguf`` package reads; a file cut inside
    one is refused when opened."""
    from jaxgen.loaders.gguf_reader import GGUFReader

    ours = GGUFReader(byte_level_gguf).fields
    reference = gguf.GGUFReader(byte_level_gguf)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        assert ours[key] == list(reference.fields[key].contents())
    assert dict(ours)["tokenizer.ggml.model"] == "gpt2"
    data = open(byte_level_gguf, "rb").read()
    cut = data.index(b"tokenizer.ggml.merges") + 200  # inside the merges
    (tmp_path / "cut.gguf").write_bytes(data[:cut])
    with pytest.raises(ValueError, match="truncated"):
        GGUFReader(tmp_path / "cut.gguf")
