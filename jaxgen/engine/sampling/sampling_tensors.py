"""Host side of sampling: per-request parameters packed into padded arrays (``SamplingTensors``)
plus static ``SamplingFlags`` for the jitted step. Plain numpy; see ``sampler.py`` for the device side.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np

from jaxgen.engine.compiled.buckets import next_power_of_two
from jaxgen.sampling_params import SamplingParams

GREEDY_TEMPERATURE = 1e-5  # temperatures below this are greedy (vLLM's _SAMPLING_EPS)
_MIN_HISTORY_BUCKET = 16
_MIN_BANNED_BUCKET = 4
_MIN_BIAS_BUCKET = 4
_UINT32_MASK = 0xFFFFFFFF
_UINT64_MASK = (1 << 64) - 1


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling parameters for a batch of B rows (padding rows are greedy).

    Numpy arrays on the host (:func:`build_sampling_tensors`), jax arrays inside the jitted step.
    """

    temperature: jax.Array  # [B] f32; < GREEDY_TEMPERATURE means greedy
    top_k: jax.Array  # [B] i32; 0 = off
    top_p: jax.Array  # [B] f32; 1 = off
    min_p: jax.Array  # [B] f32; 0 = off
    repetition_penalty: jax.Array  # [B] f32; 1 = off
    presence_penalty: jax.Array  # [B] f32; 0 = off
    frequency_penalty: jax.Array  # [B] f32; 0 = off
    seeds: jax.Array  # [B] uint32
    has_seed: jax.Array  # [B] bool; False: the seed was derived on the host for this step
    steps: jax.Array  # [B] i32; tokens generated so far by the row's sequence
    banned_token_ids: jax.Array  # [B, K] i32, padded with -1
    prompt_token_ids: jax.Array  # [B, Lp] i32, padded with -1; Lp = 0 without penalties
    output_token_ids: jax.Array  # [B, Lo] i32, padded with -1; Lo = 0 without penalties
    # Constrained decoding (``grammar_masks``): packed allowed tokens, bit j of word w = token
    # 32 * w + j; W = 0 when no row is constrained. Only rows flagged ``constrained`` are masked.
    token_bitmask: jax.Array  # [B, W] i32
    constrained: jax.Array  # [B] bool
    logit_bias_ids: jax.Array  # [B, K] i32, padded with -1; K = 0 when no row has a logit_bias
    logit_bias_values: jax.Array  # [B, K] f32, added to those tokens' logits
    # [B] i32; top logprobs the row returns (0: the sampled token's alone; -1: no logprobs)
    num_logprobs: jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingFlags:
    """Static (hashable) facts about a batch, so the jitted step only does the needed work.

    ``any_*`` only consider rows that sample (not greedy ones), except ``any_penalties``.
    ``masks``: the logit-bias, ban and grammar-mask stages are traced (where their tensors
    have width). ``host_checked``: the host has read the batch, so ``all_greedy=False`` means a
    row samples, and no run-time check of the rows is traced.
    """

    all_greedy: bool = True
    any_top_k: bool = False
    any_top_p: bool = False
    any_min_p: bool = False
    any_penalties: bool = False
    num_logprobs: int = 0  # largest top-logprobs count requested in the batch; 0 if none
    masks: bool = True
    host_checked: bool = False


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplerOutput:
    """Sampled tokens and their log-probabilities under the raw logits."""

    token_ids: jax.Array  # [B] i32
    logprobs: jax.Array  # [B] f32; log_softmax(raw logits) at token_ids
    top_token_ids: jax.Array  # [B, num_logprobs] i32; most likely tokens under the raw logits
    top_logprobs: jax.Array  # [B, num_logprobs] f32; descending


