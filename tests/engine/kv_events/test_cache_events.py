"""The page allocator's recorded prefix-cache events: a subscriber that applies them (stored:
add, removed: drop, cleared: empty) holds exactly the allocator's findable pages, each stored
page's parent stored before it, its tokens the page's."""

from __future__ import annotations

import pytest

from jaxgen.engine.kv_events import KVEventsConfig
from jaxgen.engine.scheduling.cache_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    CacheEvents,
)
from jaxgen.engine.scheduling.page_allocator import PageAllocator
from jaxgen.engine.scheduling.sequence import Sequence

PAGE = 4


def apply(index: dict, events: list) -> None:
    """A router's view of the cache: hash -> (parent hash, tokens)."""
    for event in events:
        if isinstance(event, BlockStored):
            assert event.parent_block_hash is None or event.parent_block_hash in index
            assert len(event.token_ids) == event.block_size * len(event.block_hashes)
            for i, key in enumerate(event.block_hashes):
                tokens = event.token_ids[i * event.block_size : (i + 1) * event.block_size]
                index[key] = (event.parent_block_hash, tuple(tokens))
        elif isinstance(event, BlockRemoved):
            for key in event.block_hashes:
                index.pop(key)
        else:
            assert isinstance(event, AllBlocksCleared)
            index.clear()


def run(allocator: PageAllocator, tokens: list[int]) -> Sequence:
    seq = Sequence(tokens, max_tokens=4)
    allocator.match_prefix(seq)
    assert allocator.allocate(seq, len(tokens))
    seq.num_computed_tokens = len(tokens)
    allocator.register_full_pages(seq)
    return seq


def test_a_subscriber_rebuilds_the_findable_pages():
    events = CacheEvents()
    allocator = PageAllocator(9, PAGE, events=events)
    index: dict = {}
    shared = list(range(100, 108))  # two full pages every prompt shares
    seen = []
    for round_ in range(6):  # 8 usable pages: later prompts evict earlier pages
        seq = run(allocator, shared + [round_] * 9)
        batch = events.drain()
        apply(index, batch)
        seen += batch
        assert set(index) == set(allocator.hash_to_page)
        allocator.free(seq)
    for key, page in allocator.hash_to_page.items():
        assert index[key][1] == allocator.page_tokens[page]
    assert any(isinstance(e, BlockRemoved) for e in seen)  # evictions were told
    allocator.reset_prefix_cache()
    apply(index, events.drain())
    assert index == {} == allocator.hash_to_page


def test_truncated_pages_are_removed_and_parents_chain():
    events = CacheEvents()
    allocator = PageAllocator(16, PAGE, events=events)
    seq = run(allocator, list(range(1, 13)))  # three full pages
    stored = events.drain()
    assert [e.parent_block_hash for e in stored] == [
        None,
        *[e.block_hashes[0] for e in stored[:-1]],
    ]
    assert [e.token_ids for e in stored] == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    allocator.truncate(seq, 10)  # the third page is rewritten from token 10 on
    assert events.drain() == [BlockRemoved(stored[2].block_hashes)]


def test_lora_pages_carry_their_adapter():
    events = CacheEvents()
    allocator = PageAllocator(8, PAGE, events=events)
    seq = Sequence(list(range(1, 6)), max_tokens=4)
    seq.lora_int_id, seq.lora_key = 3, ("adapter", 1)
    allocator.allocate(seq, 5)
    seq.num_computed_tokens = 5
    allocator.register_full_pages(seq)
    assert [e.lora_id for e in events.drain()] == [3]


@pytest.mark.parametrize(
    "config, key",
    [
        ({"enable_kv_cache_events": True, "bogus": 1}, "bogus"),
        ({"enable_kv_cache_events": "yes"}, "enable_kv_cache_events"),
        ({"enable_kv_cache_events": True, "publisher": "kafka"}, "publisher"),
        ({"enable_kv_cache_events": True, "endpoint": "localhost:5557"}, "endpoint"),
        ({"enable_kv_cache_events": True, "replay_endpoint": 5558}, "replay_endpoint"),
        ({"enable_kv_cache_events": True, "buffer_steps": 0}, "buffer_steps"),
        ({"enable_kv_cache_events": True, "topic": 3}, "topic"),
    ],
)
def test_malformed_config_is_refused_naming_the_key(config, key):
    from jaxgen.config.engine_config import EngineConfig

    with pytest.raises(ValueError, match=f"kv_events_config.{key}"):
        EngineConfig(kv_events_config=config)


def test_replicas_offset_their_ports():
    config = KVEventsConfig.from_dict(
        {"enable_kv_cache_events": True, "replay_endpoint": "tcp://*:6000"}
    )
    assert config.publisher == "zmq"
    second = config.for_replica(2)
    assert (second.endpoint, second.replay_endpoint) == ("tcp://*:5559", "tcp://*:6002")
    assert KVEventsConfig(endpoint="ipc:///tmp/kv").for_replica(1).endpoint == "ipc:///tmp/kv_dp1"
