"""Constrained decoding on the host: grammars compiled (and cached) with llguidance, one matcher
per constrained sequence, and the packed token bitmask of a step's sampling rows.

The device side is ``sampler.apply_token_bitmask``: a row whose ``constrained`` flag is set keeps
only the tokens whose bit is 1 (bit ``j`` of word ``w`` is token ``32 * w + j``). A step without
a constrained row carries a bitmask of width 0, so it runs the unconstrained executable.

A matcher advances on each token its sequence keeps. Preemption recomputes a sequence from its
tokens without dropping generated ones, so the matcher stays where it was; a sequence whose
grammar admits no further token (only EOS) finishes with ``"stop"``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import threading
import time

import llguidance
import llguidance.hf
import numpy as np

from jaxgen.engine.step_batch import StepBatch
from jaxgen.structured_outputs import StructuredOutputsParams

MAX_CACHED_GRAMMARS = 256
# Compact JSON (no free whitespace between tokens): a sampled model cannot wander into
# whitespace until max_tokens, and the output stays short.
JSON_OPTIONS = {"whitespace_flexible": False}


def bitmask_width(vocab_size: int) -> int:
    """int32 words per row of a packed bitmask over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


class GrammarCompiler:
    """Turns ``StructuredOutputsParams`` into ready llguidance matchers, cached by constraint.

    The llguidance tokenizer is built on first use (about a second). ``compile`` is thread-safe:
    callers (the server, ``AsyncLLM``) compile off the engine's step loop, and the engine's own
    call then hits the cache.
    """

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size  # the model's logits width
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self._llg_tokenizer = None
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, llguidance.LLMatcher] = collections.OrderedDict()
        self.compile_seconds = 0.0
        self.num_compiled = 0

    @property
    def llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._llg_tokenizer is None:
                # At least the model's logits width: ids without a token are never allowed.
                n_vocab = max(self.vocab_size, len(self.tokenizer))
                self._llg_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=n_vocab, eos_token=self.eos_token_ids or None
                )
            return self._llg_tokenizer

    @property
    def mask_width(self) -> int:
        """Words per row llguidance fills (its vocabulary may be wider than the logits)."""
        return bitmask_width(self.llg_tokenizer.vocab_size)

    def compile(self, constraint: StructuredOutputsParams) -> llguidance.LLMatcher:
        """The pristine matcher of ``constraint`` (copy it before use). Raises ``ValueError``
        naming the constraint's field (``json``, ``regex``, ...) when llguidance refuses it:
        invalid or unsupported JSON Schema, a regex or grammar that does not compile."""
        key = constraint.key()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        tokenizer = self.llg_tokenizer
        start = time.perf_counter()
        grammar = grammar_text(constraint)
        matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"{constraint.kind}: {_short(matcher.get_error())}")
        with self._lock:
            self.compile_seconds += time.perf_counter() - start
            self.num_compiled += 1
            self._cache[key] = matcher
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return matcher


_COMPILERS: dict[tuple, GrammarCompiler] = {}
_COMPILERS_LOCK = threading.Lock()


def grammar_compiler(tokenizer, vocab_size: int, eos_token_ids) -> GrammarCompiler:
    """The compiler of a tokenizer and logits width, shared by every engine over them (replicas,
    ``AsyncLLM``, the server), so a grammar compiled anywhere is cached for all."""
    key = (id(tokenizer), vocab_size, tuple(eos_token_ids))
    with _COMPILERS_LOCK:
        compiler = _COMPILERS.get(key)
        if compiler is None:  # the compiler holds the tokenizer, so its id stays its own
            compiler = _COMPILERS[key] = GrammarCompiler(tokenizer, vocab_size, eos_token_ids)
        return compiler


