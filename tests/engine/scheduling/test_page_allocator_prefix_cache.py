"""Tests for jaxgen.engine.scheduling.page_allocator's prefix cache: sharing full pages, reviving freed
ones, LRU eviction, hash collisions never sharing different tokens, turning it off or
resetting it. Plain Python (no jax), over the fake KV store of ``page_allocator_checks``."""

from __future__ import annotations

import builtins

import pytest

from jaxgen.engine.scheduling import page_allocator
from jaxgen.engine.scheduling.page_allocator import PageAllocator
from tests.engine.scheduling.page_allocator_checks import admit, check_balance, compute, make_seq

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
