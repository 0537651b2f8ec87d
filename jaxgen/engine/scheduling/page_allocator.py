"""Page allocators for the KV pool. Plain Python: never imports jax.

``PageAllocator`` hands out pages just in time, reference-counts them, and reuses full pages whose
token prefix was computed before (hash of the page's tokens chained with its parent's hash; the
chain starts from the sequence's K/V variant, so keys rotated with LongRoPE's long factors are
never shared with a sequence that uses the short ones). When every layer of the model attends
within a sliding window, ``free_before`` releases a sequence's pages that no query will read
again; their block-table entries become the scratch page, so positions keep their pages.
The non-paged baseline is ``contiguous_allocator.ContiguousAllocator``.
Page 0 is never handed out: padding tokens write their K/V there.
With ``events`` (a ``CacheEvents``) the allocator records each page it makes findable by a
prefix lookup and each it stops finding (``jaxgen.engine.scheduling.cache_events``).
With ``host`` (a ``HostKVTier``, ``kv_offloading_size``) a findable page evicted for reuse is
queued to be copied to the host first, and a lookup that misses the pool finds the page there
and queues it to be copied into a fresh page: ``take_page_moves`` hands the runner both lists
before the step that would overwrite or read those pages.
"""

from __future__ import annotations

import collections

from jaxgen.engine.scheduling.cache_events import HOST_MEDIUM, CacheEvents
from jaxgen.engine.scheduling.host_kv_tier import HostKVTier, HostPage
from jaxgen.engine.scheduling.sequence import Sequence

SCRATCH_PAGE = 0


class Allocator:
    """What both allocators share: ``num_pages`` pages of ``page_size`` tokens (page 0 is
    scratch), and the counters the engine reports."""

    def __init__(self, num_pages: int, page_size: int):
        self.num_pages = num_pages
        self.page_size = page_size
        self.prefix_hits = 0  # pages reused
        self.peak_used = 0
        self.host: HostKVTier | None = None  # the host-memory tier (PageAllocator's ``host``)

    @property
    def num_usable_pages(self) -> int:
        return self.num_pages - 1

    def pages_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)


