"""A bounded soak: thousands of requests from concurrent clients, with disconnects and bad inputs
mixed in. No 5xx, no accepted request lost, every KV page back in the pool at the end."""

from __future__ import annotations

import asyncio
import collections
import json
import random
import time

import httpx
import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import TINY_ENGINE_KNOBS, ServerThread, shared_llm

NUM_REQUESTS = 2000
NUM_CLIENTS = 32
WARMUP_REQUESTS = 256
LATENCIES: list[float] = []  # completed non-streaming requests
PROMPTS = ["Hello", "The quick brown fox", "Once upon a time", "1 2 3 4", "Paris is"]
BAD_REQUESTS = [
    ("/generate", b"{oops"),
    ("/generate", b'{"inputs": 5}'),
    ("/generate", b'{"inputs": "x", "parameters": {"max_new_tokens": -1}}'),
    ("/generate_stream", b'{"inputs": "x", "parameters": {"top_p": 7}}'),
    ("/generate", json.dumps({"inputs": "hello " * 400}).encode()),
    ("/v1/completions", b'{"model": "m", "prompt": [99999999]}'),
    ("/v1/chat/completions", b'{"model": "m", "messages": "hi"}'),
    ("/v1/completions", b'{"model": "m", "prompt": "x", "max_tokens": 100000}'),
    ("/", b"\xff\xff\xff"),
]


def valid_request(rng: random.Random) -> tuple[str, dict, bool]:
    """A random valid greedy request: (path, body, streams). (Greedy only: each sampling-flag
    combination would compile more engine programs.)"""
    prompt = rng.choice(PROMPTS)
    tokens = rng.randint(1, 8)
    kind = rng.randrange(6)
    if kind == 0:
        return (
            "/generate",
            {
                "inputs": prompt,
                "parameters": {
                    "max_new_tokens": tokens,
                    "details": rng.random() < 0.5,
                },
            },
            False,
        )
    if kind == 1:
        return (
            "/generate_stream",
            {"inputs": prompt, "parameters": {"max_new_tokens": tokens}},
            True,
        )
    if kind == 2:
        return (
            "/v1/completions",
            {
                "model": "m",
                "prompt": prompt,
                "max_tokens": tokens,
                "temperature": 0.0,
            },
            False,
        )
    if kind == 3:
        return (
            "/v1/completions",
            {
                "model": "m",
                "prompt": prompt,
                "max_tokens": tokens,
                "stream": True,
                "temperature": 0.0,
            },
            True,
        )
    messages = [{"role": "user", "content": prompt}]
    return (
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": messages,
            "max_tokens": tokens,
            "stream": kind == 5,
            "temperature": 0.0,
        },
        kind == 5,
    )


async def one_request(client: httpx.AsyncClient, rng: random.Random, counts: collections.Counter):
    roll = rng.random()
    if roll < 0.12:
        path, body = rng.choice(BAD_REQUESTS)
        response = await client.post(path, content=body)
        counts[f"status_{response.status_code}"] += 1
        assert 400 <= response.status_code < 500, (path, response.status_code, response.text)
        assert "error" in response.json()
        counts["bad_rejected"] += 1
        return
    path, body, streams = valid_request(rng)
    disconnect = roll > 0.9
    if streams:
        async with client.stream("POST", path, json=body) as response:
            counts[f"status_{response.status_code}"] += 1
            assert response.status_code == 200, (path, response.status_code)
            events = []
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
                    if disconnect:
                        counts["stream_disconnected"] += 1
                        return
        check_stream(path, events)
        counts["stream_completed"] += 1
        return
    if disconnect:
        try:
            await asyncio.wait_for(client.post(path, json=body), timeout=rng.uniform(0.0, 0.02))
        except asyncio.TimeoutError:
            counts["request_disconnected"] += 1
        else:
            counts["request_completed"] += 1
        return
    start = time.monotonic()
    response = await client.post(path, json=body)
    LATENCIES.append(time.monotonic() - start)
    counts[f"status_{response.status_code}"] += 1
    assert response.status_code == 200, (path, response.status_code, response.text)
    answer = response.json()
    assert "generated_text" in answer or answer["choices"][0]["finish_reason"] in ("stop", "length")
    counts["request_completed"] += 1


