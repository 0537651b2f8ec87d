"""Tests for jaxgen.engine.page_allocator: paging, reference counts, prefix reuse, LRU eviction.

Plain Python (no jax). A fake KV store (page -> the token written into each slot) checks that a
shared page really holds the tokens of the sequence that reuses it, and that no sequence ever
writes into a page someone else can read.
"""

from __future__ import annotations

import builtins
import collections

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from jaxgen.engine import page_allocator
from jaxgen.engine.page_allocator import SCRATCH_PAGE, ContiguousAllocator, PageAllocator
from jaxgen.engine.sequence import Sequence


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


# -- prefix reuse ---------------------------------------------------------------------------------


def test_same_prefix_shares_full_pages_copy_free_with_ref_count_two():
    alloc, kv = PageAllocator(16, 4), {}
    prompt = list(range(100, 110))  # 10 tokens: 2 full pages + 2 tokens
    a = make_seq(prompt)
    assert admit(alloc, kv, a)
    used = alloc.num_used_pages
    b = make_seq(prompt)
    assert alloc.match_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    assert [alloc.ref_counts[p] for p in a.block_table] == [2, 2, 1]
    assert alloc.num_used_pages == used, "sharing takes no new page"
    assert alloc.prefix_hits == 2
    b.num_computed_tokens = 8
    assert alloc.allocate(b, b.num_tokens)
    assert b.block_table[2] != a.block_table[2], "the partial last page is private"
    check_balance(alloc, [a, b])
    alloc.free(a)
    assert [alloc.ref_counts[p] for p in b.block_table[:2]] == [1, 1]
    assert not set(b.block_table) & set(alloc.free_pages), "pages of b stay in use"
    check_balance(alloc, [b])


def test_shared_prefix_with_different_tails_shares_only_identical_pages():
    alloc, kv = PageAllocator(16, 4), {}
    a = make_seq([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13])
    assert admit(alloc, kv, a)
    b = make_seq([1, 2, 3, 4, 5, 6, 0, 8, 9, 10, 11, 12, 13])  # differs in the second page
    assert admit(alloc, kv, b)
    assert b.num_computed_tokens == b.num_tokens
    assert b.block_table[0] == a.block_table[0]
    assert not set(b.block_table[1:]) & set(a.block_table)
    c = make_seq([0, 2, 3, 4, 5, 6, 7, 8, 9])  # differs in the first token: nothing shared
    assert alloc.match_prefix(c) == 0
    assert c.block_table == []
    check_balance(alloc, [a, b])


@pytest.mark.parametrize(
    "prompt_len, page_size, expected",
    [(8, 4, 4), (9, 4, 8), (4, 4, 0), (5, 4, 4), (1, 1, 0), (3, 1, 2), (7, 2, 6), (6, 2, 4)],
)
def test_never_shares_the_page_holding_the_last_prompt_token(prompt_len, page_size, expected):
    alloc, kv = PageAllocator(32, page_size), {}
    prompt = [7 + i for i in range(prompt_len)]
    assert admit(alloc, kv, make_seq(prompt))
    b = make_seq(prompt)
    assert alloc.match_prefix(b) == expected
    assert expected < prompt_len
    last_page = (prompt_len - 1) // page_size
    assert len(b.block_table) <= last_page


def test_prefix_reuse_revives_cached_pages_after_the_first_sequence_was_freed():
    alloc, kv = PageAllocator(8, 2), {}
    prompt = [5, 6, 7, 8, 9]
    a = make_seq(prompt)
    assert admit(alloc, kv, a)
    cached = a.block_table[:2]
    alloc.free(a)
    assert alloc.num_used_pages == 0
    assert all(page in alloc.free_pages for page in cached)
    b = make_seq(prompt)
    assert admit(alloc, kv, b)  # check_shared_content verifies the revived pages' tokens
    assert b.num_cached_tokens == 4
    assert b.block_table[:2] == cached
    assert all(page not in alloc.free_pages and alloc.ref_counts[page] == 1 for page in cached)
    check_balance(alloc, [b])


