"""The attention kernel under test and the random ragged batches it is checked and timed on.

``attention_kernels`` finds the GPU ragged paged-attention kernel: ``pallas_kernels.gpu``'s when
that package exists, else ``pallas_kernels.ragged_paged_attention`` (one signature for both).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.gpu.floors import DecodeAttention
from jaxgen.quantization import kv_cache

KERNEL_MODULES = (
    "pallas_kernels.gpu.ragged_paged_attention",
    "pallas_kernels.gpu",
    "pallas_kernels",
)
STANDARD_OPTIONS = {"scale", "soft_cap", "sliding_window", "decode_only", "interpret"}
POOL_KINDS = ("bfloat16", "float32", "int8", "fp8")


@dataclasses.dataclass(frozen=True)
class Kernels:
    kernel: object  # ragged_paged_attention_gpu(q, k_pages, v_pages, kv_lens, tables, cu, n, ...)
    reference: object  # its pure-JAX reference, same signature
    module: str


def attention_kernels() -> Kernels:
    """The first of KERNEL_MODULES that exists and exports both functions. A module that
    exists but fails to import raises: a broken new kernel must not fall back silently."""
    for name in KERNEL_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name and name.startswith(error.name):
                continue  # the package itself is absent
            raise
        kernel = getattr(module, "ragged_paged_attention_gpu", None)
        reference = getattr(module, "ragged_paged_attention_reference", None)
        if callable(kernel) and callable(reference):
            return Kernels(kernel, reference, name)
    raise ImportError(f"no ragged paged-attention kernel in {KERNEL_MODULES}")


def tuning_variants(kernel, overrides: dict | list | None = None) -> dict[str, list] | list[dict]:
    """Tuning arguments worth timing: ``overrides`` when given (``{name: [values]}``, each value
    timed alone, or ``[{name: value, ...}, ...]``, each dict one variant of several arguments),
    else the kernel's keyword arguments whose names say a decode variant (``*dot*``, or the
    split merge's ``*merge*``: on and off) or a split count (``*split*``: 1, 4 and 16)."""
    if isinstance(overrides, list):
        return [dict(variant) for variant in overrides]
    if overrides:
        return {name: list(values) for name, values in overrides.items()}
    try:
        parameters = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return {}
    variants = {}
    for name, parameter in parameters.items():
        if parameter.kind != parameter.KEYWORD_ONLY or name in STANDARD_OPTIONS:
            continue
        if "dot" in name.lower() or "merge" in name.lower():
            variants[name] = [True, False]
        elif "split" in name.lower():
            variants[name] = [1, 4, 16]
    return variants


def variant_tunings(variants: dict[str, list] | list[dict], max_values: int | None) -> list[dict]:
    """The tuning dicts to time: each listed variant, or each value of each argument alone (its
    first ``max_values``)."""
    if isinstance(variants, list):
        return variants
    return [{name: value} for name, values in variants.items() for value in values[:max_values]]


@dataclasses.dataclass(frozen=True)
class CaseSpec:
    """One ragged batch: sequence s has ``q_lens[s]`` new tokens after ``context_lens[s]``."""

    name: str
    num_heads: int
    num_kv_heads: int
    head_dim: int
    pool: str  # one of POOL_KINDS
    q_lens: tuple[int, ...]
    context_lens: tuple[int, ...]
    soft_cap: float | None = None
    sliding_window: int | None = None
    # Every row a decode row and one row per sequence slot: the kernel's decode-only path (the
    # engine's decode steps), where a kernel has one.
    decode_only: bool = False
    # The kernel's own arguments (its tuning: e.g. the one-kernel split merge), which the
    # reference does not take; a kernel without one of them runs without it.
    tuning: tuple[tuple[str, object], ...] = ()

    @property
    def options(self) -> dict:
        return {"soft_cap": self.soft_cap, "sliding_window": self.sliding_window}


def kernel_tuning(kernel, tuning) -> dict:
    """The ``(name, value)`` pairs of ``tuning`` that ``kernel`` takes, as keyword arguments."""
    try:
        parameters = inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return {}
    return {name: value for name, value in tuning if name in parameters}


def decode_only_option(kernel) -> dict:
    """``{"decode_only": True}`` for a kernel that takes it, else nothing."""
    return kernel_tuning(kernel, (("decode_only", True),))


@dataclasses.dataclass
class Batch:
    """Kernel arguments, the float32 pools the reference reads, and which rows are real."""

    args: tuple  # (q, k_pages, v_pages, kv_lens, block_tables, cu_q_lens, num_seqs)
    reference_args: tuple  # the same with q and the pools in float32
    num_real_rows: int


