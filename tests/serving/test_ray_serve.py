"""jaxgen replicas on Ray Serve (``serving/ray_app.py``), end to end through Ray's HTTP proxy.

A local Ray instance limited to this machine (2 CPUs, each replica half a CPU) serves the tiny
random model from two replicas, once per request router: ``prefix`` (the ingress deployment and
``PrefixRouter``) and ``default`` (Ray's own router, the replicas as the HTTP ingress). The
``openai`` SDK sends requests to the proxy; the ``x-jaxgen-replica`` header tells which replica
answered. Under the prefix router, every turn of a conversation lands on one replica and reuses
its cached pages. One replica's actor is then killed while requests are in flight: each must
complete or fail with a status a client retries (5xx or a broken connection), none may hang, a
conversation that lived on the dead replica goes on elsewhere, and Ray must start a new replica.
Deleting the application must let in-flight requests finish (graceful drain).
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from types import SimpleNamespace

import pytest

ray = pytest.importorskip("ray", reason="Ray Serve is the optional 'ray' extra")
openai = pytest.importorskip("openai")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

APP = "jaxgen"
ENGINE = dict(
    max_model_len=512,
    kv_cache_memory=4 << 20,
    max_rolling_batch_size=8,
    max_rolling_batch_prefill_tokens=64,
    precompile=False,  # shapes compile when first met: replicas start (and restart) sooner
)
PROMPTS = ["Hello there", "The sea is deep and", "one two three", "Once upon a time"]


@pytest.fixture(scope="module", params=["prefix", "default"])
def ray_serve(request, tiny_model_dir):
    """Ray (2 CPUs) and Serve's proxy on a free port, with two replicas of the tiny model behind
    the request router ``request.param``; yields the proxy's ``url`` and the ``router``."""
    from ray import serve

    from serving.launch.server import free_port
    from serving.ray_app import ReplicaOptions, build_deployment

    os.environ["JAX_PLATFORMS"] = "cpu"  # replicas inherit it: no libtpu probing
    try:
        ray.init(
            num_cpus=2,
            _temp_dir="/tmp/ray-jaxgen",
            include_dashboard=False,
            log_to_driver=False,
        )
    except Exception as error:  # noqa: BLE001 - the reason is reported
        pytest.skip(f"Ray cannot start on this machine: {error}")
    port = free_port()
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        options = ReplicaOptions(
            num_replicas=2, cpus=0.5, graceful_shutdown_timeout_s=60, request_router=request.param
        )
        serve.run(
            build_deployment(dict(model=tiny_model_dir, **ENGINE), options),
            name=APP,
            route_prefix="/",
        )
        url = f"http://127.0.0.1:{port}"
        _until_both_replicas_answer(url)
        yield SimpleNamespace(url=url, router=request.param)
    finally:
        serve.shutdown()
        ray.shutdown()


def _until_both_replicas_answer(url: str, deadline_s: float = 600.0) -> None:
    """Waits until each replica has answered a request (a replica under a loaded machine may
    still be compiling its first shapes; what the tests measure is a warm deployment)."""
    answered, end, round_ = set(), time.monotonic() + deadline_s, 0
    while len(answered) < 2 and time.monotonic() < end:
        round_ += 1  # new prompts, no shared start: the prefix router places them by load
        prompts = [f"{round_}.{i} warm-up" for i in range(4)]
        for result in run_requests(url, 4, workers=4, max_tokens=2, prompts=prompts):
            if result["outcome"] == "ok":
                answered.add(result["replica"])
    assert len(answered) == 2, f"replicas answering after {deadline_s:.0f} s: {answered}"


def client(url: str, timeout: float = 60.0):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=timeout)


def one_request(url: str, index: int, *, max_tokens: int = 8, prompt: str | None = None) -> dict:
    """One completion or streamed chat request: its replica, tokens and how it ended.

    ``outcome`` is "ok", or "retriable" (a 5xx status or a broken connection: what a client or a
    load balancer retries), or "other: ..." (anything else: a test failure).
    """
    prompt = prompt or PROMPTS[index % len(PROMPTS)]
    api = client(url)
    try:
        if index % 2:  # streamed chat
            raw = api.chat.completions.with_raw_response.create(
                model="tgi",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
            )
            finish, text = None, ""
            for chunk in raw.parse():
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
                    finish = chunk.choices[0].finish_reason or finish
            ok = finish == "length"
        else:
            raw = api.completions.with_raw_response.create(
                model="tgi", prompt=prompt, max_tokens=max_tokens, temperature=0
            )
            completion = raw.parse()
            finish = completion.choices[0].finish_reason
            ok = finish == "length" and completion.usage.completion_tokens == max_tokens
        replica = raw.headers.get("x-jaxgen-replica")
        return {"outcome": "ok" if ok else f"other: finish {finish}", "replica": replica}
    except openai.APIStatusError as error:
        status = error.status_code
        outcome = "retriable" if status >= 500 else f"other: {status}"
        return {"outcome": outcome, "replica": None, "detail": f"HTTP {status}"}
    except openai.APIConnectionError as error:  # includes a stream cut mid-response
        return {"outcome": "retriable", "replica": None, "detail": type(error).__name__}


def run_requests(
    url: str, count: int, *, workers: int = 8, max_tokens: int = 8, on_start=None, prompts=None
):
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = [
            pool.submit(one_request, url, i, max_tokens=max_tokens, prompt=prompts and prompts[i])
            for i in range(count)
        ]
        if on_start is not None:
            on_start()
        done, pending = concurrent.futures.wait(futures, timeout=300)
        assert not pending, f"{len(pending)} request(s) hung"
        return [f.result() for f in futures]


