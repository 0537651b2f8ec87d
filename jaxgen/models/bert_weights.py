"""A BERT-family checkpoint's tensors (transformers' names) to ``BertModel``'s parameters."""

from __future__ import annotations

import numpy as np

from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.families.checkpoint_names import LEAF, TensorGetter, torch_layout

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


def checkpoint_name(config: EncoderConfig, path: tuple) -> str:
    """The transformers tensor name of our parameter ``path``."""
    leaf = LEAF[path[-1]]
    if path[0] in HEAD_NAMES:
        return f"{HEAD_NAMES[path[0]]}.{leaf}"
    if path[0] == "layers":
        return f"{config.checkpoint_prefix}encoder.layer.{path[1]}.{LAYER_NAMES[path[2]]}.{leaf}"
    return f"{config.checkpoint_prefix}{BASE_NAMES[path[0]]}.{leaf}"


def read_parameter(config: EncoderConfig, path: tuple, get: TensorGetter) -> tuple[str, np.ndarray]:
    """The tensor parameter ``path`` comes from, and its array in our layout."""
    name = checkpoint_name(config, path)
    return name, torch_layout(path, np.asarray(get(name)))
