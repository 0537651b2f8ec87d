"""Load generators: closed-loop clients or open-loop arrivals, in-process (``AsyncLLM``) or over
HTTP (an OpenAI-compatible ``/v1/completions`` stream)."""

from __future__ import annotations

import asyncio
import json
import time

from jaxgen.bench.extra import require
from jaxgen.bench.metrics import RequestTiming
from jaxgen.bench.workloads import BenchRequest, sampling_params


class EngineBackend:
    """Streams requests through an in-process ``AsyncLLM``."""

    name = "in-process AsyncLLM"

    def __init__(self, async_llm):
        self.llm = async_llm

    async def send(self, request: BenchRequest, timing: RequestTiming) -> None:
        params = sampling_params(request.output_len)
        async for out in self.llm.generate(list(request.prompt_token_ids), params):
            timing.record_tokens(len(out.outputs[0].token_ids), time.perf_counter())
            if out.finished:
                metrics = out.metrics or {}
                arrival, scheduled = (
                    metrics.get("arrival_time"),
                    metrics.get("first_scheduled_time"),
                )
                if arrival is not None and scheduled is not None:
                    timing.queue_s = scheduled - arrival
        timing.end = time.perf_counter()

    def compiles(self) -> int | None:
        """XLA compilations so far (a level that compiles is not steady state)."""
        return self.llm.stats().get("compiles")

    async def close(self) -> None:
        pass


class HTTPBackend:
    """Streams requests to an OpenAI-compatible server (``POST {url}/v1/completions``)."""

    def __init__(self, url: str, model: str | None = None, timeout: float = 600.0):
        httpx = require("httpx", "jaxgen bench sweep --url")  # optional: the bench extra
        self.url = url.rstrip("/")
        self.name = f"HTTP {self.url}/v1/completions"
        self.model = model
        self.client = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def model_name(self) -> str:
        """The served model's id (``GET /v1/models``) unless given."""
        if self.model is None:
            response = await self.client.get("/v1/models")
            response.raise_for_status()
            self.model = response.json()["data"][0]["id"]
        return self.model

    async def send(self, request: BenchRequest, timing: RequestTiming) -> None:
        body = {
            "model": await self.model_name(),
            "prompt": list(request.prompt_token_ids),
            "max_tokens": request.output_len,
            "min_tokens": request.output_len,
            "ignore_eos": True,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        reported = None
        async with self.client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")[:200]
                timing.error = f"HTTP {response.status_code}: {text}"
                timing.end = time.perf_counter()
                return
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                now = time.perf_counter()
                if chunk.get("usage"):
                    reported = chunk["usage"].get("completion_tokens")
                if any(choice.get("text") for choice in chunk.get("choices") or []):
                    timing.record_tokens(1, now)  # a chunk per token (held-back bytes excepted)
        timing.end = time.perf_counter()
        if reported is not None:
            timing.output_tokens = reported

    def compiles(self) -> int | None:
        return None

    async def close(self) -> None:
        await self.client.aclose()


async def _one(backend, request: BenchRequest, timings: list, bar) -> None:
    timing = RequestTiming(start=time.perf_counter(), prompt_tokens=len(request.prompt_token_ids))
    try:
        await backend.send(request, timing)
    except Exception as e:  # a failed request is counted, not fatal
        timing.error = repr(e)
        timing.end = time.perf_counter()
    timings.append(timing)
    if bar is not None:
        bar.update(1)


async def closed_loop(
    backend, requests: list[BenchRequest], concurrency: int, bar=None
) -> tuple[list[RequestTiming], float]:
    """``concurrency`` clients, each sending its next request when the previous one finishes.
    Returns the timings and the duration (first start to last end)."""
    pending = list(reversed(requests))
    timings: list[RequestTiming] = []

    async def client() -> None:
        while pending:
            await _one(backend, pending.pop(), timings, bar)

    await asyncio.gather(*(client() for _ in range(max(1, concurrency))))
    return timings, _duration(timings)


async def open_loop(
    backend,
    requests: list[BenchRequest],
    offsets: list[float],
    max_concurrency: int | None = None,
    bar=None,
) -> tuple[list[RequestTiming], float]:
    """Requests sent at ``offsets`` seconds from now (at most ``max_concurrency`` in flight;
    a request's clock starts when it is sent)."""
    timings: list[RequestTiming] = []
    limit = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    origin = time.perf_counter()

    async def arrive(request: BenchRequest, offset: float) -> None:
        await asyncio.sleep(max(0.0, origin + offset - time.perf_counter()))
        if limit is None:
            await _one(backend, request, timings, bar)
            return
        async with limit:
            await _one(backend, request, timings, bar)

    await asyncio.gather(*(arrive(r, o) for r, o in zip(requests, offsets, strict=True)))
    return timings, _duration(timings)


def _duration(timings: list[RequestTiming]) -> float:
    ends = [t.end for t in timings if t.end is not None]
    if not timings or not ends:
        return 0.0
    return max(ends) - min(t.start for t in timings)
