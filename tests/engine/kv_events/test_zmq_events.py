"""KV events over ZeroMQ from a running engine: a subscriber that replays from batch 0 and then
reads the PUB socket rebuilds the engine's prefix index (its findable page hashes) from the
events alone, through evictions and a reset; a taken address fails at start."""

from __future__ import annotations

import socket
import time

import msgpack
import pytest
import zmq

from jaxgen import LLM, SamplingParams
from tests.engine.kv_events.test_cache_events import apply  # noqa: F401 (shape of the index)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Subscriber:
    """vLLM's subscriber: SUB on the endpoint, DEALER on the replay endpoint."""

    def __init__(self, endpoint: str, replay: str, topic: str):
        self.context = zmq.Context()
        self.sub = self.context.socket(zmq.SUB)
        self.sub.connect(endpoint)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.replay = self.context.socket(zmq.DEALER)
        self.replay.connect(replay)
        self.batches: dict[int, list] = {}

    def replay_from(self, start: int) -> None:
        self.replay.send_multipart([b"", start.to_bytes(8, "big")])
        while True:
            assert self.replay.poll(5000), "no replay answer"
            _, number, payload = self.replay.recv_multipart()
            if not payload:
                return
            self.batches[int.from_bytes(number, "big")] = msgpack.unpackb(payload)

    def read_published(self, until: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.batches) < until and time.monotonic() < deadline:
            if self.sub.poll(100):
                topic, number, payload = self.sub.recv_multipart()
                self.batches[int.from_bytes(number, "big")] = msgpack.unpackb(payload)

    def index(self) -> dict:
        """hash -> (parent, tokens), from every batch in order."""
        view: dict = {}
        for number in sorted(self.batches):
            _, events, *rank = self.batches[number]
            for tag, *fields in events:
                if tag == "BlockStored":
                    hashes, parent, tokens, size, _lora, medium = fields
                    assert medium == "GPU" and (parent is None or parent in view)
                    for i, key in enumerate(hashes):
                        view[key] = (parent, tuple(tokens[i * size : (i + 1) * size]))
                elif tag == "BlockRemoved":
                    for key in fields[0]:
                        view.pop(key)
                else:
                    assert tag == "AllBlocksCleared" and fields == []
                    view.clear()
        return view

    def close(self) -> None:
        self.sub.close(0)
        self.replay.close(0)
        self.context.term()


@pytest.fixture(scope="module")
def engine_with_events(tiny_model_dir):
    endpoint, replay = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": endpoint,
        "replay_endpoint": replay,
        "topic": "kv",
    }
    # 40 pages of 16 tokens: the prompts below overflow them, so pages are evicted.
    llm = LLM(
        tiny_model_dir,
        max_model_len=256,
        kv_cache_memory=40 * 16 * 2 * 2 * 2 * 16 * 4,  # 2 layers, K and V, 2 heads of 16, fp32
        kv_events_config=config,
    )
    yield llm, endpoint, replay
    llm.engine.shutdown()


def test_a_subscriber_rebuilds_the_prefix_index_from_the_events(engine_with_events):
    llm, endpoint, replay = engine_with_events
    subscriber = Subscriber(endpoint, replay, "kv")
    try:
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        system = list(range(10, 90))  # five shared pages
        for turn in range(6):
            prompts = [system + [200 + turn * 8 + i] * (40 + 7 * i) for i in range(4)]
            llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        publisher = llm.engine.cache_events.publisher
        deadline = time.monotonic() + 10
        while publisher._queue.qsize() and time.monotonic() < deadline:
            time.sleep(0.05)
        subscriber.replay_from(0)  # the batches sent before it joined, then what follows
        subscriber.read_published(publisher.sequence)
        assert sorted(subscriber.batches) == list(range(publisher.sequence))
        allocator = llm.engine.scheduler.allocator
        view = subscriber.index()
        assert set(view) == set(allocator.hash_to_page)
        for key, page in allocator.hash_to_page.items():
            assert view[key][1] == allocator.page_tokens[page]
        kinds = {tag for b in subscriber.batches.values() for tag, *_ in b[1]}
        assert {"BlockStored", "BlockRemoved"} <= kinds  # the pool overflowed: evictions told
        llm.engine.reset_prefix_cache()
        subscriber.read_published(publisher.sequence + 1)
        assert subscriber.index() == {}
    finally:
        subscriber.close()


def test_a_taken_endpoint_fails_at_start(engine_with_events, tiny_model_dir):
    _, endpoint, _ = engine_with_events
    config = {"enable_kv_cache_events": True, "endpoint": endpoint}
    with pytest.raises(ValueError, match="kv_events_config: cannot bind"):
        LLM(tiny_model_dir, max_model_len=64, kv_cache_memory=1 << 20, kv_events_config=config)
