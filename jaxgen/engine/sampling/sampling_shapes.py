"""One shape for every sampling configuration: the engine's sampler runs a single executable per
row bucket, whatever its rows ask for (top-k, top-p, min-p, penalties, logit bias, bans,
logprobs, grammars).

``build_sampling_tensors`` sizes a batch's tensors to what its rows use (no penalty history
without penalties, no bias table without a ``logit_bias``) and ``SamplingFlags`` says which
stages run; each combination would be its own executable, compiled on the engine thread when
first met. ``SamplingShapes.fit`` pads those tensors to fixed widths instead, and the engine
samples with ``GENERAL_FLAGS`` (every stage on): the sampler skips at run time the stages no
row of the batch needs (``sampler._only_if``), so a greedy batch still costs an argmax. The
rows are padded to a few buckets (powers of 4 up to the sequence cap), so the engine compiles
one sampler per bucket, at start.

Widths: penalty histories cover ``max_model_len``; ``min_tokens`` bans (any number of stop
token ids) are folded into the grammar bitmask as forbidden tokens, which has the vocabulary's
width; the logit-bias table holds ``LOGIT_BIAS_WIDTH`` entries per row (a wider one takes the
next power of two, and compiles). Inputs no row uses are the same all-padding arrays each
step, placed on the device once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jaxgen.engine.compiled.buckets import next_power_of_two
from jaxgen.engine.sampling.sampling_tensors import (
    GREEDY_TEMPERATURE,
    SamplingFlags,
    SamplingTensors,
)

MAX_LOGPROBS = 20  # the most top logprobs a request may ask for (``SamplingParams.logprobs``)
LOGIT_BIAS_WIDTH = 1024  # logit_bias entries per row every step's table holds
# Every stage on: the flags of every sampling step the engine runs.
GENERAL_FLAGS = SamplingFlags(
    all_greedy=False,
    any_top_k=True,
    any_top_p=True,
    any_min_p=True,
    any_penalties=True,
    num_logprobs=MAX_LOGPROBS,
)
# A batch the host knows needs no penalty, logprobs, logit bias, ban or grammar mask, and
# that a row samples: the filters and the draw alone, no run-time conditional of the stages.
PLAIN_FLAGS = dataclasses.replace(
    GENERAL_FLAGS, any_penalties=False, num_logprobs=0, masks=False, host_checked=True
)


def all_greedy(tensors: SamplingTensors) -> bool:
    """Whether every row of a batch's (numpy) tensors takes the argmax (padding rows do)."""
    return bool(np.all((tensors.temperature < GREEDY_TEMPERATURE) | (tensors.top_k == 1)))


def host_flags(tensors: SamplingTensors) -> SamplingFlags:
    """The flags of a batch the host has read (its numpy tensors, before ``fit``), for a
    backend that runs a run-time conditional on the host (a GPU): ``PLAIN_FLAGS`` when no row
    needs a penalty, logprobs, a logit bias, a ban or a grammar mask, else ``GENERAL_FLAGS``;
    either with ``all_greedy`` when every row takes the argmax. An all-greedy plain batch
    samples without any conditional. At most four samplers per row bucket."""
    optional = (
        (tensors.repetition_penalty != 1.0).any()
        or (tensors.presence_penalty != 0.0).any()
        or (tensors.frequency_penalty != 0.0).any()
        or (tensors.num_logprobs > 0).any()
        or (tensors.logit_bias_ids >= 0).any()
        or (tensors.banned_token_ids >= 0).any()
        or tensors.constrained.any()
    )
    flags = GENERAL_FLAGS if optional else PLAIN_FLAGS
    return dataclasses.replace(flags, all_greedy=all_greedy(tensors))


# Each per-row field: a padding row's value (greedy, nothing to apply) and its dtype.
_ROW_FIELDS = {
    "temperature": (0.0, np.float32),
    "top_k": (0, np.int32),
    "top_p": (1.0, np.float32),
    "min_p": (0.0, np.float32),
    "repetition_penalty": (1.0, np.float32),
    "presence_penalty": (0.0, np.float32),
    "frequency_penalty": (0.0, np.float32),
    "seeds": (0, np.uint32),
    "has_seed": (False, np.bool_),
    "steps": (0, np.int32),
    "constrained": (False, np.bool_),
    "num_logprobs": (-1, np.int32),
}


def row_buckets(seq_cap: int, growth: int = 4) -> tuple[int, ...]:
    """Sampler row counts: 4 and its multiples by ``growth`` below ``seq_cap``, then
    ``seq_cap`` (every step's row count, ``min(T, seq_cap)`` with ``T`` a power of two, fits
    one)."""
    buckets = []
    rows = 4
    while rows < seq_cap:
        buckets.append(rows)
        rows *= growth
    return (*buckets, seq_cap)


