"""What changed in the prefix cache, as vLLM's KV events name it: a page stored under its hash
(with its parent's hash and its tokens), pages removed, everything cleared. Plain Python.

The page allocator records them, when its ``events`` is a ``CacheEvents``, in the order they
happen; the engine drains them after each step (``jaxgen.engine.kv_events`` publishes them).
A page's hash is the allocator's key for it: the hash of its tokens chained with its parent's
key (the first page's parent, None here, is the sequence's chain root: its LoRA adapter and
RoPE variant), so a subscriber can rebuild the cache's prefix tree from the events alone.
"""

from __future__ import annotations

import dataclasses

# vLLM's ``medium`` of a page held in the accelerator's KV pool, and in host memory.
DEVICE_MEDIUM = "GPU"
HOST_MEDIUM = "CPU"


@dataclasses.dataclass(frozen=True)
class BlockStored:
    """Full pages newly findable by a prefix lookup."""

    block_hashes: list[int]
    parent_block_hash: int | None  # the page before the first of them; None: a prefix's start
    token_ids: list[int]  # every page's tokens, in order
    block_size: int  # tokens a page
    lora_id: int | None  # the LoRA adapter the pages' K/V were computed with
    medium: str | None = DEVICE_MEDIUM


@dataclasses.dataclass(frozen=True)
class BlockRemoved:
    """Pages no prefix lookup finds any more (evicted for reuse, or rewritten)."""

    block_hashes: list[int]
    medium: str | None = DEVICE_MEDIUM


@dataclasses.dataclass(frozen=True)
class AllBlocksCleared:
    """The prefix cache was emptied (``reset_prefix_cache``: new weights, a failed step)."""


class CacheEvents:
    """The events recorded since the last ``drain``."""

    def __init__(self):
        self.pending: list[BlockStored | BlockRemoved | AllBlocksCleared] = []

    def stored(
        self, key: int, parent, tokens, page_size: int, lora_id, medium: str = DEVICE_MEDIUM
    ) -> None:
        """``parent``: the previous page's key; anything else (a chain root) is told as None."""
        parent = parent if isinstance(parent, int) else None
        event = BlockStored([key], parent, list(tokens), page_size, lora_id or None, medium)
        self.pending.append(event)

    def removed(self, key: int, medium: str = DEVICE_MEDIUM) -> None:
        self.pending.append(BlockRemoved([key], medium))

    def cleared(self) -> None:
        self.pending.append(AllBlocksCleared())

    def drain(self) -> list:
        events, self.pending = self.pending, []
        return events
