"""``PageAllocator.fork`` (beam search) and ``truncate`` (speculative decoding's roll-back):
reference counts, the partial page left to recompute, and the prefix cache kept truthful."""

from __future__ import annotations

from jaxgen.engine.scheduling.page_allocator import PageAllocator
from jaxgen.engine.scheduling.sequence import Sequence


def computed(allocator, tokens, num_computed):
    seq = Sequence(tokens, max_tokens=8)
    allocator.allocate(seq, len(tokens))
    seq.num_computed_tokens = num_computed
    return seq


def test_fork_shares_full_pages_and_leaves_the_partial_one():
    allocator = PageAllocator(16, 4)
    parent = computed(allocator, list(range(10)), 10)  # pages: 4 + 4 + 2 tokens
    child = Sequence(list(range(10)), max_tokens=8)
    allocator.fork(parent, child)
    assert child.block_table == parent.block_table[:2]
    assert child.num_computed_tokens == 8  # the 2 tokens of the partial page are recomputed
    assert [allocator.ref_counts[p] for p in parent.block_table] == [2, 2, 1]
    used = allocator.num_used_pages
    allocator.allocate(child, 11)  # its own last page
    assert allocator.num_used_pages == used + 1
    allocator.free(parent)
    assert [allocator.ref_counts[p] for p in child.block_table[:2]] == [1, 1]
    allocator.free(child)
    assert allocator.num_used_pages == 0


def test_truncate_releases_pages_and_forgets_a_rewritten_page():
    allocator = PageAllocator(16, 4)
    seq = computed(allocator, list(range(11)), 11)  # 3 pages; the first two full
    allocator.register_full_pages(seq)
    kept_page = seq.block_table[1]
    assert kept_page in allocator.page_hash
    allocator.truncate(seq, 6)  # tokens 6.. rejected: page 1 keeps 2 valid tokens
    assert len(seq.block_table) == 2 and allocator.num_used_pages == 2
    assert kept_page not in allocator.page_hash  # its slots 6, 7 will be written again
    assert seq.block_table[0] in allocator.page_hash  # still exactly what it names
    allocator.truncate(seq, 4)  # a page boundary: nothing partial to forget
    assert len(seq.block_table) == 1 and seq.block_table[0] in allocator.page_hash
