"""Incremental detokenisation: streamed text equals the full decode, never half a character."""

from __future__ import annotations

import pytest

from jaxgen.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! Plain ASCII text with punctuation.",
    "日本語のテキストと中文文本，还有한국어 텍스트。",
    "Emoji: 🚀🔥👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, mixed with text.",
    "Ünïcödé àccents — dashes “quotes” and ½ fractions …",
    "  leading spaces, tabs\tand\nnew lines\n\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_streaming_equals_full_decode(text, smollm2_tokenizer):
    ids = smollm2_tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(smollm2_tokenizer, [], skip_special_tokens=True)
    pieces = [detok.add_tokens([t]) for t in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == smollm2_tokenizer.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.parametrize("text", TEXTS[1:3])
def test_streaming_after_a_prompt(text, smollm2_tokenizer):
    prompt = smollm2_tokenizer.encode("Say something:", add_special_tokens=False)
    ids = smollm2_tokenizer.encode(" " + text, add_special_tokens=False)
    detok = IncrementalDetokenizer(smollm2_tokenizer, prompt)
    streamed = "".join(detok.add_tokens([t]) for t in ids) + detok.flush()
    full = smollm2_tokenizer.decode(prompt + ids)
    assert full == smollm2_tokenizer.decode(prompt) + streamed


def test_backend_decode_streams_as_the_tokenizers_decode(smollm2_tokenizer):
    """The detokenizer decodes with a transformers fast tokenizer's ``tokenizers`` backend
    (fast, no wrapper): over random ids, special tokens among them, each delta is what the
    wrapper's decode gives. (A GGUF tokenizer decodes with its own ``decode``.)"""
    import numpy as np

    hf_tokenizer = smollm2_tokenizer.to_transformers()

    class Wrapped:  # the same tokenizer without a backend the detokenizer may use
        def decode(self, ids, **kwargs):
            return hf_tokenizer.decode(ids, **kwargs)

    rng = np.random.default_rng(0)
    for skip in (True, False):
        ids = rng.integers(0, len(hf_tokenizer), 300).tolist()
        fast = IncrementalDetokenizer(hf_tokenizer, ids[:5], skip_special_tokens=skip)
        slow = IncrementalDetokenizer(Wrapped(), ids[:5], skip_special_tokens=skip)
        assert fast._backend is not None and slow._backend is None
        for token in ids[5:]:
            assert fast.add_tokens([token]) == slow.add_tokens([token])
        assert fast.flush() == slow.flush()
