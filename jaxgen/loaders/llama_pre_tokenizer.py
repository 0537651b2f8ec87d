"""How llama.cpp splits text into words before byte-level BPE, by ``tokenizer.ggml.pre``.

llama.cpp does not run the regex of a model's ``tokenizer.json`` as written. Each pre-tokenizer
name maps to a list of regexes (applied one after the other, each inside the pieces the previous
one left); a few of those (GPT-2's, Llama 3's, Qwen 2's, Qwen 3.5's, a newline split) are
hand-written scanners, the rest run through ``std::regex`` on a "collapsed" copy of the text in
which every codepoint above 127 is one byte naming its Unicode category, and ``\\p{L}``, ``\\p{N}``,
... in the regex become classes of those bytes plus their ASCII members. So ``[^a-z]`` matches
every non-ASCII letter, ``\\s`` is llama.cpp's own whitespace set, and so on: this module does
the same collapse, and runs the result through Python's ``re`` (whose backtracking and
alternation order are ECMAScript's for these patterns), so the pieces are llama.cpp's.

Categories come from ``unicodedata`` (the running Python's Unicode version; llama.cpp's table is
a later one, so only codepoints assigned since then can differ). ``PRE_TOKENIZERS`` lists every
name llama.cpp accepts whose split this module reproduces; the few that need llama.cpp's other
hand-written scanners (``UNSUPPORTED_PRE_TOKENIZERS``) are refused, as is a name llama.cpp does
not know.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import warnings
from dataclasses import dataclass

# llama.cpp's whitespace (Unicode's White_Space property).
WHITESPACE = frozenset(
    [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B)]
    + [0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
)
# The byte a codepoint above 127 becomes in the collapsed text, by its category's first letter.
_COLLAPSED = {"N": "\xd1", "L": "\xd2", "P": "\xd3", "M": "\xd4", "S": "\xd5"}
_OTHER = "\xd0"
# What \p{..} becomes in a collapsed regex: the category's byte and its ASCII members.
_CATEGORY_CLASSES = {
    "N": "\xd1\x30-\x39",
    "L": "\xd2\x41-\x5a\x61-\x7a",
    "P": "\xd3\x21-\x23\x25-\x2a\x2c-\x2f\x3a-\x3b\x3f-\x40\\\x5b-\\\x5d\x5f\\\x7b\\\x7d",
    "M": "\xd4",
    "S": "\xd5\\\x24\\\x2b\x3c-\x3e\x5e\x60\\\x7c\\\x7e",
}
_PROPERTIES = {
    r"\p{N}": "N",
    r"\p{L}": "L",
    r"\p{P}": "P",
    r"\p{M}": "M",
    r"\p{S}": "S",
    r"\p{Lu}": "L",
    r"\p{Ll}": "L",
    r"\p{Lt}": "L",
    r"\p{Lm}": "L",
    r"\p{Lo}": "L",
}


class _CollapseTable(dict):
    """``str.translate`` table: codepoint -> its collapsed character, filled on first use."""

    def __missing__(self, codepoint: int) -> str:
        if codepoint < 128:
            value = chr(codepoint)
        elif codepoint in WHITESPACE:
            value = "\x0b"  # llama.cpp's stand-in for non-ASCII whitespace
        else:
            value = _COLLAPSED.get(unicodedata.category(chr(codepoint))[0], _OTHER)
        self[codepoint] = value
        return value


_COLLAPSE = _CollapseTable()


def collapse(text: str) -> str:
    """``text`` with every codepoint above 127 replaced by its category's byte (as a char)."""
    return text if text.isascii() else text.translate(_COLLAPSE)


# The hand-written scanners, as regexes over the collapsed text: L letters, N numbers, W
# whitespace, M marks. A trailing ``.`` is their "no match: one codepoint" step.
_L, _N, _W, _M = "A-Za-z\xd2", "0-9\xd1", "\t-\r ", "\xd4"
_CONTRACTIONS = "'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]"
_SPACES = rf"[{_W}]*[\r\n]+|[{_W}]+(?![^{_W}])|[{_W}]+|."
_SCANNERS = {
    "gpt2": rf"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_W}{_L}{_N}]+"
    rf"|[{_W}]+(?![^{_W}])|[{_W}]+|.",
    "llama3": rf"{_CONTRACTIONS}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}"
    rf"| ?[^{_W}{_L}{_N}]+[\r\n]*|{_SPACES}",
    "qwen2": rf"{_CONTRACTIONS}|[^\r\n{_L}{_N}]?[{_L}]+|[{_N}]"
    rf"| ?[^{_W}{_L}{_N}]+[\r\n]*|{_SPACES}",
    "qwen35": rf"{_CONTRACTIONS}|[^\r\n{_L}{_N}]?[{_L}{_M}]+|[{_N}]"
    rf"| ?[^{_W}{_L}{_M}{_N}]+[\r\n]*|{_SPACES}",
    "newlines": r"[^\n]+|\n+",
}

