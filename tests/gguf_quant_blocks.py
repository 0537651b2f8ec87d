"""Random valid GGUF quantised tensors of every kept type, for the loader's and kernels' tests.

``gguf.quants.quantize`` writes Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 from float weights; it has no
quantiser for the K-quants and IQ4 types, so their blocks are random bytes (every bit pattern of
codes and sub-block scales is a valid block) with each float16 super-block scale set to a
finite random number sized so that the weights come out around ``magnitude``.
"""

from __future__ import annotations

import numpy as np

from jaxgen.loaders.gguf_blocks import BLOCK_LAYOUTS, decode_blocks
from jaxgen.loaders.gguf_loader import kept_weight as loaded_weight
from jaxgen.quantization import QuantizedWeight

KEPT_GGUF_TYPES = tuple(BLOCK_LAYOUTS)
QUANTISED_BY_GGUF = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
# type -> byte offsets of its float16 scales, and the largest |code * sub-scale| they multiply
_HALVES = {
    "IQ4_NL": ((0,), 127), "Q2_K": ((80, 82), 45), "Q3_K": ((108,), 128),
    "Q4_K": ((0, 2), 945), "Q5_K": ((0, 2), 1953), "Q6_K": ((208,), 4096),
    "IQ4_XS": ((0,), 4064),
}  # fmt: skip


def random_gguf_tensor(qtype: str, rows: int, depth: int, rng, magnitude: float = 0.1):
    """``[rows, depth]`` weights as type ``qtype``'s bytes ``[rows, bytes per row]`` (what
    ``GGUFWriter.add_tensor(..., raw_dtype=...)`` takes)."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    if qtype in QUANTISED_BY_GGUF:
        weights = (rng.standard_normal((rows, depth)) * magnitude).astype(np.float32)
        return gguf.quants.quantize(weights, kind)
    elements, nbytes = BLOCK_LAYOUTS[qtype]
    blocks = rng.integers(0, 256, (rows * depth // elements, nbytes), dtype=np.uint8)
    offsets, largest = _HALVES[qtype]
    for offset in offsets:
        scale = rng.uniform(0.5, 2.0, len(blocks)) * magnitude / largest
        blocks[:, offset : offset + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def kept_weight(qtype: str, depth: int, columns: int, seed: int = 0) -> QuantizedWeight:
    """A random ``[depth, columns]`` weight of GGUF type ``qtype`` as the loader keeps it."""
    import gguf
    import jax
    import jax.numpy as jnp

    data = random_gguf_tensor(qtype, columns, depth, np.random.default_rng(seed))
    weight = loaded_weight(decode_blocks(qtype, data, columns, depth))
    weight = jax.tree_util.tree_map(jnp.asarray, weight)
    expected = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(np.asarray(weight.dequantize()), expected.T)
    return weight
