"""The sharded worker's modes that run whole engines (by ``tests/sharded_worker.py`` in a fresh
process): a real checkpoint, replicas, an Orbax checkpoint, one engine over a
``jax.distributed`` cluster of CPU processes."""

from __future__ import annotations

from tests.sharded_worker import ENGINE, PROMPTS, SAMPLING, generate, param_report, shard_shapes


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


def mode_lora_tp(args: dict) -> dict:
    """One mixed batch of adapters (and the base model) at each degree: greedy tokens, each
    token's logprob, and how layer 0's q_proj (column-parallel) and o_proj (row-parallel)
    adapter slots are split."""
    from jaxgen import LLM, SamplingParams
    from jaxgen.lora import LoRARequest

    requests = [None] + [
        LoRARequest(name, i, path) for i, (name, path) in enumerate(args["adapters"].items(), 1)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=0)
    result = {}
    for degree in args["degrees"]:
        llm = LLM(
            args["model"],
            tensor_parallel_degree=degree,
            enable_lora=True,
            max_lora_rank=8,
            max_loras=2,
            **ENGINE,
        )
        outs = llm.generate(
            [prompt for prompt in args["prompts"] for _ in requests],
            params,
            lora_request=[lora for _ in args["prompts"] for lora in requests],
            use_tqdm=False,
        )
        slots = llm.engine.lora.slots.stacks.arrays
        result[str(degree)] = {
            "tokens": [list(out.outputs[0].token_ids) for out in outs],
            "logprobs": [
                [
                    float(getattr(entry[t], "logprob", entry[t]))
                    for entry, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids, strict=True)
                ]
                for o in outs
            ],
            "slots": {
                name: [shard_shapes(x) for x in slots[f"layers.0.self_attn.{name}"]]
                for name in ("q_proj", "o_proj")
            },
        }
    return result


def mode_kv_offload_tp(args: dict) -> dict:
    """Conversations overflowing the device pool, with the host KV tier, at each degree: the
    greedy tokens and the host tier's counters (pages copied each way)."""
    from jaxgen import LLM
    from tests.engine.kv_offload.test_host_tier_engine import KNOBS, PAGE_BYTES, conversations

    result = {}
    for degree in args["degrees"]:
        llm = LLM(
            args["model"],
            tensor_parallel_degree=degree,
            kv_offloading_size=256 * PAGE_BYTES,
            **KNOBS,
        )
        tokens = conversations(llm)
        stats = llm.stats()
        result[str(degree)] = {
            "tokens": tokens,
            "host_kv_hit_pages": stats["host_kv_hit_pages"],
            "kv_offloaded_pages": stats["kv_offloaded_pages"],
        }
    return result
