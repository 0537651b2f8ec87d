"""GGUF files (llama.cpp's format): config, tensors, tokenizer (read by ``gguf_reader``; the
``gguf`` package dequantises).

Tensors come out under Hugging Face names, with what llama.cpp's converter changes undone: for
``llama`` it permutes Q and K rows into an interleaved rotary layout (we restore rotate-half, for
quantised tensors on their codes and scales alike); for Falcon it reorders the fused QKV rows
from per-KV-head groups to all queries, all keys, all values (we restore the groups); for Gemma
it stores every norm weight plus one (we subtract it); and it renames tensors per architecture
(``jaxgen.loaders.gguf_names`` maps them back).

``get_tensor`` dequantises any tensor to float32 (``quantization="none"``). ``get_quantized``
keeps a quantised 2-D tensor quantised, as a ``QuantizedWeight`` in kernel orientation
``[in, out]`` whose dequantisation is the file's, bit for bit: every kept type (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) is integer codes times a scale
(plus a minimum) per group of 16 or 32 weights (``jaxgen.loaders.gguf_blocks`` has the table):
int8 or int4 codes, float16 scales where the file's are float16, float32 where they are a
float16 super-block scale times a 6-bit sub-block scale (exact in float32, not in float16).
Memory is therefore above the file's bytes for the K-quants and IQ4 types (Q4_K: 6 bits a
weight against the file's 4.5). Stacked expert tensors are dequantised to float32 (exact, 32
bits a weight). A file holding any other type (IQ2_XXS, IQ3_S, TQ1_0, Q8_1, ...) is a
``ValueError`` naming the type and the tensor when it is opened, before any tensor is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from jaxgen.loaders.gguf_blocks import KEPT_TYPES, decode_blocks
from jaxgen.loaders.gguf_names import (
    GEMMA_ARCHITECTURES,
    SUPPORTED_GGUF_ARCHITECTURES,
    expert_tensor_names,
    hf_tensor_name,
)
from jaxgen.loaders.gguf_reader import GGUFReader
from jaxgen.loaders.gguf_weights_cache import GGUFWeightsCache
from jaxgen.quantization import QuantizedWeight, pack_int4

FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_QUANT_TYPES = (*FLOAT_TYPES, *KEPT_TYPES)  # KEPT_TYPES: kept exactly by get_quantized
# Gemma-2/3 27B: llama.cpp scales queries by hidden / heads instead of head_dim (its model-size
# rule, since GGUF has no query_pre_attn_scalar); keyed by (architecture, block count).
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


class GGUFFile:
    """An opened GGUF file: metadata fields and lazily dequantised tensors under HF names."""

    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file not found: {path!r}")
        try:
            self.reader = GGUFReader(path)
        except Exception as e:
            raise ValueError(
                f"cannot read GGUF file {path!r} (truncated or corrupt?): {e}"
            ) from None
        self.path = path
        self.architecture = self.field("general.architecture")
        if self.architecture not in SUPPORTED_GGUF_ARCHITECTURES:
            raise ValueError(
                f"unsupported GGUF architecture {self.architecture!r}; supported: "
                f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}"
            )
        _check_tensor_types(self.reader.tensors, path)
        self.tensors = {}  # HF name -> (GGUF tensor, expert index or None)
        self._gguf_names = {tensor.name for tensor in self.reader.tensors}
        for tensor in self.reader.tensors:
            # ggml order: the experts are the outermost axis, listed last.
            experts = expert_tensor_names(tensor.name, self.architecture, int(tensor.shape[-1]))
            if experts is not None:
                for expert, name in enumerate(experts):
                    self.tensors[name] = (tensor, expert)
                continue
            name = hf_tensor_name(tensor.name, self.architecture, self._gguf_names)
            self.tensors[name] = (tensor, None)
        self._stacked_cache: tuple[str, np.ndarray] | None = None
        self.weights_cache: GGUFWeightsCache | None = None  # opened at the first get_quantized

    def field(self, key: str, default=None):
        return self.reader.fields.get(key, default)

    def hf_config(self) -> dict:
        """A HF ``config.json``-style dictionary from the GGUF metadata."""
        arch = self.architecture
        if arch == "falcon":
            return self._falcon_config()
        get = lambda k, d=None: self.field(f"{arch}.{k}", d)  # noqa: E731
        num_heads = get("attention.head_count")
        hidden = get("embedding_length")
        vocab = get("vocab_size") or len(self.field("tokenizer.ggml.tokens", []))
        config = {
            "model_type": SUPPORTED_GGUF_ARCHITECTURES[arch],
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": get("feed_forward_length"),
            "num_hidden_layers": get("block_count"),
            "num_attention_heads": num_heads,
            "num_key_value_heads": get("attention.head_count_kv", num_heads),
            "head_dim": get("attention.key_length")
            or get("rope.dimension_count")
            or hidden // num_heads,
            "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-5),
            "rope_theta": get("rope.freq_base", 10000.0),
            "max_position_embeddings": get("context_length", 4096),
            "tie_word_embeddings": "lm_head.weight" not in self.tensors,
            "bos_token_id": self.field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.field("tokenizer.ggml.eos_token_id"),
        }
        scaling_type = get("rope.scaling.type")
        if scaling_type == "linear":
            config["rope_scaling"] = {
                "rope_type": "linear",
                "factor": get("rope.scaling.factor", 1.0),
            }
        sliding = get("attention.sliding_window")
        if sliding:
            config["sliding_window"] = sliding
        if arch == "llama" and any(n.endswith("q_proj.bias") for n in self.tensors):
            config["attention_bias"] = True
        if arch in GEMMA_ARCHITECTURES:
            config.update(self._gemma_config(config))
        if arch == "phi3":
            config.update(self._longrope_config(config))
        if arch == "llama" and get("expert_count"):
            config.update(
                model_type="mixtral",
                num_local_experts=get("expert_count"),
                num_experts_per_tok=get("expert_used_count"),
            )
        if arch == "qwen3moe":
            config.update(
                num_experts=get("expert_count"),
                num_experts_per_tok=get("expert_used_count"),
                moe_intermediate_size=get("expert_feed_forward_length"),
                norm_topk_prob=bool(get("expert_weights_norm", True)),  # llama.cpp's default
            )
        return config

    def _falcon_config(self) -> dict:
        """Falcon's ``config.json`` fields. llama.cpp runs every Falcon as parallel attention
        and MLP without linear biases: 7B's multi-query layout, or 40B's grouped KV heads
        (``new_decoder_architecture``) with a second LayerNorm when ``attn_norm_2`` exists. The
        converter writes ``4 * hidden`` as the MLP width whatever the checkpoint's, so the width
        is read from ``ffn_up``'s shape."""
        get = lambda k, d=None: self.field(f"falcon.{k}", d)  # noqa: E731
        num_heads = get("attention.head_count")
        num_kv_heads = get("attention.head_count_kv", 1)
        two_norms = "transformer.h.0.ln_attn.weight" in self.tensors
        up = self.tensors["transformer.h.0.mlp.dense_h_to_4h.weight"][0]
        return {
            "model_type": "falcon",
            "vocab_size": get("vocab_size") or len(self.field("tokenizer.ggml.tokens", [])),
            "hidden_size": get("embedding_length"),
            "ffn_hidden_size": int(up.shape[-1]),  # ggml order: [in, out]
            "num_hidden_layers": get("block_count"),
            "num_attention_heads": num_heads,
            "num_kv_heads": num_kv_heads,
            "multi_query": num_kv_heads == 1,
            "new_decoder_architecture": num_kv_heads > 1 or two_norms,
            "num_ln_in_parallel_attn": 2 if two_norms else 1,
            "parallel_attn": True,
            "alibi": False,
            "bias": "transformer.h.0.self_attention.query_key_value.bias" in self.tensors,
            "layer_norm_epsilon": get("attention.layer_norm_epsilon", 1e-5),
            "rope_theta": get("rope.freq_base", 10000.0),
            "max_position_embeddings": get("context_length", 2048),
            "tie_word_embeddings": "lm_head.weight" not in self.tensors,
            "bos_token_id": self.field("tokenizer.ggml.bos_token_id"),
            "eos_token_id": self.field("tokenizer.ggml.eos_token_id"),
        }

    def _longrope_config(self, config: dict) -> dict:
        """Phi-3's LongRoPE factors (stored as tensors) and original context."""
        if "rope_factors_long.weight" not in self.tensors:
            return {}
        get = lambda k, d=None: self.field(f"phi3.{k}", d)  # noqa: E731
        original = get("rope.scaling.original_context_length")
        return {
            "rope_scaling": {
                "rope_type": "longrope",
                "long_factor": self.get_tensor("rope_factors_long.weight").tolist(),
                "short_factor": self.get_tensor("rope_factors_short.weight").tolist(),
                "original_max_position_embeddings": original,
                "attention_factor": get("rope.scaling.attn_factor"),
            },
            "original_max_position_embeddings": original,
        }

    def _gemma_config(self, config: dict) -> dict:
        """Gemma 2/3 fields: soft caps, sliding layers, query scale, local RoPE base."""
        arch = self.architecture
        get = lambda k, d=None: self.field(f"{arch}.{k}", d)  # noqa: E731
        layers = config["num_hidden_layers"]
        pattern = get("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
        if isinstance(pattern, int):
            sliding = [bool((i + 1) % pattern) for i in range(layers)]
        else:
            sliding = [bool(x) for x in pattern]
        scalar = config["head_dim"]
        if layers == _GEMMA_27B_LAYERS[arch]:
            scalar = config["hidden_size"] // config["num_attention_heads"]
        out = {
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": scalar,
            "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
            "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        }
        if arch == "gemma2":
            out["attn_logit_softcapping"] = get("attn_logit_softcapping")
            out["final_logit_softcapping"] = get("final_logit_softcapping")
        else:
            out["rope_local_base_freq"] = (
                10000.0  # llama.cpp's fixed base of Gemma 3's local layers
            )
        return out

    def get_tensor(self, name: str) -> np.ndarray:
        """Dequantised float32 tensor in HF layout (``[out, in]`` for linear weights)."""
        import gguf

        if name not in self.tensors:
            raise ValueError(f"GGUF file {self.path!r} has no tensor for {name!r}")
        tensor, expert = self.tensors[name]
        if expert is not None:
            return self._stacked(tensor)[expert]
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml order is innermost first
        array = self._unpermute(name, np.asarray(data, dtype=np.float32).reshape(shape))
        if self.architecture in GEMMA_ARCHITECTURES and name.endswith("norm.weight"):
            array = array - 1.0  # the converter stores Gemma's (1 + weight) norm scale
        return array

    def tensor_type(self, name: str) -> str:
        """The GGUF type name (``"Q4_1"``, ``"F32"``, ...) of HF tensor ``name``."""
        if name not in self.tensors:
            raise ValueError(f"GGUF file {self.path!r} has no tensor for {name!r}")
        return self.tensors[name][0].tensor_type.name

    def get_quantized(self, name: str) -> QuantizedWeight | None:
        """2-D tensor ``name`` as a ``QuantizedWeight`` ``[in, out]`` (see the module docstring),
        or None for a float tensor. Read from the file's ``GGUFWeightsCache`` when it holds the
        tensor (memory-mapped, no unpacking), else converted and recorded for ``save_cache``."""
        qtype = self.tensor_type(name)
        if qtype in FLOAT_TYPES or self.tensors[name][1] is not None:  # float, or one expert
            return None
        if self.weights_cache is None:
            self.weights_cache = GGUFWeightsCache(self.path)
        weight = self.weights_cache.get(name)
        if weight is None:
            weight = self._convert_quantized(name, qtype)
            self.weights_cache.record(name, weight)
        return weight

    def save_cache(self) -> None:
        """Writes the converted quantised tensors to the weights cache (when any were)."""
        if self.weights_cache is not None:
            self.weights_cache.save()

    def _convert_quantized(self, name: str, qtype: str) -> QuantizedWeight:
        """The file's codes, scales and minimums of ``name`` (``gguf_blocks``), rows back in HF
        order, as a ``[in, out]`` weight."""
        tensor = self.tensors[name][0]
        rows, depth = (int(d) for d in reversed(tensor.shape))  # [out, in]
        decoded = decode_blocks(qtype, tensor.data, rows, depth)
        values = self._unpermute(name, decoded.codes).T  # [in, out]
        if decoded.kind == "int4":
            values = pack_int4(values)
        mins = None if decoded.mins is None else self._unpermute(name, decoded.mins).T
        return QuantizedWeight(
            np.ascontiguousarray(values),
            np.ascontiguousarray(self._unpermute(name, decoded.scales).T),
            None if mins is None else np.ascontiguousarray(mins),
            kind=decoded.kind,
            group_size=decoded.group_size,
            shape=(depth, rows),
        )

    def _unpermute(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Q/K projection rows (first axis) of a llama GGUF back in HF's rotary layout; Falcon's
        fused QKV rows back in HF's per-KV-head groups."""
        if self.architecture == "falcon" and "query_key_value" in name:
            heads = self.field("falcon.attention.head_count")
            return _falcon_grouped_qkv(rows, heads, self.field("falcon.attention.head_count_kv", 1))
        if self.architecture == "llama" and (
            name.endswith("q_proj.weight") or name.endswith("k_proj.weight")
        ):
            kv = name.endswith("k_proj.weight")
            heads = self.field(f"{self.architecture}.attention.head_count" + ("_kv" if kv else ""))
            return _unpermute_rotary(rows, heads)
        return rows

    def _stacked(self, tensor) -> np.ndarray:
        """A stacked expert tensor ``[E, out, in]``, dequantised once for its E reads."""
        if self._stacked_cache is None or self._stacked_cache[0] != tensor.name:
            whole = f"{tensor.name} (stacked)"
            self.tensors[whole] = (tensor, None)
            self._stacked_cache = (tensor.name, self.get_tensor(whole))
        return self._stacked_cache[1]

    def getter(self) -> Callable[[str], np.ndarray]:
        return self.get_tensor


def _check_tensor_types(tensors, path: str) -> None:
    """``ValueError`` naming the first tensor whose type jaxgen cannot load (before any is)."""
    for tensor in tensors:
        qtype = tensor.tensor_type.name
        if qtype not in SUPPORTED_QUANT_TYPES:
            raise ValueError(
                f"GGUF file {path!r}: tensor {tensor.name!r} has quantization type {qtype}, "
                f"which jaxgen does not load; supported: {', '.join(SUPPORTED_QUANT_TYPES)}"
            )


def _falcon_grouped_qkv(rows: np.ndarray, num_heads: int, num_kv_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Falcon QKV reorder: all query heads, all key heads, all value
    heads back to per KV head its group of query heads, one key head, one value head."""
    head_dim = rows.shape[0] // (num_heads + 2 * num_kv_heads)
    rest = rows.shape[1:]
    q_rows, k_rows = num_heads * head_dim, num_kv_heads * head_dim
    q = rows[:q_rows].reshape(num_kv_heads, num_heads // num_kv_heads, head_dim, *rest)
    k = rows[q_rows : q_rows + k_rows].reshape(num_kv_heads, 1, head_dim, *rest)
    v = rows[q_rows + k_rows :].reshape(num_kv_heads, 1, head_dim, *rest)
    return np.concatenate([q, k, v], axis=1).reshape(rows.shape)


def _unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's ``permute``: interleaved rotary pairs back to rotate-half halves."""
    rows = weight.shape[0]
    return (
        weight.reshape(num_heads, rows // num_heads // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )
