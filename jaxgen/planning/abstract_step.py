"""The decode step's arguments as ``jax.ShapeDtypeStruct``s placed by their shardings: the
model's parameters (quantised ones as a quantised load holds them) and the step's inputs. No
weights exist; the ahead-of-time compiler traces the step with these."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.engine.sampling.sampling_tensors import build_sampling_tensors
from jaxgen.engine.step.step_layout import StepLayout
from jaxgen.layers.sharding import ShardingPlan
from jaxgen.models import LlamaForCausalLM
from jaxgen.models.weights import quantisable_paths
from jaxgen.quantization.quantize import spec_for_path
from jaxgen.quantization.quantized_weight import VALUE_DTYPES, QuantizedWeight


def placed(tree, shardings):
    """``tree``'s leaves as ``ShapeDtypeStruct``s with ``shardings``' leaves (same structure)."""
    return jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        tree,
        shardings,
    )


def abstract_params(config: ModelConfig, dtype, plan: ShardingPlan, quantization: str = "none"):
    """Graph and parameter ``ShapeDtypeStruct``s (with their shardings): no weights exist.
    ``quantization`` "int8" / "int4" / "fp8": the parameters a load would quantise
    (``spec_for_path``) are ``QuantizedWeight``s of ``ShapeDtypeStruct``s, as loaded."""
    abstract = nnx.eval_shape(lambda: LlamaForCausalLM(config, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    quantisable = quantisable_paths(config, dtype) if quantization != "none" else set()
    leaves = []
    for path, var in nnx.to_flat_state(state):
        value = var.get_value()
        spec = spec_for_path(quantization, path) if path in quantisable else None
        if spec is not None:
            kernel_shape = value.shape if path[-1] == "kernel" else value.shape[::-1]  # [in, out]
            weight = abstract_quantized_weight(kernel_shape, spec)
            weight = placed(weight, plan.quantized_shardings(path, weight))
            leaves.append((path, var.replace(weight)))
            continue
        sharding = plan.sharding_for(path)
        leaves.append(
            (path, var.replace(jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=sharding)))
        )
    return graphdef, nnx.from_flat_state(leaves)


def abstract_quantized_weight(shape: tuple[int, int], spec) -> QuantizedWeight:
    """The ``QuantizedWeight`` of ``ShapeDtypeStruct``s a ``[K, N]`` kernel quantised per
    ``spec`` loads as (``jaxgen.quantization.quantize_kernel``: float16 scales for int8 and
    int4, float32 per channel for fp8)."""
    depth, columns = shape
    group = spec.group_size or depth
    scales = jax.ShapeDtypeStruct(
        (depth // group, columns), jnp.float32 if spec.kind == "fp8" else jnp.float16
    )
    rows = depth // 2 if spec.kind == "int4" else depth
    values = jax.ShapeDtypeStruct((rows, columns), VALUE_DTYPES[spec.kind])
    mins = scales if spec.asymmetric else None
    return QuantizedWeight(
        values, scales, mins, kind=spec.kind, group_size=group, shape=shape,
        activations=spec.activations,
    )  # fmt: skip


def decode_step_inputs(
    page_size: int, max_num_seqs: int, max_model_len: int, sharding=None, *, decode_only=False
):
    """``ShapeDtypeStruct``s of a full-width decode step's array arguments after params and pool
    (the step's inputs, then its prompt-logprob targets: none), of its rows' sampling tensors
    (a multi-step decode samples inside the step), and its ``sample_rows``. ``decode_only``:
    the step as an engine whose backend marks decode-only steps runs it (the row bucket of
    ``max_num_seqs`` sequences, ``AttentionMetadata.decode_only`` set)."""
    layout = StepLayout(
        page_size=page_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(max_num_seqs, 16),
        max_model_len=max_model_len,
        mark_decode_only=decode_only,
    )
    num_tokens = layout.seq_cap if decode_only else max_num_seqs
    inputs = layout.padding_step(num_tokens, -(-max_model_len // page_size))
    targets = np.full(np.shape(inputs.token_ids)[0], -1, np.int32)  # no prompt logprobs
    tensors, _ = build_sampling_tensors(
        [], layout.num_seq_slots(num_tokens), base_seed=0, step_counter=0
    )
    return (
        abstract_arrays((*inputs.arrays, targets), sharding),
        abstract_arrays(tensors, sharding),
        tensors.temperature.shape[0],
    )


def abstract_arrays(tree, sharding=None):
    """``tree``'s arrays as ``ShapeDtypeStruct``s on ``sharding``."""
    return jax.tree_util.tree_map(
        lambda a: jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype, sharding=sharding), tree
    )


def per_chip_bytes(tree) -> int:
    """Bytes each chip holds of a tree of sharded ``ShapeDtypeStruct``s."""
    total = 0
    for leaf in jax.tree_util.tree_leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape) if leaf.sharding is not None else leaf.shape
        total += math.prod(shard) * jnp.dtype(leaf.dtype).itemsize
    return total


def check_step_sizes(max_model_len: int, max_num_seqs: int, kv_cache_memory: float) -> None:
    """``ValueError`` for sizes no compiled step takes."""
    if max_model_len < 1 or max_num_seqs < 1:
        raise ValueError("max_model_len and max_num_seqs must be >= 1")
    if not 0 < kv_cache_memory <= 1:
        raise ValueError(f"kv_cache_memory must be a fraction in (0, 1], got {kv_cache_memory}")


def pool_pages(
    budget: float, page_bytes: int, page_size: int, max_model_len: int, where: str
) -> int:
    """Pages of ``page_bytes`` that ``budget`` bytes hold; ``ValueError`` when fewer than one
    sequence of ``max_model_len`` needs (``where``: whose memory, for the message)."""
    num_pages = int(budget // page_bytes)
    pages_per_seq = -(-max_model_len // page_size)
    if num_pages < pages_per_seq + 1:
        raise ValueError(
            f"{num_pages} pages of {page_size} tokens fit {where} after the weights, fewer than "
            f"one sequence of max_model_len={max_model_len} needs ({pages_per_seq + 1})"
        )
    return num_pages


def placed_pool(layers: list, shardings) -> list:
    """The pool's layers (``kv_pool_shapes``) placed: ``shardings`` is one ``NamedSharding``
    for every leaf, or a pytree of them matching each layer (an 8-bit pool's codes and scales
    under tensor parallelism)."""
    return [
        placed(
            layer,
            jax.tree_util.tree_map(lambda _: shardings, layer)
            if isinstance(shardings, jax.sharding.NamedSharding)
            else shardings,
        )
        for layer in layers
    ]


def unread_embedding_bytes(config: ModelConfig, params) -> int:
    """An untied embedding table's bytes per chip: a step reads only its rows for the step's
    tokens, so the floor leaves it out (a tied one is the LM head, read whole)."""
    return 0 if config.tie_word_embeddings else per_chip_bytes(params["embed_tokens"])
