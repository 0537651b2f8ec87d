"""The engine's decode step compiled for an NVIDIA GPU on a host without one.

The step is the engine's own (``jitted_step`` with the backend and dtype the engine's ``auto``
picks on that GPU, or those asked for, and its ``attention_kernel_options``), traced with
``jax.ShapeDtypeStruct``s on a compile-only T4, L4, A100, H100 or H200
(``jaxgen.planning.gpu_targets``) and compiled by XLA's GPU pipeline: its fusions, its Triton
GEMMs (or cuBLAS calls), the Pallas kernels through Triton to the GPU's code (from compute
capability 8.0; below it ``auto`` is the reference backend: XLA's fusions and cuBLAS). What comes back is the
compiler's: the bytes it holds per GPU (``memory_analysis``), and the kernels one step launches,
read from the compiled module's entry computation. On a GPU each launch costs a microsecond or
two beside its work (docs/gpu.md: the H200's small kernels), so the count is what a change to the
step's fusions is judged by before a GPU measures it. Nothing is autotuned without a GPU: the
GEMMs' tilings (and split-K) are XLA's defaults, which a device replaces by measured choices.
"""

from __future__ import annotations

import collections
import dataclasses
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgen.backends import select_backend
from jaxgen.backends.device_choice import auto_attention_backend, auto_dtype, check_dtype
from jaxgen.config import ModelConfig
from jaxgen.engine.step.step_function import jitted_step
from jaxgen.engine.step.step_layout import StepLayout
from jaxgen.layers.sharding import DATA_AXIS, MODEL_AXIS, ShardingPlan
from jaxgen.planning.abstract_step import (
    abstract_params,
    check_step_sizes,
    decode_step_inputs,
    per_chip_bytes,
    placed_pool,
    pool_pages,
    unread_embedding_bytes,
)
from jaxgen.planning.gpu_targets import jax_gpu_memory_fraction, resolve_gpu_target
from jaxgen.planning.hardware import GB
from jaxgen.quantization.quantize import validate_quantization

