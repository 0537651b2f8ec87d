"""Multi-host: the same engine code over two CPU processes joined by ``jax.distributed``.

Each process has 4 simulated devices; the mesh's "model" axis spans all 8 (both processes), so
every step's all-reduces cross the process boundary (gloo collectives over loopback). Both
processes run the same greedy generation, which must match a single-process run.
"""

from __future__ import annotations

import pytest

from tests.family_models import save_tiny_model
from tests.sharded_worker import ENGINE, PROMPTS, generate, run_cluster


@pytest.mark.slow  # about 60 s on a loaded 2-core CPU
def test_two_processes_degree_8_match_single_process(mha_dir):
    from jaxgen import LLM

    expected = generate(LLM(mha_dir, **ENGINE))
    results = run_cluster({"model": mha_dir}, num_processes=2, devices_per_process=4, timeout=400)
    assert sorted(r["process_index"] for r in results) == [0, 1]
    for result in results:
        assert result["process_count"] == 2
        assert result["global_devices"] == 8 and result["local_devices"] == 4
        assert result["q_proj_global_shape"] == [64, 64]
        assert result["q_proj_local_shards"] == [[64, 8]] * 4  # one head per device, 4 local
        assert result["tokens"] == expected


@pytest.fixture(scope="module")
def mha4_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    path = str(tmp_path_factory.mktemp("tiny-mha4-multihost"))
    return save_tiny_model(path, smollm2_tokenizer, num_attention_heads=4, num_key_value_heads=4)


@pytest.mark.slow  # about 2 min on a loaded 2-core CPU
def test_four_processes_degree_4_match_single_process_and_serve_from_process_0(mha4_dir):
    """Four processes of one device each (a group of 4 hosts, as a v5e-16 slice is 4 hosts of
    4 chips, in miniature), degree 4: every all-reduce crosses processes. First every process
    runs the same ``generate``; then the pod entry point's path: process 0 serves the prompts
    through ``AsyncLLM`` over a ``LeaderEngine`` while the other three follow its steps."""
    from jaxgen import LLM

    expected = generate(LLM(mha4_dir, **ENGINE))
    results = run_cluster(
        {"model": mha4_dir, "serve": True}, num_processes=4, devices_per_process=1, timeout=600
    )
    assert sorted(r["process_index"] for r in results) == [0, 1, 2, 3]
    for result in results:
        assert result["process_count"] == 4
        assert result["global_devices"] == 4 and result["local_devices"] == 1
        assert result["q_proj_local_shards"] == [[64, 16]]  # one of 4 heads of 16
        assert result["tokens"] == expected
    leader = next(r for r in results if r["process_index"] == 0)
    assert leader["served_tokens"] == expected
    followers = [r["followed_steps"] for r in results if r["process_index"] != 0]
    assert followers == [leader["published_steps"]] * 3


@pytest.mark.slow  # about 2 min on a loaded 2-core CPU
def test_pod_entry_point_serves_from_process_0_and_drains(mha4_dir):
    """``python -m serving.pod`` as two pods of a group (2 processes x 2 devices, degree 4, the
    group named by ``JAX_*`` variables as the manifests' environment would): an OpenAI request
    to process 0 returns the single-process tokens; SIGTERM drains process 0, which tells the
    follower to stop; both exit 0."""
    import json as json_module
    import signal
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from jaxgen import LLM, SamplingParams
    from tests.sharded_worker import worker_env

    single = LLM(mha4_dir, **ENGINE)
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    expected = single.generate([PROMPTS[0]], params, use_tqdm=False)[0].outputs[0].text

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]

    coordinator, http_port = free_port(), free_port()
    flags = [
        "--model", mha4_dir, "--tensor-parallel-degree", "4", "--port", str(http_port),
        "--max-model-len", "64", "--kv-cache-memory", "4MiB", "--max-rolling-batch-size", "4",
        "--no-precompile",
    ]  # fmt: skip
    procs = []
    for process_id in range(2):
        env = dict(
            worker_env(2),
            JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{coordinator}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(process_id),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "serving.pod", *flags],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        url = f"http://127.0.0.1:{http_port}"
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            assert all(p.poll() is None for p in procs), procs[0].communicate()[0][-3000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(2)
        body = json_module.dumps(
            {"model": "tgi", "prompt": PROMPTS[0], "max_tokens": 6, "temperature": 0,
             "ignore_eos": True}
        ).encode()  # fmt: skip
        request = urllib.request.Request(
            f"{url}/v1/completions", body, {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            completion = json_module.loads(response.read())
        text = completion["choices"][0]["text"]
        procs[0].send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], [o[-2000:] for o in outputs]
        assert "the leader stopped after" in outputs[1]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert text == expected
