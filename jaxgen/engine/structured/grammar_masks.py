"""Constrained decoding on the host: grammars compiled (and cached) with llguidance, one matcher
per constrained sequence, and the packed token bitmask of a step's sampling rows.

The device side is ``logit_processors.apply_token_bitmask``: a row whose ``constrained`` flag
is set keeps only the tokens whose bit is 1 (bit ``j`` of word ``w`` is token ``32 * w + j``).
A step without a constrained row carries a bitmask of width 0 here; the runner gives every
step the same shape (``sampling_shapes``), and the sampler skips the mask when no row is
constrained.

A matcher advances on each token its sequence keeps. Preemption recomputes a sequence from its
tokens without dropping generated ones, so the matcher stays where it was; a sequence whose
grammar admits no further token (only EOS) finishes with ``"stop"``, one whose matcher refuses
its token (llguidance's parser out of its limits) with ``"error"`` (``GrammarMasks.error``
says why). Speculative decoding (``draft_masks``) advances a matcher through a draft to
compute the mask at each draft position, and rolls it back at once.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import json
import logging
import threading
import time
from typing import TYPE_CHECKING

import numpy as np

from jaxgen.engine.step.step_batch import StepBatch
from jaxgen.engine.structured.grammar_threads import GrammarThreads, default_grammar_threads
from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.limits import StructuredOutputLimits, check_constraint
from jaxgen.structured_outputs.relaxations import RELAXED_OPTIONS, relaxed_keywords

if TYPE_CHECKING:  # imported on first use: ``import jaxgen`` and an unconstrained run skip it
    import llguidance

logger = logging.getLogger(__name__)

MAX_CACHED_GRAMMARS = 256
DRY_RUN_TOKENS = 32  # tokens ``GrammarCompiler.dry_run`` follows a new grammar for
# Texts the dry run takes first when allowed (closers first): it leaves strings and values
# early and reaches the grammar's later structure (a JSON object's next properties).
DRY_RUN_PREFERRED = ('"', "}", "]", ",", ":", "{", "[")
# Compact JSON (no free whitespace between tokens): a sampled model cannot wander into
# whitespace until max_tokens, and the output stays short.
JSON_OPTIONS = {"whitespace_flexible": False}


@functools.cache
def _llguidance():
    """The ``llguidance`` module, imported on first use (its import takes a fraction of a
    second that a run without a grammar need not pay)."""
    import llguidance

    return llguidance


def llguidance_tokenizer(tokenizer, n_vocab: int, eos_token_ids) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for ``tokenizer``: its own when it builds one (a GGUF file's
    ``GGUFTokenizer``: llama.cpp's token bytes and tokenization), from its ``tokenizers`` JSON
    when it decodes with its backend (``PlainTokenizer``: no transformers import), else through
    ``llguidance.hf`` (a transformers fast tokenizer)."""
    own = getattr(tokenizer, "llguidance_tokenizer", None)
    if own is not None:
        return own(n_vocab, eos_token_ids)
    llg = _llguidance()
    if getattr(type(tokenizer), "decodes_with_backend", False):
        # As llguidance.hf.from_tokenizer does: the backend serialised without padding or
        # truncation, EOS the tokenizer's own unless given.
        backend = tokenizer.backend_tokenizer
        if backend.padding is not None or backend.truncation is not None:
            backend = copy.copy(backend)
            backend.no_padding()
            backend.no_truncation()
        eos = eos_token_ids or tokenizer.eos_token_id
        return llg.LLTokenizer(backend.to_str(), n_vocab=n_vocab, eos_token=eos)
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=eos_token_ids or None)


@functools.cache
def parser_limits():
    """llguidance's own limits, with short errors (no parser state dump: they go to clients)."""
    return _llguidance().LLParserLimits(verbose_errors=False)


def bitmask_width(vocab_size: int) -> int:
    """int32 words per row of a packed bitmask over ``vocab_size`` tokens."""
    return (vocab_size + 31) // 32