@dataclasses.dataclass
class SamplingShapes:
    """Fits a batch's ``SamplingTensors`` to the engine's fixed sampling shapes.

    Args:
        vocab_size: the logits' width.
        max_model_len: the longest sequence (the width of penalty histories).
        seq_cap: the most logits rows a step has.
        place: puts a numpy array on the device (the runner's placement); used once per
            all-padding input.
        growth: the ratio of one row bucket to the next (``row_buckets``).
    """

    vocab_size: int
    max_model_len: int
    seq_cap: int
    place: Callable[[np.ndarray], object] = np.asarray
    growth: int = 4
    _constants: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def buckets(self) -> tuple[int, ...]:
        return row_buckets(self.seq_cap, self.growth)

    @property
    def history_width(self) -> int:
        return next_power_of_two(self.max_model_len, 16)

    @property
    def bitmask_width(self) -> int:
        return (self.vocab_size + 31) // 32

    def rows_for(self, num_rows: int) -> int:
        """The row bucket of a batch of ``num_rows`` logits rows."""
        return next(bucket for bucket in self.buckets if bucket >= num_rows)

    def fit(self, tensors: SamplingTensors) -> SamplingTensors:
        """``tensors`` (numpy, as ``build_sampling_tensors`` and the grammar masks made them)
        padded to the row bucket and the fixed widths, ``min_tokens`` bans folded into the
        bitmask. A padding row samples greedily and applies nothing."""
        num_rows = tensors.temperature.shape[0]
        rows = self.rows_for(num_rows)
        fields = {}
        for name, (value, dtype) in _ROW_FIELDS.items():
            fields[name] = np.full(rows, value, dtype)
            fields[name][:num_rows] = getattr(tensors, name)
        for name in ("prompt_token_ids", "output_token_ids"):
            fields[name] = self._ids(name, getattr(tensors, name), rows, self.history_width)
        bias_ids = tensors.logit_bias_ids
        bias_width = max(LOGIT_BIAS_WIDTH, next_power_of_two(bias_ids.shape[1]))
        fields["logit_bias_ids"] = self._ids("logit_bias_ids", bias_ids, rows, bias_width)
        if (bias_ids >= 0).any():
            values = np.zeros((rows, bias_width), np.float32)
            values[:num_rows, : bias_ids.shape[1]] = tensors.logit_bias_values
            fields["logit_bias_values"] = values
        else:
            fields["logit_bias_values"] = self._constant("logit_bias_values", rows, bias_width, 0)
        fields["banned_token_ids"] = self._constant("banned_token_ids", rows, 0, -1)
        fields["token_bitmask"] = self._bitmask(tensors, rows, fields["constrained"])
        return SamplingTensors(**fields)

    # -- helpers --------------------------------------------------------------------------------
    def _ids(self, name: str, ids: np.ndarray, rows: int, width: int):
        """[rows, width] int32 ids padded with -1 (the device constant when all are padding)."""
        if not (ids >= 0).any():
            return self._constant(name, rows, width, -1)
        out = np.full((rows, width), -1, np.int32)
        out[: ids.shape[0], : ids.shape[1]] = ids
        return out

    def _bitmask(self, tensors: SamplingTensors, rows: int, constrained: np.ndarray):
        """[rows, W] int32 allowed-token words: the grammar's rows, and every row with bans
        (``constrained`` set for it), all-allowed elsewhere; the device constant when no row
        is constrained or banned."""
        banned = tensors.banned_token_ids
        banned_rows = np.flatnonzero((banned >= 0).any(axis=1)) if banned.size else []
        if not constrained.any() and not len(banned_rows):
            return self._constant("token_bitmask", rows, self.bitmask_width, -1)
        width = self.bitmask_width
        bitmask = np.full((rows, width), -1, np.int32)
        grammar = tensors.token_bitmask
        if grammar.shape[1]:
            bitmask[: grammar.shape[0]] = grammar[:, :width]
        words = bitmask.view(np.uint32)
        for row in banned_rows:
            ids = banned[row][(banned[row] >= 0) & (banned[row] < self.vocab_size)]
            np.bitwise_and.at(
                words[row], ids // 32, ~(np.uint32(1) << (ids % 32).astype(np.uint32))
            )
            constrained[row] = True
        return bitmask

    def _constant(self, name: str, rows: int, width: int, value):
        """The all-``value`` [rows, width] input of ``name``, placed on the device once."""
        key = (name, rows, width)
        array = self._constants.get(key)
        if array is None:
            dtype = np.float32 if name == "logit_bias_values" else np.int32
            array = self._constants[key] = self.place(np.full((rows, width), value, dtype))
        return array
