"""One request must never hold up the others: prompts are parsed, templated and tokenized off
the event loop (too-long ones refused before), grammar compiles are admitted to bounded lanes
(429 past them, cancelled when the client leaves), and after the server reports healthy no
request compiles an XLA program."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest

from jaxgen.async_llm import AsyncLLM
from jaxgen.engine.structured.grammar_masks import GrammarCompiler
from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import ServerThread

HUGE_PROMPT = "hello world, this is a test of a long prompt. " * 85000  # 3.9 MB
LONG_PROMPT = HUGE_PROMPT[: 2 << 20]  # 2 MB: tokenized in 2-5 s on 2 cores
PLAIN = {"prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0.0}


# A small engine that precompiles, as ``jaxgen serve`` does: every step and sampler shape is
# compiled before the server is ready, so latencies measure the server, not XLA.
KNOBS = dict(
    max_model_len=256,
    kv_cache_memory=4 << 20,
    max_rolling_batch_size=4,
    max_rolling_batch_prefill_tokens=32,
    precompile=True,
)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    llm = AsyncLLM(model=tiny_model_dir, **KNOBS)
    settings = ServerSettings(
        model=tiny_model_dir,
        grammar_compile_workers=1,
        max_queued_grammar_compiles=2,
    )
    try:
        with ServerThread(create_app(llm, settings)) as running:
            with httpx.Client(base_url=running.url, timeout=300) as client:
                running.client = client
                running.compiles_when_ready = compiles(client)
                # The grammar compiler's tokenizer is built on first use (about a second).
                constrained = {"prompt": "x", "max_tokens": 2}
                constrained["structured_outputs"] = {"regex": "[ab]x"}
                assert client.post("/v1/completions", json=constrained).status_code == 200
                yield running
    finally:
        llm.shutdown()


def latencies_during(server, hostile) -> tuple[object, list[float]]:
    """Runs ``hostile(client)`` on a thread; meanwhile times plain completions and ``/health``
    on other connections. Returns its result and the latencies."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with httpx.Client(base_url=server.url, timeout=300) as hostile_client:
            running = pool.submit(hostile, hostile_client)
            times = []
            with httpx.Client(base_url=server.url, timeout=60) as client:
                while not running.done() or not times:
                    start = time.monotonic()
                    assert client.get("/health").status_code == 200
                    assert client.post("/v1/completions", json=PLAIN).status_code == 200
                    times.append(time.monotonic() - start)
            return running.result(), times


@pytest.mark.parametrize(
    "name",
    ["huge prompt", "huge chat", "huge tokenize", "huge truncated input"],
)
def test_huge_prompts_never_stall_other_requests(server, name):
    """A 3.9 MB prompt stalled /health for 2 s and a plain completion for up to 11 s while it was
    tokenized on the event loop. Too long for max_input_tokens: refused without tokenizing;
    tokenized anyway (2 MB to /tokenize, or with TGI's truncate): on a parse thread."""
    messages = [{"role": "user", "content": "hi"}] * 100_000

    def hostile(client):
        if name == "huge prompt":
            return client.post("/v1/completions", json={"prompt": HUGE_PROMPT, "max_tokens": 1})
        if name == "huge chat":
            return client.post("/v1/chat/completions", json={"messages": messages})
        if name == "huge tokenize":
            return client.post("/tokenize", json={"prompt": LONG_PROMPT})
        body = {"inputs": LONG_PROMPT, "parameters": {"truncate": 8, "max_new_tokens": 2}}
        return client.post("/generate", json=body)

    baseline = latencies_during(server, lambda client: time.sleep(1.0))[1]
    answer, times = latencies_during(server, hostile)
    if name in ("huge prompt", "huge chat"):
        assert answer.status_code == 400
        assert "max_input_tokens" in answer.json()["error"]["message"]
    else:
        assert answer.status_code == 200, answer.text[:300]
    # The hostile request delays no plain one by more than 1 s (measured against the same
    # machine's latency without it, so a loaded machine does not fail the test).
    assert max(times) < max(baseline) + 1.0, (baseline, times)


def slow_builds(monkeypatch, seconds: float) -> list[str]:
    """Makes every compile of a regex starting with "slow" take ``seconds`` longer; returns the
    list of regexes built (in order)."""
    built = []
    real = GrammarCompiler.build

    def build(self, constraint, limits=None):
        built.append(constraint.regex)
        if (constraint.regex or "").startswith("slow"):
            time.sleep(seconds)
        return real(self, constraint, limits)

    monkeypatch.setattr(GrammarCompiler, "build", build)
    return built


def slow_regex(index: int) -> str:
    """A distinct regex over the small-constraint size (it compiles on the large lane)."""
    return f"slow{index}" + "(ab|cd)" * 700


def test_benign_small_constraints_wait_their_turn(server, monkeypatch):
    """Twenty small constraints at once, each compile slowed, with two compiles allowed to
    queue per lane: the small lane queues as many as the server admits, so none gets 429."""
    slow_builds(monkeypatch, 0.05)

    def post(index: int):
        regex = f"slow{index}[0-9]{{3}}"  # distinct: none is answered from the cache
        body = {"prompt": "x", "max_tokens": 2, "structured_outputs": {"regex": regex}}
        return server.client.post("/v1/completions", json=body).status_code

    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        statuses = list(pool.map(post, range(20)))
    assert statuses == [200] * 20, statuses


