"""Which adapters an engine knows, which are read on the host (an LRU beyond ``max_loras``) and
which device slot each running one holds. Host-side bookkeeping over ``LoRASlots``.

An adapter is read and checked when first registered (``register``: a ``ValueError`` then, the
request not queued, nothing half-loaded). It takes a device slot when a step first schedules one
of its sequences (``assign``); the scheduler runs at most ``max_loras`` distinct adapters at
once, so a slot is free or holds an adapter no running sequence uses (the least recently used
such is replaced). Removing an adapter that unfinished requests use is refused.
"""

from __future__ import annotations

import collections

from jaxgen.lora.lora_request import LoRARequest
from jaxgen.lora.lora_slots import LoRASlots
from jaxgen.lora.peft_adapter import PeftAdapter, read_peft_adapter


class LoRAManager:
    """The adapters of one engine (module docstring)."""

    def __init__(self, slots: LoRASlots, *, max_cpu_loras: int | None = None):
        self.slots = slots
        self.max_cpu_loras = max(max_cpu_loras or slots.max_loras, 1)
        self.requests: dict[int, LoRARequest] = {}  # registered, by lora_int_id
        self._loads: dict[int, int] = {}  # lora_int_id -> how many times it was registered
        self._host: collections.OrderedDict[int, PeftAdapter] = collections.OrderedDict()
        self._slot_of: dict[int, int] = {}  # lora_int_id -> device slot
        self._slot_lru: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.slot_loads = 0  # adapters written into a device slot

    def read(self, request: LoRARequest) -> PeftAdapter:
        """Reads and checks ``request``'s adapter (no engine state touched: any thread)."""
        return read_peft_adapter(request, self.slots.targets, self.slots.rank)

    def register(self, request: LoRARequest, adapter: PeftAdapter | None = None) -> tuple:
        """Knows ``request``'s adapter from now on (read now unless ``adapter`` is given or it
        is known). Returns its prefix-cache key. Raises ``ValueError`` for an adapter that does
        not fit, or a ``lora_int_id`` already given to another adapter."""
        known = self.requests.get(request.lora_int_id)
        if known is not None and known != request:
            raise ValueError(
                f"lora_int_id {request.lora_int_id} is adapter {known.lora_name!r} "
                f"({known.lora_path!r}); remove it first"
            )
        if known is None or request.lora_int_id not in self._host:
            self._keep(adapter if adapter is not None else self.read(request))
        else:
            self._host.move_to_end(request.lora_int_id)
        if known is None:
            self.requests[request.lora_int_id] = request
            self._loads[request.lora_int_id] = self._loads.get(request.lora_int_id, 0) + 1
        return (request.lora_int_id, self._loads[request.lora_int_id])

    def remove(self, lora_int_id: int, in_use: set[int]) -> None:
        """Forgets an adapter; ``ValueError`` if unknown, or used by an unfinished request
        (``in_use``: their ids)."""
        if lora_int_id not in self.requests:
            raise ValueError(f"no LoRA adapter with lora_int_id {lora_int_id} is loaded")
        if lora_int_id in in_use:
            name = self.requests[lora_int_id].lora_name
            raise ValueError(f"LoRA adapter {name!r} is in use by running requests")
        del self.requests[lora_int_id]
        self._host.pop(lora_int_id, None)
        slot = self._slot_of.pop(lora_int_id, None)
        self._slot_lru.pop(lora_int_id, None)
        if slot is not None:
            self.slots.write(slot, None)

    def assign(self, seqs, running: set[int]) -> None:
        """Sets each of ``seqs``' ``lora_slot`` for the next step, loading adapters into device
        slots as needed (``running``: the ids of adapters running sequences use)."""
        for seq in seqs:
            seq.lora_slot = self._slot(seq.lora_int_id, running) if seq.lora_int_id else -1

    @property
    def loaded(self) -> list[LoRARequest]:
        return list(self.requests.values())

    def _slot(self, lora_int_id: int, running: set[int]) -> int:
        slot = self._slot_of.get(lora_int_id)
        if slot is not None:
            self._slot_lru.move_to_end(lora_int_id)
            return slot
        taken = set(self._slot_of.values())
        free = [s for s in range(self.slots.max_loras) if s not in taken]
        if not free:
            idle = [other for other in self._slot_lru if other not in running]
            if not idle:  # the scheduler's cap keeps this from happening
                raise RuntimeError("every LoRA slot holds an adapter of a running sequence")
            free = [self._slot_of.pop(idle[0])]
            del self._slot_lru[idle[0]]
        adapter = self._host.get(lora_int_id)
        if adapter is None:  # left the host LRU: read again
            adapter = self.read(self.requests[lora_int_id])
            self._keep(adapter)
        self.slots.write(free[0], adapter)
        self.slot_loads += 1
        self._slot_of[lora_int_id] = free[0]
        self._slot_lru[lora_int_id] = None
        return free[0]

    def _keep(self, adapter: PeftAdapter) -> None:
        self._host[adapter.lora_int_id] = adapter
        self._host.move_to_end(adapter.lora_int_id)
        while len(self._host) > self.max_cpu_loras:
            self._host.popitem(last=False)
