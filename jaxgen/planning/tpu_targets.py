"""TPU slices the ahead-of-time compiler can target: the product names (``v5e-4``) mapped to
libtpu's topologies (``v5e:2x2``), and the devices of a named slice, which libtpu builds on a
machine without a TPU. Each generation's datasheet figures are ``hardware.CHIPS``."""

from __future__ import annotations

import dataclasses
import math
import os

from jaxgen.planning.gpu_targets import GPU_TARGETS
from jaxgen.planning.hardware import CHIPS, Chip

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
    chip: Chip
    devices: tuple


def resolve_target(target: str) -> TpuSlice:
    """The devices of a slice named ``v5e-4`` or ``v5e:2x2``; ``ValueError`` listing the names."""
    topology = TARGETS.get(target, target)
    generation = topology.split(":", 1)[0]
    if ":" not in topology or generation not in CHIPS:
        raise ValueError(
            f"unknown TPU target {target!r}; choose one of {', '.join(TARGETS)}, a libtpu "
            f"topology such as v5e:2x2 (generations: {', '.join(CHIPS)}), a GPU "
            f"({', '.join(GPU_TARGETS)}), "
            "or cuda (lowered only)"
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
