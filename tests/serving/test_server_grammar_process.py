"""Grammars that crashed or overflowed the server process, against ``python -m serving`` in a
process of its own (a crash shows as its exit): refused with a 400 by default, compiled on
the compile threads' large stack once the limits are raised."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from serving.testing import free_port
from tests.serving.hostile_constraints import grammar_chain


def serve_in_subprocess(model: str, *flags: str):
    """``python -m serving`` on the tiny model in its own process (a crash shows as its exit),
    returning the process and its URL once healthy."""
    port = free_port()
    command = [sys.executable, "-m", "serving", "--model", model, "--port", str(port)]
    command += ["--no-precompile", "--max-model-len", "256", "--kv-cache-memory", "4MiB"]
    command += ["--log-level", "warning", *flags]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the server did not become healthy"
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)


def stop(process) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def test_grammar_that_crashed_the_process_is_refused(tiny_model_dir):
    """The ~4,500-rule chain (GBNF and Lark) killed the server with SIGSEGV in llguidance. A
    server process answers 400 and stays up."""
    process, url = serve_in_subprocess(tiny_model_dir)
    try:
        for lark in (False, True):
            constraint = {"grammar": grammar_chain(4500, lark=lark)}
            body = {"prompt": "x", "max_tokens": 4, "structured_outputs": constraint}
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            assert response.status_code == 400, response.text[:300]
            assert "--max-grammar-rules" in response.json()["error"]["message"]
            assert process.poll() is None
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200
        tokens = httpx.post(f"{url}/tokenize", json={"prompt": "still here"}, timeout=30)
        assert tokens.status_code == 200 and tokens.json()["count"] > 0
    finally:
        stop(process)


@pytest.mark.slow  # generates (its first request compiles the step): ~30 s on 2 cores
def test_deep_grammar_compiles_on_a_large_stack(tiny_model_dir):
    """With the rule and depth limits raised, the 4,500-rule Lark chain reaches llguidance,
    which overflows a default 8 MiB thread stack; on the compile threads' stack it compiles."""
    flags = ["--max-grammar-rules", "10000", "--max-constraint-depth", "10000"]
    process, url = serve_in_subprocess(tiny_model_dir, *flags)
    try:
        constraint = {"grammar": grammar_chain(4500, lark=True)}
        body = {"prompt": "x", "max_tokens": 8, "temperature": 0.0}
        response = httpx.post(
            f"{url}/v1/completions", json={**body, "structured_outputs": constraint}, timeout=300
        )
        assert response.status_code == 200, response.text[:300]
        assert re.fullmatch("a*[bc]?", response.json()["choices"][0]["text"])
        assert process.poll() is None
    finally:
        stop(process)
