"""``kv_events_config``: vLLM's ``KVEventsConfig`` fields, read from a dict (JSON on the
command line, ``--kv-events-config``) and checked when the engine's config is made."""

from __future__ import annotations

import dataclasses
import re

PUBLISHERS = ("null", "zmq")
ENDPOINT = re.compile(r"(tcp|ipc|inproc)://.+")


@dataclasses.dataclass(frozen=True)
class KVEventsConfig:
    """Where and how the prefix cache's events go (vLLM's names and defaults).

    Attributes:
        enable_kv_cache_events: record the events at all.
        publisher: ``"zmq"`` (the default once enabled) or ``"null"`` (recorded, not sent).
        endpoint: the PUB socket's address (bound; ``tcp://*:5557``).
        replay_endpoint: a ROUTER socket's address answering "batches from sequence number N"
            from the last ``buffer_steps`` batches; None: no replay.
        buffer_steps: batches kept for replay.
        hwm: the PUB socket's send high-water mark (messages queued per subscriber).
        max_queue_size: batches waiting for the publisher's thread; past it the oldest waiting
            batch is dropped (a subscriber sees the gap in sequence numbers and may replay).
        topic: the first frame of every message (subscribers filter on it).
    """

    enable_kv_cache_events: bool = False
    publisher: str | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    @classmethod
    def from_dict(cls, value) -> KVEventsConfig:
        """Checks every key; ``ValueError`` naming ``kv_events_config.<key>``."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"kv_events_config must be a dict (a JSON object), got {value!r}")
        names = {field.name for field in dataclasses.fields(cls)}
        for key in value:
            if key not in names:
                raise ValueError(
                    f"kv_events_config.{key} is not a field (fields: {', '.join(sorted(names))})"
                )
        config = cls(**value)
        config.check()
        if config.enable_kv_cache_events and config.publisher is None:
            config = dataclasses.replace(config, publisher="zmq")
        return config

    def check(self) -> None:
        def refuse(key: str, what: str):
            raise ValueError(f"kv_events_config.{key} {what}, got {getattr(self, key)!r}")

        if not isinstance(self.enable_kv_cache_events, bool):
            refuse("enable_kv_cache_events", "must be true or false")
        if self.publisher is not None and self.publisher not in PUBLISHERS:
            refuse("publisher", f"must be one of {PUBLISHERS}")
        for key in ("endpoint", "replay_endpoint"):
            address = getattr(self, key)
            if not (address is None and key == "replay_endpoint") and not (
                isinstance(address, str) and ENDPOINT.fullmatch(address)
            ):
                refuse(key, "must be a ZeroMQ address (tcp://host:port, ipc://path, inproc://name)")
        for key in ("buffer_steps", "hwm", "max_queue_size"):
            number = getattr(self, key)
            if not isinstance(number, int) or isinstance(number, bool) or number < 1:
                refuse(key, "must be an integer >= 1")
        if not isinstance(self.topic, str):
            refuse("topic", "must be a string")

    @classmethod
    def records(cls, value) -> bool:
        """Whether an engine whose ``kv_events_config`` is ``value`` (a dict, or None) has its
        page allocator record the prefix cache's events."""
        return value is not None and cls.from_dict(value).enable_kv_cache_events

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def for_replica(self, rank: int) -> KVEventsConfig:
        """Replica ``rank``'s addresses (vLLM's data-parallel offset): a TCP port plus ``rank``,
        another address with ``_dp<rank>`` appended; replica 0 keeps the configured ones."""
        if rank == 0:
            return self
        return dataclasses.replace(
            self,
            endpoint=offset_endpoint(self.endpoint, rank),
            replay_endpoint=None
            if self.replay_endpoint is None
            else offset_endpoint(self.replay_endpoint, rank),
        )


def offset_endpoint(endpoint: str, rank: int) -> str:
    match = re.fullmatch(r"(tcp://.*):(\d+)", endpoint)
    if match is not None:
        return f"{match.group(1)}:{int(match.group(2)) + rank}"
    return f"{endpoint}_dp{rank}"
