"""NVIDIA GPUs the ahead-of-time compiler can target from a host without one.

jax's CUDA plugin holds XLA's whole GPU compiler (its fusion passes, Triton, LLVM's PTX back end
and ptxas): given a description of the GPU (XLA's ``GpuTargetConfigProto``) instead of a device,
``jax.experimental.topologies`` hands out a compile-only device, and a step placed on it compiles
for that GPU on any host. The plugin alone is enough (``pip install 'jaxgen[gpu-compile]'``, jax's
``cuda13-local`` extra: no GPU, driver or CUDA libraries). Without a GPU XLA does not autotune:
its GEMM tilings are its defaults, where a device picks its own among measured candidates.

On a host without a GPU, the plugin can only register when jax starts without looking for one:
``JAX_PLATFORMS=cpu`` (``jaxgen plan`` sets it when unset) or ``JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os

from jaxgen.backends.device_choice import DeviceDescription
from jaxgen.planning.hardware import DEVICES, Chip


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuDescription:
    """What XLA's GPU compiler reads of a GPU (datasheet figures; ``chip`` has memory and
    bandwidth)."""

    chip: Chip
    compute_capability: tuple[int, int]
    num_sms: int
    clock_ghz: float  # boost clock
    l2_cache_bytes: int
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int
    threads_per_sm: int = 2048  # resident threads: 1,024 on Turing, 1,536 on sm_86 / sm_89
    fp32_units_per_sm: int = 128  # 64 on Turing and the A100

    def device(self) -> DeviceDescription:
        """The GPU as the automatic choices read it (``jaxgen.backends.device_choice``)."""
        return DeviceDescription("gpu", self.compute_capability, self.chip.name)

    def target_config(self) -> str:
        """The GPU as XLA's ``GpuTargetConfigProto``, in protobuf text format."""
        major, minor = self.compute_capability
        return "\n".join(
            [
                "gpu_device_info {",
                "  threads_per_block_limit: 1024",
                "  threads_per_warp: 32",
                "  shared_memory_per_block: 49152",
                f"  shared_memory_per_core: {self.shared_memory_per_sm}",
                f"  threads_per_core_limit: {self.threads_per_sm}",
                f"  core_count: {self.num_sms}",
                f"  fpus_per_core: {self.fp32_units_per_sm}",
                "  block_dim_limit_x: 2147483647",
                "  block_dim_limit_y: 65535",
                "  block_dim_limit_z: 65535",
                f"  memory_bandwidth: {int(self.chip.bandwidth_bytes_per_s)}",
                f"  l2_cache_size: {self.l2_cache_bytes}",
                f"  clock_rate_ghz: {self.clock_ghz}",
                f"  device_memory_size: {self.chip.memory_bytes}",
                f"  shared_memory_per_block_optin: {self.shared_memory_per_block_optin}",
                f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
                "  registers_per_core_limit: 65536",
                "  registers_per_block_limit: 65536",
                "}",
                'platform_name: "CUDA"',
                "dnn_version_info { major: 9 minor: 8 }",
                f'device_description_str: "{self.chip.name}"',
            ]
        )


