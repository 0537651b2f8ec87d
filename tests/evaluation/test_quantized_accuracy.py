"""Accuracy of quantised weights: a GGUF kept quantised against the same file dequantised
(same numbers, different arithmetic order: max |Δlogit| <= 1e-3) on the default model, through
XLA and the native kernels (tiny files of every kept type: ``tests/loaders/
test_gguf_kept_models.py``); and int8 / int4 weights quantised at load against the float
model, teacher-forced over its greedy continuations."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxgen.evaluation.agreement import (
    PROMPTS,
    greedy_sequences,
    sequence_logits,
    teacher_forced_agreement,
)
from jaxgen.loaders import load_model

# The XLA path dequantises every weight per step: slow on the full model, so in the slow suite.
BACKENDS = [pytest.param("reference", marks=pytest.mark.slow)] + (
    ["cpu"] if jax.default_backend() == "cpu" else []
)


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