def test_freed_unregistered_pages_are_reused_before_cached_ones():
    alloc, kv = PageAllocator(6, 2), {}  # 5 usable pages
    prompt = [1, 2, 3, 4, 5]  # pages [1 2] [3 4] are registered, [5] is not
    a = make_seq(prompt)
    assert admit(alloc, kv, a)
    cached, uncached = a.block_table[:2], a.block_table[2]
    alloc.free(a)
    b = make_seq([9, 9, 9, 9, 9])  # 3 pages: the uncached one and the 2 never used
    assert admit(alloc, kv, b)
    assert uncached in b.block_table
    assert not set(cached) & set(b.block_table)
    probe = make_seq(prompt)
    assert alloc.match_prefix(probe) == 4
    alloc.free(probe)
    b_cached = b.block_table[:2]  # [9 9] [9 9]: registered too, and freed after a's pages
    alloc.free(b)
    c = make_seq([8, 8, 8, 8, 8, 8, 8, 8, 8])  # the whole pool: least recently used go last
    assert admit(alloc, kv, c)
    assert set(cached) <= set(c.block_table[:3])
    assert c.block_table[-2:] == [b_cached[1], b_cached[0]], "a prefix's tail goes before its head"


def test_lru_eviction_evicts_least_recently_freed_prefix_first():
    alloc, kv = PageAllocator(7, 2), {}  # 6 usable pages
    a_prompt, b_prompt = [1, 2, 3, 4, 5], [6, 7, 8, 9, 10]
    a = make_seq(a_prompt)
    assert admit(alloc, kv, a)
    alloc.free(a)
    b = make_seq(b_prompt)
    assert admit(alloc, kv, b)
    alloc.free(b)  # now 4 cached pages (2 of a, older; 2 of b) and 2 uncached free pages
    c = make_seq([20, 21, 22, 23, 24, 25, 26])  # 4 pages: the 2 uncached, then a's 2
    assert admit(alloc, kv, c)
    alloc.free(c)
    a2, b2 = make_seq(a_prompt), make_seq(b_prompt)
    assert alloc.match_prefix(a2) == 0, "a was least recently used: evicted"
    assert alloc.match_prefix(b2) == 4, "b was more recently used: still cached"
    check_balance(alloc, [a2, b2])


def test_lru_eviction_drops_the_tail_of_a_prefix_before_its_head():
    alloc, kv = PageAllocator(6, 2), {}  # 5 usable pages
    prompt = [1, 2, 3, 4, 5, 6, 7]  # 3 full cached pages + 1 partial
    a = make_seq(prompt)
    assert admit(alloc, kv, a)
    alloc.free(a)
    # 3 pages: the uncached partial page, the never used one, then a's last cached page.
    c = make_seq([30, 31, 32, 33, 34])
    assert admit(alloc, kv, c)
    b = make_seq(prompt)
    assert alloc.match_prefix(b) == 4, "head pages survive, the tail page went first"
    check_balance(alloc, [b, c])


def test_reuse_counts_and_recently_used_order_follow_a_revived_page():
    alloc, kv = PageAllocator(7, 2), {}
    a_prompt, b_prompt = [1, 2, 3], [4, 5, 6]
    for prompt in (a_prompt, b_prompt):
        seq = make_seq(prompt)
        assert admit(alloc, kv, seq)
        alloc.free(seq)
    again = make_seq(a_prompt)  # touches a's cached page: now more recent than b's
    assert admit(alloc, kv, again)
    alloc.free(again)
    filler = make_seq(list(range(50, 59)))  # 5 pages: evicts b's cached page before a's
    assert admit(alloc, kv, filler)
    assert alloc.match_prefix(make_seq(b_prompt)) == 0
    a3 = make_seq(a_prompt)
    assert alloc.match_prefix(a3) == 2
    check_balance(alloc, [filler, a3])


def test_mismatched_page_tokens_are_never_shared_even_when_hashes_collide(monkeypatch):
    monkeypatch.setattr(page_allocator, "hash", lambda obj: 0, raising=False)
    alloc, kv = PageAllocator(16, 2), {}
    a = make_seq([1, 2, 3, 4, 5])
    assert admit(alloc, kv, a)
    for prompt in ([1, 3, 3, 4, 5], [2, 1, 3, 4, 5], [3, 4, 1, 2, 5]):
        b = make_seq(prompt)
        assert alloc.match_prefix(b) == 0
        assert b.block_table == []
    check_balance(alloc, [a])


def test_collision_of_pages_with_equal_tokens_but_different_prefixes_is_not_shared(monkeypatch):
    # A key that ignores the parent: a page's own tokens match, but the prefix before differs.
    monkeypatch.setattr(
        page_allocator, "hash", lambda obj: len(obj[1]) * 1000 + sum(obj[1]), raising=False
    )
    alloc, kv = PageAllocator(16, 2), {}
    a = make_seq([5, 6, 3, 4, 9])  # page [3 4] is K/V of positions 2-3 after [5 6]
    assert admit(alloc, kv, a)
    b = make_seq([3, 4, 3, 4, 7])
    assert admit(alloc, kv, b)  # check_shared_content: a page of positions 2-3 is not 0-1
    assert b.num_cached_tokens == 0
    check_balance(alloc, [a, b])


