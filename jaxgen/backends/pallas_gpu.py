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
from pallas_kernels.gpu.ragged_paged_attention import TUNING, ragged_paged_attention_gpu

# The backend's own options beside the attention kernel's tuning arguments: ``pallas_kv_write``
# writes the step's K/V with one Pallas kernel (``pallas_kernels/gpu/kv_write``) instead of
# XLA's two scatters (float pools only; off until timed on a GPU); ``xla_gemm`` picks how XLA
# runs the step's matmuls: "triton" (XLA's default, its autotuned Triton GEMM fusions) or
# "cublas" (cuBLAS's kernels, ``xla_gpu_enable_triton_gemm`` off). The H200's batch-1 and
# batch-64 traces show the QKV and output projections' Triton GEMMs at 2.2-3.4 TB/s of a
# 4.3 TB/s ceiling (docs/gpu.md); the device check times both. With cuBLAS, XLA's dot merger
# is off too: it merges the Q, K and V projections (they share their input) into one dot, which
# a Triton GEMM reads from the three weights but a cuBLAS call needs as one matrix, so XLA
# concatenated the weights every step (50 MB written and read again per 8B layer, seen in the
# step compiled for an H200 here: ``jaxgen plan --target h200``).
BACKEND_OPTIONS = ("pallas_kv_write", "xla_gemm")
XLA_GEMMS = {
    "triton": None,
    "cublas": {"xla_gpu_enable_triton_gemm": False, "xla_gpu_dot_merger_threshold_mb": 0},
}


@dataclasses.dataclass(frozen=True)
class PallasGPUBackend(PairedPoolBackend):
    """``interpret``: run the kernels in Pallas's interpreter (on CPU, for tests); set by
    ``select_backend`` from the platform, so lowering for CUDA from a CPU host emits the
    kernels themselves. ``tuning``: the kernel's tuning arguments as ``(name, value)`` pairs
    (hashable, so the backend stays a static argument of the step), e.g.
    ``(("decode_dot", True), ("num_splits", 8))``, and ``BACKEND_OPTIONS``; empty: the
    defaults."""

    name = "pallas-gpu"
    interpret: bool = False
    tuning: tuple[tuple[str, object], ...] = ()
    shard_kernels = True  # a Triton call is opaque to XLA's partitioner: one per device
    marks_decode_only_steps = True  # decode-only steps run without the prefill kernel

    def __post_init__(self):
        known = (*TUNING, *BACKEND_OPTIONS)
        unknown = sorted({name for name, _ in self.tuning} - set(known))
        if unknown:
            raise ValueError(
                f"attention_kernel_options: unknown kernel arguments {unknown}; known: {known}"
            )
        gemm = self._option("xla_gemm")
        if gemm is not None and gemm not in XLA_GEMMS:
            raise ValueError(
                f"attention_kernel_options: xla_gemm must be one of {sorted(XLA_GEMMS)}, "
                f"got {gemm!r}"
            )
        if self._option("pallas_kv_write") and self.kv_cache_dtype != "auto":
            raise ValueError(
                "attention_kernel_options: pallas_kv_write writes float pools only, not "
                f"kv_cache_dtype={self.kv_cache_dtype!r}"
            )

    def _option(self, name: str):
        return dict(self.tuning).get(name)

    @property
    def compiler_options(self) -> dict | None:
        """``xla_gemm``'s XLA options (None: XLA's defaults)."""
        return XLA_GEMMS[self._option("xla_gemm") or "triton"]

    def write_kv(self, k_pages, v_pages, k, v, slot_mapping):
        """XLA's two scatters, or one Pallas kernel with ``pallas_kv_write``."""
        if not self._option("pallas_kv_write"):
            return super().write_kv(k_pages, v_pages, k, v, slot_mapping)
        from pallas_kernels.gpu.kv_write import write_kv

        return write_kv(k_pages, v_pages, k, v, slot_mapping, interpret=self.interpret)

    def paged_attention(self, q, k_pages, v_pages, md, **opts):
        return ragged_paged_attention_gpu(
            q,
            k_pages,
            v_pages,
            md.kv_lens,
            md.block_tables,
            md.cu_q_lens,
            md.num_seqs,
            decode_only=md.decode_only,
            interpret=self.interpret,
            **{name: value for name, value in self.tuning if name not in BACKEND_OPTIONS},
            **opts,
        )