@dataclasses.dataclass
class SamplingRow:
    """One running sequence as the host sees it at this step.

    Args:
        params: the request's sampling parameters.
        prompt_token_ids: prompt tokens (only read when the row uses a penalty).
        output_token_ids: tokens generated so far (their count is the row's step).
        banned_token_ids: tokens forbidden at this step (see :func:`min_tokens_banned_ids`).
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    banned_token_ids: Sequence[int] = ()


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------


def min_tokens_banned_ids(
    params: SamplingParams, num_generated: int, eos_token_ids: Sequence[int]
) -> list[int]:
    """Tokens to ban while fewer than ``min_tokens`` were generated: stop ids, and EOS unless
    ``ignore_eos`` (vLLM's min_tokens processor)."""
    if num_generated >= params.min_tokens:
        return []
    banned = set(params.stop_token_ids or ())
    if not params.ignore_eos:
        banned.update(eos_token_ids)
    return sorted(banned)


def is_greedy(params: SamplingParams) -> bool:
    """Whether the request takes the argmax (temperature ~0 or top_k == 1)."""
    return params.temperature < GREEDY_TEMPERATURE or params.top_k == 1


def uses_penalties(params: SamplingParams) -> bool:
    """Whether the request needs its token history on the device."""
    return (
        params.repetition_penalty != 1.0
        or params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
    )


def build_sampling_tensors(
    rows: Sequence[SamplingRow | tuple],
    batch_size: int,
    *,
    base_seed: int,
    step_counter: int,
) -> tuple[SamplingTensors, SamplingFlags]:
    """Pack per-row parameters into numpy arrays padded to ``batch_size`` rows.

    Args:
        rows: one :class:`SamplingRow` (or a tuple of its fields) per running sequence.
        batch_size: number of rows to pad to (padding rows are greedy and unpenalised).
        base_seed: engine seed; rows without a seed get one derived from
            ``(base_seed, step_counter, row index)`` so they differ between steps.
        step_counter: engine step number.

    Returns:
        The tensors (numpy arrays, to ``device_put``) and the flags (a static jit argument).
        History and banned-token widths are padded to powers of two to limit recompiles.
    """
    rows = [row if isinstance(row, SamplingRow) else SamplingRow(*row) for row in rows]
    if len(rows) > batch_size:
        raise ValueError(f"{len(rows)} rows do not fit in a batch of {batch_size}")

    greedy = [is_greedy(row.params) for row in rows]
    penalised = [uses_penalties(row.params) for row in rows]
    scalars = _scalar_columns(rows, batch_size, base_seed, step_counter)

    banned_width = max((len(row.banned_token_ids) for row in rows), default=0)
    banned_width = next_power_of_two(banned_width, _MIN_BANNED_BUCKET) if banned_width else 0
    banned_token_ids = _pad_ids([row.banned_token_ids for row in rows], batch_size, banned_width)

    # Only rows that use a penalty carry their history; the others stay all -1.
    prompts = [
        row.prompt_token_ids if uses else () for row, uses in zip(rows, penalised, strict=True)
    ]
    outputs = [
        row.output_token_ids if uses else () for row, uses in zip(rows, penalised, strict=True)
    ]
    prompt_width = output_width = 0
    if any(penalised):
        prompt_width = next_power_of_two(max(len(ids) for ids in prompts), _MIN_HISTORY_BUCKET)
        output_width = next_power_of_two(max(len(ids) for ids in outputs), _MIN_HISTORY_BUCKET)
    prompt_token_ids = _pad_ids(prompts, batch_size, prompt_width)
    output_token_ids = _pad_ids(outputs, batch_size, output_width)

    sampling = [row.params for row, row_greedy in zip(rows, greedy, strict=True) if not row_greedy]
    flags = SamplingFlags(
        all_greedy=not sampling,
        any_top_k=any(params.top_k > 0 for params in sampling),
        any_top_p=any(params.top_p < 1.0 for params in sampling),
        any_min_p=any(params.min_p > 0.0 for params in sampling),
        any_penalties=any(penalised),
        num_logprobs=max((row.params.logprobs or 0 for row in rows), default=0),
    )
    bias_ids, bias_values = _logit_bias_table([row.params.logit_bias for row in rows], batch_size)
    tensors = SamplingTensors(
        *scalars,
        banned_token_ids,
        prompt_token_ids,
        output_token_ids,
        token_bitmask=np.zeros((batch_size, 0), np.int32),  # grammar_masks fills it when needed
        constrained=np.zeros(batch_size, np.bool_),
        logit_bias_ids=bias_ids,
        logit_bias_values=bias_values,
        num_logprobs=np.array(
            [-1 if row.params.logprobs is None else row.params.logprobs for row in rows]
            + [-1] * (batch_size - len(rows)),
            np.int32,
        ),
    )
    return tensors, flags


# SamplingTensors' per-row scalars, in field order (temperature ... steps): their dtypes, and
# the values of a padding row (greedy, unpenalised).
_SCALAR_DTYPES = (
    (np.float32, np.int32, np.float32, np.float32)  # temperature, top_k, top_p, min_p
    + (np.float32, np.float32, np.float32)  # repetition, presence, frequency penalties
    + (np.uint32, np.bool_, np.int32)  # seeds, has_seed, steps
)
_PADDING_SCALARS = (0.0, 0, 1.0, 0.0) + (1.0, 0.0, 0.0) + (0, False, 0)


def _params_scalars(params: SamplingParams) -> tuple:
    """A request's filters and penalties, in ``SamplingTensors``' field order."""
    if is_greedy(params):  # temperature 0 and every filter off, as vLLM does for greedy requests
        filters = (0.0, 0, 1.0, 0.0)
    else:
        top_k = min(params.top_k, np.iinfo(np.int32).max)
        filters = (params.temperature, top_k, params.top_p, params.min_p)
    return (*filters, params.repetition_penalty, params.presence_penalty, params.frequency_penalty)


def _scalar_columns(
    rows: list[SamplingRow], batch_size: int, base_seed: int, step_counter: int
) -> list[np.ndarray]:
    """``SamplingTensors``' per-row scalars (temperature ... steps) of ``rows`` padded to
    ``batch_size``: each distinct params object read once, unseeded rows' seeds derived in bulk."""
    by_params: dict[int, tuple] = {}
    values, seeds, has_seed = [], [], []
    for row in rows:
        params = row.params
        scalars = by_params.get(id(params))
        if scalars is None:
            seed = None if params.seed is None else _fold_seed(params.seed)
            scalars = by_params[id(params)] = (_params_scalars(params), seed)
        values.append(scalars[0])
        seeds.append(scalars[1] or 0)
        has_seed.append(scalars[1] is not None)
    count = len(rows)
    padding = _PADDING_SCALARS[:7]
    table = np.array(values + [padding] * (batch_size - count), np.float64).reshape(batch_size, 7)
    seed_column = np.zeros(batch_size, np.uint32)
    seed_column[:count] = seeds
    seeded = np.zeros(batch_size, np.bool_)
    seeded[:count] = has_seed
    unseeded = np.flatnonzero(~seeded[:count])
    if len(unseeded):
        seed_column[unseeded] = _derived_seeds(base_seed, step_counter, unseeded)
    steps = np.zeros(batch_size, np.int32)
    steps[:count] = [len(row.output_token_ids) for row in rows]
    columns = [table[:, i].astype(dtype) for i, dtype in enumerate(_SCALAR_DTYPES[:7])]
    return [*columns, seed_column, seeded, steps]


def _logit_bias_table(
    biases: Sequence[dict[int, float] | None], batch_size: int
) -> tuple[np.ndarray, np.ndarray]:
    """[batch_size, K] ids (-1 padded) and values of each row's ``logit_bias``; K is a power of
    two (at least ``_MIN_BIAS_BUCKET``), 0 when no row has one."""
    width = max((len(bias) for bias in biases if bias), default=0)
    width = next_power_of_two(width, _MIN_BIAS_BUCKET) if width else 0
    ids = np.full((batch_size, width), -1, np.int32)
    values = np.zeros((batch_size, width), np.float32)
    for index, bias in enumerate(biases):
        if bias:
            ids[index, : len(bias)] = list(bias)
            values[index, : len(bias)] = list(bias.values())
    return ids, values


# The fill of each [B, W] field's padding columns: no id, no bias, every token allowed.
_WIDTH_FILLS = {"logit_bias_values": 0.0}


def concat_rows(first: SamplingTensors, second: SamplingTensors) -> SamplingTensors:
    """The rows of ``first`` then those of ``second`` (numpy, as ``build_sampling_tensors``
    makes them); a [B, W] field of two widths is padded to the wider (-1: no id, every token
    allowed; no bias)."""
    fields = {}
    for field in dataclasses.fields(SamplingTensors):
        a, b = getattr(first, field.name), getattr(second, field.name)
        if a.ndim == 2 and a.shape[1] != b.shape[1]:
            width = max(a.shape[1], b.shape[1])
            fill = _WIDTH_FILLS.get(field.name, -1)
            a, b = (
                np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=fill) for x in (a, b)
            )
        fields[field.name] = np.concatenate([a, b])
    return SamplingTensors(**fields)


