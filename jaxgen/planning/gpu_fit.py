"""Whether one or more engines fit one NVIDIA GPU, checked on a host without one.

An engine on a GPU holds, inside the memory jax's allocator takes (``XLA_PYTHON_CLIENT_MEM_FRACTION``
of the GPU, 0.75 by default; the rest is CUDA's context, cuBLAS's workspaces and the driver's):
the weights, its KV pool (``kv_cache_memory``: bytes, or a fraction of the allocator's memory free
when the engine is built, 0.9 for None: ``jaxgen.engine.scheduling.kv_pool_plan``), and while a
step runs, that step's temporaries and outputs. Engines built over one ``LoadedModel`` share its
weights; each takes its pool from what the ones before left. Steps run one at a time, so the peak
is the largest step's, or the sampler's over its logits.

The largest step of an engine is its largest token bucket (``max_num_batched_tokens``: 512 by
default; a batch-at-a-time mode's ``batch_size x max_model_len``) with block tables covering
``max_model_len``, which is what the XLA reference backend gathers; a backend that marks decode-only
steps (``pallas-gpu``) also has its decode step of ``max_num_seqs`` rows. Each is compiled by XLA's
GPU compiler for the target (``jaxgen.planning.gpu_targets``) with what ``auto`` picks there, and its
``memory_analysis()`` read: compiler counts, not memory measured on a GPU. ``extrapolate=True``
compiles the model at 1 and 2 layers and extends the difference linearly to every layer (a layer
adds little: on Qwen2.5-1.5B's 28 layers, for a T4, this over-counts the compiled temporaries by
0.6% at a 512-token step and by 5% at a 16,384-token one); ``False`` compiles every layer.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgen.backends import select_backend
from jaxgen.backends.device_choice import auto_attention_backend, auto_dtype, check_dtype
from jaxgen.config import ModelConfig
from jaxgen.engine.compiled.buckets import bucket_for
from jaxgen.engine.sampling.sampling_tensors import build_sampling_tensors
from jaxgen.engine.scheduling.kv_pool_plan import ACCELERATOR_KV_FRACTION
from jaxgen.engine.step.step_function import jitted_sampler, jitted_step
from jaxgen.engine.step.step_layout import StepLayout
from jaxgen.layers.sharding import DATA_AXIS, MODEL_AXIS, ShardingPlan
from jaxgen.planning.abstract_step import (
    abstract_arrays,
    abstract_params,
    per_chip_bytes,
    placed_pool,
)
from jaxgen.planning.gpu_targets import jax_gpu_memory_fraction, resolve_gpu_target
from jaxgen.planning.hardware import GB


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineSizes:
    """The engine knobs that size its memory (``EngineConfig``'s names where they have one).

    Attributes:
        max_model_len: longest sequence.
        max_num_seqs: sequences a step holds (``max_rolling_batch_size``; ``batch_size`` for
            static and dynamic batching, 1 for none).
        max_num_batched_tokens: the step's token budget (``max_rolling_batch_prefill_tokens``;
            ``max_num_seqs * max_model_len`` for the batch-at-a-time modes).
        kv_cache_memory: the pool: bytes (int), a fraction of the allocator's free memory, or
            None (0.9 of it), as ``EngineConfig.kv_cache_memory``.
    """

    max_model_len: int
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    kv_cache_memory: int | float | None = None
    page_size: int = 16


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuFit:
    """Bytes on one GPU: ``peak`` against ``allocator_limit`` says whether the engines fit."""

    target: str
    gpu: str
    dtype: str
    attention_backend: str
    memory: int
    allocator_limit: int
    weights: int
    kv_pools: tuple[int, ...]  # one per engine, in the order they are built
    largest_step: dict  # the step whose temporaries and outputs peak: its shape and bytes
    sampler: dict | None  # the sampler's bytes over the largest logits rows (None: not compiled)
    extrapolated: bool

    @property
    def peak(self) -> int:
        step = self.largest_step["temp"] + self.largest_step["outputs"]
        sampler = sum(self.sampler.values()) if self.sampler else 0
        return self.weights + sum(self.kv_pools) + max(step, sampler)

    @property
    def fits(self) -> bool:
        return self.peak <= self.allocator_limit

    def lines(self) -> list[str]:
        step = self.largest_step
        how = "1- and 2-layer compiles extended to every layer" if self.extrapolated else "compiled"
        pools = " + ".join(f"{pool / GB:.3f}" for pool in self.kv_pools)
        return [
            f"target {self.target}: {self.gpu}, {self.dtype}, attention {self.attention_backend}",
            f"  weights                   {self.weights / GB:8.3f} GB",
            f"  KV pools                  {sum(self.kv_pools) / GB:8.3f} GB  ({pools})",
            f"  largest step              {(step['temp'] + step['outputs']) / GB:8.3f} GB  "
            f"({step['tokens']} tokens, {step['seq_slots']} sequences x {step['width_tokens']} "
            f"tokens of pages; temporaries {how})",
            f"  sampler                   {self.sampler['temp'] / GB:8.3f} GB  temporaries"
            if self.sampler else "  sampler                   not compiled",
            f"  peak                      {self.peak / GB:8.3f} GB  of {self.allocator_limit / GB:.2f}"
            f" GB jax's allocator takes of {self.memory / GB:.2f} GB: "
            + ("fits" if self.fits else "does not fit"),
        ]  # fmt: skip


def plan_gpu_fit(
    config: ModelConfig,
    target: str,
    engines: list[EngineSizes],
    *,
    dtype=None,
    attention_backend: str = "auto",
    memory_bytes: int | None = None,
    extrapolate: bool = False,
    sampler: bool = True,
) -> GpuFit:
    """``engines`` (built in order over one loaded ``config``) on GPU ``target`` (a
    ``GPU_TARGETS`` name): weights, pools, and the largest step and sampler compiled for it.
    ``dtype`` None and ``attention_backend`` "auto": what the engine's ``auto`` picks there.
    ``memory_bytes``: the GPU's memory as CUDA reports it, when below the datasheet's (ECC
    takes some). ``sampler`` False: the sampler is not compiled (seconds for a 150k vocabulary),
    and the peak is the largest step's. ``ValueError`` for a pool that cannot hold one
    sequence, and for what the GPU cannot run."""
    if not engines:
        raise ValueError("engines must name at least one engine's sizes")
    gpu = resolve_gpu_target(target)
    device = gpu.gpu.device()
    check_dtype(device, dtype)
    if attention_backend == "auto":
        attention_backend = auto_attention_backend(device, cpu_kernels=False)
    dtype = jnp.dtype(auto_dtype(device, config.model_type) if dtype is None else dtype)
    backend = select_backend(attention_backend, dtype=dtype, device=device)
    _, params = abstract_params(config, dtype, ShardingPlan.create(config, _one_gpu(target)))
    weights = per_chip_bytes(params)
    memory = memory_bytes or gpu.gpu.chip.memory_bytes
    limit = int(memory * jax_gpu_memory_fraction())
    pools = []
    for sizes in engines:
        pools.append(_pool_bytes(sizes, backend, config, dtype, limit - weights - sum(pools)))
    shapes = sorted({shape for sizes in engines for shape in _largest_steps(sizes, backend)})
    steps = [step_bytes(config, target, backend, dtype, shape, extrapolate) for shape in shapes]
    largest = max(steps, key=lambda step: step["temp"] + step["outputs"])
    rows = max(step["seq_slots"] for step in steps)
    return GpuFit(
        target=target,
        gpu=gpu.gpu.chip.name,
        dtype=dtype.name,
        attention_backend=backend.name,
        memory=memory,
        allocator_limit=limit,
        weights=weights,
        kv_pools=tuple(pools),
        largest_step=largest,
        sampler=sampler_bytes(target, rows, config.vocab_size) if sampler else None,
        extrapolated=extrapolate,
    )


def _pool_bytes(sizes: EngineSizes, backend, config, dtype, free: int) -> int:
    """The pool's bytes as ``plan_kv_pool`` sizes a paged one: whole pages of the budget."""
    budget = sizes.kv_cache_memory
    if not isinstance(budget, int):
        budget = int(free * (ACCELERATOR_KV_FRACTION if budget is None else budget))
    page_bytes = backend.kv_bytes_per_page(config, sizes.page_size, dtype)
    pages = budget // page_bytes
    need = -(-sizes.max_model_len // sizes.page_size)
    if pages < need:
        raise ValueError(
            f"kv_cache_memory ({budget} bytes) holds {pages} pages, fewer than one sequence of "
            f"max_model_len={sizes.max_model_len} needs ({need}): the weights leave {free} bytes"
        )
    return pages * page_bytes


def _largest_steps(sizes: EngineSizes, backend) -> list[tuple]:
    """(tokens, max_num_seqs, max_model_len, page_size, decode_only) of the engine's steps that
    can peak: its top token bucket, and a decode-only step where the backend marks them."""
    layout = StepLayout(
        page_size=sizes.page_size,
        max_num_seqs=sizes.max_num_seqs,
        max_num_batched_tokens=sizes.max_num_batched_tokens,
        max_model_len=sizes.max_model_len,
    )
    top = bucket_for(max(sizes.max_num_batched_tokens, 2), layout.token_buckets)
    common = (sizes.max_num_seqs, sizes.max_model_len, sizes.page_size)
    steps = [(top, *common, False)]
    if backend.marks_decode_only_steps:
        steps.append((layout.seq_cap, *common, True))
    return steps


def _one_gpu(target: str) -> Mesh:
    devices = resolve_gpu_target(target).devices[:1]
    return Mesh(np.array(devices, dtype=object).reshape(1, 1), (DATA_AXIS, MODEL_AXIS))


@functools.lru_cache(maxsize=64)
def step_bytes(config: ModelConfig, target: str, backend, dtype, shape: tuple, extrapolate: bool):
    """Temporaries and (not donated) outputs of one step compiled for GPU ``target``:
    ``shape`` is (tokens, max_num_seqs, max_model_len, page_size, decode_only). Cached: a
    compile takes seconds and the figures depend on these arguments alone."""
    mesh = _one_gpu(target)
    tokens, max_num_seqs, max_model_len, page_size, decode_only = shape
    layout = StepLayout(
        page_size=page_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(tokens, max_num_seqs),
        max_model_len=max_model_len,
        full_width_tables=backend.full_width_tables,
        mark_decode_only=decode_only,
    )
    inputs = layout.padding_step(tokens, layout.full_width)
    rows = layout.num_seq_slots(tokens)
    if extrapolate and config.num_layers > 2:
        one, two = (_compiled(_layers(config, n), mesh, backend, dtype, inputs, rows, page_size)
                    for n in (1, 2))  # fmt: skip
        temp = one[0] + max(two[0] - one[0], 0) * (config.num_layers - 1)
        outputs = max(one[1], two[1])
    else:
        temp, outputs = _compiled(config, mesh, backend, dtype, inputs, rows, page_size)
    return {
        "tokens": tokens,
        "seq_slots": rows,
        "width_tokens": layout.full_width * page_size,
        "decode_only": decode_only,
        "temp": temp,
        "outputs": outputs,
    }


def _layers(config: ModelConfig, num_layers: int) -> ModelConfig:
    return dataclasses.replace(
        config, num_layers=num_layers, layer_types=config.layer_types[:num_layers]
    )


def _compiled(config, mesh, backend, dtype, inputs, rows: int, page_size: int) -> tuple[int, int]:
    """(temporaries, outputs not aliased to a donated input) of the step over a one-sequence
    pool (the pool's size changes neither)."""
    graphdef, params = abstract_params(config, dtype, ShardingPlan.create(config, mesh))
    step_params, head = backend.prepare_params(params, config)
    replicated = NamedSharding(mesh, PartitionSpec())
    sharding = backend.kv_pool_sharding() or replicated
    if not isinstance(sharding, NamedSharding):
        sharding = (sharding, sharding)
    num_pages = inputs.metadata.block_tables.shape[1] + 1
    pool = placed_pool(backend.kv_pool_shapes(config, num_pages, page_size, dtype), sharding)
    arrays = abstract_arrays(inputs.arrays, replicated)
    with jax.set_mesh(mesh):
        lowered = (
            jitted_step(graphdef, backend)
            .trace(step_params, pool, *arrays, None, head=head, sample_rows=rows)
            .lower()
        )
        analysis = lowered.compile(compiler_options=backend.compiler_options).memory_analysis()
    outputs = analysis.output_size_in_bytes - analysis.alias_size_in_bytes
    return int(analysis.temp_size_in_bytes), int(outputs)


@functools.lru_cache(maxsize=16)
def sampler_bytes(target: str, rows: int, vocab_size: int) -> dict:
    """The sampler over ``rows`` float32 logits rows compiled for GPU ``target``: its input,
    temporaries and outputs (cached, as :func:`step_bytes`)."""
    mesh = _one_gpu(target)
    replicated = NamedSharding(mesh, PartitionSpec())
    logits = jax.ShapeDtypeStruct((rows, vocab_size), jnp.float32, sharding=replicated)
    tensors, _ = build_sampling_tensors([], rows, base_seed=0, step_counter=0)
    with jax.set_mesh(mesh):
        compiled = (
            jitted_sampler(rows).trace(logits, abstract_arrays(tensors, replicated)).lower()
        ).compile()
    analysis = compiled.memory_analysis()
    return {
        "logits": rows * vocab_size * 4,
        "temp": int(analysis.temp_size_in_bytes),
        "outputs": int(analysis.output_size_in_bytes),
    }
