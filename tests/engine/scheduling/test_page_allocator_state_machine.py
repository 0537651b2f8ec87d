"""Stateful property tests for jaxgen.engine.scheduling.page_allocator: random admits, computes, forks and
frees keep the pages balanced and every shared page's content right, with real hashes and
with colliding ones."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
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

from jaxgen.engine.scheduling import page_allocator
from jaxgen.engine.scheduling.page_allocator import PageAllocator
from jaxgen.engine.scheduling.sequence import Sequence
from tests.engine.scheduling.page_allocator_checks import admit, check_balance, compute, make_seq

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