class GrammarCompiler:
    """Turns ``StructuredOutputsParams`` into ready llguidance matchers, cached by constraint.

    ``build`` checks a constraint against ``StructuredOutputLimits``, compiles it, and follows
    it for a few tokens (``dry_run``), so a constraint llguidance cannot follow is refused here
    (``ValueError`` naming its field) rather than failing a request mid-output. It runs on
    ``GrammarThreads`` (a large stack: a grammar that still recursed too deep would kill the
    process on a default one); ``compile`` does that and waits. The llguidance tokenizer is
    built on first use (about a second). Thread-safe: callers (the server, ``AsyncLLM``)
    compile off the engine's step loop, and hand the engine the matcher.
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
                self._llg_tokenizer = llguidance_tokenizer(
                    self.tokenizer, n_vocab, self.eos_token_ids
                )
            return self._llg_tokenizer

    @property
    def mask_width(self) -> int:
        """Words per row llguidance fills (its vocabulary may be wider than the logits)."""
        return bitmask_width(self.llg_tokenizer.vocab_size)

    @functools.cached_property
    def preferred_tokens(self) -> list[int]:
        """The ids of ``DRY_RUN_PREFERRED``'s texts that are one token each, in order."""
        ids = []
        for text in DRY_RUN_PREFERRED:
            encoded = self.tokenizer.encode(text, add_special_tokens=False)
            if len(encoded) == 1 and encoded[0] < self.vocab_size:
                ids.append(int(encoded[0]))
        return ids

    def cached(self, constraint: StructuredOutputsParams) -> llguidance.LLMatcher | None:
        """The pristine matcher of ``constraint`` if it was compiled before, else None."""
        key = constraint.key()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
            return cached

    def compile(
        self,
        constraint: StructuredOutputsParams,
        limits: StructuredOutputLimits | None = None,
        threads: GrammarThreads | None = None,
    ) -> llguidance.LLMatcher:
        """The pristine matcher of ``constraint`` (copy it before use): cached, or ``build``
        on ``threads`` (the process's default ones) and waited for."""
        cached = self.cached(constraint)
        if cached is not None:
            return cached
        return (threads or default_grammar_threads()).run(self.build, constraint, limits)

    def build(
        self, constraint: StructuredOutputsParams, limits: StructuredOutputLimits | None = None
    ) -> llguidance.LLMatcher:
        """Checks, compiles, dry-runs and caches ``constraint``'s matcher; call it on a
        ``GrammarThreads`` thread. A JSON schema llguidance refuses is compiled again with the
        keywords it cannot enforce left out (``jaxgen.structured_outputs.relaxations``;
        ``relaxed_keywords(matcher)`` names them). Raises ``ValueError`` naming the
        constraint's field (``json``, ``regex``, ...): a constraint over ``limits``
        (``ConstraintTooLarge``), invalid JSON Schema or one refused even leniently, a regex or
        grammar that does not compile, one that admits no output, or one llguidance cannot
        follow."""
        check_constraint(constraint, limits or StructuredOutputLimits())
        tokenizer = self.llg_tokenizer  # built before the compile is timed
        start = time.perf_counter()
        matcher = _matcher(tokenizer, grammar_text(constraint))
        error = matcher.get_error() if matcher.is_error() else None
        if error and constraint.kind == "json":  # read leniently, and say so
            matcher = _relaxed_matcher(tokenizer, constraint)
            if not matcher.is_error():
                keywords = ", ".join(relaxed_keywords(matcher))
                logger.warning("a JSON schema compiled without enforcing %s", keywords)
            elif matcher.get_error() != error:  # what still fails, then what failed first
                error = f"{matcher.get_error()} (read leniently; strictly: {error})"
        if matcher.is_error():
            raise ValueError(f"{constraint.kind}: {_short(error)}")
        self.dry_run(constraint, matcher)
        with self._lock:
            self.compile_seconds += time.perf_counter() - start
            self.num_compiled += 1
            self._cache[constraint.key()] = matcher
            while len(self._cache) > MAX_CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return matcher

    def dry_run(self, constraint: StructuredOutputsParams, matcher: llguidance.LLMatcher) -> None:
        """Follows a copy of ``matcher`` for up to ``DRY_RUN_TOKENS`` tokens and raises
        ``ValueError`` if it fails: a schema that admits no value fails at once; one that
        makes llguidance's parser exceed its limits (``Current row has 5001 items``, ``too many
        expressions``) fails on its first lexemes, where a request would otherwise fail after
        its output began. Each step takes the first allowed ``DRY_RUN_PREFERRED`` text, else
        the lowest allowed id that is not EOS. Failures further in still end a request with
        ``finish_reason`` "error"."""
        probe = matcher.deep_copy()
        mask = np.zeros(self.mask_width, np.int32)
        eos = set(self.eos_token_ids)
        preferred = self.preferred_tokens
        for step in range(DRY_RUN_TOKENS):
            probe.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
            if probe.is_error():
                what = "admits no output" if step == 0 else "cannot be followed"
                raise ValueError(f"{constraint.kind}: {what} ({_short(probe.get_error())})")
            if probe.is_stopped():
                return
            bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
            allowed = np.flatnonzero(bits)
            tokens = [t for t in preferred if bits[t]]
            tokens += [t for t in allowed[allowed < self.vocab_size].tolist() if t not in eos]
            if not tokens:
                if step == 0 and not (set(allowed.tolist()) & eos):
                    raise ValueError(f"{constraint.kind}: admits no output")
                return
            if not probe.consume_token(tokens[0]):
                error = _short(probe.get_error())
                raise ValueError(f"{constraint.kind}: cannot be followed ({error})")


def _matcher(tokenizer: llguidance.LLTokenizer, grammar: str) -> llguidance.LLMatcher:
    return _llguidance().LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits())


