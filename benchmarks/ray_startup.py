"""Ray Serve start-up: how long a local Ray instance, Serve, and jaxgen replicas take to come up,
and how long Ray takes to replace a killed replica.

Usage (from the repository root; ~3 min on a 2-core CPU):
  python benchmarks/ray_startup.py [--model DIR] [--replicas 2] [--precompile]

Without ``--model`` a tiny random Llama (2 layers, hidden 64, the SmolLM2 tokenizer) is written
to a temporary directory first (not timed). Each phase is wall-clock seconds in this process:
``ray.init`` (a local instance, 2 CPUs), ``serve.start`` (controller and HTTP proxy),
``serve.run`` (every replica loaded its engine and answers), the first request through the
proxy, and from ``ray.kill`` of one replica until Serve reports that many replicas running again.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tiny_model(path: str) -> str:
    from jaxgen.loaders.default_model import default_model_path
    from jaxgen.loaders.tokenizer import load_tokenizer
    from tests.conftest import save_tiny_model

    return save_tiny_model(path, load_tokenizer(default_model_path()))


def post(url: str, body: dict) -> tuple[dict, dict]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read()), dict(response.headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--precompile", action="store_true", help="as jaxgen serve does")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = args.model or tiny_model(tempfile.mkdtemp(prefix="jaxgen-tiny-"))

    import ray
    from ray import serve
    from ray.serve._private.common import DeploymentID, ReplicaID

    from serving.ray_app import DEPLOYMENT_NAME, ReplicaOptions, build_deployment

    times = {}
    start = time.perf_counter()
    ray.init(num_cpus=2, _temp_dir="/tmp/ray-jaxgen-bench", include_dashboard=False)
    times["ray.init"] = time.perf_counter() - start
    start = time.perf_counter()
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    times["serve.start"] = time.perf_counter() - start
    engine = dict(
        max_model_len=128,
        kv_cache_memory=4 << 20,
        max_rolling_batch_size=8,
        max_rolling_batch_prefill_tokens=64,
        precompile=args.precompile,
    )
    options = ReplicaOptions(num_replicas=args.replicas, cpus=0.5)
    start = time.perf_counter()
    serve.run(build_deployment(dict(model=model, **engine), options), name="jaxgen")
    times[f"serve.run ({args.replicas} replicas ready)"] = time.perf_counter() - start
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    start = time.perf_counter()
    _, headers = post(url, {"model": "tgi", "prompt": "Hello", "max_tokens": 8})
    times["first request (8 tokens)"] = time.perf_counter() - start
    replica = headers["x-jaxgen-replica"]
    name = ReplicaID(replica, DeploymentID(name=DEPLOYMENT_NAME, app_name="jaxgen"))
    start = time.perf_counter()
    ray.kill(ray.get_actor(name.to_full_id_str(), namespace="serve"), no_restart=True)

    def states() -> dict:
        return serve.status().applications["jaxgen"].deployments[DEPLOYMENT_NAME].replica_states

    running = {"RUNNING": args.replicas}
    while states() == running:  # until the controller notices (its health check)
        time.sleep(0.2)
    times["kill noticed by Serve"] = time.perf_counter() - start
    while states() != running:
        time.sleep(0.2)
    times["killed replica replaced"] = time.perf_counter() - start
    serve.shutdown()
    ray.shutdown()
    for phase, seconds in times.items():
        print(f"{phase:40} {seconds:7.1f} s")


if __name__ == "__main__":
    main()
