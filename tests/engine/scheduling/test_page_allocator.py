"""Tests for jaxgen.engine.scheduling.page_allocator: paging, reference counts, the contiguous allocator,
freeing out of a sliding window. Plain Python (no jax), over the fake KV store and balances of
``tests/engine/scheduling/page_allocator_checks.py`` (prefix caching: ``test_page_allocator_prefix_cache``)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxgen.engine.scheduling.contiguous_allocator import ContiguousAllocator
from jaxgen.engine.scheduling.page_allocator import SCRATCH_PAGE, PageAllocator
from tests.engine.scheduling.page_allocator_checks import (
    admit,
    check_balance,
    check_contiguous_balance,
    check_shared_content,
    make_seq,
)

# -- construction and just-in-time growth ------------------------------------------------------


def test_new_allocator_has_every_page_but_scratch_free():
    alloc = PageAllocator(9, 4)
    assert alloc.num_usable_pages == 8
    assert alloc.num_free_pages == 8
    assert alloc.num_used_pages == 0
    assert SCRATCH_PAGE not in alloc.free_pages
    check_balance(alloc, [])


@pytest.mark.parametrize("num_pages, page_size", [(1, 4), (0, 4), (4, 0)])
def test_rejects_pool_without_usable_page_or_empty_pages(num_pages, page_size):
    with pytest.raises(ValueError):
        PageAllocator(num_pages, page_size)


def test_allocate_grows_block_table_one_page_per_page_size_tokens():
    alloc = PageAllocator(9, 4)
    seq = make_seq(range(3))
    for num_tokens, pages in [(1, 1), (4, 1), (5, 2), (8, 2), (9, 3), (2, 3), (12, 3), (13, 4)]:
        assert alloc.allocate(seq, num_tokens)
        assert len(seq.block_table) == pages
        assert alloc.num_used_pages == pages
        check_balance(alloc, [seq])
    assert alloc.peak_used == 4
    assert SCRATCH_PAGE not in seq.block_table


def test_pages_needed_rounds_up():
    alloc = PageAllocator(4, 4)
    assert [alloc.pages_needed(n) for n in range(10)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_allocate_fails_without_any_change_when_pool_is_exhausted():
    alloc = PageAllocator(5, 2)  # 4 usable pages = 8 tokens
    a, b = make_seq([1]), make_seq([2])
    assert alloc.allocate(a, 5)  # 3 pages
    assert not alloc.can_allocate(b, 3)
    assert not alloc.allocate(b, 3)
    assert b.block_table == []
    assert alloc.num_free_pages == 1
    assert alloc.can_allocate(b, 2) and alloc.allocate(b, 2)
    assert not alloc.can_allocate(a, 7) and not alloc.allocate(a, 7)
    assert len(a.block_table) == 3
    check_balance(alloc, [a, b])


def test_freeing_everything_returns_every_page():
    alloc = PageAllocator(6, 2)
    seqs = [make_seq([i]) for i in range(3)]
    for seq, n in zip(seqs, [3, 1, 4], strict=True):
        assert alloc.allocate(seq, n)
    check_balance(alloc, seqs)
    for seq in seqs:
        alloc.free(seq)
        assert seq.block_table == []
    assert alloc.num_free_pages == alloc.num_usable_pages
    assert all(count == 0 for count in alloc.ref_counts)
    alloc.free(seqs[0])  # freeing an already freed sequence is a no-op
    check_balance(alloc, [])


@settings(max_examples=80, deadline=None)
@given(
    kind=st.sampled_from(["paged", "contiguous"]),
    num_pages=st.integers(2, 9),
    plan=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 14)), max_size=25),
)
def test_can_allocate_agrees_with_allocate_and_pages_balance(kind, num_pages, plan):
    if kind == "paged":
        alloc = PageAllocator(num_pages, 2)
    else:
        alloc = ContiguousAllocator(max(num_pages // 3, 1), 8, 2)
    seqs = [make_seq([i]) for i in range(4)]
    for index, num_tokens in plan:
        seq = seqs[index]
        if num_tokens == 0:
            alloc.free(seq)
            assert seq.block_table == []
            continue
        before = list(seq.block_table)
        expected = alloc.can_allocate(seq, num_tokens)
        assert alloc.allocate(seq, num_tokens) == expected
        if expected:
            assert len(seq.block_table) >= alloc.pages_needed(num_tokens)
            assert seq.block_table[: len(before)] == before, "growth must keep existing pages"
        else:
            assert seq.block_table == before
        assert 0 <= alloc.num_free_pages <= alloc.num_usable_pages
        assert alloc.num_free_pages + alloc.num_used_pages == alloc.num_usable_pages
        assert alloc.peak_used >= alloc.num_used_pages
        if kind == "paged":
            check_balance(alloc, seqs)
        else:
            check_contiguous_balance(alloc, seqs)
    for seq in seqs:
        alloc.free(seq)
    assert alloc.num_used_pages == 0
    assert alloc.num_free_pages == alloc.num_usable_pages


# -- the contiguous baseline --------------------------------------------------------------------


def test_contiguous_allocator_reserves_one_run_of_max_model_len_per_slot():
    alloc = ContiguousAllocator(3, max_model_len=10, page_size=4)
    assert alloc.pages_per_slot == 3
    assert alloc.num_pages == 10 and alloc.num_usable_pages == 9
    seqs = [make_seq([i]) for i in range(4)]
    assert alloc.allocate(seqs[0], 1)
    assert seqs[0].block_table == [1, 2, 3]
    assert alloc.num_used_pages == 3, "a slot is reserved whole, whatever the length"
    assert alloc.allocate(seqs[1], 10) and seqs[1].block_table == [4, 5, 6]
    assert alloc.allocate(seqs[2], 5) and seqs[2].block_table == [7, 8, 9]
    assert not alloc.can_allocate(seqs[3], 1) and not alloc.allocate(seqs[3], 1)
    assert seqs[3].block_table == []
    assert alloc.num_free_pages == 0 and alloc.peak_used == 9
    assert alloc.allocate(seqs[0], 9) and seqs[0].block_table == [1, 2, 3], "growth is in place"
    assert not alloc.can_allocate(seqs[0], 13), "beyond max_model_len"
    check_contiguous_balance(alloc, seqs)
    alloc.free(seqs[1])
    assert seqs[1].block_table == [] and alloc.num_free_pages == 3
    assert alloc.allocate(seqs[3], 2) and seqs[3].block_table == [4, 5, 6], "freed slot reused"
    check_contiguous_balance(alloc, seqs)
    for seq in seqs:
        alloc.free(seq)
    alloc.free(seqs[0])
    assert alloc.num_used_pages == 0 and alloc.free_slots == [0, 1, 2]


def test_contiguous_allocator_never_shares_prefixes():
    alloc = ContiguousAllocator(2, max_model_len=8, page_size=2)
    a, b = make_seq([1, 2, 3, 4, 5]), make_seq([1, 2, 3, 4, 5])
    assert alloc.allocate(a, 5)
    a.num_computed_tokens = 5
    alloc.register_full_pages(a)
    assert alloc.match_prefix(b) == 0
    assert alloc.allocate(b, 5)
    assert not set(a.block_table) & set(b.block_table)
    with pytest.raises(ValueError):
        ContiguousAllocator(0, 8, 2)


def test_fake_kv_helper_catches_a_wrongly_shared_page():
    """Guards the harness itself: check_shared_content must reject a page of other tokens."""
    alloc, kv = PageAllocator(8, 2), {}
    a = make_seq([1, 2, 3])
    assert admit(alloc, kv, a)
    b = make_seq([7, 8, 9])
    b.block_table = [a.block_table[0]]
    b.num_computed_tokens = 2
    with pytest.raises(AssertionError):
        check_shared_content(alloc, kv, b)


def test_free_before_releases_pages_out_of_the_window_and_keeps_positions():
    alloc = PageAllocator(16, 4)
    seq = make_seq(range(18))
    assert alloc.allocate(seq, 18)  # 5 pages
    seq.num_computed_tokens = 18
    alloc.register_full_pages(seq)
    used = alloc.num_used_pages
    assert alloc.free_before(seq, 9) == 2  # pages of tokens 0-3 and 4-7
    assert seq.block_table[:2] == [SCRATCH_PAGE, SCRATCH_PAGE] and len(seq.block_table) == 5
    assert alloc.num_used_pages == used - 2
    assert alloc.free_before(seq, 9) == 0  # already released
    assert alloc.allocate(seq, 22)  # grows at the end, positions unchanged
    assert len(seq.block_table) == 6
    seq.num_computed_tokens = 20
    alloc.register_full_pages(seq)  # walks past the released pages
    alloc.free(seq)
    assert alloc.num_used_pages == 0
    # The released prompt pages were cached while live: a new sequence reuses the whole prefix.
    again = make_seq(range(18))
    assert alloc.match_prefix(again) == 16
