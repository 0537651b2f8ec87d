"""The engine's decode step compiled ahead of time for a TPU slice (or lowered for CUDA), on a
machine without either.

libtpu's compiler runs on CPU: ``jax.experimental.topologies`` gives the devices of a named slice,
and ``jax.jit(step).trace(...).lower().compile()`` under that mesh runs XLA's TPU pipeline and the
Mosaic compiler on every Pallas kernel. The step is the engine's own (``jitted_step``: model,
attention backend, sampler, donated pool), traced with ``jax.ShapeDtypeStruct``s placed by the
engine's sharding rules: no weights and no TPU are needed. ``jaxgen plan --target`` prints it.

The figures are the compiler's: ``memory_analysis()`` (bytes per chip) and ``cost_analysis()``
(bytes and flops it counts for one step, per chip). They are counts, not measured times.

For CUDA, :func:`lower_decode_step_for_cuda` lowers the same step with the ``pallas-gpu`` backend
(``lowering_platforms=("cuda",)``, for an abstract H100: jax 0.11 needs a GPU to lower Pallas
Triton kernels for, ``pallas_kernels.gpu.abstract_device``) and lists the kernels it calls: it
lowers; nothing is compiled or run for a GPU here.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgen.backends import PallasGPUBackend, PallasTPUBackend
from jaxgen.backends.device_choice import DeviceDescription, auto_attention_backend, auto_dtype
from jaxgen.config import ModelConfig
from jaxgen.config.speculative_config import check_num_speculative_tokens
from jaxgen.engine.step.step_function import jitted_step
from jaxgen.layers.sharding import DATA_AXIS, MODEL_AXIS, ShardingPlan
from jaxgen.loaders import model_config_only
from jaxgen.models import LlamaForCausalLM
from jaxgen.planning.abstract_step import (
    abstract_params,
    check_step_sizes,
    decode_step_inputs,
    per_chip_bytes,
    placed,
    placed_pool,
    pool_pages,
    unread_embedding_bytes,
)
from jaxgen.planning.hardware import GB
from jaxgen.planning.tpu_targets import resolve_target
from jaxgen.planning.verify_compile import (
    compile_verify_step,
    verify_report_lines,
    verify_step_inputs,
)
from jaxgen.quantization.quantize import validate_quantization
from pallas_kernels.gpu.abstract_device import abstract_gpu, abstract_gpu_mesh


def config_from_path(model: str | None) -> ModelConfig:
    """A model config from a ``config.json`` path, an HF directory, a GGUF or an alias."""
    if model is not None and os.path.isfile(model) and model.endswith(".json"):
        with open(model) as f:
            return ModelConfig.from_hf_dict(json.load(f))
    return model_config_only(model)


def lower_decode_step_for_cuda(
    config: ModelConfig,
    *,
    dtype=jnp.bfloat16,
    max_model_len: int = 2048,
    max_num_seqs: int = 64,
    page_size: int = 16,
    num_pages: int | None = None,
    tensor_parallel_degree: int = 1,
    kv_cache_dtype: str = "auto",
) -> dict:
    """Lowers one decode step for CUDA (``pallas-gpu`` backend) and lists the custom calls it
    makes. ``num_pages`` defaults to what the step's sequences need, plus the scratch page.
    ``tensor_parallel_degree`` > 1: over a mesh of that many abstract H100s (no devices needed
    on this host), weights and pool placed as the engine places them; the pool shard shapes found in
    the module are reported (``pool_shard_types``: each device's codes / scales, as the kernels
    inside ``shard_map`` see them). Lowering only: no GPU compiler runs, so nothing here says
    the kernels fit a GPU."""
    if max_model_len < 1 or max_num_seqs < 1:
        raise ValueError("max_model_len and max_num_seqs must be >= 1")
    if tensor_parallel_degree < 1:
        raise ValueError(f"tensor_parallel_degree must be >= 1, got {tensor_parallel_degree}")
    pages_per_seq = -(-max_model_len // page_size)
    num_pages = num_pages or max_num_seqs * pages_per_seq + 1
    abstract = nnx.eval_shape(lambda: LlamaForCausalLM(config, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract)
    backend = PallasGPUBackend(kv_cache_dtype=kv_cache_dtype)
    pool = backend.kv_pool_shapes(config, num_pages, page_size, dtype)
    step_inputs, _, sample_rows = decode_step_inputs(page_size, max_num_seqs, max_model_len)
    mesh, shard_types = None, []
    if tensor_parallel_degree > 1:
        mesh = abstract_gpu_mesh((1, tensor_parallel_degree), (DATA_AXIS, MODEL_AXIS))
        plan = ShardingPlan.create(config, mesh)
        backend = dataclasses.replace(backend, mesh=mesh, model_axis=plan.kv_sharding.spec[0])
        params = nnx.from_flat_state(
            [
                (path, var.replace(placed(var.get_value(), plan.sharding_for(path))))
                for path, var in nnx.to_flat_state(params)
            ]
        )
        leaf_shardings = backend.kv_pool_sharding()
        pool = [placed(layer, (leaf_shardings, leaf_shardings)) for layer in pool]
        replicated = NamedSharding(mesh, PartitionSpec())
        step_inputs, _, sample_rows = decode_step_inputs(
            page_size, max_num_seqs, max_model_len, replicated
        )
        shard_types = sorted(
            {
                _tensor_type(leaf.sharding.shard_shape(leaf.shape), leaf.dtype)
                for leaf in jax.tree_util.tree_leaves(pool)
            }
        )
    start = time.perf_counter()
    with abstract_gpu(mesh):
        lowered = (
            jitted_step(graphdef, backend)
            .trace(params, pool, *step_inputs, head=None, sample_rows=sample_rows)
            .lower(lowering_platforms=("cuda",))
        )
    text = lowered.as_text()
    seconds = time.perf_counter() - start
    targets = collections.Counter(re.findall(r"custom_call @([^(\s]+)\(", text))
    # The kernel's wrapper is a private function (called once per layer) holding the Triton
    # custom calls, each named after its kernel.
    kernels = collections.Counter(re.findall(r"call @(ragged_paged_attention[\w.]*)\(", text))
    triton = sorted(set(re.findall(r'custom_call @__gpu\$xla\.gpu\.triton.*?name = "(\w+)"', text)))
    return {
        "target": "cuda",
        "attention_backend": backend.name,
        "kv_cache_dtype": kv_cache_dtype,
        "tensor_parallel_degree": tensor_parallel_degree,
        "custom_calls": dict(targets),
        "kernel_calls": dict(kernels),
        "triton_kernels": triton,
        "shard_map_regions": text.count("sdy.manual_computation("),
        "pool_shard_types": {t: t in text for t in shard_types},
        "num_pages": num_pages,
        "lower_seconds": seconds,
    }


def _tensor_type(shape, dtype) -> str:
    """The MLIR type of a ``shape`` / ``dtype`` array, as the lowered module spells it."""
    names = {
        "int8": "i8",
        "uint8": "ui8",
        "uint16": "ui16",
        "float8_e4m3fn": "f8E4M3FN",
        "float32": "f32",
        "bfloat16": "bf16",
    }
    name = names.get(jnp.dtype(dtype).name, jnp.dtype(dtype).name)
    return f"tensor<{'x'.join(map(str, shape))}x{name}>"


def compile_decode_step(
    config: ModelConfig,
    target: str,
    *,
    dtype=None,
    max_model_len: int = 2048,
    max_num_seqs: int = 64,
    page_size: int = 16,
    kv_cache_memory: float = 0.9,
    tensor_parallel_degree: int | None = None,
    quantization: str = "none",
    kv_cache_dtype: str = "auto",
    num_scheduler_steps: int = 1,
    num_speculative_tokens: int | None = None,
) -> dict:
    """Compiles one full decode step (``max_num_seqs`` sequences at ``max_model_len``) for
    ``target`` and returns the per-chip figures (see :func:`report_lines` for their meaning).
    ``dtype`` None: what the engine's ``dtype="auto"`` loads on a TPU (bfloat16); the result's
    ``auto`` says what ``auto`` picks there (``jaxgen.backends.device_choice``).
    ``quantization`` "int8" / "int4" / "fp8": the weights as a quantised load holds them (the
    step streams int8 / int4 codes and scales through the quantised Pallas matmul);
    ``kv_cache_dtype`` "int8" / "fp8": an 8-bit pool (page_size a multiple of 128);
    ``num_scheduler_steps`` > 1: the engine's multi-step call (that many decode steps in one
    ``lax.scan``); XLA counts the scan's body once, so its counts are one step's;
    ``num_speculative_tokens`` k: speculative decoding's verify step too (``verify_step``:
    every sequence verifying k draft tokens, ``jaxgen.planning.verify_compile``)."""
    validate_quantization(quantization)
    if num_speculative_tokens is not None:
        check_num_speculative_tokens(num_speculative_tokens)
        if num_scheduler_steps != 1:
            raise ValueError("num_speculative_tokens needs num_scheduler_steps=1")
    if isinstance(num_scheduler_steps, bool) or not (
        isinstance(num_scheduler_steps, int) and num_scheduler_steps >= 1
    ):
        raise ValueError(
            f"num_scheduler_steps must be an integer >= 1, got {num_scheduler_steps!r}"
        )
    if quantization == "auto":
        quantization = "none"
    tpu = resolve_target(target)
    device = DeviceDescription("tpu", name=tpu.chip.name)
    auto = {
        "attention_backend": auto_attention_backend(device, cpu_kernels=False),
        "dtype": jnp.dtype(auto_dtype(device, config.model_type)).name,
    }
    dtype = jnp.dtype(auto["dtype"] if dtype is None else dtype)
    num_chips = len(tpu.devices)
    degree = tensor_parallel_degree or num_chips
    if degree < 1 or num_chips % degree:
        raise ValueError(
            f"tensor_parallel_degree={degree} must divide the {num_chips} chips of {target}"
        )
    check_step_sizes(max_model_len, max_num_seqs, kv_cache_memory)
    mesh = Mesh(
        np.array(tpu.devices[:degree], dtype=object).reshape(1, degree), (DATA_AXIS, MODEL_AXIS)
    )
    plan = ShardingPlan.create(config, mesh)  # ValueError when the degree does not split heads
    backend = (
        PallasTPUBackend(mesh=mesh, model_axis=MODEL_AXIS, kv_cache_dtype=kv_cache_dtype)
        if degree > 1
        else PallasTPUBackend(kv_cache_dtype=kv_cache_dtype)
    )
    graphdef, params = abstract_params(config, dtype, plan, quantization)
    step_params, head = backend.prepare_params(params, config)  # as the engine's runner does
    # Quantised weights: what the step reads (the prepared form holds float32 scales).
    weight_bytes = per_chip_bytes(params if quantization == "none" else (step_params, head))
    hbm = tpu.chip.memory_bytes
    if weight_bytes >= hbm:
        raise ValueError(
            f"the weights need {weight_bytes / GB:.1f} GB per chip at tensor_parallel_degree="
            f"{degree}, more than a {tpu.chip.name} chip's {hbm / GB:.0f} GB of HBM"
        )
    page_bytes = backend.kv_bytes_per_page(config, page_size, dtype) // degree  # per chip
    budget = kv_cache_memory * (hbm - weight_bytes)
    num_pages = pool_pages(budget, page_bytes, page_size, max_model_len, "per chip")
    pool = placed_pool(
        backend.kv_pool_shapes(config, num_pages, page_size, dtype),
        backend.kv_pool_sharding() or NamedSharding(mesh, PartitionSpec()),
    )
    step_inputs, sampling, sample_rows = decode_step_inputs(
        page_size, max_num_seqs, max_model_len, NamedSharding(mesh, PartitionSpec())
    )
    step = jitted_step(graphdef, backend)
    steps = {}
    if num_scheduler_steps > 1:  # as ModelRunner.dispatch passes them
        steps = {"num_steps": num_scheduler_steps, "page_size": page_size, "sampling": sampling}
    start = time.perf_counter()
    with jax.set_mesh(mesh):
        lowered = step.trace(
            step_params, pool, *step_inputs, head=head, sample_rows=sample_rows, **steps
        ).lower()
        compiled = lowered.compile()
        compile_seconds = time.perf_counter() - start
        verify = None
        if num_speculative_tokens is not None:
            inputs = verify_step_inputs(
                config.vocab_size, page_size, max_num_seqs, max_model_len,
                num_speculative_tokens, NamedSharding(mesh, PartitionSpec()),
            )  # fmt: skip
            verify = compile_verify_step(step, step_params, pool, head, inputs)
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    kv_bytes_per_token = config.kv_bytes_per_token(jnp.dtype(dtype).itemsize) // min(
        degree, config.num_kv_heads
    )
    if kv_cache_dtype != "auto":  # codes and scales as the pool lays them out, per chip
        kv_bytes_per_token = page_bytes // page_size
    pool_bytes = num_pages * page_bytes
    # Live KV: every sequence at max_model_len, or the whole pool when they do not all fit.
    live_kv = min(max_num_seqs * max_model_len * kv_bytes_per_token, pool_bytes)
    unread = unread_embedding_bytes(config, params)
    floor = weight_bytes - unread + live_kv
    # XLA's cost analysis counts a loop's body once: for a multi-step call, one of its steps
    # (the scan's body) plus what runs once around it.
    accessed = float(cost.get("bytes accessed", 0.0))
    kernels = sorted(set(_custom_calls(lowered.as_text())))
    # XLA's count is not HBM alone: it also counts on-chip traffic, such as the weight slices
    # it prefetches into VMEM (reported, as a diagnostic, beside it).
    prefetched = vmem_prefetch_bytes(compiled.as_text())
    return {
        "target": target,
        "topology": tpu.topology,
        "chip": tpu.chip.name,
        "num_chips": num_chips,
        "tensor_parallel_degree": degree,
        "auto": auto,
        "attention_backend": backend.name,
        "kernels": kernels,
        "dtype": jnp.dtype(dtype).name,
        "quantization": quantization,
        "kv_cache_dtype": kv_cache_dtype,
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "page_size": page_size,
        "num_pages": num_pages,
        "num_scheduler_steps": num_scheduler_steps,
        "per_chip_bytes": {
            "weights": weight_bytes,
            "kv_pool": pool_bytes,
            "temp": int(memory.temp_size_in_bytes),
            "arguments": int(memory.argument_size_in_bytes),
            "hbm": hbm,
        },
        "decode_step": {
            "bytes_accessed": accessed,
            "vmem_prefetch_bytes": prefetched,
            "flops": float(cost.get("flops", 0.0)),
            "floor_bytes": floor,
            "live_kv_bytes": live_kv,
            "unread_embedding_bytes": unread,
            "ratio": accessed / floor,
            "floor_ms": floor / tpu.chip.bandwidth_bytes_per_s * 1e3,
        },
        "compile_seconds": compile_seconds,
        **({"verify_step": verify} if verify is not None else {}),
    }


_DTYPE_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "s8": 1, "u8": 1, "pred": 1}


def vmem_prefetch_bytes(hlo_text: str) -> int:
    """Bytes XLA copies from HBM into VMEM ahead of use (``copy-start``/``slice-start`` whose
    destination layout is in memory space 1) in the compiled entry computation."""
    entry = hlo_text[hlo_text.find("\nENTRY") :]
    total = 0
    for line in entry.split("\n"):
        if "copy-start(" not in line and "slice-start(" not in line:
            continue
        # The start's tuple: (source or (sources), destination, context); take the destination.
        result_type = re.split(r" (?:copy|slice)-start\(", line.split(" = ", 1)[1])[0]
        shapes = re.findall(r"(\w+)\[([\d,]*)\]\{([^}]*)\}", result_type)
        destinations = [s for s in shapes if "S(1)" in s[2]]
        if destinations:
            dtype, dims, _ = destinations[-1]
            size = math.prod(int(d) for d in dims.split(",") if d)
            total += size * _DTYPE_BYTES.get(dtype, 4)
    return total


def _custom_calls(hlo_text: str) -> list[str]:
    """Names of the Mosaic kernels a lowered step calls."""
    names = re.findall(r'kernel_name\s*=\s*"([^"]+)"', hlo_text)
    names += re.findall(
        r"name\s*=\s*\"((?:ragged_paged_attention|kv_cache_update)[a-z_]*)", hlo_text
    )
    return names


def report_lines(result: dict) -> list[str]:
    gb = GB
    chip = result["per_chip_bytes"]
    step = result["decode_step"]
    used = chip["weights"] + chip["kv_pool"] + chip["temp"]
    steps = result.get("num_scheduler_steps", 1)
    per_step = (
        f"; one step of a {steps}-step call: XLA counts a loop body once" if steps > 1 else ""
    )
    return [
        f"target {result['target']} ({result['topology']}): {result['num_chips']} x {result['chip']}, "
        f"tensor parallel {result['tensor_parallel_degree']}, {result['dtype']}, weights "
        f"{result['quantization']}, KV {result['kv_cache_dtype']}",
        f"attention backend           {result['attention_backend']} ({', '.join(result['kernels']) or 'no kernels found'})",
        f"auto on this TPU            attention_backend {result['auto']['attention_backend']}, dtype {result['auto']['dtype']}",
        "per chip (compiler and datasheet counts, not measured on hardware):",
        f"  weights                   {chip['weights'] / gb:8.3f} GB",
        f"  KV pool                   {chip['kv_pool'] / gb:8.3f} GB  ({result['num_pages']:,} pages of {result['page_size']})",
        f"  compiler temporaries      {chip['temp'] / gb:8.3f} GB  ({chip['temp'] / chip['hbm']:.2%} of HBM)",
        f"  total                     {used / gb:8.3f} GB  of {chip['hbm'] / gb:.0f} GB HBM",
        f"decode step, {result['max_num_seqs']} sequences x {result['max_model_len']} tokens (compiler counts per chip{per_step}):",
        f"  bytes accessed            {step['bytes_accessed'] / gb:8.3f} GB  (of which XLA prefetched {step['vmem_prefetch_bytes'] / gb:.3f} GB of weights into VMEM)",
        f"  floor                     {step['floor_bytes'] / gb:8.3f} GB  (weights read + live KV) -> {step['floor_ms']:.2f} ms at datasheet bandwidth",
        f"  ratio to floor            {step['ratio']:8.3f}x",
        f"  flops                     {step['flops'] / 1e9:8.1f} GFLOP",
        f"compiled in {result['compile_seconds']:.1f} s",
    ] + (verify_report_lines(result, step, gb) if "verify_step" in result else [])  # fmt: skip
