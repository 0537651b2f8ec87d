"""How many pages the engine's KV pool holds and which allocator hands them out: the byte budget
(``kv_cache_memory``, or a fraction of an accelerator's free memory; on CPU by default the
smaller of 2 GiB and every slot at ``max_model_len``), the backend's bytes per page, and the
batching plan's slots."""

from __future__ import annotations

import dataclasses
import os

import jax

from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.kv_events_config import KVEventsConfig
from jaxgen.engine.scheduling.batching import BatchingPlan
from jaxgen.engine.scheduling.cache_events import CacheEvents
from jaxgen.engine.scheduling.contiguous_allocator import ContiguousAllocator
from jaxgen.engine.scheduling.host_kv_tier import HostKVTier
from jaxgen.engine.scheduling.page_allocator import PageAllocator

CPU_DEFAULT_KV_BYTES = 2 << 30
ACCELERATOR_KV_FRACTION = 0.9


@dataclasses.dataclass(frozen=True)
class KVPoolPlan:
    """The pool's pages (page 0 included) and their allocator, and the bytes a token takes in
    the pool and on each device the pool is split over."""

    num_pages: int
    allocator: PageAllocator | ContiguousAllocator
    kv_bytes_per_token: int
    kv_bytes_per_token_per_device: int


def kv_budget_bytes(kv_cache_memory, shares: int = 1) -> int:
    """The pool's bytes: ``kv_cache_memory`` bytes, or a fraction of an accelerator's free
    memory (of the CPU default), taken on each of the ``shares`` devices every page is split
    over."""
    if isinstance(kv_cache_memory, int):
        return kv_cache_memory
    fraction = kv_cache_memory
    device = jax.devices()[0]
    if device.platform == "cpu":
        return CPU_DEFAULT_KV_BYTES if fraction is None else int(CPU_DEFAULT_KV_BYTES * fraction)
    stats = device.memory_stats() or {}
    free = stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0)
    return int(free * (ACCELERATOR_KV_FRACTION if fraction is None else fraction)) * shares


def plan_kv_pool(
    config: EngineConfig,
    batching: BatchingPlan,
    backend,
    model_config,
    dtype,
    *,
    max_model_len: int,
    kv_sharding=None,
) -> KVPoolPlan:
    """The pool for ``config`` on ``backend``: a ``ValueError`` when the budget cannot hold one
    sequence of ``max_model_len`` (paged) or every slot's reservation (the other strategies)."""
    page_size = config.page_size
    # The backend's pool layout decides the bytes (the TPU's pads head_dim to 128 lanes).
    page_bytes = backend.kv_bytes_per_page(model_config, page_size, dtype)
    shares = backend.kv_pool_shares(model_config, page_size, dtype, kv_sharding)
    kv_bytes = kv_budget_bytes(config.kv_cache_memory, shares)
    if config.kv_cache_memory is None and jax.devices()[0].platform == "cpu":
        # Host memory is the machine's: take what the engine can use at once (every slot at
        # max_model_len), not the whole default, so a small job starts small.
        pages_per_sequence = -(-max_model_len // page_size)
        kv_bytes = min(kv_bytes, batching.num_slots * pages_per_sequence * page_bytes)
    if batching.paged:
        num_pages = int(kv_bytes // page_bytes) + 1
        need = -(-max_model_len // page_size) + 1
        if num_pages < need:
            raise ValueError(
                f"kv_cache_memory ({kv_bytes} bytes) holds {num_pages - 1} pages, fewer than one "
                f"sequence of max_model_len={max_model_len} needs ({need - 1})"
            )
        allocator = PageAllocator(
            num_pages,
            page_size,
            enable_prefix_caching=config.enable_prefix_caching,
            events=CacheEvents() if KVEventsConfig.records(config.kv_events_config) else None,
            host=host_tier(config, page_bytes),
        )
    else:
        if config.kv_offloading_size:
            raise ValueError(
                f"kv_offloading_size needs batching='paged' (the host tier keeps prefix-cache "
                f"pages), not {config.batching!r}"
            )
        slots = batching.num_slots
        allocator = ContiguousAllocator(slots, max_model_len, page_size)
        if (allocator.num_pages - 1) * page_bytes > kv_bytes:
            raise ValueError(
                f"batching={config.batching!r} reserves max_model_len={max_model_len} tokens "
                f"for each of {slots} slots ({(allocator.num_pages - 1) * page_bytes} bytes), more "
                f"than kv_cache_memory ({kv_bytes} bytes); lower max_model_len or the batch size"
            )
        num_pages = allocator.num_pages
    per_token = page_bytes // page_size
    return KVPoolPlan(num_pages, allocator, per_token, per_token // shares)


def host_tier(config: EngineConfig, page_bytes: int) -> HostKVTier | None:
    """The host-memory KV tier ``kv_offloading_size`` bytes hold, or None (off). A size over
    the host's physical memory, or under one page, is a ``ValueError`` naming it."""
    size = config.kv_offloading_size
    if not size:
        return None
    if not config.enable_prefix_caching:
        raise ValueError("kv_offloading_size needs enable_prefix_caching (it keeps cached pages)")
    physical = host_memory_bytes()
    if physical is not None and size > physical:
        raise ValueError(
            f"kv_offloading_size ({size} bytes) is more than this host's memory ({physical} bytes)"
        )
    if size < page_bytes:
        raise ValueError(
            f"kv_offloading_size ({size} bytes) holds no page (a page takes {page_bytes} bytes)"
        )
    return HostKVTier(size // page_bytes, page_bytes)


def host_memory_bytes() -> int | None:
    """The host's physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