def test_repeated_pages_within_one_prompt_are_not_aliased_when_hashes_collide(monkeypatch):
    monkeypatch.setattr(page_allocator, "hash", lambda obj: 0, raising=False)
    alloc, kv = PageAllocator(16, 2), {}
    prompt = [1, 2, 1, 2, 1, 2, 3]
    a = make_seq(prompt)
    assert admit(alloc, kv, a)
    b = make_seq(prompt)
    assert admit(alloc, kv, b)
    assert b.num_cached_tokens == 2, "only the first page is the same K/V"
    assert b.block_table[0] == a.block_table[0]
    check_balance(alloc, [a, b])


def test_collisions_of_parent_hashes_at_different_depths_are_not_shared(monkeypatch):
    monkeypatch.setattr(page_allocator, "hash", lambda obj: sum(obj[1]) % 3, raising=False)
    alloc, kv = PageAllocator(8, 1), {}
    a = make_seq([1])
    assert admit(alloc, kv, a)
    alloc.free(a)
    b = make_seq([1, 2, 1, 2, 3])  # page [3] is cached after a parent hash equal to c's
    assert admit(alloc, kv, b)
    c = make_seq([1, 2, 3, 0])
    assert admit(alloc, kv, c)
    assert c.num_cached_tokens == 2, "[1] [2] are the same K/V; [3] at position 2 is not"
    check_balance(alloc, [b, c])


def test_pages_computed_after_a_duplicate_of_a_cached_page_stay_reusable():
    alloc, kv = PageAllocator(16, 2), {}
    system = [7, 7, 8, 8]
    a, b = make_seq(system + [1, 1, 0]), make_seq(system + [2, 2, 0])
    for seq in (a, b):  # admitted in the same step: b computes its own copy of the system pages
        assert alloc.match_prefix(seq) == 0
        assert alloc.allocate(seq, seq.num_tokens)
    for seq in (a, b):
        compute(alloc, kv, seq, seq.num_tokens)
    assert not set(a.block_table) & set(b.block_table)
    c = make_seq(system + [2, 2, 5])
    assert admit(alloc, kv, c)
    assert c.num_cached_tokens == 6
    assert c.block_table[:3] == a.block_table[:2] + [b.block_table[2]]
    check_balance(alloc, [a, b, c])


def test_cached_page_whose_parent_page_was_reused_is_not_shared_after_a_collision(monkeypatch):
    monkeypatch.setattr(page_allocator, "hash", lambda obj: builtins.hash(obj[1]), raising=False)
    alloc, kv = PageAllocator(7, 2), {}  # 6 usable pages
    system = [7, 7]
    a, b = make_seq(system + [1, 1, 0]), make_seq(system + [2, 2, 0])
    for seq in (a, b):  # b computes its own copy of [7 7]; its [2 2] page refers to a's
        assert alloc.match_prefix(seq) == 0 and alloc.allocate(seq, seq.num_tokens)
    for seq in (a, b):
        compute(alloc, kv, seq, seq.num_tokens)
    a_system_page, b_page = a.block_table[0], b.block_table[1]
    alloc.free(a)
    alloc.free(b)  # a's [7 7] page is now older than b's [2 2] page: it is reused first
    n = make_seq([30, 31, 32, 33, 34, 35, 4, 4])
    assert admit(alloc, kv, n)
    assert n.block_table[3] == a_system_page, "now holds [4 4] after another prefix"
    assert b_page not in n.block_table
    m = make_seq(n.token_ids + [2, 2, 0])  # [2 2] after [4 4]: the key collides with b's page
    assert admit(alloc, kv, m)
    assert m.num_cached_tokens == 8
    check_balance(alloc, [n, m])


def test_prefix_caching_disabled_never_shares():
    alloc, kv = PageAllocator(16, 2, enable_prefix_caching=False), {}
    a = make_seq([1, 2, 3, 4, 5])
    assert admit(alloc, kv, a)
    b = make_seq([1, 2, 3, 4, 5])
    assert alloc.match_prefix(b) == 0
    assert alloc.prefix_hits == 0
    assert not alloc.page_hash and not alloc.hash_to_page


def test_reset_prefix_cache_forgets_cached_pages():
    alloc, kv = PageAllocator(16, 2), {}
    a = make_seq([1, 2, 3, 4, 5])
    assert admit(alloc, kv, a)
    alloc.free(a)
    alloc.reset_prefix_cache()
    b = make_seq([1, 2, 3, 4, 5])
    assert alloc.match_prefix(b) == 0
    assert admit(alloc, kv, b)
    check_balance(alloc, [b])