class PageAllocator(Allocator):
    """Free list, per-sequence block tables, reference counts and prefix reuse."""

    def __init__(
        self,
        num_pages: int,
        page_size: int,
        *,
        enable_prefix_caching: bool = True,
        events: CacheEvents | None = None,
        host: HostKVTier | None = None,
    ):
        if num_pages < 2:
            raise ValueError(f"num_pages must be >= 2 (page 0 is scratch), got {num_pages}")
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        super().__init__(num_pages, page_size)
        self.enable_prefix_caching = enable_prefix_caching
        # Free pages in LRU order; cached (hashed) free pages can still be revived by a prefix hit.
        self.free_pages: collections.OrderedDict[int, None] = collections.OrderedDict(
            (p, None) for p in range(1, num_pages)
        )
        self.ref_counts = [0] * num_pages
        self.page_hash: dict[int, int] = {}  # page -> hash of its full token prefix
        self.page_tokens: dict[int, tuple[int, ...]] = {}
        # A hit must match a page's tokens and, exactly, the prefix before them: the page (and its
        # generation, bumped when the page is reused) that holds the prefix it was computed after.
        # So a hash collision never shares the K/V of another prefix.
        self.page_parent: dict[int, tuple[int, int] | str | None] = {}
        self.page_generation = [0] * num_pages
        self.hash_to_page: dict[int, int] = {}
        self.events = events  # what the prefix cache stored and removed, or None
        self.host = host  # the host-memory tier, or None
        self.page_parent_key: dict[int, object] = {}  # page -> the key of the prefix before it
        self.pending_offloads: list[tuple[int, HostPage]] = []  # (device page, its host copy)
        self.pending_loads: dict[int, HostPage] = {}  # device page -> the host page to copy in

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    @property
    def num_used_pages(self) -> int:
        return self.num_usable_pages - len(self.free_pages)

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Whether ``seq`` can grow to hold ``num_tokens`` tokens."""
        return self.pages_needed(num_tokens) - len(seq.block_table) <= len(self.free_pages)

    def _pop_free_page(self) -> int:
        page, _ = self.free_pages.popitem(last=False)
        if self.host is not None:
            self._offload(page)
        self._forget(page)
        self.page_generation[page] += 1
        self.ref_counts[page] = 1
        return page

    def allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Grows ``seq.block_table`` to hold ``num_tokens`` tokens; False (and no change) if full."""
        need = -(-num_tokens // self.page_size) - len(seq.block_table)
        if need <= 0:  # its pages hold them already (most decode steps): nothing to change
            return True
        if need > len(self.free_pages):
            return False
        for _ in range(max(need, 0)):
            seq.block_table.append(self._pop_free_page())
        self.peak_used = max(self.peak_used, self.num_used_pages)
        return True

    def match_prefix(self, seq: Sequence) -> int:
        """Shares cached full pages of ``seq``'s prefix (before it has pages); returns tokens reused.

        At least one token is always left to compute, so the step that finishes the prompt has a
        query to produce the next token's logits.
        """
        assert not seq.block_table, "match_prefix runs before a sequence owns pages"
        if not self.enable_prefix_caching:
            return 0
        tokens = seq.token_ids
        parent = prefix = _chain_root(seq)  # prefix: which page holds the K/V matched so far
        matched = 0
        for start in range(0, len(tokens) - 1 - self.page_size + 1, self.page_size):
            chunk = tuple(tokens[start : start + self.page_size])
            key = hash((parent, chunk))
            page = self.hash_to_page.get(key)
            if page is None or not self._holds(page, prefix, chunk):
                page = self._onload(seq, key, parent, prefix, chunk)
                if page is None:
                    break
            else:
                if self.ref_counts[page] == 0:
                    del self.free_pages[page]
                self.ref_counts[page] += 1
            seq.block_table.append(page)
            parent = key
            prefix = (page, self.page_generation[page])
            matched += self.page_size
        self.prefix_hits += matched // self.page_size
        self.peak_used = max(self.peak_used, self.num_used_pages)
        return matched

    def register_full_pages(self, seq: Sequence) -> None:
        """Makes the full, computed pages of ``seq`` available for prefix reuse."""
        if not self.enable_prefix_caching:
            return
        num_full = min(seq.num_computed_tokens, seq.num_tokens) // self.page_size
        full = seq.block_table[:num_full]
        if SCRATCH_PAGE not in full and not set(full).difference(self.page_hash):
            return  # every full page is registered already (most steps): the walk changes nothing
        tokens = seq.token_ids
        parent = prefix = _chain_root(seq)
        for i in range(num_full):
            page = seq.block_table[i]
            chunk = tuple(tokens[i * self.page_size : (i + 1) * self.page_size])
            key = hash((parent, chunk))
            if page == SCRATCH_PAGE:  # left the sliding window after it was registered
                page = self.hash_to_page.get(key)
                if page is None or not self._holds(page, prefix, chunk):
                    return  # its cached copy is gone: later pages cannot name their prefix
            if page not in self.page_hash:
                if key not in self.hash_to_page:
                    self.hash_to_page[key] = page
                    self.page_tokens[page] = chunk
                    self.page_parent[page] = prefix
                    self.page_parent_key[page] = parent
                    if self.events is not None:
                        first = i == 0
                        self.events.stored(
                            key, None if first else parent, chunk, self.page_size, seq.lora_int_id
                        )
                self.page_hash[page] = key
            # Children refer to the page a later lookup finds for this prefix (when it holds the
            # same K/V), so pages computed after a duplicate of a cached page stay reusable.
            found = self.hash_to_page.get(key)
            if found is None or not self._holds(found, prefix, chunk):
                found = page
            parent = key
            prefix = (found, self.page_generation[found])

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Beam search: ``child`` (no pages yet) shares ``parent``'s full computed pages, one
        more reference each; the tokens of ``parent``'s last partial page are left for
        ``child`` to compute into a page of its own (copy-on-write of at most one page, by
        recomputing it), so no page is ever written by two sequences."""
        assert not child.block_table, "fork runs before the child owns pages"
        full = min(parent.num_computed_tokens // self.page_size, len(parent.block_table))
        child.block_table = list(parent.block_table[:full])
        for page in child.block_table:
            if page != SCRATCH_PAGE:
                self.ref_counts[page] += 1
        child.num_computed_tokens = full * self.page_size
        child.long_rope = parent.long_rope

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative decoding: ``seq`` keeps K/V for its first ``num_tokens`` tokens only
        (rejected draft tokens' slots are written again later). Pages past them are released;
        a kept page that held rejected tokens forgets its prefix-cache entry, as its contents
        are about to change."""
        keep = self.pages_needed(num_tokens)
        for page in seq.block_table[keep:]:
            if page != SCRATCH_PAGE:
                self._release(page)
        del seq.block_table[keep:]
        if num_tokens % self.page_size and seq.block_table:
            self._forget(seq.block_table[-1])

    def _forget(self, page: int) -> None:
        key = self.page_hash.pop(page, None)
        if key is not None and self.hash_to_page.get(key) == page:
            del self.hash_to_page[key]
            self.page_tokens.pop(page, None)
            self.page_parent.pop(page, None)
            self.page_parent_key.pop(page, None)
            if self.events is not None:
                self.events.removed(key)

    def _holds(
        self, page: int, prefix: tuple[int, int] | str | None, chunk: tuple[int, ...]
    ) -> bool:
        """Whether cached ``page`` holds the K/V of ``chunk`` right after exactly ``prefix``."""
        return (
            page in self.page_tokens
            and self.page_tokens[page] == chunk
            and self.page_parent[page] == prefix
        )

    def free(self, seq: Sequence) -> None:
        """Releases ``seq``'s pages (shared pages stay until their last user frees them)."""
        for page in reversed(seq.block_table):
            if page != SCRATCH_PAGE:
                self._release(page)
        seq.block_table = []

    def free_before(self, seq: Sequence, position: int) -> int:
        """Releases ``seq``'s pages that hold only tokens before ``position`` (sliding-window
        attention reads them no more); their block-table entries become the scratch page.
        Returns how many pages were released."""
        released = 0
        for i in range(min(max(position, 0) // self.page_size, len(seq.block_table))):
            if seq.block_table[i] != SCRATCH_PAGE:
                self._release(seq.block_table[i])
                seq.block_table[i] = SCRATCH_PAGE
                released += 1
        return released

    def _release(self, page: int) -> None:
        self.ref_counts[page] -= 1
        assert self.ref_counts[page] >= 0, f"page {page} freed twice"
        if self.ref_counts[page] == 0:
            self.free_pages[page] = None  # cached pages: most recently used at the end
            if page not in self.page_hash:
                self.free_pages.move_to_end(page, last=False)  # uncached: reuse first

    def reset_prefix_cache(self) -> None:
        self.page_hash.clear()
        self.page_tokens.clear()
        self.page_parent.clear()
        self.hash_to_page.clear()
        self.page_parent_key.clear()
        self.pending_offloads.clear()
        self.pending_loads.clear()
        if self.host is not None:
            self.host.clear()
        if self.events is not None:
            self.events.cleared()

    # -- the host tier (``host``) ----------------------------------------------------------------
    def take_page_moves(self) -> tuple[list[tuple[int, HostPage]], list[tuple[int, HostPage]]]:
        """The pages to copy to the host (before anything writes them again), then the pages
        to copy in from it (before a step reads them); both lists are emptied."""
        offloads, self.pending_offloads = self.pending_offloads, []
        loads, self.pending_loads = list(self.pending_loads.items()), {}
        return offloads, loads

    def _offload(self, page: int) -> None:
        """Queues findable ``page``'s copy to the host before the page is reused."""
        if self.pending_loads.pop(page, None) is not None:
            return  # never written from the host copy it was to get: the host still has it
        key = self.page_hash.get(page)
        if key is None or self.hash_to_page.get(key) != page or key in self.host.pages:
            return
        copy = HostPage(self.page_tokens[page], self.page_parent_key.get(page))
        self.host.put(key, copy)
        self.pending_offloads.append((page, copy))
        if self.events is not None:
            self.events.stored(key, copy.parent_key, copy.tokens, self.page_size, None, HOST_MEDIUM)
            for old in self.host.evicted:
                self.events.removed(old, HOST_MEDIUM)
        self.host.evicted.clear()

    def _onload(self, seq: Sequence, key: int, parent, prefix, chunk) -> int | None:
        """A fresh device page for the host tier's copy of ``chunk`` (after ``parent``'s
        prefix), registered as the pool's own and queued to be copied in; None: not there, or
        no free page."""
        if self.host is None or not self.free_pages:
            return None
        copy = self.host.find(key, parent, chunk)
        if copy is None:
            return None
        page = self._pop_free_page()
        self.hash_to_page[key] = page
        self.page_hash[page] = key
        self.page_tokens[page] = chunk
        self.page_parent[page] = prefix
        self.page_parent_key[page] = parent
        self.pending_loads[page] = copy
        self.host.hit_pages += 1
        if self.events is not None:
            self.events.stored(key, parent, chunk, self.page_size, seq.lora_int_id)
        return page


def _chain_root(seq: Sequence) -> str | None:
    """The start of a sequence's page-hash chain: what, besides tokens, its K/V depend on (the
    LongRoPE variant, the LoRA adapter)."""
    root = "long_rope" if seq.long_rope else None
    return root if seq.lora_key is None else (root, "lora", seq.lora_key)
