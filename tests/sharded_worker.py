"""Sharded checks run in a fresh process (the device count must be set before jax starts).

``python tests/sharded_worker.py MODE JSON_ARGS`` prints one line ``RESULT <json>``. The parent
sets ``XLA_FLAGS=--xla_force_host_platform_device_count=N``; ``multihost`` instead joins a
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


def mode_tp(args: dict) -> dict:
    """Degrees on an MHA model (tokens, logits, shard shapes) and a GQA model past its KV heads."""
    import numpy as np

    from jaxgen import LLM
    from jaxgen.evaluation.full_forward import full_sequence_logits

    result = {"tokens": {}, "logits_max_diff": {}, "params": {}, "gqa": {}}
    reference_logits = None
    for degree in args["degrees"]:
        llm = LLM(args["mha"], tensor_parallel_degree=degree, **ENGINE)
        result["tokens"][degree] = generate(llm)
        ids = llm.get_tokenizer().encode("The quick brown fox jumps over the lazy dog")
        logits = full_sequence_logits(llm.loaded, ids)
        if reference_logits is None:
            reference_logits = logits
        result["logits_max_diff"][degree] = float(np.abs(logits - reference_logits).max())
        result["params"][degree] = param_report(llm)
    for degree in args["gqa_degrees"]:
        llm = LLM(args["gqa"], tensor_parallel_degree=degree, **ENGINE)
        result["gqa"][degree] = {"tokens": generate(llm), "params": param_report(llm)}
    return result


def mode_quantized_tp(args: dict) -> dict:
    """int8 / int4 weights quantised at load, at degree 1 and 2: tokens, logits, whether the
    placed weights are still quantised and how their leaves are split; degree 4 splits the
    2-group o_proj off its group boundaries."""
    import numpy as np

    from jaxgen import LLM
    from jaxgen.evaluation.full_forward import full_sequence_logits

    result = {}
    for kind in args["kinds"]:
        reference_logits, row = None, {"tokens": {}, "logits_max_diff": {}}
        for degree in (1, 2):
            llm = LLM(args["mha"], tensor_parallel_degree=degree, quantization=kind, **ENGINE)
            row["tokens"][degree] = generate(llm)
            ids = llm.get_tokenizer().encode("The quick brown fox jumps over the lazy dog")
            logits = full_sequence_logits(llm.loaded, ids)
            reference_logits = logits if reference_logits is None else reference_logits
            row["logits_max_diff"][degree] = float(np.abs(logits - reference_logits).max())
            layer = llm.params["layers"][0]
            weights = {
                "q_proj": layer["self_attn"]["q_proj"]["kernel"].get_value(),
                "o_proj": layer["self_attn"]["o_proj"]["kernel"].get_value(),
                "embedding": llm.params["embed_tokens"]["embedding"].get_value(),
            }
            row[degree] = {
                name: {
                    "type": type(w).__name__,
                    "values": shard_shapes(w.values),
                    "scales": shard_shapes(w.scales),
                }
                for name, w in weights.items()
            }
        try:
            LLM(args["mha"], tensor_parallel_degree=4, quantization=kind, **ENGINE)
            row["degree4_error"] = None
        except ValueError as error:
            row["degree4_error"] = str(error)
        result[kind] = row
    return result


def mode_kv_pool_tp(args: dict) -> dict:
    """KV pools under tensor parallelism: for each (model, backend, kv_cache_dtype, degree)
    case, the greedy tokens of prompts prefilled in chunks (paged batching, 16-token step
    budget) and how the layer-0 K pool is split (an 8-bit pool: its codes and scales)."""
    from jaxgen import LLM

    prompts = [" ".join(["the sea is deep and"] * 6), "one two three four five six", "Hi"]
    engine = dict(ENGINE, batching="paged", max_rolling_batch_prefill_tokens=16)
    result = {}
    for model, backend, kv_cache_dtype, degree in args["cases"]:
        llm = LLM(
            args["models"][model],
            tensor_parallel_degree=degree,
            attention_backend=backend,
            kv_cache_dtype=kv_cache_dtype,
            **engine,
        )
        tokens = generate(llm, prompts, max_tokens=8)
        pool = llm.engine.runner.kv_cache[0][0]  # after the steps: the sharding they kept
        leaves = {"values": getattr(pool, "values", pool), "scales": getattr(pool, "scales", None)}
        result[f"{model} {backend} {kv_cache_dtype} {degree}"] = {
            "tokens": tokens,
            "backend": llm.engine.runner.backend.name,
            "pool": type(pool).__name__,
            **{name: None if a is None else shard_shapes(a) for name, a in leaves.items()},
            "spec": [
                str(getattr(a.sharding, "spec", None)) for a in leaves.values() if a is not None
            ],
            "stats": {
                k: llm.stats()[k]
                for k in ("kv_cache_dtype", "kv_bytes_per_token", "kv_bytes_per_token_per_device")
            },
        }
    return result


def mode_cuda_lowering_tp(args: dict) -> dict:
    """The pallas-gpu decode step lowered for CUDA at degree 2 with an 8-bit pool."""
    from jaxgen.config import ModelConfig
    from jaxgen.planning.ahead_of_time import lower_decode_step_for_cuda

    config = ModelConfig(**args["config"])
    return lower_decode_step_for_cuda(
        config,
        max_model_len=128,
        max_num_seqs=8,
        tensor_parallel_degree=2,
        kv_cache_dtype=args["kv_cache_dtype"],
    )


def mode_streamed_weight(args: dict) -> dict:
    """``StreamedWeight``'s shard_map placement on a 4-device model axis, with the pure-jnp
    product in place of the Pallas kernel (TPU interpret mode does not run under shard_map on
    simulated CPU devices): the max error against ``x @ w`` per split, and the split read."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxgen.backends.streamed_weight import StreamedWeight
    from pallas_kernels.tpu.streamed_matmul import streamed_matmul_reference

    mesh = Mesh(np.array(jax.devices()[:4]), ("model",))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((5, 64)), jnp.float32)  # [M, K]
    result = {}
    cases = {  # name: (stored shape, spec, transposed)
        "columns": ((64, 512), PartitionSpec(None, "model"), False),
        "depth": ((64, 384), PartitionSpec("model", None), False),
        "replicated": ((64, 200), PartitionSpec(), False),
        "head": ((100_000, 64), PartitionSpec("model", None), True),  # [V, K], vocab split
    }
    for name, (shape, spec, transposed) in cases.items():
        w = jax.device_put(
            jnp.asarray(rng.standard_normal(shape), jnp.float32), NamedSharding(mesh, spec)
        )
        weight = StreamedWeight.wrap(w, transposed=transposed, mesh=mesh, model_axis="model")
        product = functools.partial(streamed_matmul_reference, transposed=transposed)
        out = jax.jit(lambda x, weight, product=product: weight._sharded(product, x))(x, weight)
        expected = x @ (w.T if transposed else w)
        result[name] = {
            "split": weight.split,
            "stored": list(weight.values.shape),
            "max_error": float(jnp.abs(out[:, : weight.columns] - expected).max()),
        }
    return result


