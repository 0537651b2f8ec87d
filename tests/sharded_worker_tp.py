"""The sharded worker's tensor-parallel modes (run by ``tests/sharded_worker.py`` in a fresh
process with N simulated CPU devices): float, quantised and streamed weights, the KV pool, the
CUDA lowering, every model family."""

from __future__ import annotations

from tests.sharded_worker import ENGINE, generate, param_report, shard_shapes


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
        out = jax.jit(lambda x, weight, product=product: weight.sharded(product, x))(x, weight)
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


def mode_bit_planes_tp(args: dict) -> dict:
    """GGUF types kept as bit planes (``args["qtypes"]``, ``[1024, 64]``), placed by a
    ``ShardingPlan`` at each degree as o_proj (input dim split) and up_proj (columns split):
    per case whether the jitted dequantisation equals the unsplit one bit for bit and needs no
    all-gather, the matmul's max error, and each device's values / scale-code shard shapes; and
    the error for 4-bit scale codes whose byte pairs a split would cut."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxgen.layers.sharding import LOGICAL_AXIS_RULES, ShardingPlan, make_mesh
    from jaxgen.quantization import QuantizedWeight
    from jaxgen.quantization.bit_planes import pack_planes
    from tests.gguf_quant_blocks import kept_weight

    paths = {
        "o_proj": ("layers", 0, "self_attn", "o_proj", "kernel"),
        "up_proj": ("layers", 0, "mlp", "up_proj", "kernel"),
    }
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, 1024)), jnp.float32)
    result = {}
    for qtype in args["qtypes"]:
        weight = kept_weight(qtype, 1024, 64)
        dense = np.asarray(weight.dequantize())
        for degree in args["degrees"]:
            plan = ShardingPlan(mesh=make_mesh(degree), rules=LOGICAL_AXIS_RULES)
            for name, path in paths.items():
                placed = plan.place_quantized(path, weight)
                dequantize = jax.jit(lambda w: w.dequantize())
                hlo = dequantize.lower(placed).compile().as_text()
                out = jax.jit(lambda x, w: w.matmul(x))(x, placed)
                result[f"{qtype}/{degree}/{name}"] = {
                    "exact": bool(np.array_equal(np.asarray(dequantize(placed)), dense)),
                    "all_gather": "all-gather" in hlo,
                    "matmul_error": float(np.abs(np.asarray(out) - np.asarray(x) @ dense).max()),
                    "values": [list(s.data.shape) for s in placed.values.addressable_shards],
                    "scale_codes": [
                        list(s.data.shape) for s in placed.scale_codes.addressable_shards
                    ]
                    if placed.scale_codes is not None
                    else None,
                }
    # 6 groups of 16, one per super-block, 4-bit codes two a byte: 3 rows do not split 2 ways.
    odd = QuantizedWeight(
        pack_planes(np.zeros((96, 8), np.uint8), "int2"), jnp.ones((6, 8), jnp.float16),
        jnp.ones((6, 8), jnp.float16), kind="int2", group_size=16, shape=(96, 8),
        scale_codes=jnp.ones((3, 8), jnp.uint8), min_codes=jnp.ones((3, 8), jnp.uint8),
    )  # fmt: skip
    try:
        ShardingPlan(mesh=make_mesh(2), rules=LOGICAL_AXIS_RULES).quantized_shardings(
            paths["o_proj"], odd
        )
        result["split_error"] = None
    except ValueError as error:
        result["split_error"] = str(error)
    return result


FAMILY_PROMPTS = [[101, 202, 303, 404, 505], [7, 8, 9], [1000, 2000, 3000, 4000, 5000, 6000, 7000]]
FAMILY_IDS = list(range(100, 140))


def mode_families_tp(args: dict) -> dict:
    """Tokens, logits and expert shard shapes of each family model at each degree, tensor
    parallel (the rules table's choice) and, for MoE, expert parallel."""
    import dataclasses

    import numpy as np

    from jaxgen import LLM
    from jaxgen.evaluation.full_forward import full_sequence_logits
    from jaxgen.layers.sharding import ShardingPlan, make_mesh, shard_loaded
    from jaxgen.loaders import load_model

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
