"""KV events: the prefix cache's changes published in vLLM's format over ZeroMQ
(``kv_events_config``), so llm-d / Dynamo-style routers can route on jaxgen's caches."""

from jaxgen.config.kv_events_config import KVEventsConfig
from jaxgen.engine.kv_events.cache_event_stream import (
    CacheEventStream,
    open_cache_event_stream,
)
from jaxgen.engine.kv_events.zmq_publisher import ZmqEventPublisher, encode_batch

__all__ = [
    "CacheEventStream",
    "KVEventsConfig",
    "ZmqEventPublisher",
    "encode_batch",
    "open_cache_event_stream",
]
