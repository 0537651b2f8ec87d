"""The host-memory KV tier (``kv_offloading_size``): full prefix-cache pages that leave the
device pool, kept on the host under the same prefix hash. Plain Python: the page data is an
opaque handle the runner makes and reads (``jaxgen.engine.step.kv_page_mover``).

A page the allocator evicts while a prefix lookup could still find it is *offloaded*: copied
here before its device page is written again. A lookup that misses the device pool tries this
tier next, with the same check the pool makes (the page's tokens, and the key of the prefix
before them); a hit is *onloaded* into a fresh device page before its sequence's step. The
tier evicts least recently used pages past ``capacity_pages``.
"""

from __future__ import annotations

import collections
import dataclasses


@dataclasses.dataclass
class HostPage:
    """One page's K/V on the host and what it was computed after."""

    tokens: tuple[int, ...]
    parent_key: object  # the previous page's key, or the sequence's chain root
    data: object = None  # the runner's host copy (set when the copy is made)


class HostKVTier:
    """Key -> ``HostPage``, least recently used first, at most ``capacity_pages``."""

    def __init__(self, capacity_pages: int, page_bytes: int):
        if capacity_pages < 1:
            raise ValueError(f"capacity_pages must be >= 1, got {capacity_pages}")
        self.capacity_pages = capacity_pages
        self.page_bytes = page_bytes
        self.pages: collections.OrderedDict[int, HostPage] = collections.OrderedDict()
        self.hit_pages = 0  # pages onloaded for a prefix hit
        self.offloaded_pages = 0  # pages copied device -> host
        self.evicted = []  # keys evicted since the last drain (for KV events)

    def __len__(self) -> int:
        return len(self.pages)

    def find(self, key: int, parent_key, tokens: tuple[int, ...]) -> HostPage | None:
        """The page holding ``tokens`` right after ``parent_key``'s prefix, or None."""
        page = self.pages.get(key)
        if page is None or page.tokens != tokens or page.parent_key != parent_key:
            return None
        self.pages.move_to_end(key)
        return page

    def put(self, key: int, page: HostPage) -> None:
        """Keeps ``page`` (most recently used), evicting the least recently used past the
        capacity."""
        self.pages[key] = page
        self.pages.move_to_end(key)
        self.offloaded_pages += 1
        while len(self.pages) > self.capacity_pages:
            old, _ = self.pages.popitem(last=False)
            self.evicted.append(old)

    def clear(self) -> None:
        self.pages.clear()

    @property
    def offloaded_bytes(self) -> int:
        return self.offloaded_pages * self.page_bytes

    @property
    def onloaded_bytes(self) -> int:
        return self.hit_pages * self.page_bytes
