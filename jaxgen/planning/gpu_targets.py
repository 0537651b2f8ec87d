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

from jaxgen.planning.hardware import DEVICES, Chip


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuDescription:
    """What XLA's GPU compiler reads of a GPU (datasheet figures; ``chip`` has memory and
    bandwidth)."""

    chip: Chip
    compute_capability: tuple[int, int]
    num_sms: int
    clock_ghz: float
    l2_cache_bytes: int
    shared_memory_per_sm: int
    shared_memory_per_block_optin: int

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
                "  threads_per_core_limit: 2048",
                f"  core_count: {self.num_sms}",
                "  fpus_per_core: 128",
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


def _hopper(device: str) -> GpuDescription:
    return GpuDescription(
        chip=DEVICES[device],
        compute_capability=(9, 0),
        num_sms=132,
        clock_ghz=1.98,
        l2_cache_bytes=50 * 2**20,
        shared_memory_per_sm=228 * 2**10,
        shared_memory_per_block_optin=227 * 2**10,
    )


def jax_gpu_memory_fraction() -> float:
    """The share of a GPU's memory jax's allocator takes: ``XLA_PYTHON_CLIENT_MEM_FRACTION``,
    0.75 by default."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", 0.75))


# The GPUs this project measures on (docs/gpu.md): one architecture, two memories.
GPU_TARGETS = {"h100": _hopper("h100"), "h200": _hopper("h200")}


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
    """``num_gpus`` compile-only devices of GPU ``target`` ("h100", "h200") in one host;
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
