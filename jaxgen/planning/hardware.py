"""One hardware datasheet: memory, memory bandwidth and dense peak FLOP/s of every accelerator
``jaxgen plan`` knows (GPUs, TPU generations, the CI machine's CPU). Capacity planning reads a
device by its ``--device`` name (``DEVICES``); the TPU sweep and ahead-of-time compiles read a
TPU generation (``CHIPS``: the same rows, by libtpu's generation name)."""

from __future__ import annotations

import dataclasses

GB = 10**9


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chip:
    """Datasheet figures of one accelerator (dense peak, no sparsity)."""

    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    peak_flops: dict  # dtype name -> FLOP/s

    @property
    def peak_bf16_flops(self) -> float:
        return self.peak_flops["bfloat16"]


def _tpu(name: str, memory_gb: int, bandwidth: float, bf16_flops: float) -> Chip:
    return Chip(
        name=name,
        memory_bytes=memory_gb * GB,
        bandwidth_bytes_per_s=bandwidth,
        peak_flops={"bfloat16": bf16_flops, "float32": bf16_flops / 4},
    )


# GPU rows: NVIDIA's datasheets (dense tensor-core peaks, no sparsity; H100 SXM5, H200 SXM,
# A100 SXM4 80GB, L4, T4). Memory is the datasheet's decimal GB; a T4 with ECC on (as clouds
# run it) shows 15,360 MiB. The T4 (compute capability 7.5) has no bfloat16 arithmetic: its
# tensor cores take float16 (65 TFLOP/s), its float32 is 8.1 TFLOP/s.
DEVICES = {
    "h100": Chip(
        name="NVIDIA H100 SXM 80GB",
        memory_bytes=80 * GB,
        bandwidth_bytes_per_s=3.35e12,
        peak_flops={"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    ),
    "h200": Chip(
        name="NVIDIA H200 141GB",
        memory_bytes=141 * GB,
        bandwidth_bytes_per_s=4.8e12,
        peak_flops={"bfloat16": 989e12, "float16": 989e12, "float32": 67e12},
    ),
    "a100": Chip(
        name="NVIDIA A100 SXM 80GB",
        memory_bytes=80 * GB,
        bandwidth_bytes_per_s=2.04e12,
        peak_flops={"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12},
    ),
    "l4": Chip(
        name="NVIDIA L4 24GB",
        memory_bytes=24 * GB,
        bandwidth_bytes_per_s=300e9,
        peak_flops={"bfloat16": 121e12, "float16": 121e12, "float32": 30e12},
    ),
    "t4": Chip(
        name="NVIDIA T4 16GB",
        memory_bytes=16 * GB,
        bandwidth_bytes_per_s=320e9,
        peak_flops={"float16": 65e12, "float32": 8.1e12},
    ),
    "tpu-v5e": _tpu("TPU v5e", 16, 819e9, 197e12),
    "tpu-v6e": _tpu("TPU v6e", 32, 1640e9, 918e12),
    "tpu-v5p": _tpu("TPU v5p", 95, 2765e9, 459e12),
    # Measured on this project's 2-core CI machine (XLA fp32 matmul rate at decode shapes).
    "cpu-2core": Chip(
        name="2-core x86 CPU (CI machine)",
        memory_bytes=24 * 2**30,
        bandwidth_bytes_per_s=10e9,
        peak_flops={"float32": 140e9},
    ),
}

# TPU generations by libtpu's name (``v5e:2x2``'s ``v5e``): the same rows.
CHIPS = {
    name.removeprefix("tpu-"): chip for name, chip in DEVICES.items() if name.startswith("tpu-")
}


def overridden(base: Chip, memory=None, bandwidth=None, peak_flops=None, dtype="bfloat16") -> Chip:
    """``base`` with the figures given (``jaxgen plan --device-memory/--bandwidth/--peak-flops``:
    bytes, bytes/s, FLOP/s in ``dtype``) in place of its datasheet's; ``base`` if none is."""
    if not (memory or bandwidth or peak_flops):
        return base
    return dataclasses.replace(
        base,
        name=f"{base.name} (overridden)",
        memory_bytes=int(memory or base.memory_bytes),
        bandwidth_bytes_per_s=float(bandwidth or base.bandwidth_bytes_per_s),
        peak_flops={dtype: float(peak_flops)} if peak_flops else base.peak_flops,
    )
