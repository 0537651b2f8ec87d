"""Dense float32 matmul for XLA:CPU as a native kernel (C++ through the XLA FFI).

At the row counts of batched decode (tens of tokens) XLA:CPU's dot reaches about 70% of this
CPU's FMA peak. The weights are packed once (``pack_weight``: [K, N] -> [N / 24, K, 24] panels
that stream contiguously, N zero-padded to a multiple of 24) and ``native/matmul_cpu.cc`` runs an
AVX2 register tile over them. ``PackedWeight`` is such a weight as a ``Linear`` kernel: it
carries its column count and its own matmul, so models run it without importing this module.
Built on first use (``build``); ``matmul_kernel_available()`` is False where it cannot be built
or the compiler lacks AVX2 + FMA, and callers keep ``jnp.dot``, the reference.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxgen.backends.cpu_kernels.build import register_simd_kernel

TARGET = "jaxgen_matmul_f32"
PANEL_WIDTH = 24  # kPanelWidth in native/matmul_f32.h


def kernel_rows(x: jax.Array, depth: int, live_rows):
    """``x`` as the kernels' ``[rows, depth]`` and its live-row spans (``[2, 2]`` int32: two
    ``[begin, end)`` runs; None: every row), checked."""
    rows = x.reshape(-1, depth)
    if live_rows is None:
        return rows, jnp.array([[0, rows.shape[0]], [0, 0]], jnp.int32)
    if live_rows.shape != (2, 2):
        raise ValueError(
            f"live_rows must be [2, 2] (two [begin, end) spans), got {live_rows.shape}"
        )
    return rows, jnp.asarray(live_rows, jnp.int32)


@functools.cache
def matmul_kernel_available() -> bool:
    """Builds and registers the kernel once; False without a build or without AVX2 + FMA."""
    return register_simd_kernel("JaxgenMatmulHasSimd", "JaxgenMatmulF32", TARGET)


def can_pack(w: jax.Array) -> bool:
    """Whether ``w`` is a float32 [K, N] weight ``pack_weight`` takes."""
    return isinstance(w, (jax.Array, np.ndarray)) and w.ndim == 2 and w.dtype == jnp.float32


def pack_weight(w: jax.Array) -> jax.Array:  # [K, N] -> [ceil(N / 24), K, 24]
    """Panel layout of a float32 weight for ``matmul_cpu``; N is zero-padded to a multiple of 24."""
    if not can_pack(w):
        raise ValueError(f"w must be a float32 [K, N] weight, got {w.dtype} {w.shape}")
    depth, columns = w.shape
    panels = -(-columns // PANEL_WIDTH)
    w = jnp.pad(w, ((0, 0), (0, panels * PANEL_WIDTH - columns)))
    return w.reshape(depth, panels, PANEL_WIDTH).transpose(1, 0, 2)


def unpack_weight(packed: jax.Array, columns: int) -> jax.Array:  # -> [K, columns]
    """Inverse of ``pack_weight`` for a weight of ``columns`` columns."""
    panels, depth, width = packed.shape
    return packed.transpose(1, 0, 2).reshape(depth, panels * width)[:, :columns]


def matmul_cpu(
    x: jax.Array,  # [..., K] float32
    packed: jax.Array,  # [ceil(N / 24), K, 24] float32, from pack_weight
    columns: int | None = None,  # N; default: every packed column
    *,
    live_rows: jax.Array | None = None,  # [2, 2] int32 [begin, end) spans of x's flat rows
) -> jax.Array:  # [..., N] float32
    """``x @ w`` on XLA:CPU for ``packed = pack_weight(w)``; reference: ``jnp.dot(x, w)``.

    ``live_rows`` names the rows that hold real tokens (an engine step's decode and prefill
    rows); the others, padding up to a shape bucket, come out as zeros and cost nothing.
    Default: every row."""
    return matmul_cpu_group(x, [packed], [columns], live_rows=live_rows)[0]


def matmul_cpu_group(
    x: jax.Array,  # [..., K] float32
    packed: list[jax.Array],  # each [ceil(N_i / 24), K, 24] float32, from pack_weight
    columns: list[int | None] | None = None,  # N_i each; default: every packed column
    *,
    live_rows: jax.Array | None = None,  # [2, 2] int32 [begin, end) spans of x's flat rows
) -> list[jax.Array]:  # each [..., N_i] float32
    """``[x @ w_i for w_i]`` in one native call (the q/k/v or gate/up projections of a layer):
    one parallel job rather than several small ones. Arguments as ``matmul_cpu``'s."""
    if not packed:
        raise ValueError("packed must hold at least one weight")
    columns = [None] * len(packed) if columns is None else list(columns)
    if len(columns) != len(packed):
        raise ValueError(f"columns has {len(columns)} entries for {len(packed)} weights")
    for name, array in (("x", x), *(("packed", w) for w in packed)):
        if array.dtype != jnp.float32:
            raise ValueError(f"{name} must be float32 for the CPU kernel, got {array.dtype}")
    if x.ndim < 1:
        raise ValueError(f"x must be at least 1-D, got {x.shape}")
    depth = x.shape[-1]
    results = []
    for w, n in zip(packed, columns, strict=True):
        if w.ndim != 3 or w.shape[2] != PANEL_WIDTH:
            raise ValueError(
                f"packed must be [N / {PANEL_WIDTH}, K, {PANEL_WIDTH}] (pack_weight), got {w.shape}"
            )
        if w.shape[1] != depth:
            raise ValueError(
                f"x's last dimension {depth} must equal the weight's depth {w.shape[1]}"
            )
        padded = w.shape[0] * PANEL_WIDTH
        n = padded if n is None else n
        if not padded - PANEL_WIDTH < n <= padded:
            raise ValueError(f"columns must be in ({padded - PANEL_WIDTH}, {padded}], got {n}")
        results.append((padded, n))
    if not matmul_kernel_available():
        raise RuntimeError("the CPU matmul kernel could not be built on this machine")
    rows, live_rows = kernel_rows(x, depth, live_rows)
    shapes = [jax.ShapeDtypeStruct((rows.shape[0], padded), x.dtype) for padded, _ in results]
    outs = jax.ffi.ffi_call(TARGET, shapes)(rows, jnp.asarray(live_rows, jnp.int32), *packed)
    return [out[:, :n].reshape(*x.shape[:-1], n) for out, (_, n) in zip(outs, results, strict=True)]


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["panels"], meta_fields=["columns"]
)
@dataclasses.dataclass(frozen=True)
class PackedWeight:
    """A float32 [K, N] weight packed for the native matmul, as a ``Linear`` kernel takes it.

    A pytree: ``panels`` ([ceil(N / 24), K, 24]) is its leaf, ``columns`` (N) static. It
    provides the kernel protocol of ``jaxgen.layers.linear``: :meth:`matmul` and
    :meth:`matmul_group`."""

    panels: jax.Array  # [ceil(N / 24), K, 24] float32
    columns: int  # N

    @classmethod
    def pack(cls, w: jax.Array) -> PackedWeight:
        """``w`` ([K, N] float32) packed."""
        return cls(pack_weight(w), w.shape[1])

    def unpack(self) -> jax.Array:  # [K, N]
        return unpack_weight(self.panels, self.columns)

    @property
    def shape(self) -> tuple[int, int]:
        """The [K, N] shape of the weight it packs."""
        return (self.panels.shape[1], self.columns)

    @property
    def dtype(self):
        return self.panels.dtype

    def matmul(self, x: jax.Array, live_rows: jax.Array | None = None) -> jax.Array:
        """``x @ w`` (see ``matmul_cpu``; ``live_rows``: the rows to compute, others are 0)."""
        return matmul_cpu(x, self.panels, self.columns, live_rows=live_rows)

    @staticmethod
    def matmul_group(
        x: jax.Array, weights: list[PackedWeight], live_rows: jax.Array | None = None
    ) -> list[jax.Array]:
        """``[x @ w for w in weights]`` in one native call (see ``matmul_cpu_group``)."""
        panels = [weight.panels for weight in weights]
        columns = [weight.columns for weight in weights]
        return matmul_cpu_group(x, panels, columns, live_rows=live_rows)