def _relaxed_matcher(tokenizer, constraint: StructuredOutputsParams) -> llguidance.LLMatcher:
    """A refused JSON schema's lenient matcher; its dependencies too left out if they fail."""
    matcher = _matcher(tokenizer, grammar_text(constraint, relaxed=True))
    if matcher.is_error():
        unenforced = _matcher(tokenizer, grammar_text(constraint, relaxed=True, dependencies=False))
        matcher = matcher if unenforced.is_error() else unenforced
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


def grammar_text(constraint: StructuredOutputsParams, relaxed=False, dependencies=True) -> str:
    """llguidance's grammar for a constraint; ``relaxed``: a JSON schema's keywords llguidance
    cannot enforce are left out (``jaxgen.structured_outputs.relaxations``); ``dependencies``:
    its property dependencies enforced (``StructuredOutputsParams.schema``). Raises
    ``ValueError`` naming the field for text llguidance cannot even read (the matcher checks
    the rest)."""
    kind = constraint.kind
    try:
        if kind == "json":
            options = {**JSON_OPTIONS, **RELAXED_OPTIONS} if relaxed else JSON_OPTIONS
            return _llguidance().LLMatcher.grammar_from_json_schema(
                constraint.schema(dependencies), defaults=options
            )
        if kind == "json_object":
            return _llguidance().LLMatcher.grammar_from_json_schema(
                {"type": "object"}, defaults=JSON_OPTIONS
            )
        if kind == "regex":
            return _llguidance().LLMatcher.grammar_from_regex(constraint.regex)
        if kind == "choice":
            alternatives = " | ".join(
                json.dumps(choice, ensure_ascii=False) for choice in constraint.choice
            )
            # One lexeme, as a JSON enum: a rule of alternatives puts each in the parser's row
            # (over 2,000 is past llguidance's limit), and its compile grows quadratically.
            return _llguidance().LLMatcher.grammar_from_lark(
                f"start: CHOICE\nCHOICE: {alternatives}"
            )
        return _llguidance().grammar_from("grammar", constraint.grammar)  # Lark, or GBNF converted
    except ValueError as error:
        raise ValueError(f"{kind}: {_short(str(error))}") from None


def _short(message: str, limit: int = 500) -> str:
    message = " ".join(message.replace("<non-verbose/>", "").split())
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

    def add(self, seq_ids, pristine: llguidance.LLMatcher) -> None:
        """Gives each sequence its own copy of a compiled matcher (``n > 1``: one per sample)."""
        for seq_id in seq_ids:
            self.matchers[seq_id] = pristine.deep_copy()

    def release(self, seq_id: int) -> None:
        self.matchers.pop(seq_id, None)

    def attach(self, batch: StepBatch) -> StepBatch:
        """``batch`` with its bitmask filled for the rows whose sequence is constrained; the
        same batch when none is (its bitmask stays of width 0)."""
        if not self.matchers:
            return batch
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

    def draft_masks(self, seq_id: int, draft: list[int]) -> np.ndarray:
        """The masks [n + 1, W] of a constrained sequence's next n + 1 tokens along ``draft``
        (speculative decoding): row i is the mask after the first i draft tokens. n counts
        the draft tokens the grammar takes in order, up to the first it refuses and at most
        through the first that ends it (then row n allows only EOS). The matcher is advanced
        through them and rolled back: it is left where it was. [0, W] when the grammar refuses
        the draft's first token (nothing to verify)."""
        matcher = self.matchers[seq_id]
        start = time.perf_counter()
        valid = matcher.validate_tokens(draft)
        if valid == 0:
            return np.empty((0, self.compiler.mask_width), np.int32)
        masks = np.empty((valid + 1, self.compiler.mask_width), np.int32)  # [n + 1, W]
        row_bytes = masks.shape[1] * 4
        matcher.unsafe_compute_mask_ptr(masks[0].ctypes.data, row_bytes)
        consumed = 0
        for token in draft[:valid]:
            if not matcher.consume_token(token):
                break
            consumed += 1
            matcher.unsafe_compute_mask_ptr(masks[consumed].ctypes.data, row_bytes)
            if matcher.is_stopped():
                break
        matcher.rollback(consumed)
        self.stats.mask_seconds += time.perf_counter() - start
        self.stats.masked_rows += consumed + 1
        return masks[: consumed + 1]

    def advance(self, seq_id: int, token: int) -> str | None:
        """Feeds the token a sequence kept to its matcher. Returns ``"stop"`` once the grammar
        admits nothing more, ``"error"`` if the matcher refused the token, else None."""
        matcher = self.matchers.get(seq_id)
        if matcher is None:
            return None
        if not matcher.consume_token(token):
            return "error"
        return "stop" if matcher.is_stopped() else None

    def error(self, seq_id: int) -> str:
        """Why a sequence's matcher refused its token."""
        matcher = self.matchers.get(seq_id)
        message = matcher.get_error() if matcher is not None else ""
        return _short(message or "the grammar refused the sampled token")
