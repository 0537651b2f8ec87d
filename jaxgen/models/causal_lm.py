"""The decoder stack every family shares: embeddings, the family's decoder layers, final norm,
LM head.

Flax NNX; it knows nothing about batching strategy or parallelism: it takes a flat batch of
tokens, their positions, the per-layer KV pages and the step's attention metadata, and returns
hidden states plus the updated pages. What a family's blocks change lives in a block module
(``llama.py``, ``gemma.py``, ``falcon.py``, ``moe.py``); this module picks one by the family's
``blocks`` (:data:`BLOCKS`; the family itself is declared in ``jaxgen.families``) and applies
the few stack-level differences: Gemma's scaled embeddings and final-logit soft cap,
LongRoPE's long/short choice, Gemma 3's local RoPE base on sliding layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.families import family_of
from jaxgen.layers.attention import AttentionMetadata, row_sequences
from jaxgen.layers.linear import Linear, embedding_table, matmul
from jaxgen.layers.rope import rope_angles, rope_buffers
from jaxgen.models.falcon import FalconDecoderLayer, LayerNorm
from jaxgen.models.gemma import GemmaDecoderLayer, GemmaRMSNorm
from jaxgen.models.llama import DecoderLayer, RMSNorm

KVCache = list  # per layer: that layer's pool in the backend's layout

# A family's ``blocks`` (jaxgen.families) -> (decoder layer, final norm).
BLOCKS = {
    "llama": (DecoderLayer, RMSNorm),
    "gemma": (GemmaDecoderLayer, GemmaRMSNorm),
    "falcon": (FalconDecoderLayer, LayerNorm),
}


class CausalLM(nnx.Module):
    """Decoder stack plus LM head (tied to the embedding when the config says so)."""

    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
        blocks = family_of(config.model_type).blocks  # ValueError for an unknown family
        layer_class, norm_class = BLOCKS[blocks]
        self.config = config
        self.embed_tokens = embedding_table(
            config.vocab_size, config.hidden_size, dtype=dtype, rngs=rngs
        )
        self.layers = nnx.List(
            [layer_class(config, i, dtype=dtype, rngs=rngs) for i in range(config.num_layers)]
        )
        self.norm = norm_class(config.hidden_size, config.rms_norm_eps, dtype=dtype, rngs=rngs)
        if not config.tie_word_embeddings:
            self.lm_head = Linear(
                config.hidden_size, config.vocab_size, bias=False, dtype=dtype, rngs=rngs
            )
        # Gemma scales embeddings by sqrt(hidden), rounded to the model's dtype as HF does.
        self.embed_scale = config.hidden_size**0.5 if blocks == "gemma" else None
        # inv_freq, and LongRoPE's long_inv_freq / Gemma 3's local_inv_freq when configured.
        for name, table in rope_buffers(config).items():
            setattr(self, name, nnx.Variable(jnp.asarray(table)))

    def rotations(self, positions: jax.Array, md: AttentionMetadata):
        """The step's RoPE cos/sin: the global one, and Gemma 3's local one (or None)."""
        scaling = self.config.rope_scaling
        inv_freq = self.inv_freq[...]
        if hasattr(self, "long_inv_freq"):
            # LongRoPE, as transformers: a sequence longer than the original context rotates
            # with the long factors (the engine says which, and recomputes a sequence that
            # crosses the boundary, so its cached keys are rotated alike).
            seq, _, _ = row_sequences(md, positions.shape[0])
            if md.long_rope is None:
                long = md.kv_lens[seq] > scaling.original_max_position_embeddings  # [T]
            else:
                long = md.long_rope[seq]  # [T]
            inv_freq = jnp.where(long[:, None], self.long_inv_freq[...][None], inv_freq[None])
        rope = rope_angles(positions, inv_freq, scaling.attention_factor)
        local = None
        if hasattr(self, "local_inv_freq"):
            local = rope_angles(positions, self.local_inv_freq[...])
        return rope, local

    def __call__(
        self,
        token_ids: jax.Array,  # [T]
        positions: jax.Array,  # [T]
        kv_cache: KVCache,
        md: AttentionMetadata,
        *,
        backend,  # a jaxgen.backends.KernelBackend
    ) -> tuple[jax.Array, KVCache]:  # hidden [T, D], updated pages
        """Runs the decoder stack (layers unrolled: faster than a scan on XLA CPU)."""
        x = self.embed_tokens(token_ids)
        if self.embed_scale is not None:
            x = x * jnp.asarray(self.embed_scale, x.dtype)
        rope, local = self.rotations(positions, md)  # traced once; XLA may recompute per layer
        new_cache = []
        for i, (layer, kv_layer) in enumerate(zip(self.layers, kv_cache, strict=True)):
            layer_rope = (
                local if local is not None and self.config.layer_sliding_window(i) else rope
            )
            x, kv_layer = layer(x, layer_rope, kv_layer, md, backend)
            new_cache.append(kv_layer)
        return self.norm(x), new_cache

    def compute_logits(
        self,
        hidden: jax.Array,
        *,
        head_kernel=None,
        live_rows: jax.Array | None = None,
    ) -> jax.Array:  # [N, D] -> [N, V] float32
        """LM head; ``head_kernel``: a [D, V] kernel to use instead, in any form ``Linear`` takes
        (the backend's prepared tied embedding, see ``KernelBackend.prepare_params``);
        ``live_rows``: the rows that are not padding (see ``Linear``)."""
        if head_kernel is not None:
            logits = matmul(hidden, head_kernel, live_rows)
        elif self.config.tie_word_embeddings:
            logits = self.embed_tokens.attend(hidden)
        else:
            logits = self.lm_head(hidden, live_rows)
        logits = logits.astype(jnp.float32)
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = cap * jnp.tanh(logits / cap)
        return logits