def test_grammar_compiles_are_admitted(server, monkeypatch):
    """12 concurrent large grammars kept a one-property schema waiting 39 s. One compile thread
    and two pending compiles allowed: the others get 429 at once naming the limit, and a small
    constraint compiles on its own lane meanwhile."""
    slow_builds(monkeypatch, 2.0)

    def post(index: int):
        body = {"prompt": "x", "max_tokens": 2, "structured_outputs": {"regex": slow_regex(index)}}
        return server.client.post("/v1/completions", json=body)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        running = [pool.submit(post, index) for index in range(8)]
        time.sleep(0.5)  # two compiles admitted, six refused
        start = time.monotonic()
        small = {"prompt": "x", "max_tokens": 2, "structured_outputs": {"regex": "[0-9]{3}x"}}
        assert server.client.post("/v1/completions", json=small).status_code == 200
        small_latency = time.monotonic() - start
        answers = [future.result() for future in running]
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses.count(200) == 2 and statuses.count(429) == 6, statuses
    refused = next(answer for answer in answers if answer.status_code == 429)
    assert "--max-queued-grammar-compiles" in refused.json()["error"]["message"]
    assert small_latency < 1.0
    metrics = server.client.get("/metrics").text
    assert 'jaxgen_request_rejected_total{reason="grammar_queue"}' in metrics


def test_queued_compile_of_a_departed_client_never_runs(server, monkeypatch):
    built = slow_builds(monkeypatch, 1.5)
    body = {"prompt": "x", "max_tokens": 2}
    first = threading.Thread(
        target=server.client.post,
        args=("/v1/completions",),
        kwargs={"json": {**body, "structured_outputs": {"regex": slow_regex(100)}}},
    )
    first.start()
    time.sleep(0.3)  # the first compile runs; the next one waits behind it
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server.url}/v1/completions",
            json={**body, "structured_outputs": {"regex": slow_regex(101)}},
            timeout=0.5,
        )
    first.join()
    time.sleep(0.5)
    assert slow_regex(100) in built and slow_regex(101) not in built
    state = server.client.get("/health")
    assert state.status_code == 200


# -- no compiles after the server is ready ----------------------------------------------------------
EVERY_SAMPLING = [  # (route, body): every sampling configuration a client can ask for
    ("/v1/completions", {"prompt": "a b c", "max_tokens": 3, "temperature": 0.0}),
    ("/v1/completions", {"prompt": "a b", "max_tokens": 3, "temperature": 0.8, "seed": 1}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "top_k": 5, "top_p": 0.9, "seed": 2}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "top_k": 400, "seed": 3}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "min_p": 0.2, "seed": 4}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "presence_penalty": 1.0}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "frequency_penalty": 0.5}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "repetition_penalty": 1.3}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 3, "logit_bias": {"5": 50, "7": -100}}),
    ("/v1/completions", {"prompt": "a b", "max_tokens": 3, "logprobs": 5}),
    ("/v1/completions", {"prompt": "a b", "max_tokens": 3, "logprobs": 20, "echo": True}),
    ("/v1/completions", {"prompt": "a b c d", "max_tokens": 3, "prompt_logprobs": 3}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 4, "n": 3, "temperature": 1.0}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 4, "min_tokens": 3, "stop_token_ids": [9]}),
    ("/v1/completions", {"prompt": "a", "max_tokens": 4, "structured_outputs": {"regex": "[ab]+"}}),
    (
        "/v1/completions",
        {"prompt": ["a", "b c"], "max_tokens": 3, "structured_outputs": {"choice": ["x", "y"]}},
    ),
    ("/v1/completions", {"prompt": "word " * 200, "max_tokens": 2}),  # a long prefill
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "logprobs": True},
    ),
    ("/generate", {"inputs": "a", "parameters": {"max_new_tokens": 3, "do_sample": True}}),
    (
        "/generate",
        {
            "inputs": "a b",
            "parameters": {"max_new_tokens": 2, "details": True, "decoder_input_details": True},
        },
    ),
]


def test_no_request_compiles_after_ready(server):
    """The first request with logprobs, top-k/p, min-p, penalties, logit bias or prompt
    logprobs compiled a program on the engine thread (3-10 s, stalling every request). With
    precompile (``jaxgen serve``'s default) none does: /metrics' compile count stays where it
    was when the server became ready, through every test of this module."""
    client = server.client
    assert server.compiles_when_ready > 0
    for route, body in EVERY_SAMPLING:  # one at a time, then all at once
        assert client.post(route, json=body).status_code == 200, (route, body)
    with concurrent.futures.ThreadPoolExecutor(len(EVERY_SAMPLING)) as pool:
        answers = pool.map(lambda item: client.post(item[0], json=item[1]), EVERY_SAMPLING)
        assert all(answer.status_code == 200 for answer in answers)
    assert compiles(client) == server.compiles_when_ready


def compiles(client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("jaxgen_compiles_total "):
            return float(line.split()[1])
    raise AssertionError("jaxgen_compiles_total is missing from /metrics")
