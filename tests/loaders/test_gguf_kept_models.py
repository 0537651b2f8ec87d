"""A tiny model written to a GGUF in each kept quantisation type computes what the same file
dequantised to float32 computes (``quantization="auto"`` against ``"none"``): the greedy token
at every step of the float model's greedy continuation, and every log-probability within 1e-3,
through XLA's reference path and the native CPU kernels; and the types kept as bit planes
(2-, 3-, 5- and 6-bit codes) compute what their codes widened to int8 / int4 did."""

from __future__ import annotations

import dataclasses

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxgen.config import ModelConfig
from jaxgen.evaluation.agreement import sequence_logits
from jaxgen.loaders import LoadedModel
from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.models.weights import params_from_hf_tensors
from jaxgen.quantization import is_quantized
from jaxgen.quantization.bit_planes import PLANE_KINDS, widen
from tests.gguf_quant_blocks import KEPT_GGUF_TYPES, random_gguf_tensor

BACKENDS = ["reference"] + (["cpu"] if jax.default_backend() == "cpu" else [])
HIDDEN, FFN, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 256, 512, 96, 4, 2, 64  # K-quants: 256-blocks


def write_tiny_gguf(path: str, qtype: str, seed: int = 0) -> str:
    """A 2-layer llama GGUF (GQA 4/2, tied embedding) with every matrix in ``qtype``."""
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_context_length(256)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(VOCAB)
    raw = gguf.GGMLQuantizationType[qtype]

    def matrix(name, rows, cols, magnitude=0.05):
        data = random_gguf_tensor(qtype, rows, cols, rng, magnitude)
        writer.add_tensor(name, data, raw_dtype=raw)

    def norm(name):
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))

    matrix("token_embd.weight", VOCAB, HIDDEN, 1.0)
    norm("output_norm.weight")
    for layer in range(2):
        prefix = f"blk.{layer}."
        norm(prefix + "attn_norm.weight")
        norm(prefix + "ffn_norm.weight")
        matrix(prefix + "attn_q.weight", HEADS * HEAD_DIM, HIDDEN)
        matrix(prefix + "attn_k.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(prefix + "attn_v.weight", KV_HEADS * HEAD_DIM, HIDDEN)
        matrix(prefix + "attn_output.weight", HIDDEN, HEADS * HEAD_DIM)
        matrix(prefix + "ffn_gate.weight", FFN, HIDDEN)
        matrix(prefix + "ffn_up.weight", FFN, HIDDEN)
        matrix(prefix + "ffn_down.weight", HIDDEN, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def load_tiny(path: str, quantization: str) -> LoadedModel:
    gguf_file = GGUFFile(path)
    config = ModelConfig.from_hf_dict(gguf_file.hf_config())
    graphdef, params = params_from_hf_tensors(
        config,
        gguf_file.get_tensor,
        quantization=quantization,
        get_quantized=gguf_file.get_quantized,
    )
    return LoadedModel(config, graphdef, params, None, path, jnp.float32, 0.0, quantization)


def greedy(loaded, prompts: np.ndarray, steps: int, backend: str) -> np.ndarray:
    """``prompts`` [S, P] continued greedily by ``steps`` tokens, as [S, P + steps] (the padded
    length is fixed, so one compiled prefill serves every step: causal attention never reads
    the padding after a position)."""
    sequences = np.concatenate([prompts, np.zeros((len(prompts), steps), prompts.dtype)], 1)
    for step in range(steps):
        at = prompts.shape[1] + step
        logits = sequence_logits(loaded, sequences, backend=backend)
        sequences[:, at] = logits[:, at - 1].argmax(-1)
    return sequences


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


@pytest.mark.parametrize("qtype", KEPT_GGUF_TYPES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_kept_model_is_its_dequantised_self(tmp_path, qtype, backend):
    path = write_tiny_gguf(str(tmp_path / f"tiny-{qtype}.gguf"), qtype)
    kept, dequantised = load_tiny(path, "auto"), load_tiny(path, "none")
    kept_kernels = [
        leaf for leaf in jax.tree.leaves(kept.params, is_leaf=is_quantized) if is_quantized(leaf)
    ]
    assert len(kept_kernels) == 1 + 2 * 7  # the tied embedding and every layer's matrices
    prompts = np.random.default_rng(1).integers(0, VOCAB, (3, 8))
    sequences = greedy(dequantised, prompts, 8, backend)
    logprobs = _log_softmax(sequence_logits(kept, sequences, backend=backend))
    reference = _log_softmax(sequence_logits(dequantised, sequences, backend=backend))
    delta = np.abs(logprobs - reference)[:, 7:-1]  # the greedy steps' positions
    print(f"{qtype} {backend}: max |delta logprob| {delta.max():.2e}")
    assert delta.max() <= 1e-3, delta.max()
    np.testing.assert_array_equal(logprobs[:, 7:-1].argmax(-1), sequences[:, 8:])


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_bit_planes_compute_what_widened_codes_did(tmp_path, qtype, backend):
    """The kept planes against the same weights widened to int8 / int4 codes (``widen``: the
    layout these types were kept in before): the same logits, so the same greedy tokens, at
    under 80% of the widened parameter bytes."""
    path = write_tiny_gguf(str(tmp_path / f"tiny-{qtype}.gguf"), qtype)
    kept = load_tiny(path, "auto")
    kinds = {leaf.kind for leaf in jax.tree.leaves(kept.params, is_leaf=is_quantized)
             if is_quantized(leaf)}  # fmt: skip
    assert kinds <= set(PLANE_KINDS) and kinds
    params = jax.tree.map(
        lambda leaf: widen(leaf) if is_quantized(leaf) else leaf, kept.params, is_leaf=is_quantized
    )
    widened = dataclasses.replace(kept, params=params)
    nbytes = [sum(leaf.nbytes for leaf in jax.tree.leaves(m.params)) for m in (kept, widened)]
    assert nbytes[0] < 0.8 * nbytes[1], nbytes
    prompts = np.random.default_rng(2).integers(0, VOCAB, (2, 8))
    sequences = greedy(widened, prompts, 6, backend)
    np.testing.assert_array_equal(greedy(kept, prompts, 6, backend), sequences)
    logits = sequence_logits(kept, sequences, backend=backend)
    np.testing.assert_allclose(logits, sequence_logits(widened, sequences, backend=backend),
                               rtol=0, atol=1e-6)  # fmt: skip