def mode_packed_scales_depth_split(args: dict) -> dict:
    """An int4-with-mins weight split over its depth on a 2-device model axis: each chip's
    float16 scales and mins packed in pairs of its own groups, through the quantised Pallas
    kernel (interpret mode, under shard_map) and through XLA (many rows): max errors against
    ``x @ dequantize()``."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jaxgen.backends.streamed_quantized_weight import StreamedQuantizedWeight
    from jaxgen.quantization import QuantizationSpec, quantize_kernel

    mesh = Mesh(np.array(jax.devices()[:2]).reshape(1, 2), ("data", "model"))
    rng = np.random.default_rng(0)
    spec = QuantizationSpec(kind="int4", group_size=32, asymmetric=True)
    weight = quantize_kernel(rng.normal(size=(256, 128)), spec)
    placed = jax.tree_util.tree_map(
        lambda a: jax.device_put(a, NamedSharding(mesh, PartitionSpec("model", None))), weight
    )
    streamed = StreamedQuantizedWeight.wrap(placed, mesh=mesh, model_axis="model", interpret=True)
    x = jnp.asarray(rng.normal(size=(4, 256)), jnp.float32)
    expected = np.asarray(x @ weight.dequantize())
    with jax.set_mesh(mesh):
        kernel = np.asarray(streamed.matmul(x))
        xla = np.asarray(streamed.matmul(jnp.tile(x, (150, 1))))[:4]
    return {
        "split": streamed.split,
        "packed_pieces": streamed.packed_pieces,
        "scales": [jnp.dtype(streamed.weight.scales.dtype).name, *streamed.weight.scales.shape],
        "kernel_error": float(np.abs(kernel - expected).max()),
        "xla_error": float(np.abs(xla - expected).max()),
    }


def mode_smollm2(args: dict) -> dict:
    """The default model (9 query heads, 3 KV heads): degree 3 vs 1, and degree 2 refused."""
    from jaxgen import LLM
    from jaxgen.loaders import load_model

    try:
        LLM(None, tensor_parallel_degree=2, **ENGINE)
        error = None
    except ValueError as e:
        error = str(e)
    loaded = load_model(None)
    prompts = ["The capital of France is", "Write a haiku about"]
    result = {"degree2_error": error}
    for degree in (1, 3):
        llm = LLM(loaded, tensor_parallel_degree=degree, **ENGINE)
        result[str(degree)] = generate(llm, prompts, max_tokens=4)
        if degree == 3:
            result["params"] = param_report(llm)
    return result


def mode_replicas(args: dict) -> dict:
    """Two replicas x degree 2 on 4 devices vs one replica; AsyncLLM over the same."""
    import asyncio

    from jaxgen import LLM, AsyncLLM, SamplingParams

    prompts = PROMPTS + ["a b c d e f g", "Once upon a time", "Sun and moon"]
    single = LLM(args["model"], tensor_parallel_degree=2, **ENGINE)
    expected = generate(single, prompts)
    llm = LLM(args["model"], tensor_parallel_degree=2, data_parallel_size=2, **ENGINE)
    outs = llm.generate(prompts, SamplingParams(**SAMPLING), use_tqdm=False)
    stats = llm.stats()
    devices = [
        sorted(d.id for d in e.runner.params["lm_head"]["kernel"][...].devices())
        for e in llm.engine.engines
    ]
    chat = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(**SAMPLING), use_tqdm=False)

    async def run_async() -> tuple[list[list[int]], dict]:
        engine = AsyncLLM(args["model"], tensor_parallel_degree=2, data_parallel_size=2, **ENGINE)

        async def one(i, prompt):
            tokens = []
            async for out in engine.generate(
                prompt, SamplingParams(**SAMPLING), request_id=f"r{i}"
            ):
                tokens += out.token_ids
            return tokens

        try:
            tokens = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
            await asyncio.sleep(0.2)  # let the engine thread publish its final stats
            return list(tokens), engine.stats()
        finally:
            engine.shutdown()

    async_tokens, async_stats = asyncio.run(run_async())
    return {
        "expected": expected,
        "tokens": [o.token_ids for o in outs],
        "request_ids": [o.request_id for o in outs],
        "stats": {k: v for k, v in stats.items() if k != "replicas"},
        "replica_stats": stats["replicas"],
        "replica_devices": devices,
        "chat_tokens": len(chat[0].token_ids),
        "async_tokens": async_tokens,
        "async_requests_routed": async_stats["requests_routed"],
    }


def mode_orbax(args: dict) -> dict:
    """Converts from degree-2 shards, then restores straight into degree-4 shardings."""
    import numpy as np
    from flax import nnx

    from jaxgen import LLM
    from jaxgen.loaders import load_model
    from jaxgen.loaders.convert import convert

    convert(args["original"], args["convert_to"], tensor_parallel_degree=2)
    llm = LLM(args["convert_to"], tensor_parallel_degree=4, **ENGINE)
    restored = dict(nnx.to_flat_state(llm.params))
    equal = all(
        np.array_equal(np.asarray(var.get_value()), np.asarray(restored[path].get_value()))
        for path, var in nnx.to_flat_state(load_model(args["original"]).params)
    )
    return {"params_equal": equal, "params": param_report(llm), "tokens": generate(llm)}


FAMILY_PROMPTS = [[101, 202, 303, 404, 505], [7, 8, 9], [1000, 2000, 3000, 4000, 5000, 6000, 7000]]
FAMILY_IDS = list(range(100, 140))


def mode_families_tp(args: dict) -> dict:
    """Tokens, logits and expert shard shapes of each family model at each degree, tensor
    parallel (the rules table's choice) and, for MoE, expert parallel."""
    import dataclasses

    import numpy as np

    from jaxgen import LLM
    from jaxgen.evaluation.full_forward import full_sequence_logits
    from jaxgen.loaders import load_model
    from jaxgen.parallel.sharding import ShardingPlan, make_mesh, shard_loaded

    result = {}
    for name, path in args["models"].items():
        runs, reference = {}, None
        for degree in args["degrees"]:
            llm = LLM(path, tensor_parallel_degree=degree, **ENGINE)
            logits = full_sequence_logits(llm.loaded, FAMILY_IDS)
            reference = logits if reference is None else reference
            run = {
                "tokens": generate(llm, FAMILY_PROMPTS),
                "logits_diff": float(np.abs(logits - reference).max()),
            }
            layer = llm.loaded.params["layers"][0]
            if "experts" in layer["mlp"]:
                run["expert_shards"] = shard_shapes(layer["mlp"]["experts"]["gate_proj"][...])
            runs[degree] = run
        loaded = load_model(path)
        if "experts" in loaded.params["layers"][0]["mlp"]:
            for degree in args["degrees"][1:]:
                plan = ShardingPlan.create(loaded.config, make_mesh(degree))
                rules = dict(plan.rules, expert="model", expert_mlp=None)
                plan = dataclasses.replace(plan, rules=tuple(rules.items()))
                sharded = shard_loaded(loaded, plan)
                logits = full_sequence_logits(sharded, FAMILY_IDS)
                gate = sharded.params["layers"][0]["mlp"]["experts"]["gate_proj"][...]
                runs[f"ep{degree}"] = {
                    "logits_diff": float(np.abs(logits - reference).max()),
                    "expert_shards": shard_shapes(gate),
                }
        result[name] = runs
    return result


def mode_multihost(args: dict) -> dict:
    """One process of a 2-process CPU cluster: degree 8 over both processes' devices."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        f"127.0.0.1:{args['port']}",
        num_processes=args["num_processes"],
        process_id=args["process_id"],
        initialization_timeout=120,
    )
    from jaxgen import LLM

    llm = LLM(args["model"], tensor_parallel_degree=len(jax.devices()), **ENGINE)
    tokens = generate(llm)
    q = llm.params["layers"][0]["self_attn"]["q_proj"]["kernel"][...]
    result = {
        "process_index": jax.process_index(),
        "process_count": jax.process_count(),
        "global_devices": len(jax.devices()),
        "local_devices": len(jax.local_devices()),
        "q_proj_global_shape": list(q.shape),
        "q_proj_local_shards": shard_shapes(q),
        "tokens": tokens,
    }
    if args.get("serve"):
        result.update(serve_from_process_0(llm.engine))
    jax.distributed.shutdown()
    return result


def serve_from_process_0(engine) -> dict:
    """The pod entry point's path: process 0 runs the prompts through ``AsyncLLM`` over a
    ``LeaderEngine`` (arriving at different steps), the others follow its steps."""
    import asyncio

    import jax

    from jaxgen import AsyncLLM, SamplingParams
    from jaxgen.parallel.multihost import LeaderEngine, StepChannel, follow_leader

    channel = StepChannel()
    if jax.process_index() != 0:
        return {"followed_steps": follow_leader(engine, channel, poll_s=5.0)}
    leader = LeaderEngine(engine, channel)
    llm = AsyncLLM(engine=leader)

    async def one(index: int, prompt: str) -> list[int]:
        await asyncio.sleep(0.3 * index)  # later requests join a running batch
        tokens = []
        async for out in llm.generate(prompt, SamplingParams(**SAMPLING), request_id=f"s{index}"):
            tokens += out.token_ids
        return tokens

    async def run() -> list[list[int]]:
        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS))))

    try:
        served = asyncio.run(run())
    finally:
        llm.shutdown()
        leader.shutdown()
    return {"served_tokens": served, "published_steps": leader.steps_published}


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
    mode, args = sys.argv[1], json.loads(sys.argv[2])
    result = globals()[f"mode_{mode}"](args)
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
