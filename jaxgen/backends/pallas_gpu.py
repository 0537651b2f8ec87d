"""The Pallas GPU backend: every row of the step, decode and prefill, through the GPU ragged
paged-attention kernels (``pallas_kernels/gpu/ragged_paged_attention``: split-KV decode programs
sized to the GQA group, causal prefill blocks; Pallas's interpreter on CPU, which is how the tests
run them). An 8-bit pool (``kv_cache_dtype`` "int8" / "fp8") reaches the kernels as codes and
scales, dequantised per key block inside them. The new K/V are written by the paired pool's XLA
scatter into the donated pool (see docs/gpu.md for how the device check confirms it is in place).
"""

from __future__ import annotations

import dataclasses

from jaxgen.backends.paired_pool import PairedPoolBackend
from pallas_kernels import ragged_paged_attention
from pallas_kernels.gpu.ragged_paged_attention import TUNING


@dataclasses.dataclass(frozen=True)
class PallasGPUBackend(PairedPoolBackend):
    """``interpret``: run the kernels in Pallas's interpreter (on CPU, for tests); set by
    ``select_backend`` from the platform, so lowering for CUDA from a CPU host emits the
    kernels themselves. ``tuning``: the kernel's tuning arguments as ``(name, value)`` pairs
    (hashable, so the backend stays a static argument of the step), e.g.
    ``(("decode_dot", True), ("num_splits", 8))``; empty: the kernel's defaults."""

    name = "pallas-gpu"
    interpret: bool = False
    tuning: tuple[tuple[str, object], ...] = ()
    shard_kernels = True  # a Triton call is opaque to XLA's partitioner: one per device
    marks_decode_only_steps = True  # decode-only steps run without the prefill kernel

    def __post_init__(self):
        unknown = sorted({name for name, _ in self.tuning} - set(TUNING))
        if unknown:
            raise ValueError(
                f"attention_kernel_options: unknown kernel arguments {unknown}; known: {TUNING}"
            )

    def paged_attention(self, q, k_pages, v_pages, md, **opts):
        return ragged_paged_attention(
            q,
            k_pages,
            v_pages,
            md.kv_lens,
            md.block_tables,
            md.cu_q_lens,
            md.num_seqs,
            decode_only=md.decode_only,
            interpret=self.interpret,
            **dict(self.tuning),
            **opts,
        )
