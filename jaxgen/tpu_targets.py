"""TPU slices the ahead-of-time compiler can target: each generation's datasheet figures, the
product names (``v5e-4``) mapped to libtpu's topologies (``v5e:2x2``), and the devices of a
named slice, which libtpu builds on a machine without a TPU."""

from __future__ import annotations

import dataclasses
import math
import os

GB = 10**9


@dataclasses.dataclass(frozen=True, kw_only=True)
class TpuChip:
    """Datasheet figures of one chip."""

    name: str
    hbm_bytes: int
    bandwidth_bytes_per_s: float
    peak_bf16_flops: float


CHIPS = {
    "v5e": TpuChip(name="TPU v5e", hbm_bytes=16 * GB, bandwidth_bytes_per_s=819e9, peak_bf16_flops=197e12),
    "v6e": TpuChip(name="TPU v6e", hbm_bytes=32 * GB, bandwidth_bytes_per_s=1640e9, peak_bf16_flops=918e12),
    "v5p": TpuChip(name="TPU v5p", hbm_bytes=95 * GB, bandwidth_bytes_per_s=2765e9, peak_bf16_flops=459e12),
}  # fmt: skip

# Product names (chips, as Cloud TPU counts them; v5p-8 is 4 chips of 2 cores) -> libtpu's names.
TARGETS = {
    "v5e-1": "v5e:1x1",
    "v5e-4": "v5e:2x2",
    "v5e-8": "v5e:2x4",
    "v6e-1": "v6e:1x1",
    "v6e-4": "v6e:2x2",
    "v6e-8": "v6e:2x4",
    "v5p-8": "v5p:2x2x1",
}


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    target: str
    topology: str
    chip: TpuChip
    devices: tuple


def resolve_target(target: str) -> TpuSlice:
    """The devices of a slice named ``v5e-4`` or ``v5e:2x2``; ``ValueError`` listing the names."""
    topology = TARGETS.get(target, target)
    generation = topology.split(":", 1)[0]
    if ":" not in topology or generation not in CHIPS:
        raise ValueError(
            f"unknown TPU target {target!r}; choose one of {', '.join(TARGETS)}, a libtpu "
            f"topology such as v5e:2x2 (generations: {', '.join(CHIPS)}), or cuda (lowered only)"
        )
    # Compiling needs libtpu but no chip; several processes may then load it side by side.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies

    dims = [int(d) for d in topology.split(":", 1)[1].split("x")]
    bounds = {"chips_per_host_bounds": (1, 1, 1)} if math.prod(dims) == 1 else {}
    try:
        desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, **bounds)
    except Exception as error:  # libtpu missing, or a name it does not know
        raise ValueError(
            f"libtpu cannot build TPU target {target!r} ({topology}): {error}; known targets: "
            f"{', '.join(TARGETS)} (needs the tpu extra: pip install 'jaxgen[tpu]')"
        ) from None
    return TpuSlice(target, topology, CHIPS[generation], tuple(desc.devices))
