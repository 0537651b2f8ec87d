"""The Pallas TPU backend: one ragged paged-attention kernel for decode and prefill rows, and a
small kernel that writes the step's K/V into the pool in place.

The pool of a layer is one array ``[num_pages, page_size, 2 * Hkv_p, Dp]`` with K and V heads
interleaved and ``head_dim`` padded to 128 lanes (``pallas_kernels.tpu.kv_pool.layout``). Pallas
calls are not partitioned by XLA, so under tensor parallelism the backend runs them inside
``jax.shard_map`` over the model axis: each chip attends its own query heads against its own KV
heads. When a model has fewer KV heads than chips, each KV head is repeated so that every chip
holds exactly the head its query heads need (as vLLM does), rather than the whole pool.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgen.backends.base import KernelBackend, replace_linear_kernels
from jaxgen.backends.streamed_quantized_weight import StreamedQuantizedWeight
from jaxgen.backends.streamed_weight import StreamedWeight
from jaxgen.quantization import is_quantized
from jaxgen.quantization.kv_cache import validate_kv_cache_dtype
from jaxgen.quantization.quantized_embedding_table import QuantizedEmbeddingTable
from pallas_kernels.tpu.kv_cache_update import update_kv_cache_tpu, update_quantized_pool_tpu
from pallas_kernels.tpu.kv_pool import QuantizedKVPool, kv_pool_shape, quantized_pool_shapes
from pallas_kernels.tpu.ragged_paged_attention import ragged_paged_attention_tpu
from pallas_kernels.tpu.rotary_embedding import rotary_embedding_supported, rotary_embedding_tpu


@dataclasses.dataclass(frozen=True)
class PallasTPUBackend(KernelBackend):
    """``mesh``/``model_axis``: where the pool is split over KV heads (None: one device);
    ``interpret``: run the kernels in Pallas's TPU interpreter (on CPU, for tests);
    ``kv_cache_dtype`` "int8" / "fp8": each layer's pool is a ``QuantizedKVPool`` (8-bit codes
    and per-token scales, dequantised in VMEM by the attention kernel)."""

    name = "pallas-tpu"
    full_width_tables = True
    mesh: Mesh | None = None
    model_axis: str | None = None
    interpret: bool = False
    kv_cache_dtype: str = "auto"

    def __post_init__(self):
        validate_kv_cache_dtype(self.kv_cache_dtype)

    @property
    def degree(self) -> int:
        return (
            1 if self.mesh is None or self.model_axis is None else self.mesh.shape[self.model_axis]
        )

    @property
    def compiler_options(self):
        """No cross-program prefetch on TPU: XLA would copy a small weight whole into VMEM every
        step (an int8 embedding's scale table, 8 MB per chip for Llama-3-8B on v5e-4, to gather
        the step's 64 rows of it), counted at 66 MB a step."""
        return None if self.interpret else {"xla_max_cross_program_prefetches": 0}

    @property
    def interpret_params(self):
        if not self.interpret:
            return False
        return pltpu.InterpretParams()

    def prepare_params(self, params, config):
        """``Linear`` kernels as ``StreamedWeight``s (streamed from HBM by a Pallas matmul in
        decode steps; int8 / int4 ``QuantizedWeight``s as ``StreamedQuantizedWeight``s,
        dequantised in VMEM; bit-plane ones keep XLA's dot at their own bytes), and a tied embedding wrapped, untransposed, as the LM head kernel
        (a quantised table is held as its head kernel already). An untied quantised embedding
        is held row-major (``QuantizedEmbeddingTable``), so its lookup is a row gather."""
        placement = dict(mesh=self.mesh, model_axis=self.model_axis, interpret=self.interpret)

        def wrap(kernel, transposed=False):
            if is_quantized(kernel):
                if kernel.kind not in ("int8", "int4") or kernel.activations == "int8":
                    # fp8, W8A8 / W4A8, and bit planes (GGUF's 2-, 3-, 5- and 6-bit codes):
                    # XLA's dot (QuantizedWeight.matmul, the unpacking fused into its operand).
                    # The streamed kernel reads int8 / int4 codes, so planes would be widened
                    # (Q6_K 8.56 bits a weight in HBM against the file's 6.56).
                    return None
                return StreamedQuantizedWeight.wrap(kernel, **placement)
            if not _streamable(kernel):
                return None
            return StreamedWeight.wrap(kernel, transposed=transposed, **placement)

        head = None
        if config.tie_word_embeddings:
            embedding = params["embed_tokens"]["embedding"].get_value()
            head = wrap(embedding, transposed=not is_quantized(embedding))
        step_params = replace_linear_kernels(params, wrap)
        if not config.tie_word_embeddings:
            step_params = _row_major_embedding(step_params)
        return step_params, head

    def kv_heads_per_chip(self, config) -> int:
        """KV heads each chip holds: its share, or the one head its query heads read."""
        degree, heads = self.degree, config.num_kv_heads
        if heads % degree == 0:
            return heads // degree
        if degree % heads == 0:
            return 1
        raise ValueError(
            f"tensor_parallel_degree={degree} neither divides nor is a multiple of the model's "
            f"{heads} KV heads, which the pallas-tpu backend needs"
        )

    def kv_pool_shapes(self, config, num_pages: int, page_size: int, dtype) -> list:
        heads = self.kv_heads_per_chip(config)
        if self.kv_cache_dtype != "auto":
            local = quantized_pool_shapes(
                self.kv_cache_dtype, num_pages, page_size, heads, config.head_dim
            )
            codes, scales = local.codes, local.scales  # split on KV rows / their scale rows
            pool = QuantizedKVPool(
                jax.ShapeDtypeStruct(
                    (*codes.shape[:2], codes.shape[2] * self.degree, codes.shape[3]), codes.dtype
                ),
                jax.ShapeDtypeStruct(
                    (scales.shape[0], scales.shape[1] * self.degree, scales.shape[2]),
                    scales.dtype,
                ),
            )
            return [pool for _ in range(config.num_layers)]
        local = kv_pool_shape(num_pages, page_size, heads, config.head_dim, dtype)
        shape = (local[0], local[1], local[2] * self.degree, local[3])
        return [jax.ShapeDtypeStruct(shape, dtype) for _ in range(config.num_layers)]

    def kv_pool_spec(self, model_axis: str | None = None):
        """The pool's partition spec (a ``QuantizedKVPool`` of specs for an 8-bit pool): split
        over KV rows (codes) and their scale rows."""
        axis = model_axis or self.model_axis
        if self.kv_cache_dtype != "auto":
            return QuantizedKVPool(
                PartitionSpec(None, None, axis, None), PartitionSpec(None, axis, None)
            )
        return PartitionSpec(None, None, axis, None)

    def kv_pool_sharding(self, kv_sharding=None):
        if self.mesh is None:
            return None
        return jax.tree_util.tree_map(
            lambda spec: NamedSharding(self.mesh, spec),
            self.kv_pool_spec(),
            is_leaf=lambda x: isinstance(x, PartitionSpec),
        )

    def allocate_kv_pool(self, config, num_pages, page_size, dtype, kv_sharding=None) -> list:
        shapes = self.kv_pool_shapes(config, num_pages, page_size, dtype)
        sharding = self.kv_pool_sharding()
        out = []
        for shape in shapes:

            def make(shape=shape):
                pool = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shape)
                if isinstance(pool, QuantizedKVPool):  # unwritten slots: scale 1, code 0
                    pool = dataclasses.replace(pool, scales=jnp.ones_like(pool.scales))
                return pool

            out.append(jax.jit(make, out_shardings=sharding)() if sharding else make())
        return out

    def rotate(self, x, rope):
        """RoPE by the Pallas kernel (each chip its own heads), where it tiles ``x``."""
        tokens, num_heads, head_dim = x.shape
        cos, sin = rope  # [T, 1, D / 2]
        if cos.shape != (tokens, 1, head_dim // 2) or num_heads % self.degree:
            return super().rotate(x, rope)
        if not rotary_embedding_supported(num_heads // self.degree, head_dim):
            return super().rotate(x, rope)
        rotate = functools.partial(rotary_embedding_tpu, interpret=self.interpret_params)
        cos, sin = cos[:, 0], sin[:, 0]
        if self.degree == 1:
            return rotate(x, cos, sin)
        heads, replicated = PartitionSpec(None, self.model_axis, None), PartitionSpec()
        return jax.shard_map(
            rotate,
            mesh=self.mesh,
            in_specs=(heads, replicated, replicated),
            out_specs=heads,
            check_vma=False,
        )(x, cos, sin)

    def attention(self, q, k, v, kv_layer, md, *, scale, soft_cap=None, sliding_window=None):
        num_kv_heads = k.shape[1]

        def local(q, k, v, kv_pages, slots, md):
            if isinstance(kv_pages, QuantizedKVPool):
                update = update_quantized_pool_tpu
                if not self.interpret:
                    # Pinned to HBM: else XLA stages a layer's scale pool that fits VMEM (43 MB
                    # at Llama-3-8B on v5e-4) through VMEM around the update, a copy in and out.
                    # (In the kernel itself the pin breaks a standalone donated jit: XLA rejects
                    # aliasing a default-space parameter with a pinned output.)
                    scales = pltpu.with_memory_space_constraint(kv_pages.scales, pltpu.HBM)
                    kv_pages = QuantizedKVPool(kv_pages.codes, scales)
            else:
                update = update_kv_cache_tpu
            kv_pages = update(kv_pages, k, v, slots, interpret=self.interpret_params)
            out = ragged_paged_attention_tpu(
                q,
                kv_pages,
                md.kv_lens,
                md.block_tables,
                md.cu_q_lens,
                md.num_seqs,
                scale=scale,
                soft_cap=soft_cap,
                sliding_window=sliding_window,
                num_kv_heads=k.shape[1],
                interpret=self.interpret_params,
            )
            return out, kv_pages

        if self.degree == 1:
            return local(q, k, v, kv_layer, md.slot_mapping, md)
        if num_kv_heads < self.degree:  # every chip gets the KV head its query heads read
            k = jnp.repeat(k, self.degree // num_kv_heads, axis=1)
            v = jnp.repeat(v, self.degree // num_kv_heads, axis=1)
        heads = PartitionSpec(None, self.model_axis, None)
        replicated = PartitionSpec()
        return jax.shard_map(
            local,
            mesh=self.mesh,
            in_specs=(heads, heads, heads, self.kv_pool_spec(), replicated, replicated),
            out_specs=(heads, self.kv_pool_spec()),
            check_vma=False,
        )(q, k, v, kv_layer, md.slot_mapping, md)


def _row_major_embedding(params):
    """``params`` with a quantised embedding table as a ``QuantizedEmbeddingTable`` (a copy;
    other leaves shared)."""
    leaves = []
    for path, var in nnx.to_flat_state(params):
        if tuple(path) == ("embed_tokens", "embedding") and is_quantized(var.get_value()):
            var = var.replace(QuantizedEmbeddingTable.from_kernel(var.get_value()))
        leaves.append((path, var))
    return nnx.from_flat_state(leaves)


def _streamable(kernel) -> bool:
    """A plain 2-D float kernel (an array, or its ``ShapeDtypeStruct`` ahead of time)."""
    return (
        isinstance(kernel, (jax.Array, jax.ShapeDtypeStruct))
        and kernel.ndim == 2
        and kernel.dtype in (jnp.bfloat16, jnp.float32)
    )
