"""Checks the page allocator's tests share: a fake KV store (page -> the token written into each
slot) that shows whether a shared page really holds the tokens of the sequence reusing it, and
page balances (every page free, cached or owned, exactly once)."""

from __future__ import annotations

import collections

from jaxgen.engine.scheduling.contiguous_allocator import ContiguousAllocator
from jaxgen.engine.scheduling.page_allocator import SCRATCH_PAGE, PageAllocator
from jaxgen.engine.scheduling.sequence import Sequence


def make_seq(tokens) -> Sequence:
    return Sequence(list(tokens), max_tokens=16)


def check_balance(alloc: PageAllocator, live: list[Sequence]) -> None:
    """Reference counts equal block-table occurrences; free pages are exactly the unreferenced."""
    counts = collections.Counter(page for seq in live for page in seq.block_table)
    assert SCRATCH_PAGE not in counts
    assert SCRATCH_PAGE not in alloc.free_pages
    assert alloc.ref_counts[SCRATCH_PAGE] == 0
    for page in range(1, alloc.num_pages):
        assert alloc.ref_counts[page] == counts.get(page, 0) >= 0
        assert (page in alloc.free_pages) == (alloc.ref_counts[page] == 0)
    assert alloc.num_free_pages + alloc.num_used_pages == alloc.num_usable_pages
    assert alloc.num_used_pages == len(counts)
    assert alloc.peak_used >= alloc.num_used_pages


def check_contiguous_balance(alloc: ContiguousAllocator, live: list[Sequence]) -> None:
    holders = [seq for seq in live if seq.block_table]
    assert sorted(alloc.slot_of) == sorted(seq.seq_id for seq in holders)
    assert sorted(alloc.free_slots + list(alloc.slot_of.values())) == list(range(alloc.num_slots))
    pages = [page for seq in holders for page in seq.block_table]
    assert len(pages) == len(set(pages)) == alloc.num_used_pages
    assert SCRATCH_PAGE not in pages


def compute(alloc: PageAllocator, kv: dict, seq: Sequence, upto: int) -> None:
    """Writes K/V (the token ids) for positions [num_computed_tokens, upto), as the runner does."""
    for pos in range(seq.num_computed_tokens, upto):
        page = seq.block_table[pos // alloc.page_size]
        assert page != SCRATCH_PAGE
        assert alloc.ref_counts[page] == 1, "wrote into a page another sequence can read"
        assert page not in alloc.page_hash, "wrote into a page registered for prefix reuse"
        # K/V of a position depends on its whole causal prefix (RoPE position and attention).
        kv.setdefault(page, [None] * alloc.page_size)[pos % alloc.page_size] = tuple(
            seq.token_ids[: pos + 1]
        )
    seq.num_computed_tokens = upto
    alloc.register_full_pages(seq)


def admit(alloc: PageAllocator, kv: dict, seq: Sequence) -> bool:
    """Prefix match, allocation of the whole prompt and its prefill; False if the pool is full."""
    seq.num_computed_tokens = seq.num_cached_tokens = alloc.match_prefix(seq)
    check_shared_content(alloc, kv, seq)
    if not alloc.allocate(seq, seq.num_tokens):
        alloc.free(seq)
        seq.num_computed_tokens = 0
        return False
    compute(alloc, kv, seq, seq.num_tokens)
    return True


def check_shared_content(alloc: PageAllocator, kv: dict, seq: Sequence) -> None:
    ps = alloc.page_size
    matched = seq.num_computed_tokens
    assert matched % ps == 0
    assert matched <= seq.num_tokens - 1, "the page of the last token must be computed"
    assert len(seq.block_table) == matched // ps
    assert len(set(seq.block_table)) == len(seq.block_table), "one page aliased twice"
    tokens = seq.token_ids
    for i, page in enumerate(seq.block_table):
        expected = [tuple(tokens[: pos + 1]) for pos in range(i * ps, (i + 1) * ps)]
        assert kv[page] == expected, "shared a page holding the K/V of another prefix"
