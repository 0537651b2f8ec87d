"""Dense layer whose weight may be panel-packed for the native XLA:CPU matmul.

``Linear`` keeps ``nnx.Linear``'s parameter names (``kernel`` [in, out], ``bias``), so loaders and
sharding rules map it the same way. When the engine runs the "cpu" backend it hands the step a
copy of the parameters in which every packable kernel is ``pack_weight``-ed to
[ceil(out / 24), in, 24] (``pack_linear_weights``); a 3-D kernel is that layout and runs on
``pallas_kernels.matmul_cpu``, a 2-D one on ``jnp.dot``. ``apply_linears`` runs several layers
that read the same input (q/k/v, gate/up) as one native call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from pallas_kernels.matmul_cpu import can_pack, matmul_cpu_group, pack_weight


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
        return apply_linears((self,), x, live_rows)[0]


def apply_linears(
    layers: tuple[Linear, ...], x: jax.Array, live_rows: jax.Array | None = None
) -> list[jax.Array]:
    """``[layer(x) for layer in layers]``; one native matmul call when every kernel is packed."""
    kernels = [layer.kernel[...] for layer in layers]
    if all(kernel.ndim == 3 for kernel in kernels):
        columns = [layer.out_features for layer in layers]
        outputs = matmul_cpu_group(x, kernels, columns, live_rows=live_rows)
    else:
        outputs = [jnp.dot(x, kernel) for kernel in kernels]
    return [
        y if layer.bias is None else y + layer.bias[...]
        for layer, y in zip(layers, outputs, strict=True)
    ]


def pack_linear_weights(params: nnx.State) -> nnx.State:
    """A copy of ``params`` with every packable ``Linear`` kernel panel-packed (others shared)."""
    leaves = []
    for path, var in nnx.to_flat_state(params):
        value = var.get_value()
        if path[-1] == "kernel" and can_pack(value):
            var = var.replace(pack_weight(value))
        leaves.append((path, var))
    return nnx.from_flat_state(leaves)
