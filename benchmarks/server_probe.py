"""Replays the hostile requests that once hurt `jaxgen serve` and measures what a plain client
sees meanwhile: the status each hostile request gets, whether the server is still alive after it,
`/health`'s latency while huge prompts are tokenized, a one-property schema's latency while large
grammars compile, and whether requests with new sampling configurations compile anything.

Starts `jaxgen serve` on the default model in a subprocess (or probes ``--url``) and prints one
JSON object; ``--out`` keeps it.

    python benchmarks/server_probe.py [--url http://127.0.0.1:8080] [--out probe.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx

PLAIN = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}


def grammar_chain(num_rules: int) -> str:
    """``r{i} ::= "a" r{i+1} | "b"``: ~4,500 of these once overflowed the compiler's stack."""
    rules = "".join(f'r{i} ::= "a" r{i + 1} | "b"\n' for i in range(num_rules))
    return f'root ::= r0\n{rules}r{num_rules} ::= "c"\n'


def wide_schema(num_properties: int, salt: int) -> dict:
    """A flat object of many optional properties: slow to compile, within every limit."""
    properties = {f"p{salt}_{i}": {"type": "string", "maxLength": 8} for i in range(num_properties)}
    return {"type": "object", "properties": properties}


def compiles(client: httpx.Client) -> float:
    text = client.get("/metrics").text
    match = re.search(r"^jaxgen_compiles_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def timed_post(client: httpx.Client, path: str, body: dict) -> tuple[int, float, str]:
    start = time.perf_counter()
    answer = client.post(path, json=body)
    return answer.status_code, time.perf_counter() - start, answer.text[:200]


def poll_health(client: httpx.Client, stop: threading.Event) -> list[float]:
    latencies = []
    while not stop.is_set():
        start = time.perf_counter()
        client.get("/health")
        latencies.append(time.perf_counter() - start)
        time.sleep(0.05)
    return latencies


def alive(client: httpx.Client) -> bool:
    try:
        return client.get("/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def hostile_constraints(client: httpx.Client) -> dict:
    """Defects 1, 5 and 6: constraints refused before compiling, or by the dry run."""
    cases = {
        "gbnf chain of 4,500 rules": {"grammar": grammar_chain(4500)},
        "50,001 enum values": {"json": {"enum": [0] * 50_001}},
        "regex (a{1000}){1000}": {"regex": "(a{1000}){1000}"},
        'schema {"$ref": "#"}': {"json": {"$ref": "#"}},
        "schema allOf itself": {"json": {"allOf": [{"$ref": "#"}]}},
    }
    results = {}
    for name, constraint in cases.items():
        body = dict(PLAIN, structured_outputs=constraint)
        status, seconds, text = timed_post(client, "/v1/completions", body)
        results[name] = dict(status=status, seconds=round(seconds, 3), alive=alive(client))
        results[name]["message"] = text
    return results


def huge_prompts(client: httpx.Client, url: str) -> dict:
    """Defect 2: 4 clients x 5 prompts of 3.9 MB while /health and a plain request are timed."""
    prompt = "hello world " * 325_000  # 3.9 MB
    stop = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        health = pool.submit(poll_health, httpx.Client(base_url=url, timeout=120), stop)

        def client_run() -> list[int]:
            with httpx.Client(base_url=url, timeout=300) as own:
                body = {"prompt": prompt, "max_tokens": 1}
                return [own.post("/v1/completions", json=body).status_code for _ in range(5)]

        loads = [pool.submit(client_run) for _ in range(4)]
        time.sleep(0.5)
        plain = [timed_post(client, "/v1/completions", PLAIN)[1] for _ in range(3)]
        statuses = [status for load in loads for status in load.result()]
        stop.set()
        latencies = health.result()
    return dict(
        huge_prompt_statuses=sorted(set(statuses)),
        health_p50_s=round(statistics.median(latencies), 4),
        health_max_s=round(max(latencies), 4),
        health_polls=len(latencies),
        plain_completion_s=[round(s, 3) for s in plain],
    )


def grammar_storm(client: httpx.Client, url: str, num_grammars: int, num_properties: int) -> dict:
    """Defect 3: a one-property schema's latency alone and behind large concurrent compiles."""
    small = dict(PLAIN, structured_outputs={"json": {"type": "object", "properties": {"a": {}}}})
    small["max_tokens"] = 4
    alone = timed_post(client, "/v1/completions", small)

    def big(salt: int) -> tuple[int, float, str]:
        with httpx.Client(base_url=url, timeout=600) as own:
            body = dict(PLAIN, structured_outputs={"json": wide_schema(num_properties, salt)})
            return timed_post(own, "/v1/completions", body)

    with concurrent.futures.ThreadPoolExecutor(num_grammars) as pool:
        storms = [pool.submit(big, salt) for salt in range(num_grammars)]
        time.sleep(0.5)
        behind = timed_post(client, "/v1/completions", small)
        results = [storm.result() for storm in storms]
    statuses = [status for status, _, _ in results]
    return dict(
        small_schema_alone=dict(status=alone[0], seconds=round(alone[1], 3)),
        small_schema_behind_storm=dict(status=behind[0], seconds=round(behind[1], 3)),
        storm_statuses={str(s): statuses.count(s) for s in sorted(set(statuses))},
        storm_seconds_max=round(max(seconds for _, seconds, _ in results), 3),
        storm_schema_properties=num_properties,
    )


def sampling_configs(client: httpx.Client) -> dict:
    """Defect 4: first requests with each sampling configuration; compiles before and after."""
    configs = {
        "logprobs": {"logprobs": 5},
        "top_k": {"temperature": 0.8, "top_k": 5},
        "top_p": {"temperature": 0.8, "top_p": 0.9},
        "min_p": {"temperature": 0.8, "min_p": 0.1},
        "penalties": {"presence_penalty": 0.5, "frequency_penalty": 0.5},
        "repetition_penalty": {"repetition_penalty": 1.2},
        "logit_bias": {"logit_bias": {"11": 5}},
        "prompt_logprobs": {"prompt_logprobs": 1},
        "min_tokens": {"min_tokens": 4},
    }
    before = compiles(client)
    results = {}
    for name, extra in configs.items():
        status, seconds, _ = timed_post(client, "/v1/completions", dict(PLAIN, **extra))
        results[name] = dict(status=status, seconds=round(seconds, 3))
    return dict(per_config=results, compiles_before=before, compiles_after=compiles(client))


def smuggling(host: str, port: int) -> dict:
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return dict(
        first_status=answer.split(b"\r\n", 1)[0].decode(), answers=answer.count(b"HTTP/1.1")
    )


def start_server(port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "serving", "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    deadline = time.time() + 900
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None:
            raise RuntimeError(f"jaxgen serve exited with {server.returncode}")
        time.sleep(1)
    server.kill()
    raise RuntimeError("jaxgen serve did not become healthy in 900 s")


def measured_on_server(url: str | None, port: int, measure) -> dict:
    """``measure(url)`` against the server at ``url``, or against ``jaxgen serve`` started on
    ``port`` for it (stopped afterwards)."""
    server = None
    if url is None:
        server = start_server(port)
        url = f"http://127.0.0.1:{port}"
    try:
        return measure(url)
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)


def print_report(report: dict, path: str | None) -> None:
    """The report as JSON on stdout, and in ``path`` when given."""
    text = json.dumps(report, indent=2)
    print(text)
    if path:
        with open(path, "w") as out:
            out.write(text + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default=None, help="probe this server instead of starting one")
    parser.add_argument("--port", type=int, default=8093)
    parser.add_argument("--storm-grammars", type=int, default=12)
    parser.add_argument("--storm-properties", type=int, default=2000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    server = None
    if args.url is None:
        server = start_server(args.port)
        args.url = f"http://127.0.0.1:{args.port}"
    host, port = httpx.URL(args.url).host, httpx.URL(args.url).port
    try:
        with httpx.Client(base_url=args.url, timeout=600) as client:
            timed_post(client, "/v1/completions", PLAIN)  # warm
            report = dict(
                constraints=hostile_constraints(client),
                sampling=sampling_configs(client),
                huge_prompts=huge_prompts(client, args.url),
                grammar_storm=grammar_storm(
                    client, args.url, args.storm_grammars, args.storm_properties
                ),
                smuggling=smuggling(host, port),
                alive_at_end=alive(client),
            )
    finally:
        if server is not None:
            server.terminate()
            server.wait(60)
    print_report(report, args.out)


if __name__ == "__main__":
    main()