def jax_gpu_memory_fraction() -> float:
    """The share of a GPU's memory jax's allocator takes: ``XLA_PYTHON_CLIENT_MEM_FRACTION``,
    0.75 by default."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", 0.75))


# Datasheet figures (NVIDIA's product datasheets and architecture whitepapers; the CUDA C++
# Programming Guide's per-compute-capability limits for threads and shared memory per SM).
# Memory size and bandwidth are the ``hardware.DEVICES`` rows.
GPU_TARGETS = {
    # Tesla T4 (TU104, Turing, sm_75): 40 SMs, 1.59 GHz boost, 4 MB L2, 64 KB shared memory
    # per SM (all of it one block's), 1,024 threads and 64 FP32 units per SM; 16 GB GDDR6 at
    # 320 GB/s. Colab's and Kaggle's free GPU.
    "t4": GpuDescription(
        chip=DEVICES["t4"],
        compute_capability=(7, 5),
        num_sms=40,
        clock_ghz=1.59,
        l2_cache_bytes=4 * 2**20,
        shared_memory_per_sm=64 * 2**10,
        shared_memory_per_block_optin=64 * 2**10,
        threads_per_sm=1024,
        fp32_units_per_sm=64,
    ),
    # L4 (AD104, Ada, sm_89): 58 SMs, 2.04 GHz boost, 48 MB L2, 100 KB shared memory per SM
    # (99 KB one block's), 1,536 threads per SM; 24 GB GDDR6 at 300 GB/s.
    "l4": GpuDescription(
        chip=DEVICES["l4"],
        compute_capability=(8, 9),
        num_sms=58,
        clock_ghz=2.04,
        l2_cache_bytes=48 * 2**20,
        shared_memory_per_sm=100 * 2**10,
        shared_memory_per_block_optin=99 * 2**10,
        threads_per_sm=1536,
    ),
    # A100 SXM4 80GB (GA100, Ampere, sm_80): 108 SMs, 1.41 GHz boost, 40 MB L2, 164 KB shared
    # memory per SM (163 KB one block's), 64 FP32 units per SM; 80 GB HBM2e at 2,039 GB/s.
    "a100": GpuDescription(
        chip=DEVICES["a100"],
        compute_capability=(8, 0),
        num_sms=108,
        clock_ghz=1.41,
        l2_cache_bytes=40 * 2**20,
        shared_memory_per_sm=164 * 2**10,
        shared_memory_per_block_optin=163 * 2**10,
        fp32_units_per_sm=64,
    ),
    # H100 SXM5 and H200 (GH100, Hopper, sm_90): 132 SMs, 1.98 GHz boost, 50 MB L2, 228 KB
    # shared memory per SM (227 KB one block's); 80 GB at 3.35 TB/s, 141 GB at 4.8 TB/s. The
    # GPUs this project has measured on (docs/gpu.md).
    **{
        name: GpuDescription(
            chip=DEVICES[name],
            compute_capability=(9, 0),
            num_sms=132,
            clock_ghz=1.98,
            l2_cache_bytes=50 * 2**20,
            shared_memory_per_sm=228 * 2**10,
            shared_memory_per_block_optin=227 * 2**10,
        )
        for name in ("h100", "h200")
    },
}


@dataclasses.dataclass(frozen=True)
class GpuTarget:
    target: str
    gpu: GpuDescription
    devices: tuple  # the compile-only jax devices


def cuda_plugin_installed() -> bool:
    """Whether jax's CUDA plugin (12 or 13) is importable."""
    if importlib.util.find_spec("jax_plugins") is None:
        return False
    return any(
        importlib.util.find_spec(f"jax_plugins.xla_cuda{version}") is not None
        for version in (13, 12)
    )


def resolve_gpu_target(target: str, num_gpus: int = 1) -> GpuTarget:
    """``num_gpus`` compile-only devices of GPU ``target`` (a ``GPU_TARGETS`` name) in one host;
    ``ValueError`` naming what is missing (an unknown name, the plugin, or the plugin not
    registered)."""
    if target not in GPU_TARGETS:
        raise ValueError(f"unknown GPU target {target!r}; choose one of {', '.join(GPU_TARGETS)}")
    if not cuda_plugin_installed():
        raise ValueError(
            f"compiling for --target {target} needs XLA's GPU compiler, jax's CUDA plugin: "
            "pip install 'jaxgen[gpu-compile]' (no GPU or CUDA libraries needed)"
        )
    from jax.experimental import topologies

    gpu = GPU_TARGETS[target]
    try:
        desc = topologies.get_topology_desc(
            platform="cuda", target_config=gpu.target_config(), topology=f"1x1x{num_gpus}"
        )
    except NotImplementedError:  # the plugin did not register: it looked for a GPU and found none
        raise ValueError(
            f"jax's CUDA plugin is installed but not registered, so --target {target} cannot "
            "compile; on a host without a GPU start with JAX_PLATFORMS=cpu (or "
            "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1)"
        ) from None
    return GpuTarget(target, gpu, tuple(desc.devices))
