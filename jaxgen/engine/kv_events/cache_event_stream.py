"""From the page allocator's recorded events to the publisher: after each step the engine ran
(a step observer) and after ``reset_prefix_cache``, the events since the last batch go out as
one batch."""

from __future__ import annotations

from jaxgen.config.kv_events_config import KVEventsConfig
from jaxgen.engine.kv_events.zmq_publisher import ZmqEventPublisher
from jaxgen.engine.scheduling.cache_events import CacheEvents


class CacheEventStream:
    """``events`` drained into ``publisher`` (None: the "null" publisher, which drops them)."""

    def __init__(self, events: CacheEvents, publisher: ZmqEventPublisher | None):
        self.events = events
        self.publisher = publisher

    def after_step(self, _event=None) -> None:
        batch = self.events.drain()
        if self.publisher is not None:
            self.publisher.publish(batch)

    def close(self) -> None:
        self.after_step()
        if self.publisher is not None:
            self.publisher.close()


def open_cache_event_stream(
    kv_events_config, allocator, data_parallel_rank: int | None = None
) -> CacheEventStream | None:
    """The stream of ``allocator``'s events under ``kv_events_config`` (an ``EngineConfig``'s
    dict), or None when events are off or the allocator keeps no prefix cache."""
    if kv_events_config is None:
        return None
    config = KVEventsConfig.from_dict(kv_events_config)
    events = getattr(allocator, "events", None)
    if not config.enable_kv_cache_events or not isinstance(events, CacheEvents):
        return None
    if data_parallel_rank is not None:
        config = config.for_replica(data_parallel_rank)
    publisher = ZmqEventPublisher(config, data_parallel_rank) if config.publishes else None
    return CacheEventStream(events, publisher)
