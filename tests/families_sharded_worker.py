"""Sharded runs of the new families in a fresh process with simulated CPU devices (see
``tests/sharded_worker.py``): ``python tests/families_sharded_worker.py MODE JSON_ARGS``."""

from __future__ import annotations

import json
import sys

ENGINE = dict(max_model_len=64, kv_cache_memory=4 << 20, max_rolling_batch_size=4)
PROMPTS = [[101, 202, 303, 404, 505], [7, 8, 9], [1000, 2000, 3000, 4000, 5000, 6000, 7000]]
IDS = list(range(100, 140))


def _tokens(llm) -> list[list[int]]:
    from jaxgen import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return [out.token_ids for out in llm.generate(PROMPTS, params, use_tqdm=False)]


def _shards(array) -> list[list[int]]:
    return [list(shard.data.shape) for shard in array.addressable_shards]


def mode_tp(args: dict) -> dict:
    """Tokens, logits and expert shard shapes at each degree, tensor and expert parallel."""
    import dataclasses

    import numpy as np

    from jaxgen import LLM
    from jaxgen.loaders import load_model
    from jaxgen.models.full_forward import full_sequence_logits
    from jaxgen.sharding import ShardingPlan, make_mesh, shard_loaded

    result = {}
    for name, path in args["models"].items():
        runs, reference = {}, None
        for degree in args["degrees"]:
            llm = LLM(path, tensor_parallel_degree=degree, **ENGINE)
            logits = full_sequence_logits(llm.loaded, IDS)
            reference = logits if reference is None else reference
            run = {"tokens": _tokens(llm), "logits_diff": float(np.abs(logits - reference).max())}
            layer = llm.loaded.params["layers"][0]
            if "experts" in layer["mlp"]:
                run["expert_shards"] = _shards(layer["mlp"]["experts"]["gate_proj"][...])
            runs[degree] = run
        if "experts" in load_model(path).params["layers"][0]["mlp"]:
            loaded = load_model(path)
            for degree in args["degrees"][1:]:
                plan = ShardingPlan.create(loaded.config, make_mesh(degree))
                rules = dict(plan.rules, expert="model", expert_mlp=None)
                plan = dataclasses.replace(plan, rules=tuple(rules.items()))
                sharded = shard_loaded(loaded, plan)
                logits = full_sequence_logits(sharded, IDS)
                gate = sharded.params["layers"][0]["mlp"]["experts"]["gate_proj"][...]
                runs[f"ep{degree}"] = {
                    "logits_diff": float(np.abs(logits - reference).max()),
                    "expert_shards": _shards(gate),
                }
        result[name] = runs
    return result


def main() -> None:
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    print("RESULT " + json.dumps(globals()[f"mode_{mode}"](args)), flush=True)


def run_families_worker(mode: str, args: dict, *, num_devices: int, timeout: float = 600):
    import subprocess

    from tests.sharded_worker import parse_result, worker_env

    proc = subprocess.run(
        [sys.executable, __file__, mode, json.dumps(args)],
        env=worker_env(num_devices),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return parse_result(proc.stdout, proc.stderr, proc.returncode)


if __name__ == "__main__":
    main()