def grammar_text(constraint: StructuredOutputsParams) -> str:
    """llguidance's grammar for a constraint. Raises ``ValueError`` naming the field for text
    llguidance cannot even read (the matcher checks the rest)."""
    kind = constraint.kind
    try:
        if kind == "json":
            return llguidance.LLMatcher.grammar_from_json_schema(
                constraint.json, defaults=JSON_OPTIONS
            )
        if kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=JSON_OPTIONS
            )
        if kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(constraint.regex)
        if kind == "choice":
            alternatives = " | ".join(
                json.dumps(choice, ensure_ascii=False) for choice in constraint.choice
            )
            return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
        return llguidance.grammar_from("grammar", constraint.grammar)  # Lark, or GBNF converted
    except ValueError as error:
        raise ValueError(f"{kind}: {_short(str(error))}") from None


def _short(message: str, limit: int = 500) -> str:
    message = " ".join(message.split())
    return message if len(message) <= limit else message[: limit - 3] + "..."


@dataclasses.dataclass
class GrammarStats:
    mask_seconds: float = 0.0  # host time filling bitmasks
    masked_rows: int = 0  # rows that carried a mask
    masked_steps: int = 0  # steps with at least one constrained row


class GrammarMasks:
    """The engine's matchers (one per constrained sequence) and each step's bitmask."""

    def __init__(self, compiler: GrammarCompiler):
        self.compiler = compiler
        self.matchers: dict[int, llguidance.LLMatcher] = {}  # seq_id -> its matcher
        self.stats = GrammarStats()

    def add(self, seq_ids, constraint: StructuredOutputsParams) -> None:
        """Gives each sequence its own matcher of ``constraint`` (``n > 1``: one per sample)."""
        pristine = self.compiler.compile(constraint)
        for seq_id in seq_ids:
            self.matchers[seq_id] = pristine.deep_copy()

    def release(self, seq_id: int) -> None:
        self.matchers.pop(seq_id, None)

    def attach(self, batch: StepBatch) -> StepBatch:
        """``batch`` with its bitmask filled for the rows whose sequence is constrained; the
        same batch when none is (its bitmask stays of width 0)."""
        rows = [
            (row, self.matchers[seq.seq_id])
            for row, seq in enumerate(batch.seqs)
            if seq is not None and seq.seq_id in self.matchers
        ]
        if not rows:
            return batch
        start = time.perf_counter()
        num_rows = len(batch.seqs)
        bitmask = np.full((num_rows, self.compiler.mask_width), -1, np.int32)  # [S, W]
        constrained = np.zeros(num_rows, np.bool_)  # [S]
        for row, matcher in rows:
            matcher.unsafe_compute_mask_ptr(bitmask[row].ctypes.data, bitmask.shape[1] * 4)
            constrained[row] = True
        batch = self.with_bitmask(batch, bitmask, constrained)
        self.stats.mask_seconds += time.perf_counter() - start
        self.stats.masked_rows += len(rows)
        self.stats.masked_steps += 1
        return batch

    def with_bitmask(self, batch: StepBatch, bitmask: np.ndarray, constrained) -> StepBatch:
        """``batch`` carrying ``bitmask`` [S, W] (cut to the logits' width) and flags [S]."""
        width = bitmask_width(self.compiler.vocab_size)
        if bitmask.shape[1] != width:  # the tokenizer is wider than the logits
            bitmask = np.ascontiguousarray(bitmask[:, :width])
        sampling = dataclasses.replace(
            batch.sampling, token_bitmask=bitmask, constrained=constrained
        )
        return dataclasses.replace(batch, sampling=sampling)

    def padding_bitmask(self, batch: StepBatch) -> StepBatch:
        """``batch`` with an all-allowed bitmask and no constrained row (precompiling)."""
        num_rows = len(batch.seqs)
        width = bitmask_width(self.compiler.vocab_size)
        return self.with_bitmask(
            batch, np.full((num_rows, width), -1, np.int32), np.zeros(num_rows, np.bool_)
        )

    def advance(self, seq_id: int, token: int) -> str | None:
        """Feeds the token a sequence kept to its matcher. Returns ``"stop"`` once the grammar
        admits nothing more, ``"error"`` if the matcher refused the token, else None."""
        matcher = self.matchers.get(seq_id)
        if matcher is None:
            return None
        if not matcher.consume_token(token):
            return "error"
        return "stop" if matcher.is_stopped() else None
