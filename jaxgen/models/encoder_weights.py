"""An encoder's parameters from its checkpoint: the model its config names (``BertModel`` or
``ModernBertModel``), each parameter read through that encoder's name mapping."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.families.checkpoint_names import TensorGetter
from jaxgen.models import bert_weights, modernbert_weights
from jaxgen.models.bert import BertModel
from jaxgen.models.modernbert import ModernBertModel
from jaxgen.models.weights import ShapeOnlyKeys

# ``EncoderConfig.encoder`` -> (its model, ``read(config, path, get) -> (tensor name, array)``).
ENCODER_MODELS = {
    "bert": (BertModel, bert_weights.read_parameter),
    "modernbert": (ModernBertModel, modernbert_weights.read_parameter),
}


def encoder_from_tensors(
    config: EncoderConfig, get_tensor: TensorGetter, *, dtype=jnp.float32
) -> tuple[nnx.GraphDef, nnx.State]:
    """The encoder's graph and parameters (on the default device), each read through
    ``get_tensor(name)``; a tensor of the wrong shape is a ``ValueError`` naming it."""
    model_class, read = ENCODER_MODELS[config.encoder]
    graphdef, abstract = nnx.split(model_class(config, dtype=dtype, rngs=ShapeOnlyKeys()))
    leaves, values = [], []
    for path, var in nnx.to_flat_state(abstract):
        name, array = read(config, path, get_tensor)
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
