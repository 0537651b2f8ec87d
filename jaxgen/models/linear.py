"""Dense layer whose weight may be panel-packed for the native XLA:CPU matmul.

``Linear`` keeps ``nnx.Linear``'s parameter names (``kernel`` [in, out], ``bias``), so loaders and
sharding rules map it the same way. When the engine runs the "cpu" backend it hands the step a
copy of the parameters in which every packable kernel is ``pack_weight``-ed to
[ceil(out / 24), in, 24] (``pack_linear_weights``); a 3-D kernel is that layout and runs on
``pallas_kernels.matmul_cpu``, a 2-D one on ``jnp.dot``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.matmul_cpu import can_pack, matmul_cpu, pack_weight


class Linear(nnx.Module):
    """``x @ kernel + bias`` with ``nnx.Linear``'s parameters and initialisers."""

    def __init__(self, n_in: int, n_out: int, *, bias: bool, dtype, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.kernel = nnx.Param(init(rngs.params(), (n_in, n_out), dtype))  # [in, out]
        self.out_features = n_out
        self.bias = nnx.Param(jnp.zeros((n_out,), dtype)) if bias else None

    def __call__(self, x: jax.Array, live_rows: jax.Array | None = None) -> jax.Array:
        """``live_rows`` ([2, 2] row spans, see ``matmul_cpu``) lets the native matmul skip
        padding rows (they come out as zeros); ``jnp.dot`` computes every row."""
        kernel = self.kernel[...]
        if kernel.ndim == 3:
            y = matmul_cpu(x, kernel, self.out_features, live_rows=live_rows)
        else:
            y = jnp.dot(x, kernel)
        return y if self.bias is None else y + self.bias[...]


def pack_linear_weights(params: nnx.State) -> nnx.State:
    """A copy of ``params`` with every packable ``Linear`` kernel panel-packed (others shared)."""
    leaves = []
    for path, var in nnx.to_flat_state(params):
        value = var.get_value()
        if path[-1] == "kernel" and can_pack(value):
            var = var.replace(pack_weight(value))
        leaves.append((path, var))
    return nnx.from_flat_state(leaves)
