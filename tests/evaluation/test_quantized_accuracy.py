"""Accuracy of quantised weights: a GGUF kept quantised against the same file dequantised
(same numbers, different arithmetic order: max |Δlogit| <= 1e-3) on the default model and on
tiny Q8_0 / Q4_0 / Q4_1 files, through XLA and the native kernels; and int8 / int4 weights
quantised at load against the float model, teacher-forced over its greedy continuations."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.config import ModelConfig
from jaxgen.evaluation.agreement import (
    PROMPTS,
    greedy_sequences,
    sequence_logits,
    teacher_forced_agreement,
)
from jaxgen.loaders import LoadedModel, load_model
from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.models.weights import params_from_hf_tensors

# The XLA path dequantises every weight per step: slow on the full model, so in the slow suite.
BACKENDS = [pytest.param("reference", marks=pytest.mark.slow)] + (
    ["cpu"] if jax.default_backend() == "cpu" else []
)
TINY_BACKENDS = ["reference"] + (["cpu"] if jax.default_backend() == "cpu" else [])


@pytest.fixture(scope="module")
def default_kept_and_float():
    return load_model(None, quantization="auto"), load_model(None, quantization="none")


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_model_kept_quantised_matches_dequantised(default_kept_and_float, backend):
    kept, dequantised = default_kept_and_float
    assert kept.quantization == "auto" and dequantised.quantization == "none"
    ids = kept.tokenizer.encode(
        "The three primary colours are red, yellow and", add_special_tokens=True
    )
    sequences = np.asarray([ids + [0] * (32 - len(ids))])
    delta = np.abs(
        sequence_logits(kept, sequences, backend=backend)
        - sequence_logits(dequantised, sequences, backend=backend)
    )
    assert delta.max() <= 1e-3, delta.max()


def _write_tiny_gguf(path: str, qtype_name: str, seed: int = 0) -> str:
    """A 2-layer llama GGUF (hidden 64, GQA 4/2, tied embedding) with its matrices in
    ``qtype_name`` and norms in F32; no tokenizer."""
    import gguf

    rng = np.random.default_rng(seed)
    hidden, ffn, vocab, heads, kv_heads, head_dim = 64, 128, 96, 4, 2, 16
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_context_length(256)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    qtype = gguf.GGMLQuantizationType[qtype_name]

    def matrix(name, rows, cols):
        data = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)

    def norm(name):
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    matrix("token_embd.weight", vocab, hidden)
    norm("output_norm.weight")
    for layer in range(2):
        prefix = f"blk.{layer}."
        norm(prefix + "attn_norm.weight")
        norm(prefix + "ffn_norm.weight")
        matrix(prefix + "attn_q.weight", heads * head_dim, hidden)
        matrix(prefix + "attn_k.weight", kv_heads * head_dim, hidden)
        matrix(prefix + "attn_v.weight", kv_heads * head_dim, hidden)
        matrix(prefix + "attn_output.weight", hidden, heads * head_dim)
        matrix(prefix + "ffn_gate.weight", ffn, hidden)
        matrix(prefix + "ffn_up.weight", ffn, hidden)
        matrix(prefix + "ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _load_tiny(path: str, quantization: str) -> LoadedModel:
    gguf_file = GGUFFile(path)
    config = ModelConfig.from_hf_dict(gguf_file.hf_config())
    graphdef, params = params_from_hf_tensors(
        config,
        gguf_file.get_tensor,
        quantization=quantization,
        get_quantized=gguf_file.get_quantized,
    )
    return LoadedModel(config, graphdef, params, None, path, jnp.float32, 0.0, quantization)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("backend", TINY_BACKENDS)
def test_tiny_gguf_kept_quantised_matches_dequantised(tmp_path, qtype, backend):
    path = _write_tiny_gguf(str(tmp_path / f"tiny-{qtype}.gguf"), qtype)
    kept, dequantised = _load_tiny(path, "auto"), _load_tiny(path, "none")
    kinds = {type(leaf).__name__ for leaf in jax.tree.leaves(kept.params, is_leaf=_is_quantized)}
    assert "QuantizedWeight" in kinds
    sequences = np.random.default_rng(1).integers(0, 96, (3, 40))
    delta = np.abs(
        sequence_logits(kept, sequences, backend=backend)
        - sequence_logits(dequantised, sequences, backend=backend)
    )
    assert delta.max() <= 1e-3, delta.max()


def _is_quantized(leaf) -> bool:
    return type(leaf).__name__ == "QuantizedWeight"


@pytest.fixture(scope="module")
def float_model_sequences():
    from jaxgen import LLM

    llm = LLM(None, quantization="none", max_model_len=256, kv_cache_memory=128 << 20)
    return llm.loaded, llm


@pytest.mark.slow
# w8a8: no bar in the issue; 0.966 measured (cpu kernels) at the commit that added it. w4a8
# (the GGUF's Q4_1 / Q8_0 kept, int8 activations): 0.969 at the commit that added it.
@pytest.mark.parametrize(
    "kind, threshold", [("int8", 0.98), ("int4", 0.90), ("w8a8", 0.95), ("w4a8", 0.95)]
)
def test_quantised_at_load_agrees_with_float(float_model_sequences, kind, threshold):
    reference, llm = float_model_sequences
    sequences, first = greedy_sequences(llm, PROMPTS, 64)
    candidate = load_model(None, quantization=kind)
    result = teacher_forced_agreement(reference, candidate, sequences, first)
    print(kind, result)
    assert result.tokens == 32 * 64 and result.top1 >= threshold, result


KV_BACKENDS = ["reference"] + (["cpu"] if jax.default_backend() == "cpu" else [])


@pytest.mark.slow
@pytest.mark.parametrize("backend", KV_BACKENDS)
@pytest.mark.parametrize("kv_cache_dtype, threshold", [("int8", 0.98), ("fp8", 0.95)])
def test_8bit_kv_pool_agrees_with_float_pool(
    float_model_sequences, kv_cache_dtype, threshold, backend
):
    reference, llm = float_model_sequences
    sequences, first = greedy_sequences(llm, PROMPTS, 64)
    result = teacher_forced_agreement(
        reference,
        reference,
        sequences,
        first,
        backend=backend,
        candidate_kv_cache_dtype=kv_cache_dtype,
    )
    print(kv_cache_dtype, backend, result)
    assert result.tokens == 32 * 64 and result.top1 >= threshold, result


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the native CPU kernels")
@pytest.mark.parametrize(
    "kv_cache_dtype, threshold",
    [
        pytest.param("int8", 0.98, marks=pytest.mark.slow),
        pytest.param("fp8", 0.95, marks=pytest.mark.slow),
    ],
)
def test_native_8bit_kv_pool_agrees_with_float_pool(
    float_model_sequences, kv_cache_dtype, threshold
):
    """The native CPU kernel reading the 8-bit pool (8 prompts x 32 tokens; the full 32 x 64
    run is the slow test above)."""
    reference, llm = float_model_sequences
    sequences, first = greedy_sequences(llm, PROMPTS[:8], 32)
    result = teacher_forced_agreement(
        reference,
        reference,
        sequences,
        first,
        backend="cpu",
        candidate_kv_cache_dtype=kv_cache_dtype,
    )
    print(kv_cache_dtype, result)
    assert result.tokens == 8 * 32 and result.top1 >= threshold, result
