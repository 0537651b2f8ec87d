"""The pre-tokenizers llama.cpp names by ``tokenizer.ggml.pre``: each name's regexes (verbatim
from llama-vocab.cpp's ``llm_tokenizer_bpe``) and the vocabulary options it sets.

``PRE_TOKENIZERS`` lists every name llama.cpp accepts whose split
``jaxgen.loaders.llama_pre_tokenizer`` reproduces; the few that need llama.cpp's other
hand-written scanners (``UNSUPPORTED_PRE_TOKENIZERS``) are refused, as is a name llama.cpp does
not know.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from jaxgen.loaders.llama_pre_tokenizer import (
    CASED_CONTRACTIONS,
    GPT2_REGEX,
    LLAMA3_REGEX,
    NEWLINES_REGEX,
    QWEN2_REGEX,
    QWEN35_REGEX,
)

_CJK = "[一-龥ࠀ-一가-퟿]+"
_SPLIT_WORDS = r" ?[^(\s|.,!?…。，、।۔،)]+"
_CASE_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    + r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    + r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    + r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK3 = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_REGEXES = {
    "llama3": (LLAMA3_REGEX,),
    "jais2": (
        CASED_CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
        r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
    ),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
        "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
        "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
        "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
        "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
        "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
        "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
        "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
        "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
        "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
        "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
        "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
        "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
        "\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-v3": (r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", _DEEPSEEK3),
    "spark2_5": (
        r"\p{N}{1,3}",
        "[一-龥぀-ゟ゠-ヿ]+",
        r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
        r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
        r"\p{N}",
    ),
    "youtu": (
        "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
        + CASED_CONTRACTIONS
        + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        + CASED_CONTRACTIONS
        + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, "[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", GPT2_REGEX),
    "gpt2": (GPT2_REGEX,),
    "qwen2": (QWEN2_REGEX,),
    "qwen35": (QWEN35_REGEX,),
    "bloom": (_SPLIT_WORDS,),
    "viking": (_SPLIT_WORDS, r"\p{N}"),
    "tekken": (
        r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
        r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
        r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "chameleon": (
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        r"([\t\n]|    |  )",
        r"\p{N}",
        r"[\p{P}!-/:-@\[-`{-~]",
        GPT2_REGEX,
    ),
    "gpt-4o": (_CASE_SPLIT,),
    "granite-embed-multi": (_CASE_SPLIT.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])"),),
    "bailingmoe": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "seed-coder": (
        CASED_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "ufakzeka": (
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "laguna": (NEWLINES_REGEX, QWEN2_REGEX),
    "exaone-moe": (
        CASED_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "minicpm5": (
        r"\p{N}{1,3}",
        CASED_CONTRACTIONS
        + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", "[0-9][0-9][0-9]"),
}


@dataclass(frozen=True)
class PreTokenizer:
    """What a ``tokenizer.ggml.pre`` name sets in llama.cpp: its regexes and the vocabulary
    options it changes."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is a token is that token, merges or not
    add_bos: bool = False  # the default of tokenizer.ggml.add_bos_token
    no_bos: bool = False  # the vocabulary has no BOS token unless the file names one


def _names(regexes: str, names: str, **options) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names.split(), PreTokenizer(_REGEXES[regexes], **options))


# Every name llama.cpp's vocabulary loader accepts for a byte-level BPE vocabulary.
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_names("default", "default"),
    **_names("minicpm5", "minicpm5", ignore_merges=True),
    **_names(
        "llama3",
        "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
        ignore_merges=True,
        add_bos=True,
    ),
    **_names("deepseek-llm", "deepseek-llm"),
    **_names("deepseek-coder", "deepseek-coder"),
    **_names("deepseek-v3", "deepseek-v3 hunyuan-dense hy_v4 joyai-llm"),
    **_names("spark2_5", "spark2_5"),
    **_names("youtu", "youtu", ignore_merges=True),
    **_names("falcon", "falcon"),
    **_names("starcoder", "starcoder refact command-r smollm codeshell exaone minerva-7b mellum2"),
    **_names(
        "gpt2",
        "mpt gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum "
        "modern-bert jina-v1-en jina-v2-code roberta-bpe olmo jais exaone4 trillion "
        "granite-docling",
    ),
    **_names("jais2", "jais-2"),
    **_names("qwen2", "qwen2 deepseek-r1-qwen kormo f2llmv2 stablelm2 megrez hunyuan solar-open"),
    **_names("qwen35", "qwen35"),
    **_names("llama3", "dbrx smaug-bpe"),
    **_names("bloom", "poro-chat bloom gpt3-finnish"),
    **_names("llama3", "chatglm-bpe", no_bos=True),
    **_names("llama3", "glm4 glm5", no_bos=True, ignore_merges=True),
    **_names("viking", "viking"),
    **_names("tekken", "tekken", ignore_merges=True, add_bos=True),
    **_names("chameleon", "chameleon", add_bos=True),
    **_names("gpt-4o", "gpt-4o llama4 kanana2 talkie minimax-m2"),
    **_names("granite-embed-multi", "granite-embed-multi-97m", ignore_merges=True),
    **_names("bailingmoe", "bailingmoe bailingmoe2 llada-moe"),
    **_names("seed-coder", "seed-coder"),
    **_names("ufakzeka", "ufakzeka"),
    **_names("qwen2", "grok-2"),
    **_names("laguna", "laguna"),
    **_names("exaone-moe", "exaone-moe"),
}
# Names llama.cpp knows whose split needs another of its hand-written scanners (Kimi-K2's Han
# handling, AFMoE's and Tiny Aya's digit grouping), a zero-width split (SuperBPE), or its
# SentencePiece-style BPE on raw UTF-8 (Gemma 4, Sarvam).
UNSUPPORTED_PRE_TOKENIZERS = frozenset(
    "kimi-k2 afmoe tiny_aya cohere2moe superbpe gemma4 granite-embed-multi-311m "
    "sarvam-moe whitespace".split()
)


def pre_tokenizer(name: str | None) -> PreTokenizer:
    """The pre-tokenizer llama.cpp uses for ``tokenizer.ggml.pre = name``.

    Raises:
        ValueError: a name llama.cpp does not know, or one whose split is not reproduced here.
    """
    if name is None:  # llama.cpp: "missing pre-tokenizer type, using: 'default'"
        warnings.warn(
            "GGUF file has no tokenizer.ggml.pre: using llama.cpp's 'default' split, as it "
            "does (its warning: generation quality will be degraded)",
            stacklevel=3,
        )
        return PRE_TOKENIZERS["default"]
    found = PRE_TOKENIZERS.get(name)
    if found is not None:
        return found
    if name in UNSUPPORTED_PRE_TOKENIZERS:
        raise ValueError(
            f"GGUF tokenizer.ggml.pre {name!r} is not supported: jaxgen does not reproduce "
            "llama.cpp's split for it"
        )
    raise ValueError(
        f"unknown GGUF tokenizer.ggml.pre {name!r} (llama.cpp refuses it too); known: "
        f"{', '.join(sorted(PRE_TOKENIZERS))}"
    )
