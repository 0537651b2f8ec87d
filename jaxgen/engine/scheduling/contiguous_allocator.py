"""``ContiguousAllocator``: the non-paged baseline. Each running slot reserves a fixed run of
pages covering ``max_model_len`` tokens, as a contiguous per-slot KV cache does. Plain Python."""

from __future__ import annotations

from jaxgen.engine.scheduling.page_allocator import Allocator
from jaxgen.engine.scheduling.sequence import Sequence


class ContiguousAllocator(Allocator):
    """Per-slot reservation of ``max_model_len`` tokens: continuous batching without paging."""

    def __init__(self, num_slots: int, max_model_len: int, page_size: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.pages_per_slot = -(-max_model_len // page_size)
        super().__init__(1 + num_slots * self.pages_per_slot, page_size)
        self.num_slots = num_slots
        self.free_slots = list(range(num_slots))
        self.slot_of: dict[int, int] = {}

    @property
    def num_used_pages(self) -> int:
        return len(self.slot_of) * self.pages_per_slot

    @property
    def num_free_pages(self) -> int:
        return self.num_usable_pages - self.num_used_pages

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        if self.pages_needed(num_tokens) > self.pages_per_slot:
            return False
        return seq.seq_id in self.slot_of or bool(self.free_slots)

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        if not self.can_allocate(seq, num_tokens):
            return False
        if seq.seq_id not in self.slot_of:
            slot = self.free_slots.pop(0)
            self.slot_of[seq.seq_id] = slot
            first = 1 + slot * self.pages_per_slot
            seq.block_table = list(range(first, first + self.pages_per_slot))
        self.peak_used = max(self.peak_used, self.num_used_pages)
        return True

    def match_prefix(self, seq: Sequence) -> int:
        return 0

    def register_full_pages(self, seq: Sequence) -> None:
        pass

    def free_before(self, seq: Sequence, position: int) -> int:
        return 0  # a slot's pages are reserved whatever it holds

    def fork(self, parent: Sequence, child: Sequence) -> None:
        child.num_computed_tokens = 0  # a slot shares nothing: the child computes every token
        child.long_rope = parent.long_rope

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        pass  # the slot keeps its pages; rejected slots are written again

    def free(self, seq: Sequence) -> None:
        slot = self.slot_of.pop(seq.seq_id, None)
        if slot is not None:
            self.free_slots.append(slot)
            self.free_slots.sort()
        seq.block_table = []

    def reset_prefix_cache(self) -> None:
        pass