# Instructions of a compiled entry computation that launch nothing.
_NOT_LAUNCHED = {"parameter", "get-tuple-element", "bitcast", "tuple", "constant"}
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%(\S+) = .+? ([a-z][\w-]*)\((.*)$")


def compile_decode_step_for_gpu(
    config: ModelConfig,
    target: str,
    *,
    dtype=None,
    attention_backend: str = "auto",
    quantization: str = "none",
    max_model_len: int = 2048,
    max_num_seqs: int = 64,
    page_size: int = 16,
    kv_cache_memory: float = 0.9,
    kv_cache_dtype: str = "auto",
    attention_kernel_options: dict | None = None,
    tensor_parallel_degree: int = 1,
) -> dict:
    """Compiles one decode-only step of ``max_num_seqs`` sequences (the engine's row bucket for
    them) for GPU ``target`` (a ``GPU_TARGETS`` name); the pool is what ``kv_cache_memory`` of
    the memory jax's allocator leaves after the weights holds, as the engine sizes it.
    ``dtype`` None and ``attention_backend`` "auto": what the engine's ``auto`` picks on that
    GPU (``jaxgen.backends.device_choice``: below compute capability 8.0, float16 and the
    reference backend); an explicit choice the GPU cannot run is the engine's ``ValueError``.
    ``quantization`` "int8" / "int4" / "fp8": the weights as a quantised load holds them.
    ``tensor_parallel_degree`` n > 1: over n such GPUs (NVLink all-reduces), weights and pool
    placed as the engine places them, every figure per GPU. Returns the figures
    :func:`gpu_report_lines` prints (``auto``: what the engine's automatic choices are on the
    GPU, beside what was compiled). ``ValueError`` for arguments the step cannot take."""
    check_step_sizes(max_model_len, max_num_seqs, kv_cache_memory)
    validate_quantization(quantization)
    quantization = "none" if quantization == "auto" else quantization
    if isinstance(tensor_parallel_degree, bool) or not (
        isinstance(tensor_parallel_degree, int) and tensor_parallel_degree >= 1
    ):
        raise ValueError(
            f"tensor_parallel_degree must be an integer >= 1, got {tensor_parallel_degree!r}"
        )
    gpu = resolve_gpu_target(target, tensor_parallel_degree)
    device = gpu.gpu.device()
    check_dtype(device, dtype)
    auto = {
        "attention_backend": auto_attention_backend(
            device, sharded=tensor_parallel_degree > 1, cpu_kernels=False
        ),
        "dtype": jnp.dtype(auto_dtype(device, config.model_type)).name,
    }
    dtype = jnp.dtype(auto["dtype"] if dtype is None else dtype)
    mesh = Mesh(
        np.array(gpu.devices, dtype=object).reshape(1, tensor_parallel_degree),
        (DATA_AXIS, MODEL_AXIS),
    )
    plan = ShardingPlan.create(config, mesh)  # ValueError when the degree does not split heads
    backend = select_backend(
        attention_backend,
        dtype=dtype,
        kv_sharding=plan.kv_sharding if tensor_parallel_degree > 1 else None,
        device=device,
        kv_cache_dtype=kv_cache_dtype,
        kernel_options=attention_kernel_options,
    )
    _, params = abstract_params(config, dtype, plan, quantization)
    weight_bytes = per_chip_bytes(params)
    memory = gpu.gpu.chip.memory_bytes
    limit = memory * jax_gpu_memory_fraction()  # the engine's pool: a share of what is left
    shares = backend.kv_pool_shares(config, page_size, dtype, plan.kv_sharding)
    page_bytes = backend.kv_bytes_per_page(config, page_size, dtype) // shares  # per GPU
    where = f"on a {gpu.gpu.chip.name}"
    num_pages = pool_pages(
        kv_cache_memory * (limit - weight_bytes), page_bytes, page_size, max_model_len, where
    )
    start = time.perf_counter()
    shapes = (num_pages, page_size, max_num_seqs, max_model_len, quantization)
    compiled = _compile_step(config, mesh, backend, dtype, *shapes)
    compile_seconds = time.perf_counter() - start
    analysis = compiled.memory_analysis()
    rows = StepLayout(
        page_size=page_size, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_seqs,
        max_model_len=max_model_len,
    ).seq_cap  # fmt: skip
    live_kv = min(max_num_seqs * max_model_len, num_pages * page_size) * (page_bytes // page_size)
    floor = weight_bytes - unread_embedding_bytes(config, params) + live_kv
    launches = kernel_launches(compiled.as_text())
    # Per layer: this step's launches less those of the same step over one layer, shared out.
    outside = launches["total"]
    if config.num_layers > 1:
        one_layer = dataclasses.replace(config, num_layers=1, layer_types=config.layer_types[:1])
        single = _compile_step(one_layer, mesh, backend, dtype, *shapes)
        single_total = kernel_launches(single.as_text())["total"]
        outside = single_total - (launches["total"] - single_total) / (config.num_layers - 1)
    return {
        "target": target,
        "gpu": gpu.gpu.chip.name,
        "compute_capability": ".".join(map(str, gpu.gpu.compute_capability)),
        "tensor_parallel_degree": tensor_parallel_degree,
        "auto": auto,
        "attention_backend": backend.name,
        "attention_kernel_options": dict(attention_kernel_options or {}),
        "compiler_options": backend.compiler_options or {},
        "dtype": dtype.name,
        "quantization": quantization,
        "kv_cache_dtype": kv_cache_dtype,
        "max_num_seqs": max_num_seqs,
        "rows": rows,
        "max_model_len": max_model_len,
        "page_size": page_size,
        "num_pages": num_pages,
        "num_layers": config.num_layers,
        "per_gpu_bytes": {
            "weights": weight_bytes,
            "kv_pool": num_pages * page_bytes,
            "temp": int(analysis.temp_size_in_bytes),
            "memory": memory,
            "allocator_limit": int(limit),
        },
        "decode_step": {
            "floor_bytes": floor,
            "floor_ms": floor / gpu.gpu.chip.bandwidth_bytes_per_s * 1e3,
        },
        "launches": {
            **launches,
            "per_layer": (launches["total"] - outside) / config.num_layers,
            "outside_layers": outside,
        },
        "autotuned": False,
        "compile_seconds": compile_seconds,
    }


def _compile_step(
    config, mesh, backend, dtype, num_pages, page_size, max_num_seqs, max_model_len, quantization
):
    """The decode-only step of ``max_num_seqs`` sequences over a pool of ``num_pages`` pages,
    compiled for ``mesh``'s GPU."""
    plan = ShardingPlan.create(config, mesh)
    graphdef, params = abstract_params(config, dtype, plan, quantization)
    step_params, head = backend.prepare_params(params, config)
    replicated = NamedSharding(mesh, PartitionSpec())
    # One sharding for every leaf, or (an 8-bit pool under tensor parallelism) one per leaf
    # of each of a layer's K and V pools.
    sharding = backend.kv_pool_sharding() or replicated
    if not isinstance(sharding, NamedSharding):
        sharding = (sharding, sharding)
    pool = placed_pool(backend.kv_pool_shapes(config, num_pages, page_size, dtype), sharding)
    step_inputs, _, sample_rows = decode_step_inputs(
        page_size, max_num_seqs, max_model_len, replicated, decode_only=True
    )
    *arrays, _targets = step_inputs  # a decode step asks for no prompt logprobs
    with jax.set_mesh(mesh):
        lowered = (
            jitted_step(graphdef, backend)
            .trace(step_params, pool, *arrays, None, head=head, sample_rows=sample_rows)
            .lower()
        )
        return lowered.compile(compiler_options=backend.compiler_options)


def kernel_launches(hlo_text: str) -> dict:
    """The kernels a compiled GPU module's entry computation launches, by kind: ``gemm`` (XLA's
    Triton GEMM fusions and cuBLAS calls), ``pallas`` (each Pallas kernel's name and count),
    ``fusions`` (XLA's other fusions: elementwise, reductions, scatters, copies into place),
    ``other`` (collectives, copies, control flow and any other custom call, by opcode)."""
    entry = hlo_text[hlo_text.find("\nENTRY") :].split("\n")[1:]
    gemm, fusions, total = 0, 0, 0
    pallas, other = collections.Counter(), collections.Counter()
    for line in entry:
        match = _INSTRUCTION.match(line)
        if match is None or match.group(2) in _NOT_LAUNCHED:
            continue
        _, opcode, rest = match.groups()
        if opcode.endswith("-done"):  # an asynchronous op's wait: its start launched it
            continue
        opcode = opcode.removesuffix("-start")
        total += 1
        target = re.search(r'custom_call_target="([^"]+)"', rest)
        if opcode == "custom-call" and target and target.group(1).startswith("__cublas"):
            gemm += 1
        elif opcode == "custom-call" and target and target.group(1) == "__gpu$xla.gpu.triton":
            name = re.search(r'op_name="[^"]*?([\w.]+)/pallas_call"', rest)
            pallas[name.group(1) if name else "pallas_call"] += 1
        elif opcode == "fusion" and re.search(r'"kind":"__triton_(?:nested_)?gemm', rest):
            gemm += 1
        elif opcode == "fusion":
            fusions += 1
        else:
            other[opcode if target is None else target.group(1)] += 1
    return {
        "total": total,
        "gemm": gemm,
        "pallas": dict(pallas),
        "fusions": fusions,
        "other": dict(other),
    }


def gpu_report_lines(result: dict) -> list[str]:
    chip = result["per_gpu_bytes"]
    step = result["decode_step"]
    launches = result["launches"]
    used = chip["weights"] + chip["kv_pool"] + chip["temp"]
    options = result["attention_kernel_options"]
    pallas = ", ".join(f"{name} x {count}" for name, count in sorted(launches["pallas"].items()))
    other = ", ".join(f"{name} x {count}" for name, count in sorted(launches["other"].items()))
    auto = result["auto"]
    return [
        f"target {result['target']}: {result['tensor_parallel_degree']} x {result['gpu']} "
        f"(compute capability {result['compute_capability']}), {result['dtype']}, weights "
        f"{result['quantization']}, KV {result['kv_cache_dtype']}, attention "
        f"{result['attention_backend']}" + (f" {options}" if options else ""),
        f"auto on this GPU: attention_backend {auto['attention_backend']}, dtype {auto['dtype']}",
        "per GPU (compiler and datasheet counts, not measured on hardware):",
        f"  weights                   {chip['weights'] / GB:8.3f} GB",
        f"  KV pool                   {chip['kv_pool'] / GB:8.3f} GB  ({result['num_pages']:,} pages of {result['page_size']})",
        f"  compiler temporaries      {chip['temp'] / GB:8.3f} GB",
        f"  total                     {used / GB:8.3f} GB  of {chip['allocator_limit'] / GB:.1f} GB jax's allocator takes of {chip['memory'] / GB:.0f} GB",
        f"decode step, {result['max_num_seqs']} sequences ({result['rows']} rows) x "
        f"{result['max_model_len']} tokens:",
        f"  floor                     {step['floor_bytes'] / GB:8.3f} GB  (weights read + live KV) -> {step['floor_ms']:.2f} ms at datasheet bandwidth",
        f"  kernel launches           {launches['total']:8d}  ({launches['per_layer']:.1f} per layer of {result['num_layers']})",
        f"    GEMMs                   {launches['gemm']:8d}",
        f"    Pallas kernels          {sum(launches['pallas'].values()):8d}  ({pallas or 'none'})",
        f"    XLA fusions             {launches['fusions']:8d}",
        f"    other                   {sum(launches['other'].values()):8d}" + (f"  ({other})" if other else ""),
        f"compiled in {result['compile_seconds']:.1f} s by XLA's GPU compiler without a GPU "
        "(not autotuned: GEMM tilings are XLA's defaults)",
    ]  # fmt: skip
