"""``/health``'s latency while one large request is served, as issue 64 measured it: a 3.9 MB
``/tokenize`` (with and without ``return_token_strs``), a completion prompt of 10^6 token ids
(refused for its length), ``/detokenize`` of 10^6 ids, TGI ``decoder_input_details`` and
completions ``echo`` + ``logprobs`` on a ~2,000-token prompt. For each: the request's status and
duration, and the max and p50 latency of ``/health`` polled every 10 ms from another thread
while it runs.

Starts `jaxgen serve` on the default model with its default limits in a subprocess (or probes
``--url``) and prints one JSON object; ``--out`` keeps it.

    python -m benchmarks.event_loop_latency [--repeat 3] [--out event_loop.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx

from benchmarks.server_probe import measured_on_server, print_report

POLL_INTERVAL_S = 0.01
LONG_PROMPT = "hello world " * 999 + "hello world"  # 2,000 SmolLM2 tokens


def compact(body: dict) -> bytes:
    """A request body encoded once, before the clock starts (the client's own JSON encoding
    would otherwise hold its poller back)."""
    return json.dumps(body, separators=(",", ":")).encode()


def huge_text() -> str:
    return "hello world " * 325_000  # 3.9 MB


def million_ids() -> list[int]:
    return [i % 100 for i in range(10**6)]  # 3 MB as compact JSON


# The requests of issue 64 whose cost grows with their input or output: name -> a builder of
# ``(path, body)``. Every body is under the default ``--max-body-bytes`` (4 MiB).
LARGE_REQUESTS = {
    "tokenize 3.9 MB": lambda: ("/tokenize", compact({"prompt": huge_text()})),
    "tokenize 3.9 MB + token strs": lambda: (
        "/tokenize",
        compact({"prompt": huge_text(), "return_token_strs": True}),
    ),
    "completion of 10^6 token ids": lambda: (
        "/v1/completions",
        compact({"prompt": million_ids(), "max_tokens": 1}),
    ),
    "detokenize 10^6 ids": lambda: ("/detokenize", compact({"tokens": million_ids()})),
    "TGI decoder_input_details, 2k tokens": lambda: (
        "/generate",
        compact(
            {
                "inputs": LONG_PROMPT,
                "parameters": {"max_new_tokens": 1, "details": True, "decoder_input_details": True},
            }
        ),
    ),
    "completion echo + logprobs 5, 2k tokens": lambda: (
        "/v1/completions",
        compact({"prompt": LONG_PROMPT, "max_tokens": 1, "echo": True, "logprobs": 5}),
    ),
}


class HealthPoller:
    """Polls ``/health`` every ``POLL_INTERVAL_S`` on its own connection, from a thread; keeps
    each poll's start and latency."""

    def __init__(self, url: str):
        self.client = httpx.Client(base_url=url, timeout=60)
        self.polls: list[tuple[float, float]] = []  # (start, seconds)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="health-poller", daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            start = time.perf_counter()
            self.client.get("/health")
            self.polls.append((start, time.perf_counter() - start))
            time.sleep(POLL_INTERVAL_S)

    def __enter__(self) -> HealthPoller:
        self.client.get("/health")  # the connection, opened before measuring
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.client.close()

    def during(self, start: float, end: float) -> list[float]:
        """Latencies of the polls that overlapped ``[start, end]``."""
        return [
            seconds for begun, seconds in self.polls if begun <= end and begun + seconds >= start
        ]


def health_while(url: str, path: str, body: bytes, settle_s: float = 0.2) -> dict:
    """Serves one request while ``/health`` is polled: its status, duration and the
    ``/health`` latencies (max, p50, count) of the polls that overlapped it."""
    headers = {"content-type": "application/json"}
    with httpx.Client(base_url=url, timeout=600) as client, HealthPoller(url) as poller:
        time.sleep(settle_s)
        start = time.perf_counter()
        answer = client.post(path, content=body, headers=headers)
        end = time.perf_counter()
        time.sleep(settle_s)
    latencies = poller.during(start, end)
    return {
        "status": answer.status_code,
        "response_bytes": len(answer.content),
        "seconds": end - start,
        "health_max_s": max(latencies),
        "health_p50_s": statistics.median(latencies),
        "health_polls": len(latencies),
    }


def idle_health(url: str, seconds: float = 2.0) -> dict:
    """``/health``'s latency while nothing else is served: the machine's own noise."""
    with HealthPoller(url) as poller:
        time.sleep(seconds)
    latencies = [latency for _, latency in poller.polls]
    return {
        "health_max_ms": round(1000 * max(latencies), 1),
        "health_p50_ms": round(1000 * statistics.median(latencies), 1),
        "health_polls": len(latencies),
    }


def measure(url: str, repeat: int) -> dict:
    """Each large request ``repeat`` times after a warm-up: the worst max, the median p50 and
    the median duration; ``/health`` alone first."""
    report = {"idle": idle_health(url)}
    for name, build in LARGE_REQUESTS.items():
        path, body = build()
        health_while(url, path, body)  # warm: compiles, token-text caches
        runs = [health_while(url, path, body) for _ in range(repeat)]
        report[name] = {
            "status": runs[0]["status"],
            "response_bytes": runs[0]["response_bytes"],
            "seconds": round(statistics.median(r["seconds"] for r in runs), 3),
            "health_max_ms": round(1000 * max(r["health_max_s"] for r in runs), 1),
            "health_p50_ms": round(1000 * statistics.median(r["health_p50_s"] for r in runs), 1),
            "health_polls": sum(r["health_polls"] for r in runs),
        }
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=None, help="probe this server instead of starting one")
    parser.add_argument("--port", type=int, default=8095)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = measured_on_server(args.url, args.port, lambda url: measure(url, args.repeat))
    print_report(report, args.out)


if __name__ == "__main__":
    main()
