"""The prefix cache's events, sent as vLLM sends them: msgpack batches on a ZeroMQ PUB socket,
with replay of recent batches on a ROUTER socket.

Each message is three frames: the topic, the batch's sequence number (8 bytes, big-endian) and
the batch: ``[ts, [event, ...]]`` (``[ts, events, data_parallel_rank]`` for a replica), each
event an array led by its tag, as vLLM's ``msgspec`` structs (``array_like``, ``tag``) encode:
``["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]``,
``["BlockRemoved", block_hashes, medium]``, ``["AllBlocksCleared"]``. A replay request is a
start sequence number (8 bytes); the answer is every kept batch from it as ``[seq, batch]``
frames, then ``[-1, b""]``.

The engine's thread only queues a batch (``publish``); one thread of the publisher's own
encodes, sends and answers replays, so a slow subscriber never slows a step.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time

from jaxgen.config.kv_events_config import KVEventsConfig
from jaxgen.engine.scheduling.cache_events import AllBlocksCleared, BlockRemoved, BlockStored

logger = logging.getLogger("jaxgen")
END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)
_STOP = object()


def encode_batch(ts: float, events: list, data_parallel_rank: int | None = None) -> bytes:
    """One batch in vLLM's wire form (module docstring)."""
    import msgpack

    encoded = []
    for event in events:
        if isinstance(event, (BlockStored, BlockRemoved, AllBlocksCleared)):
            encoded.append([type(event).__name__, *dataclasses.astuple(event)])
        else:
            raise TypeError(f"not a KV cache event: {event!r}")
    batch = [ts, encoded] if data_parallel_rank is None else [ts, encoded, data_parallel_rank]
    return msgpack.packb(batch)


class ZmqEventPublisher:
    """Binds ``config``'s sockets at once (a taken address fails here, at start) and sends
    from a thread of its own."""

    def __init__(self, config: KVEventsConfig, data_parallel_rank: int | None = None):
        try:
            import msgpack  # noqa: F401
            import zmq
        except ImportError as error:
            raise ValueError(
                "kv_events_config with publisher 'zmq' needs pyzmq and msgpack "
                "(pip install 'jaxgen[kv-events]')"
            ) from error
        self.config = config
        self.rank = data_parallel_rank
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        self._replay = None
        try:
            self._pub.bind(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as error:
            self._close_sockets()
            raise ValueError(f"kv_events_config: cannot bind its endpoints: {error}") from error
        self._queue: queue.Queue = queue.Queue()
        self._kept: collections.deque = collections.deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode()
        self.sequence = 0  # the next batch's number
        self.dropped = 0  # batches dropped from a full queue
        self._thread = threading.Thread(target=self._run, name="jaxgen-kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list) -> None:
        """Queues one batch (the engine's thread); nothing for no events."""
        if not events:
            return
        self._queue.put((time.time(), events))
        while self._queue.qsize() > self.config.max_queue_size:
            try:
                self._queue.get_nowait()
                self.dropped += 1
            except queue.Empty:
                break

    def close(self, timeout: float = 5.0) -> None:
        """Sends what is queued, then closes the sockets."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
        self._close_sockets()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            try:
                if item is not None:
                    self._send(*item)
                self._answer_replays()
            except Exception:  # a broken batch or socket must not end the publisher
                logger.exception("publishing KV events failed")

    def _send(self, ts: float, events: list) -> None:
        payload = encode_batch(ts, events, self.rank)
        number = self.sequence.to_bytes(8, "big")
        self._pub.send_multipart([self._topic, number, payload])
        self._kept.append((self.sequence, payload))
        self.sequence += 1

    def _answer_replays(self) -> None:
        import zmq

        while self._replay is not None and self._replay.poll(0):
            frames = self._replay.recv_multipart()
            identity, start = frames[0], int.from_bytes(frames[-1], "big")
            for number, payload in list(self._kept):
                if number >= start:
                    self._replay.send_multipart(
                        [identity, b"", number.to_bytes(8, "big"), payload], zmq.NOBLOCK
                    )
            self._replay.send_multipart([identity, b"", END_OF_REPLAY, b""], zmq.NOBLOCK)

    def _close_sockets(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=500)
        self._context.term()