def test_match_prefix_covers_generated_tokens_of_a_recomputed_sequence():
    alloc, kv = PageAllocator(16, 2), {}
    a = make_seq([1, 2, 3])
    assert admit(alloc, kv, a)
    for token in (40, 41, 42):  # decode three tokens, one page at a time
        a.output_token_ids.append(token)
        assert alloc.allocate(a, a.num_tokens)
        compute(alloc, kv, a, a.num_tokens)
    alloc.free(a)  # preempted: recompute from the cache
    a.num_computed_tokens = 0
    assert admit(alloc, kv, a)
    check_balance(alloc, [a])
    b = make_seq([1, 2, 3, 40, 41, 42])
    assert alloc.match_prefix(b) == 4


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


# -- a stateful model: random prompts sharing prefixes, growth and frees --------------------------

BASE_PROMPTS = ([1, 2, 1, 2, 3, 1, 2, 3, 4, 5, 6, 7], [1, 2, 1, 2, 9, 9, 9, 9])


def _prompt(base: int, shared: int, tail: list[int]) -> list[int]:
    return BASE_PROMPTS[base][:shared] + tail


# Prompts over a tiny alphabet that often share a prefix (and repeat pages within one prompt).
prompts = st.builds(
    _prompt, st.integers(0, 1), st.integers(0, 12), st.lists(st.integers(0, 3), max_size=6)
).filter(bool)


class AllocatorMachine(RuleBasedStateMachine):
    """Random admissions (prefix match + prefill), decode growth and frees over a small pool."""

    live = Bundle("live")

    @initialize(
        num_pages=st.integers(2, 12),
        page_size=st.integers(1, 4),
        prefix_caching=st.booleans(),
    )
    def setup(self, num_pages, page_size, prefix_caching):
        self.alloc = PageAllocator(num_pages, page_size, enable_prefix_caching=prefix_caching)
        self.kv: dict[int, list[int | None]] = {}
        self.seqs: list[Sequence] = []

    @rule(target=live, prompt=prompts)
    def add(self, prompt):
        seq = make_seq(prompt)
        can = self.alloc.can_allocate(seq, seq.num_tokens)
        if admit(self.alloc, self.kv, seq):
            self.seqs.append(seq)
            return seq
        assert not can, "a prefix hit never makes a sequence that fits not fit"
        return multiple()

    @rule(seq=live, tokens=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def grow(self, seq, tokens):
        if seq not in self.seqs:
            return
        before = list(seq.block_table)
        seq.output_token_ids.extend(tokens)
        can = self.alloc.can_allocate(seq, seq.num_tokens)
        ok = self.alloc.allocate(seq, seq.num_tokens)
        assert ok == can
        if ok:
            compute(self.alloc, self.kv, seq, seq.num_tokens)
        else:
            assert seq.block_table == before
            del seq.output_token_ids[-len(tokens) :]

    @rule(seq=consumes(live))
    def free(self, seq):
        if seq in self.seqs:
            self.alloc.free(seq)
            self.seqs.remove(seq)

    @precondition(lambda self: self.alloc.enable_prefix_caching)
    @rule()
    def reset_prefix_cache(self):
        self.alloc.reset_prefix_cache()

    @invariant()
    def pages_balance(self):
        check_balance(self.alloc, self.seqs)

    def teardown(self):
        for seq in self.seqs:
            self.alloc.free(seq)
        check_balance(self.alloc, [])
        assert self.alloc.num_free_pages == self.alloc.num_usable_pages


AllocatorMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
TestAllocatorMachine = AllocatorMachine.TestCase


class CollidingHashAllocatorMachine(AllocatorMachine):
    """The same model with a page hash that collides all the time (and ignores the parent)."""

    @initialize(
        num_pages=st.integers(2, 12),
        page_size=st.integers(1, 4),
        prefix_caching=st.just(True),
    )
    def setup(self, num_pages, page_size, prefix_caching):
        page_allocator.hash = lambda obj: sum(obj[1]) % 3
        super().setup(num_pages, page_size, prefix_caching)

    def teardown(self):
        try:
            if hasattr(self, "alloc"):
                super().teardown()
        finally:
            vars(page_allocator).pop("hash", None)


CollidingHashAllocatorMachine.TestCase.settings = settings(
    max_examples=80,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
)
TestCollidingHashAllocatorMachine = CollidingHashAllocatorMachine.TestCase


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