def _pool(kind: str, values: jax.Array):
    """A [Hkv, P, S, D] pool of ``kind`` holding ``values`` (float32), and its float32 view
    (an 8-bit pool dequantised exactly as the kernels read it)."""
    if kind in ("bfloat16", "float32"):
        pool = values.astype(kind)
        return pool, pool.astype(jnp.float32)
    hkv, pages, page_size, dim = values.shape
    slots = jnp.arange(pages * page_size, dtype=jnp.int32)
    tokens = values.reshape(hkv, pages * page_size, dim).swapaxes(0, 1)  # [T, Hkv, D]
    pool = kv_cache.write(kv_cache.zeros(kind, values.shape, jnp.bfloat16), tokens, slots)
    return pool, pool.gather(jnp.arange(pages, dtype=jnp.int32)[None, :])[:, 0]


@functools.partial(jax.jit, static_argnames=("q_shape", "pool_shape", "pool"))
def _random_arrays(key, *, q_shape, pool_shape, pool):
    """q and both pools with their float32 views, drawn on the device in one program."""
    key_q, key_k, key_v = jax.random.split(key, 3)
    q_dtype = jnp.float32 if pool == "float32" else jnp.bfloat16
    q = jax.random.normal(key_q, q_shape).astype(q_dtype)
    k_pool, k_float = _pool(pool, jax.random.normal(key_k, pool_shape))
    v_pool, v_float = _pool(pool, jax.random.normal(key_v, pool_shape))
    return q, k_pool, v_pool, k_float, v_float


def make_batch(
    spec: CaseSpec, *, page_size: int, seed: int, padding_seqs: int = 2, padding_rows: int = 5
) -> Batch:
    """Random q and pools, distinct shuffled pages (page 0 never used), ``padding_seqs`` unused
    slots with garbage lengths after the used ones, and ``padding_rows`` rows after the tokens."""
    rng = np.random.default_rng(seed)
    if spec.decode_only:
        padding_rows = padding_seqs  # one row per sequence slot
    q_lens = np.asarray(spec.q_lens, np.int64)
    kv_lens = q_lens + np.asarray(spec.context_lens, np.int64)
    num_seqs, max_seqs = len(q_lens), len(q_lens) + padding_seqs
    width = int(-(-max(kv_lens.max(), 1) // page_size)) + 1
    num_pages = max_seqs * width + 1
    tables = (rng.permutation(num_pages - 1) + 1).reshape(max_seqs, width)
    cu_q_lens = np.concatenate([[0], np.cumsum(q_lens), np.zeros(padding_seqs, np.int64)])
    num_real = int(q_lens.sum())
    q, k_pool, v_pool, k_float, v_float = _random_arrays(
        jax.random.key(int(rng.integers(1 << 31)), impl="rbg"),
        q_shape=(num_real + padding_rows, spec.num_heads, spec.head_dim),
        pool_shape=(spec.num_kv_heads, num_pages, page_size, spec.head_dim),
        pool=spec.pool,
    )
    lens = np.concatenate([kv_lens, np.full(padding_seqs, 5)])
    common = (
        jnp.asarray(lens, jnp.int32),
        jnp.asarray(tables, jnp.int32),
        jnp.asarray(cu_q_lens, jnp.int32),
        jnp.asarray([num_seqs], jnp.int32),
    )
    return Batch(
        (q, k_pool, v_pool, *common), (q.astype(jnp.float32), k_float, v_float, *common), num_real
    )


def poison_free_memory(shape, dtype, copies: int = 4) -> None:
    """Fills device memory the allocator will hand out next with NaN: ``copies`` NaN arrays of
    the output's shape, freed at once, so an output row a kernel never writes reads NaN."""
    buffers = [jnp.full(shape, jnp.nan, dtype) for _ in range(copies)]
    jax.block_until_ready(buffers)
    for buffer in buffers:
        buffer.delete()


def decode_batch(shape: DecodeAttention, *, rotations: int, seed: int = 0):
    """A decode step of ``shape`` (bf16): q, the pools and ``rotations`` block tables over
    disjoint shuffled pages ([R, batch, pages]), so successive calls read different memory."""
    batch, context, pages, page_size = shape.batch, shape.context, shape.pages, shape.page_size
    num_heads, num_kv_heads, head_dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
    num_pages = rotations * batch * pages + 1
    rng = np.random.default_rng(seed)
    tables = (rng.permutation(num_pages - 1) + 1).reshape(rotations, batch, pages)
    q, k_pages, v_pages = _random_decode_arrays(
        jax.random.key(seed, impl="rbg"),
        q_shape=(batch, num_heads, head_dim),
        pool_shape=(num_kv_heads, num_pages, page_size, head_dim),
    )
    return (
        q,
        k_pages,
        v_pages,
        jnp.full((batch,), context, jnp.int32),
        jnp.asarray(tables, jnp.int32),
        jnp.arange(batch + 1, dtype=jnp.int32),
        jnp.asarray([batch], jnp.int32),
    )


@functools.partial(jax.jit, static_argnames=("q_shape", "pool_shape"))
def _random_decode_arrays(key, *, q_shape, pool_shape):
    keys = jax.random.split(key, 3)
    return (
        jax.random.normal(keys[0], q_shape, jnp.bfloat16),
        jax.random.normal(keys[1], pool_shape, jnp.bfloat16),
        jax.random.normal(keys[2], pool_shape, jnp.bfloat16),
    )
