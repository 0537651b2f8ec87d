"""llama.cpp's ``llama_tokenize`` and ``llama_token_to_piece`` over a ``GGUFVocab``.

``encode`` follows llama-vocab.cpp step for step:

1. Special tokens are cut out of the text first (``tokenizer_st_partition``): every control,
   user-defined and unknown token, longest first, each found everywhere in what is still text;
   with ``parse_special=False`` only the user-defined ones. Their ``lstrip``/``rstrip``
   attributes eat the whitespace beside them.
2. Each text piece is tokenized on its own. SentencePiece (``llm_tokenizer_spm``): a space
   prefixed when ``add_space_prefix`` and the piece starts the text or follows a special token,
   spaces escaped to U+2581, then adjacent symbols merged best score first (leftmost on ties)
   while their concatenation is a token; what is not a token becomes its bytes' ``<0xXX>``
   tokens. Byte-level BPE (``llm_tokenizer_bpe``): the pre-tokenizer's words, each byte-mapped
   and merged lowest merge rank first (leftmost on ties), a word that is a token taken whole
   where the pre-tokenizer says to ignore merges.
3. BOS / EOS as ``add_bos`` / ``add_eos`` say, when ``add_special``.

Merging is exact, not approximate: a SentencePiece text is cut where no token can span the cut
(before a U+2581 that no token has a given character in front of), and results are kept per
word, which changes nothing but the time it takes.
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable

from jaxgen.loaders.gguf_vocab import (
    BYTE,
    CONTROL,
    LSTRIP,
    NORMAL,
    RSTRIP,
    UNKNOWN,
    USER_DEFINED,
    GGUFVocab,
)
from jaxgen.loaders.llama_pre_tokenizer import split_words

SPACE = "\u2581"  # SentencePiece's escaped space
_C_SPACE = " \t\n\v\f\r"  # C's isspace, which lstrip/rstrip use
_CACHE_LIMIT = 1 << 16
_PREFIX = 3  # characters special tokens are indexed by  # words kept per vocabulary before the cache starts over


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {byte: chr(byte) for byte in printable}
    extra = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def merge_symbols(symbols: list[str], priority: Callable[[str, str], float | None]) -> list[str]:
    """Repeatedly joins the adjacent pair of lowest ``priority`` (None: never), leftmost first
    on ties, as llama.cpp's work queue does; the symbols left, in order."""
    count = len(symbols)
    if count < 2:
        return symbols
    text = list(symbols)
    after = list(range(1, count + 1))
    after[-1] = -1
    before = list(range(-1, count - 1))
    heap = []
    for i in range(count - 1):
        rank = priority(text[i], text[i + 1])
        if rank is not None:
            heap.append((rank, i, text[i] + text[i + 1]))
    heapq.heapify(heap)
    while heap:
        _, left, merged = heapq.heappop(heap)
        right = after[left]
        # Outdated: one side was merged away or grew since the pair was queued.
        if right < 0 or not text[left] or text[left] + text[right] != merged:
            continue
        text[left], text[right] = merged, ""
        after[left] = after[right]
        if after[right] >= 0:
            before[after[right]] = left
        for a, b in ((before[left], left), (left, after[left])):
            if a >= 0 and b >= 0:
                rank = priority(text[a], text[b])
                if rank is not None:
                    heapq.heappush(heap, (rank, a, text[a] + text[b]))
    return [symbol for symbol in text if symbol]