# llama.cpp's regexes (llama-vocab.cpp, llm_tokenizer_bpe), verbatim; the ones equal to a
# hand-written scanner's are run as that scanner, as llama.cpp does.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CASED = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CASED + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CASED + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35 = (
    _CASED + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_NEWLINES = r"[^\n]+|[\n]+"
_SCANNER_OF = {
    _GPT2: "gpt2",
    _LLAMA3: "llama3",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)" + _LLAMA3[len(_CASED) :]: "llama3",
    _QWEN2: "qwen2",
    _QWEN35: "qwen35",
    _NEWLINES: "newlines",
}
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
    "llama3": (_LLAMA3,),
    "jais2": (
        _CASED + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
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
        + _CASED
        + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
        + _CASED
        + r"?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "starcoder": (r"\p{N}", _GPT2),
    "gpt2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "qwen35": (_QWEN35,),
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
        _GPT2,
    ),
    "gpt-4o": (_CASE_SPLIT,),
    "granite-embed-multi": (_CASE_SPLIT.replace(r"(?=[\p{L}])", r"(?=[\p{L}\p{M}])"),),
    "bailingmoe": (
        r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "seed-coder": (
        _CASED + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "ufakzeka": (
        r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    ),
    "laguna": (_NEWLINES, _QWEN2),
    "exaone-moe": (
        _CASED + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
    ),
    "minicpm5": (
        r"\p{N}{1,3}",
        _CASED + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
        r"|\s+(?!\S)|\s+",
    ),
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
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


@functools.cache
def _compiled(regex: str) -> tuple[re.Pattern, bool, bool]:
    """(pattern, runs on the collapsed text, is a scanner: unmatched text is one codepoint
    each and never left between matches)."""
    scanner = _SCANNER_OF.get(regex)
    if scanner is not None:
        return re.compile(_SCANNERS[scanner], re.DOTALL | re.ASCII), True, True
    collapsed = any(name in regex for name in _PROPERTIES)
    if collapsed:
        if not regex.isascii():
            raise ValueError(f"regex mixes unicode categories and non-ASCII text: {regex!r}")
        regex = _collapse_regex(regex)
    with warnings.catch_warnings():  # "possible nested set" for ECMAScript's literal [ ~ |
        warnings.simplefilter("ignore", FutureWarning)
        return re.compile(_ecmascript_to_python(regex), re.ASCII), collapsed, False


def _collapse_regex(regex: str) -> str:
    """``\\p{..}`` replaced by its collapsed class (bracketed unless already in a class)."""
    out, inside, i = [], False, 0
    while i < len(regex):
        char = regex[i]
        if char == "[" and (i == 0 or regex[i - 1] != "\\"):
            inside = True
        elif char == "]" and inside and regex[i - 1] != "\\":
            inside = False
        elif regex.startswith("\\p{", i):
            close = regex.find("}", i + 3)
            category = _PROPERTIES.get(regex[i : close + 1])
            if close != -1 and category is not None:
                body = _CATEGORY_CLASSES[category]
                out.append(body if inside else f"[{body}]")
                i = close + 1
                continue
        out.append(char)
        i += 1
    return "".join(out)


def _ecmascript_to_python(regex: str) -> str:
    """ECMAScript's ``$`` (the end of the input only) outside classes as Python's ``\\Z``."""
    out, inside, escaped = [], False, False
    for char in regex:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            inside = True
        elif char == "]":
            inside = False
        elif char == "$" and not inside:
            char = r"\Z"
        out.append(char)
    return "".join(out)


def split_words(text: str, regexes: tuple[str, ...]) -> list[str]:
    """``text`` cut into the words llama.cpp's ``unicode_regex_split`` gives (before byte
    encoding): each regex splits the pieces the previous one left, a match and the text
    between two matches each a piece."""
    collapsed_text = None
    pieces = [(0, len(text))]
    for regex in regexes:
        pattern, collapsed, scanner = _compiled(regex)
        if collapsed:
            if collapsed_text is None:
                collapsed_text = collapse(text)
            source = collapsed_text
        else:  # llama.cpp's wide-character regex: non-ASCII whitespace read as \v
            source = text if text.isascii() else _wide(text)
        finditer = pattern.finditer
        new = []
        for start, end in pieces:
            if scanner:
                new.extend(m.span() for m in finditer(source, start, end))
                continue
            last = start
            for match in finditer(source, start, end):
                begin, stop = match.span()
                if begin > last:
                    new.append((last, begin))
                if stop > begin:
                    new.append((begin, stop))
                last = stop
            if last < end:
                new.append((last, end))
        pieces = new
    return [text[start:end] for start, end in pieces]


def _wide(text: str) -> str:
    return "".join("\x0b" if ord(c) > 0x7F and ord(c) in WHITESPACE else c for c in text)
