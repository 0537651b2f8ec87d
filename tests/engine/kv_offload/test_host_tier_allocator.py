"""The page allocator with a host tier, in plain Python: a findable page evicted for reuse is
queued for a host copy (once), a device miss finds the host copy and gets a fresh page queued
to be filled from it, and the queues empty in order (offloads, then onloads)."""

from __future__ import annotations

from jaxgen.engine.scheduling.host_kv_tier import HostKVTier
from jaxgen.engine.scheduling.page_allocator import PageAllocator
from jaxgen.engine.scheduling.sequence import Sequence

PAGE = 4


def run(allocator: PageAllocator, tokens: list[int]) -> Sequence:
    seq = Sequence(tokens, max_tokens=4)
    seq.num_computed_tokens = allocator.match_prefix(seq)
    assert allocator.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    allocator.register_full_pages(seq)
    return seq


def test_evicted_pages_go_to_the_host_and_come_back():
    host = HostKVTier(capacity_pages=16, page_bytes=64)
    allocator = PageAllocator(5, PAGE, host=host)  # 4 usable pages
    first = list(range(1, 13))  # 3 full pages
    allocator.free(run(allocator, first + [99]))  # 4 pages: 3 cached
    allocator.take_page_moves()
    allocator.free(run(allocator, list(range(50, 66))))  # 4 new pages evict the 3
    offloads, onloads = allocator.take_page_moves()
    assert len(offloads) == 3 and onloads == [] and len(host) == 3
    assert sorted(copy.tokens for _, copy in offloads) == [
        (1, 2, 3, 4),
        (5, 6, 7, 8),
        (9, 10, 11, 12),
    ]
    again = Sequence(first + [7], max_tokens=4)
    assert allocator.match_prefix(again) == 12  # all three from the host
    offloads, onloads = allocator.take_page_moves()
    assert [copy.tokens for _, copy in onloads] == [(1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12)]
    assert [page for page, _ in onloads] == again.block_table
    assert len(offloads) == 3  # the second prompt's pages made room, and went to the host
    assert host.hit_pages == 3 and allocator.prefix_hits == 3
    allocator.free(again)
    assert all(count == 0 for count in allocator.ref_counts)


def test_a_page_reused_before_its_onload_is_not_offloaded():
    host = HostKVTier(capacity_pages=8, page_bytes=64)
    allocator = PageAllocator(3, PAGE, host=host)  # 2 usable pages
    allocator.free(run(allocator, list(range(1, 9))))  # 2 pages cached
    allocator.take_page_moves()
    allocator.free(run(allocator, list(range(20, 28))))
    allocator.take_page_moves()  # the first two pages now live on the host only
    seq = Sequence(list(range(1, 9)) + [5], max_tokens=4)
    assert allocator.match_prefix(seq) == 8
    allocator.free(seq)  # never stepped: its pages are still to be filled from the host
    other = run(allocator, list(range(40, 48)))  # takes both pages back
    offloads, onloads = allocator.take_page_moves()
    assert onloads == []  # the host copies were never written in: nothing stale goes back
    # The pages the onloads took had held 20..27 (still on the device): they go to the host.
    assert sorted(copy.tokens for _, copy in offloads) == [(20, 21, 22, 23), (24, 25, 26, 27)]
    assert sorted(page.tokens[0] for page in host.pages.values()) == [1, 5, 20, 24]
    allocator.free(other)


def test_the_host_tier_evicts_least_recently_used():
    host = HostKVTier(capacity_pages=2, page_bytes=64)
    allocator = PageAllocator(2, PAGE, host=host)  # 1 usable page
    for start in (1, 11, 21, 31):
        allocator.free(run(allocator, list(range(start, start + 4))))
    assert len(host) == 2
    assert [page.tokens[0] for page in host.pages.values()] == [11, 21]


def test_reset_empties_every_tier():
    host = HostKVTier(capacity_pages=8, page_bytes=64)
    allocator = PageAllocator(3, PAGE, host=host)
    for start in (1, 11, 21):
        allocator.free(run(allocator, list(range(start, start + 8))))
    assert len(host) > 0
    allocator.reset_prefix_cache()
    assert len(host) == 0 and allocator.take_page_moves() == ([], [])