class LlamaTokenize:
    """Text to ids and ids to bytes exactly as llama.cpp does for one vocabulary."""

    def __init__(self, vocab: GGUFVocab):
        self.vocab = vocab
        self.ids = {token: i for i, token in enumerate(vocab.tokens)}  # last id of a text wins
        self.spm = vocab.model == "llama"
        attrs = vocab.attrs
        # Special tokens in llama.cpp's partition order: longest (in bytes) first.
        marked = [i for i, a in enumerate(attrs) if a & (CONTROL | USER_DEFINED | UNKNOWN)]
        marked.sort(key=lambda i: -len(vocab.tokens[i].encode()))
        self._specials = marked
        # Special tokens by their first three characters (fewer for shorter ones), under
        # their first: where one can occur in a text is found without searching for each.
        self._by_prefix: dict[str, dict[str, list[int]]] = {}
        for rank, i in enumerate(marked):
            text = vocab.tokens[i]
            group = self._by_prefix.setdefault(text[0], {})
            group.setdefault(text[:_PREFIX], []).append(rank)
        self._words: dict[str, tuple[int, ...]] = {}
        if self.spm:
            scores = vocab.scores
            ids = self.ids
            # llama.cpp's bigram queue takes the best score first: the priority is its negative.
            self._priority = lambda a, b: -scores[ids[a + b]] if a + b in ids else None
            # Characters some token has right before a U+2581: a cut there could be spanned.
            self._joins_space = {
                t[k - 1] for t in vocab.tokens for k in _positions(t, SPACE) if k > 0
            }
        else:
            ranks: dict[tuple[str, str], int] = {}
            for rank, pair in enumerate(vocab.merges):
                ranks.setdefault(pair, rank)  # the first of a repeated merge counts
            self._priority = lambda a, b: ranks.get((a, b))
            alphabet = byte_alphabet()
            self._byte_map = str.maketrans({chr(b): c for b, c in alphabet.items()})
            self._unbyte = {c: b for b, c in alphabet.items()}
        self.pieces = [self._piece(i) for i in range(len(vocab.tokens))]
        self.hidden = [bool(a & (CONTROL | UNKNOWN)) for a in attrs]

    # -- text -> ids ---------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """``llama_tokenize(text, add_special, parse_special)``."""
        vocab = self.vocab
        out: list[int] = []
        if add_special and vocab.add_bos:
            out.append(vocab.bos_id)
        previous_special = True  # the first piece is prefixed as one after a special token
        for fragment in self.partition(text, parse_special) if text else ():
            if isinstance(fragment, int):
                out.append(fragment)
                previous_special = True
            elif self.spm:
                if vocab.add_space_prefix and previous_special:
                    fragment = " " + fragment
                self._spm(fragment.replace(" ", SPACE), out)
                previous_special = False
            else:
                for word in split_words(fragment, vocab.pre.regexes):
                    out.extend(self._bpe_word(word))
        if add_special and vocab.add_eos:
            out.append(vocab.eos_id)
        return out

    def partition(self, text: str, parse_special: bool) -> list[str | int]:
        """``tokenizer_st_partition``: the text as text pieces (str) and special tokens (int)."""
        fragments: list[str | int] = [text]
        tokens, attrs = self.vocab.tokens, self.vocab.attrs
        for i in self._candidates(text):
            attr = attrs[i]
            if not parse_special and attr & (CONTROL | UNKNOWN):
                continue
            special = tokens[i]
            new: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int) or special not in fragment:
                    new.append(fragment)
                    continue
                start = 0
                while (found := fragment.find(special, start)) != -1:
                    left = fragment[start:found]
                    if attr & LSTRIP:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        new.append(left)
                    new.append(i)
                    start = found + len(special)
                    if attr & RSTRIP:
                        while start < len(fragment) and fragment[start] in _C_SPACE:
                            start += 1
                if start < len(fragment):
                    new.append(fragment[start:])
            fragments = new
        return fragments

    def _candidates(self, text: str) -> list[int]:
        """The special tokens found in ``text``, in partition order."""
        by_prefix = self._by_prefix
        ranks: set[int] = set()
        for first in set(text) & by_prefix.keys():
            group, seen = by_prefix[first], set()
            start = text.find(first)
            while start != -1:
                for size in range(1, _PREFIX + 1):
                    prefix = text[start : start + size]
                    if prefix not in seen:
                        seen.add(prefix)
                        ranks.update(group.get(prefix, ()))
                start = text.find(first, start + 1)
        specials, tokens = self._specials, self.vocab.tokens
        return [specials[r] for r in sorted(ranks) if tokens[specials[r]] in text]

    def _spm(self, text: str, out: list[int]) -> None:
        words, joins = self._words, self._joins_space
        start = 0
        for cut in _positions(text, SPACE):
            if cut > start and text[cut - 1] not in joins:
                out.extend(words.get(text[start:cut]) or self._spm_word(text[start:cut]))
                start = cut
        if start < len(text):
            out.extend(words.get(text[start:]) or self._spm_word(text[start:]))

    def _spm_word(self, word: str) -> tuple[int, ...]:
        ids, out = self.ids, []
        for symbol in merge_symbols(list(word), self._priority):
            token = ids.get(symbol)
            if token is not None:
                out.append(token)
                continue
            for byte in symbol.encode():  # byte fallback: <0xXX>, else the byte itself
                token = ids.get(f"<0x{byte:02X}>")
                if token is None:
                    token = ids.get(chr(byte)) if byte < 128 else None
                if token is None:
                    token = self.vocab.unk_id  # llama.cpp fails here; unk as transformers
                if token is not None:
                    out.append(token)
        return self._keep(word, tuple(out))

    def _bpe_word(self, word: str) -> tuple[int, ...]:
        encoded = word.encode().decode("latin-1").translate(self._byte_map)
        found = self._words.get(encoded)
        if found is not None:
            return found
        ids = self.ids
        if self.vocab.pre.ignore_merges and encoded in ids:
            return self._keep(encoded, (ids[encoded],))
        out = []
        for symbol in merge_symbols(list(encoded), self._priority):
            token = ids.get(symbol)
            if token is not None:
                out.append(token)
                continue
            for byte in symbol.encode():  # as llama.cpp: single-byte texts that are tokens
                token = ids.get(chr(byte)) if byte < 128 else None
                if token is not None:
                    out.append(token)
        return self._keep(encoded, tuple(out))

    def _keep(self, word: str, ids: tuple[int, ...]) -> tuple[int, ...]:
        if len(self._words) >= _CACHE_LIMIT:
            self._words.clear()
        self._words[word] = ids
        return ids

    # -- ids -> text ---------------------------------------------------------------------------
    def _piece(self, i: int) -> bytes:
        """``llama_token_to_piece(i, special=True)``."""
        text, attr = self.vocab.tokens[i], self.vocab.attrs[i]
        if attr & (CONTROL | UNKNOWN | USER_DEFINED):
            return text.encode()
        if attr & NORMAL:
            if self.spm:
                return text.replace(SPACE, " ").encode()
            out = bytearray()
            for char in text:
                byte = self._unbyte.get(char)
                if byte is None:  # llama.cpp's marker for a character outside the alphabet
                    out += b"[UNK_BYTE_0x" + char.encode().hex().encode() + text.encode() + b"]"
                else:
                    out.append(byte)
            return bytes(out)
        if attr & BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def decode_bytes(self, ids: list[int], skip_special: bool) -> bytes:
        """The tokens' pieces joined (control and unknown tokens left out with
        ``skip_special``); with ``add_space_prefix``, the first piece's leading space dropped
        (the space ``encode`` prefixed)."""
        pieces, hidden, n = self.pieces, self.hidden, len(self.pieces)
        for i in ids:
            if not 0 <= i < n:
                raise ValueError(f"token id {i} is outside the vocabulary (0..{n - 1})")
        chosen = [pieces[i] for i in ids if not (skip_special and hidden[i])]
        if self.vocab.add_space_prefix and chosen and chosen[0][:1] == b" ":
            chosen[0] = chosen[0][1:]
        return b"".join(chosen)


def _positions(text: str, char: str) -> list[int]:
    out, start = [], text.find(char)
    while start != -1:
        out.append(start)
        start = text.find(char, start + 1)
    return out
