"""Sleep mode, as vLLM has it: an idle engine frees its device memory between rollouts, so that a
trainer beside it can use it, and takes it back on ``wake_up``.

Level 1 copies the weights to the host, then drops them and the KV pool from the devices;
``wake_up`` puts them back (and allocates a zeroed pool). Level 2 drops both and keeps nothing
but the small non-``Param`` buffers (RoPE tables): ``update_weights`` brings weights back (a
trainer's new ones), then ``wake_up`` the pool. ``wake_up(tags=["weights"])`` or
``["kv_cache"]`` wakes one part (vLLM's tags). What is dropped is freed once nothing else holds
it: weights the engine shares with a trainer (``update_weights`` holds device arrays as given)
stay the trainer's. The cached prompt pages go with the pool. While any part sleeps, requests
are refused (``EngineSleepingError``) and ``params`` holds the parameters' shapes.

``SleepMode`` is the state and its checks; ``LLMEngine.sleep`` / ``wake_up`` act on it.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxgen.engine.errors import EngineBusyError, EngineSleepingError, SleepModeError
from jaxgen.engine.weights.weight_layout import WeightLayout, named_values

TAGS = ("weights", "kv_cache")  # vLLM's wake_up tags


class SleepMode:
    """Which parts of an engine sleep, and what it keeps of its weights meanwhile."""

    def __init__(self):
        self.level = 0  # the level the engine sleeps at, 0 awake
        self.weights_asleep = False
        self.kv_asleep = False
        self.host_weights: dict | None = None  # level 1: every parameter on the host, by name
        self.buffers: dict = {}  # level 2: the non-Param values kept (RoPE tables), by name

    @property
    def asleep(self) -> bool:
        """Whether any part sleeps (requests are refused until both are awake)."""
        return self.weights_asleep or self.kv_asleep

    def check_awake(self, what: str) -> None:
        """``EngineSleepingError`` for ``what`` (a request, a precompile) while asleep."""
        if self.asleep:
            raise EngineSleepingError(
                f"the engine is asleep (sleep level {self.level}): call wake_up() before {what}"
            )

    def check_sleep(self, level) -> None:
        if isinstance(level, bool) or level not in (1, 2):
            raise ValueError(f"level must be 1 or 2, got {level!r}")
        if self.asleep:
            raise SleepModeError(
                f"the engine is asleep already (level {self.level}): wake_up() before sleeping again"
            )

    def fall_asleep(self, level: int, params, layout: WeightLayout) -> None:
        """Keeps what ``level`` keeps of ``params``: all of it on the host (1), or its
        buffers (2)."""
        values = named_values(params)
        if level == 1:  # copies: on a CPU a view of a device buffer would keep it alive
            self.host_weights = jax.tree.map(np.array, values)
        else:
            self.buffers = {name: values[name] for name in layout.buffer_names}
        self.level, self.weights_asleep, self.kv_asleep = level, True, True

    def check_update(self) -> None:
        """``update_weights`` is refused while the weights wait on the host (level 1)."""
        if self.weights_asleep and self.host_weights is not None:
            raise SleepModeError(
                "update_weights while asleep at level 1: the weights wait on the host, and "
                "wake_up() would bring them back over the new ones. Call "
                "wake_up(tags=['weights']) first (the KV pool may sleep on), or sleep at level 2, "
                "which discards the weights so that update_weights restores them"
            )

    def check_wake(self, tags) -> tuple[bool, bool]:
        """Which parts ``wake_up(tags)`` wakes: (weights, kv_cache). ``tags`` None wakes what
        sleeps; named tags must each sleep. Raises before anything wakes."""
        if tags is None:
            wanted = TAGS
        else:
            if isinstance(tags, str) or not all(isinstance(tag, str) for tag in tags):
                raise ValueError(f"tags must be a list of {list(TAGS)}, got {tags!r}")
            wanted = tuple(tags)
            unknown = [tag for tag in wanted if tag not in TAGS]
            if unknown or not wanted:
                raise ValueError(f"tags must be a non-empty list of {list(TAGS)}, got {tags!r}")
        if not self.asleep:
            raise SleepModeError("wake_up(): the engine is awake (it was not put to sleep)")
        asleep = {"weights": self.weights_asleep, "kv_cache": self.kv_asleep}
        if tags is not None:
            for tag in wanted:
                if not asleep[tag]:
                    raise SleepModeError(f"wake_up(tags={list(wanted)}): the {tag} are awake")
        weights = "weights" in wanted and self.weights_asleep
        if weights and self.host_weights is None:
            raise SleepModeError(
                "the weights were discarded by sleep(level=2): restore them with "
                "update_weights(params) or update_weights_from_path(path), then wake_up() wakes "
                "the KV pool"
            )
        return weights, "kv_cache" in wanted and self.kv_asleep

    def weights_restored(self) -> None:
        self.weights_asleep, self.host_weights, self.buffers = False, None, {}
        self.level = self.level if self.asleep else 0

    def kv_restored(self) -> None:
        self.kv_asleep = False
        self.level = self.level if self.asleep else 0


def require_idle(engine, what: str) -> None:
    """``EngineBusyError`` when ``engine`` has unfinished requests (they go on)."""
    if engine.has_unfinished():
        raise EngineBusyError(
            f"{what} needs an idle engine: {len(engine.requests)} request(s) are unfinished; "
            "let them finish (or abort them) first"
        )


def memory_in_use() -> dict:
    """What this process holds on its devices: ``live_array_bytes`` (every live jax array,
    ``jax.live_arrays()``) and ``device_bytes_in_use`` (the allocators' own count over the
    local devices, where ``memory_stats`` reports one; None on a CPU)."""
    in_use = [(device.memory_stats() or {}).get("bytes_in_use") for device in jax.local_devices()]
    return {
        "live_array_bytes": sum(array.nbytes for array in jax.live_arrays()),
        "device_bytes_in_use": None if None in in_use else sum(in_use),
    }
