"""Small GGUF files holding only a tokenizer, trained here (no download), and random texts to
compare tokenizers on: shared by the GGUF tokenizer's tests and its cache's."""

from __future__ import annotations

import random

import gguf

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
    'Line one\r\nLine two\r\n\r\n  <div class="box">Tom &amp; Jerry</div>\r\n',
    "See https://example.com/path/to?q=llama.cpp&lang=en#top or mailto:a.b@c.org now.",
    "I'M SURE you're right, DON'T we'll they've HelloWorld ÜberÄrger İstanbul ΣΊΣΥΦΟΣ",
    "Numbers: 1,234,567.89 · ١٢٣٤ · ½ ² ³ · 2024-01-31T12:00:00Z · 0b1010 · 1e-9",
    "x\u00a0y\u3000z\u2028w\x85v\x1cu\u200bt \u0301a\u0308 👋🏽 한국어 텍스트 中文",
]
PIECES = [
    "hello", "world", " the", "The", "tokenizer", "don't", "we'll", "I'M", "ça", "naïve",
    "東京", "中文", "한국어", "😀", "👍🏽", "👩‍💻", "🇯🇵", "e\u0301", "a\u0308\u0304", "ﬁ",
    "   ", "\t", "\n", "\n\n", "\r\n", "  \n ", "0", "7", "42", "1234567", "3.14", "-1e9",
    "def", "(x)", "{}", "[1, 2]", "==", "->", "//", "/*", "*/", "#include", "<b>", "</b>",
    "&amp;", "\\n", "'", '"', "`", "~", "|", "\u00a0", "\u200b", "\u2581", "Ġ", "ÿ", "\x7f",
    " ", "  ", "\r", "\t\t", " \n", "http://a.io/x", "<div>", "</p>", "éé", "ÀÉÎ", "١٢", "㊿",
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


def special_texts(tokenizer) -> list[str]:
    return sorted(tokenizer.get_added_vocab())


def write_tokenizer_gguf(path: str, *, model: str, tokens, token_types, **fields) -> str:
    """A GGUF holding a tokenizer and the few ``llama.*`` keys transformers reads, no tensors."""
    writer = gguf.GGUFWriter(path, "llama")
    if "general_name" in fields:
        writer.add_name(fields["general_name"])
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
    if "add_eos" in fields:
        writer.add_add_eos_token(fields["add_eos"])
    if "add_space_prefix" in fields:
        writer.add_add_space_prefix(fields["add_space_prefix"])
    writer.add_chat_template(CHAT_TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_byte_level_gguf(directory) -> str:
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
    path = str(directory / "bpe.gguf")
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


def write_sentencepiece_gguf(directory) -> str:
    """A SentencePiece BPE vocabulary with byte fallback trained here, written as llama.cpp's
    ``llama`` kind (tokens, scores, types; no merges)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2

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
