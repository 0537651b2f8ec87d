"""Sharded checks run in a fresh process (the device count must be set before jax starts).

``python tests/sharded_worker.py MODE JSON_ARGS`` runs ``mode_MODE`` (of ``sharded_worker_tp``
or ``sharded_worker_engines``) and prints one line ``RESULT <json>``. The parent sets
``XLA_FLAGS=--xla_force_host_platform_device_count=N``; ``multihost`` instead joins a
``jax.distributed`` cluster of CPU processes over loopback.
"""

from __future__ import annotations

import json
import sys

SAMPLING = dict(temperature=0.0, max_tokens=6, ignore_eos=True)
PROMPTS = ["Hello there", "The sea is deep and", "one two three"]
ENGINE = dict(max_model_len=64, kv_cache_memory=4 << 20, max_rolling_batch_size=4)


def generate(llm, prompts=PROMPTS, **sampling) -> list[list[int]]:
    from jaxgen import SamplingParams

    params = SamplingParams(**{**SAMPLING, **sampling})
    return [out.token_ids for out in llm.generate(prompts, params, use_tqdm=False)]


def shard_shapes(array) -> list[list[int]]:
    """Each device's shard shape; a quantised kernel's in its logical [K, N] (int4 packs two
    rows per byte)."""
    from jaxgen.quantization.quantized_weight import is_quantized

    rows_per_value_row = 1
    if is_quantized(array):
        rows_per_value_row = array.shape[0] // array.values.shape[0]
        array = array.values
    return [
        [shard.data.shape[0] * rows_per_value_row, *shard.data.shape[1:]]
        for shard in array.addressable_shards
    ]


def param_report(llm) -> dict:
    """Spec and per-device shard shapes of representative weights and the KV pool."""
    layer = llm.params["layers"][0]
    arrays = {
        "q_proj": layer["self_attn"]["q_proj"]["kernel"].get_value(),
        "k_proj": layer["self_attn"]["k_proj"]["kernel"].get_value(),
        "o_proj": layer["self_attn"]["o_proj"]["kernel"].get_value(),
        "up_proj": layer["mlp"]["up_proj"]["kernel"].get_value(),
        "down_proj": layer["mlp"]["down_proj"]["kernel"].get_value(),
        "embedding": llm.params["embed_tokens"]["embedding"].get_value(),
        "kv_pool": llm.engine.runner.kv_cache[0][0],
    }
    return {
        name: {
            "spec": str(getattr(getattr(a, "values", a).sharding, "spec", None)),
            "shards": shard_shapes(a),
        }
        for name, a in arrays.items()
    }


# -- parent side (no jax imports) ------------------------------------------------------------------
def worker_env(num_devices: int) -> dict:
    """The environment for a worker with ``num_devices`` simulated CPU devices."""
    import os

    env = dict(os.environ)
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    env["XLA_FLAGS"] = " ".join(flags + [f"--xla_force_host_platform_device_count={num_devices}"])
    env["JAX_PLATFORMS"] = "cpu"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def parse_result(stdout: str, stderr: str, returncode: int) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise AssertionError(f"worker failed (exit {returncode}):\n{stdout[-3000:]}\n{stderr[-6000:]}")


def run_worker(mode: str, args: dict, *, num_devices: int, timeout: float = 300) -> dict:
    """Runs ``mode`` in a fresh process with ``num_devices`` CPU devices; returns its result."""
    import subprocess

    proc = subprocess.run(
        [sys.executable, __file__, mode, json.dumps(args)],
        env=worker_env(num_devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return parse_result(proc.stdout, proc.stderr, proc.returncode)


def run_cluster(
    args: dict, *, num_processes: int, devices_per_process: int, timeout: float = 300
) -> list[dict]:
    """Runs ``mode_multihost`` in ``num_processes`` processes joined over loopback."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = []
    for process_id in range(num_processes):
        worker_args = dict(args, port=port, process_id=process_id, num_processes=num_processes)
        procs.append(
            subprocess.Popen(
                [sys.executable, __file__, "multihost", json.dumps(worker_args)],
                env=worker_env(devices_per_process),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            results.append(parse_result(stdout, stderr, proc.returncode))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def main() -> None:
    from tests import sharded_worker_engines, sharded_worker_tp

    mode, args = sys.argv[1], json.loads(sys.argv[2])
    for modes in (sharded_worker_tp, sharded_worker_engines):
        if hasattr(modes, f"mode_{mode}"):
            result = getattr(modes, f"mode_{mode}")(args)
            break
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