def check_stream(path: str, events: list[str]) -> None:
    assert events, path
    if path.startswith("/v1"):
        assert events[-1] == "[DONE]", events[-3:]
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] in ("stop", "length"), last
    else:
        last = json.loads(events[-1])
        assert last["generated_text"] is not None and last["details"]["finish_reason"], last


async def soak(url: str, counts: collections.Counter, num_requests: int, seed: int) -> None:
    remaining = iter(range(num_requests))
    limits = httpx.Limits(max_connections=NUM_CLIENTS * 2, max_keepalive_connections=NUM_CLIENTS)

    async def client_loop(worker: int) -> None:
        rng = random.Random(seed * 1000 + worker)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            for _ in remaining:
                await one_request(client, rng, counts)
                counts["requests"] += 1

    await asyncio.gather(*(client_loop(worker) for worker in range(NUM_CLIENTS)))


@pytest.mark.slow
def test_soak(tiny_model_dir):
    llm = shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)
    settings = ServerSettings(model=tiny_model_dir, max_total_tokens=64, served_model_name="m")
    app = create_app(llm, settings)
    with ServerThread(app) as server:
        # Warm-up round (not counted): the engine compiles a program per batch shape it meets.
        warm_start, compiles_before = time.monotonic(), llm.stats()["compiles"]
        asyncio.run(soak(server.url, collections.Counter(), WARMUP_REQUESTS, seed=1))
        warmup = time.monotonic() - warm_start
        warmup_compiles = llm.stats()["compiles"] - compiles_before
        counts: collections.Counter = collections.Counter()
        compiles_before = llm.stats()["compiles"]
        LATENCIES.clear()
        start = time.monotonic()
        asyncio.run(soak(server.url, counts, NUM_REQUESTS, seed=0))
        elapsed = time.monotonic() - start
        deadline = time.monotonic() + 30
        while True:
            stats = llm.stats()
            if stats["num_running"] == stats["num_waiting"] == stats["kv_pages_used"] == 0:
                break
            assert time.monotonic() < deadline, stats
            time.sleep(0.05)
        metrics = httpx.get(f"{server.url}/metrics").text
        assert app.state.server.in_flight == 0 and not app.state.server.active_request_ids
    print(f"\nwarm-up: {WARMUP_REQUESTS} requests in {warmup:.1f} s, {warmup_compiles} compiles")
    print(
        f"soak: {counts['requests']} requests from {NUM_CLIENTS} clients in {elapsed:.1f} s "
        f"({counts['requests'] / elapsed:.1f} req/s)"
    )
    for key, value in sorted(counts.items()):
        print(f"  {key}: {value}")
    ordered = sorted(LATENCIES)
    print(
        f"  non-streaming latency: p50={ordered[len(ordered) // 2]:.3f} s "
        f"p95={ordered[int(len(ordered) * 0.95)]:.3f} s"
    )
    print(
        f"  engine: steps={stats['steps']} preemptions={stats['preemptions']} "
        f"kv_pages_peak={stats['kv_pages_peak']} "
        f"compiles_during_soak={stats['compiles'] - compiles_before}"
    )
    assert counts["requests"] == NUM_REQUESTS
    assert not any(key.startswith("status_5") for key in counts)
    completed = (
        counts["request_completed"]
        + counts["stream_completed"]
        + counts["request_disconnected"]
        + counts["stream_disconnected"]
        + counts["bad_rejected"]
    )
    assert completed == NUM_REQUESTS  # every request accounted for: none lost
    finished = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("jaxgen_request_success_total{")
        and ('"length"' in line or '"stop"' in line)
    )
    assert finished >= counts["request_completed"] + counts["stream_completed"]
