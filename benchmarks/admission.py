"""Admission under a burst, as issue 64 measured it: ``--schemas`` concurrent chat requests, each
with a benign JSON schema of its own (every one compiles), then ``--streams`` concurrent streamed
completions; the statuses each burst gets (429 only when the waiting queue is full), their
latencies, and the engine's running, waiting and KV pages once every client is done.

Starts `jaxgen serve` on the default model with its default limits in a subprocess (or probes
``--url``) and prints one JSON object; ``--out`` keeps it.

    python benchmarks/admission.py [--schemas 20] [--streams 128] [--out admission.json]
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import time

import httpx

from benchmarks.server_probe import measured_on_server, print_report


def benign_schema(salt: int) -> dict:
    """A small object schema, different per request (so each compiles a grammar of its own)."""
    return {
        "type": "object",
        "properties": {
            f"name_{salt}": {"type": "string", "maxLength": 12},
            f"count_{salt}": {"type": "integer", "minimum": 0, "maximum": 100},
            "tags": {"type": "array", "items": {"enum": ["a", "b", str(salt)]}, "maxItems": 3},
        },
        "required": [f"name_{salt}"],
        "additionalProperties": False,
    }


def schema_request(url: str, salt: int) -> tuple[int, float, str]:
    body = {
        "messages": [{"role": "user", "content": f"Describe item {salt} as JSON."}],
        "max_tokens": 24,
        "temperature": 0,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": f"item{salt}", "schema": benign_schema(salt)},
        },
    }
    start = time.perf_counter()
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=900)
    return answer.status_code, time.perf_counter() - start, answer.headers.get("retry-after", "")


def stream_request(url: str, index: int) -> tuple[int, float, str]:
    body = {"prompt": f"Count to ten, take {index}:", "max_tokens": 16, "stream": True}
    start = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=900) as answer:
        for _ in answer.iter_lines():
            pass
        return (
            answer.status_code,
            time.perf_counter() - start,
            answer.headers.get("retry-after", ""),
        )


def burst(fn, url: str, count: int) -> dict:
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        results = list(pool.map(lambda i: fn(url, i), range(count)))
    latencies = sorted(seconds for status, seconds, _ in results if status == 200)
    return {
        "requests": count,
        "statuses": dict(collections.Counter(status for status, _, _ in results)),
        "retry_after_on_429": sorted({r for s, _, r in results if s == 429}),
        "seconds_p50": latencies[len(latencies) // 2] if latencies else None,
        "seconds_max": latencies[-1] if latencies else None,
    }


def engine_state(url: str) -> dict:
    """Running and waiting requests and KV pages used, from the Prometheus metrics."""
    wanted = ("num_requests_running", "num_requests_waiting", "kv_pages_used")
    state = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#"):
            continue
        for name in wanted:
            if name in line.split("{")[0].split(" ")[0]:
                state[name] = float(line.rsplit(" ", 1)[1])
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=None, help="probe this server instead of starting one")
    parser.add_argument("--port", type=int, default=8094)
    parser.add_argument("--schemas", type=int, default=20)
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    report = measured_on_server(args.url, args.port, lambda url: measure(url, args))
    print_report(report, args.out)


def measure(url: str, args) -> dict:
    """Warm, then the schema burst and the stream burst, and the engine's state after."""
    stream_request(url, -1)  # warm
    report = {
        "schemas": burst(schema_request, url, args.schemas),
        "streams": burst(stream_request, url, args.streams),
    }
    time.sleep(1.0)
    report["after"] = engine_state(url)
    return report


if __name__ == "__main__":
    main()