def chat_turn(url: str, messages: list[dict]) -> dict:
    """One non-streamed chat turn: the reply appended to ``messages``; its replica and the
    prompt tokens it found cached."""
    raw = client(url).chat.completions.with_raw_response.create(
        model="tgi", messages=messages, max_tokens=8, temperature=0
    )
    completion = raw.parse()
    messages.append({"role": "assistant", "content": completion.choices[0].message.content})
    cached = completion.usage.prompt_tokens_details.cached_tokens
    return {"replica": raw.headers["x-jaxgen-replica"], "cached": cached}


def conversation(url: str, index: int, turns: int, messages: list[dict] | None = None):
    """``turns`` turns of conversation ``index`` (continuing ``messages`` if given)."""
    messages = messages if messages is not None else []
    results = []
    for _ in range(turns):
        question = f"conversation {index}, question {len(messages)}: " + "tell me more " * 6
        messages.append({"role": "user", "content": question})
        results.append(chat_turn(url, messages))
    return messages, results


def replica_states() -> dict:
    from ray import serve

    return dict(serve.status().applications[APP].deployments[APP].replica_states)


def replica_actor(replica_id: str):
    from ray.serve._private.common import DeploymentID, ReplicaID

    name = ReplicaID(replica_id, DeploymentID(name=APP, app_name=APP)).to_full_id_str()
    return ray.get_actor(name, namespace="serve")


def test_two_replicas_serve_openai_requests_streamed_and_not(ray_serve):
    results = run_requests(ray_serve.url, 40, prompts=[f"{i % 12} prompt" for i in range(40)])
    assert [r["outcome"] for r in results] == ["ok"] * 40
    replicas = {r["replica"] for r in results}
    assert len(replicas) == 2, replicas  # Ray's router sent some to each


def test_metrics_are_labelled_with_the_replica(ray_serve):
    import httpx

    response = httpx.get(f"{ray_serve.url}/metrics", timeout=30)
    replica = response.headers["x-jaxgen-replica"]
    assert f'jaxgen_engine_steps_total{{replica="{replica}"}}' in response.text


def test_turns_of_a_conversation_land_on_one_replica(ray_serve):
    if ray_serve.router != "prefix":
        pytest.skip("Ray's default router places each request by load alone")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda i: conversation(ray_serve.url, i, 4)[1], range(6)))
    homes = [{turn["replica"] for turn in turns} for turns in runs]
    assert all(len(home) == 1 for home in homes), homes
    assert len(set().union(*homes)) == 2, homes  # new conversations spread over both
    # every later turn reuses the pages of the turn before (the prompt grows by ~2 pages)
    assert all(turn["cached"] >= 16 for turns in runs for turn in turns[1:]), runs


def test_a_killed_replica_fails_retriably_and_ray_replaces_it(ray_serve):
    url = ray_serve.url
    history, first = conversation(url, 100, 2)  # a conversation living on one replica
    victim = first[0]["replica"]
    actor = replica_actor(victim)

    def kill_soon():
        time.sleep(1.5)  # requests are running on both replicas by now
        ray.kill(actor, no_restart=True)

    results = run_requests(url, 24, max_tokens=32, on_start=kill_soon)
    outcomes = [r["outcome"] for r in results]
    assert all(o in ("ok", "retriable") for o in outcomes), outcomes
    assert "ok" in outcomes  # the other replica kept serving
    # The conversation goes on elsewhere; under the prefix router its later turns stay there
    # (the router dropped the dead replica's prefixes and learns the new home).
    _, after = conversation(url, 100, 2, history)
    assert victim not in {turn["replica"] for turn in after}
    if ray_serve.router == "prefix":
        assert after[0]["replica"] == after[1]["replica"] and after[1]["cached"] >= 16

    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and replica_states() != {"RUNNING": 2}:
        time.sleep(2)
    assert replica_states() == {"RUNNING": 2}
    # The proxy learns of the new replica shortly after it runs: send until it answers.
    seen: set = set()
    for attempt in range(20):  # new prompts, no shared start: the prefix router places them by load
        prompts = [f"{attempt}.{i} after the kill" for i in range(8)]
        after = run_requests(url, 8, prompts=prompts)
        assert [r["outcome"] for r in after] == ["ok"] * 8
        seen |= {r["replica"] for r in after}
        if len(seen) == 2:
            break
        time.sleep(2)
    assert victim not in seen and len(seen) == 2, seen  # the replacement serves too
    print(
        f"fault test: {outcomes.count('ok')} ok, {outcomes.count('retriable')} retriable",
        sorted(r["detail"] for r in results if "detail" in r),
    )


def test_deleting_the_application_drains_requests_in_flight(ray_serve):
    from ray import serve

    def delete_soon():
        time.sleep(1.0)
        serve.delete(APP, _blocking=False)

    # Six requests (one per worker thread) are in flight when the delete starts: Ray stops
    # routing to the replicas, waits for their requests (graceful_shutdown_timeout_s), and only
    # then runs the app's lifespan shutdown and stops the engines. Every one completes.
    results = run_requests(ray_serve.url, 6, workers=6, max_tokens=48, on_start=delete_soon)
    assert [r["outcome"] for r in results] == ["ok"] * 6, results
