"""Lowering the GPU kernels for CUDA from a host without a GPU.

jax 0.11's Pallas Triton lowering asks the platform for the GPU it compiles for ("No supported
GPU devices found, please specify an abstract GPU device using AbstractDevice"); jax 0.10 assumed
compute capability 9.0. Under :func:`abstract_gpu` both lower for an H100 (9.0), the GPU this
project measures on (an H200 is the same architecture).
"""

from __future__ import annotations

import jax

H100 = "NVIDIA H100 80GB HBM3"
H100_SMS = 132


def abstract_gpu_mesh(
    axis_sizes: tuple[int, ...] = (1,),
    axis_names: tuple[str, ...] = ("gpu",),
    axis_types: tuple | None = None,
    *,
    device_kind: str = H100,
    num_cores: int = H100_SMS,
) -> jax.sharding.AbstractMesh:
    """A mesh of ``device_kind`` GPUs that need not be present: shardings on it trace and lower
    (``lowering_platforms=("cuda",)``) on any host, for any number of devices."""
    device = jax.sharding.AbstractDevice(
        device_kind=device_kind, num_cores=num_cores, platform="gpu"
    )
    if axis_types is None:
        axis_types = (jax.sharding.AxisType.Auto,) * len(axis_sizes)
    return jax.sharding.AbstractMesh(axis_sizes, axis_names, axis_types, abstract_device=device)


def abstract_gpu(mesh: jax.sharding.AbstractMesh | None = None):
    """A context in which Pallas Triton kernels lower for an abstract GPU: ``mesh`` (from
    :func:`abstract_gpu_mesh`, the mesh a sharded step's shardings name) or one H100."""
    return jax.sharding.use_abstract_mesh(abstract_gpu_mesh() if mesh is None else mesh)