def take_rows(tensors: SamplingTensors, count: int) -> SamplingTensors:
    """The first ``count`` rows of ``tensors`` (numpy)."""
    return SamplingTensors(
        **{f.name: getattr(tensors, f.name)[:count] for f in dataclasses.fields(SamplingTensors)}
    )


def _pad_ids(id_lists: Sequence[Sequence[int]], batch_size: int, width: int) -> np.ndarray:
    """Stack id lists into a [batch_size, width] int32 array padded with -1."""
    out = np.full((batch_size, width), -1, np.int32)
    for index, ids in enumerate(id_lists):
        if len(ids):
            out[index, : len(ids)] = ids
    return out


def _splitmix64(value: int) -> int:
    value = (value + 0x9E3779B97F4A7C15) & _UINT64_MASK
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _UINT64_MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _UINT64_MASK
    return value ^ (value >> 31)


def _fold_seed(seed: int) -> int:
    """A user seed (any Python int) folded into 32 bits."""
    seed &= _UINT64_MASK
    return (seed ^ (seed >> 32)) & _UINT32_MASK


def _derived_seeds(base_seed: int, step_counter: int, rows: np.ndarray) -> np.ndarray:
    """``_derived_seed`` of each of ``rows`` (row indices), in bulk: [R] uint32."""
    value = _splitmix64(base_seed & _UINT64_MASK)
    value = _splitmix64(value ^ (step_counter & _UINT64_MASK))
    value = np.uint64(value) ^ rows.astype(np.uint64)
    value = value + np.uint64(0x9E3779B97F4A7C15)
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    value = value ^ (value >> np.uint64(31))
    return ((value ^ (value >> np.uint64(32))) & np.uint64(_UINT32_MASK)).astype(np.uint32)


def _derived_seed(base_seed: int, step_counter: int, row: int) -> int:
    """A 32-bit seed for an unseeded row, different for every (base_seed, step, row)."""
    value = _splitmix64(base_seed & _UINT64_MASK)
    value = _splitmix64(value ^ (step_counter & _UINT64_MASK))
    value = _splitmix64(value ^ (row & _UINT64_MASK))
    return _fold_seed(value)
