"""A BERT-family checkpoint's tensors (transformers' names) to ``BertModel``'s parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.families.checkpoint_names import TensorGetter, torch_layout
from jaxgen.models.bert import BertModel
from jaxgen.models.weights import ShapeOnlyKeys

# Our layer's module -> its transformers name under ``encoder.layer.N.``.
LAYER_NAMES = {
    "q_proj": "attention.self.query",
    "k_proj": "attention.self.key",
    "v_proj": "attention.self.value",
    "o_proj": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "up_proj": "intermediate.dense",
    "down_proj": "output.dense",
    "mlp_norm": "output.LayerNorm",
}
# Our top-level module -> its transformers name (the base model's, under the checkpoint prefix).
BASE_NAMES = {
    "embed_tokens": "embeddings.word_embeddings",
    "position_embeddings": "embeddings.position_embeddings",
    "token_type_embeddings": "embeddings.token_type_embeddings",
    "embed_norm": "embeddings.LayerNorm",
    "pooler": "pooler.dense",
}
# The classifier heads' tensors sit outside the base model's prefix.
HEAD_NAMES = {
    "classifier": "classifier",
    "classifier_dense": "classifier.dense",
    "classifier_out": "classifier.out_proj",
}
LEAF = {"kernel": "weight", "embedding": "weight", "weight": "weight", "bias": "bias"}


def checkpoint_name(config: EncoderConfig, path: tuple) -> str:
    """The transformers tensor name of our parameter ``path``."""
    leaf = LEAF[path[-1]]
    if path[0] in HEAD_NAMES:
        return f"{HEAD_NAMES[path[0]]}.{leaf}"
    if path[0] == "layers":
        return f"{config.checkpoint_prefix}encoder.layer.{path[1]}.{LAYER_NAMES[path[2]]}.{leaf}"
    return f"{config.checkpoint_prefix}{BASE_NAMES[path[0]]}.{leaf}"


def encoder_from_tensors(
    config: EncoderConfig, get_tensor: TensorGetter, *, dtype=jnp.float32
) -> tuple[nnx.GraphDef, nnx.State]:
    """The encoder's graph and parameters (on the default device), each read through
    ``get_tensor(name)``; a tensor of the wrong shape is a ``ValueError`` naming it."""
    graphdef, abstract = nnx.split(BertModel(config, dtype=dtype, rngs=ShapeOnlyKeys()))
    leaves, values = [], []
    for path, var in nnx.to_flat_state(abstract):
        name = checkpoint_name(config, path)
        array = torch_layout(path, np.asarray(get_tensor(name)))
        expected = tuple(var.get_value().shape)
        if tuple(array.shape) != expected:
            raise ValueError(f"tensor {name!r} has shape {array.shape}, expected {expected}")
        leaves.append((path, var))
        values.append(array.astype(jnp.dtype(dtype)))
    placed = jax.device_put(values)
    state = nnx.from_flat_state(
        [(path, var.replace(value)) for (path, var), value in zip(leaves, placed, strict=True)]
    )
    return graphdef, state
