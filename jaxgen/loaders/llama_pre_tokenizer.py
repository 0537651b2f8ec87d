"""How llama.cpp splits text into words before byte-level BPE (``unicode_regex_split``).

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
a later one, so only codepoints assigned since then can differ). Which regexes a
``tokenizer.ggml.pre`` name means: ``jaxgen.loaders.llama_pre_tokenizers``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
import warnings

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
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
CASED_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
LLAMA3_REGEX = (
    CASED_CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    CASED_CONTRACTIONS
    + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN35_REGEX = (
    CASED_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
NEWLINES_REGEX = r"[^\n]+|[\n]+"
_SCANNER_OF = {
    GPT2_REGEX: "gpt2",
    LLAMA3_REGEX: "llama3",
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)" + LLAMA3_REGEX[len(CASED_CONTRACTIONS) :]: "llama3",
    QWEN2_REGEX: "qwen2",
    QWEN35_REGEX: "qwen35",
    NEWLINES_REGEX: "newlines",
}


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
