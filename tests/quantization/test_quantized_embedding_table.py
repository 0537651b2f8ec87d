"""The row-major quantised embedding table (the pallas-tpu backend's form of an untied quantised
embedding): its row lookup equals the ``[hidden, vocab]`` kernel's column lookup, exactly, and the
backend's prepared parameters use it without changing the loaded ones."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgen.backends.pallas_tpu import PallasTPUBackend
from jaxgen.config import ModelConfig
from jaxgen.models import LlamaForCausalLM
from jaxgen.quantization import QuantizationSpec, QuantizedWeight, quantize_kernel
from jaxgen.quantization.quantized_embedding_table import QuantizedEmbeddingTable

SPECS = [
    pytest.param(QuantizationSpec(kind="int8", group_size=32), id="int8-g32"),
    pytest.param(QuantizationSpec(kind="int4", group_size=32), id="int4-g32"),
    pytest.param(QuantizationSpec(kind="int4", group_size=32, asymmetric=True), id="int4-g32-min"),
    pytest.param(QuantizationSpec(kind="fp8"), id="fp8"),
]


@pytest.mark.parametrize("spec", SPECS)
def test_row_lookup_equals_the_kernels_column_lookup(spec):
    kernel = quantize_kernel(np.random.default_rng(0).normal(size=(64, 96)), spec)  # [D, V]
    table = QuantizedEmbeddingTable.from_kernel(kernel)
    assert table.shape == (96, 64) and table.values.shape[0] == 96
    ids = jnp.asarray([5, 0, 95, 5, 17], jnp.int32)
    np.testing.assert_array_equal(
        np.asarray(table.take_columns(ids)), np.asarray(kernel.take_columns(ids))
    )


@pytest.mark.parametrize("tied", [False, True])
def test_pallas_tpu_holds_an_untied_quantised_embedding_row_major(tied):
    """Untied: the step's embedding is the row-major table and looks up the same rows; the
    loaded parameters keep their ``[hidden, vocab]`` kernel. Tied: the kernel stays (the head
    reads it)."""
    config = ModelConfig.from_hf_dict(
        dict(
            model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=tied,
        )
    )  # fmt: skip
    graphdef, params = nnx.split(LlamaForCausalLM(config, rngs=nnx.Rngs(0)))
    embedding = params["embed_tokens"]["embedding"]
    spec = QuantizationSpec(kind="int4", group_size=32, asymmetric=True)
    embedding.set_value(quantize_kernel(np.asarray(embedding.get_value()).T, spec))
    step_params, head = PallasTPUBackend(interpret=True).prepare_params(params, config)
    step_table = step_params["embed_tokens"]["embedding"].get_value()
    assert isinstance(embedding.get_value(), QuantizedWeight)
    assert isinstance(step_table, QuantizedWeight if tied else QuantizedEmbeddingTable)
    assert (head is not None) == tied
    ids = jnp.asarray([3, 255, 0, 3], jnp.int32)
    loaded = nnx.merge(graphdef, params).embed_tokens(ids)
    stepped = nnx.merge(graphdef, step_params).embed_tokens(ids)
    np.testing.assert_array_equal(np.asarray(stepped), np.asarray(loaded))
