"""A ModernBERT checkpoint's tensors (transformers' names) to ``ModernBertModel``'s parameters:
the fused ``attn.Wqkv`` split into thirds (q, k, v) and ``mlp.Wi`` into halves (the GeGLU's
activated input, our ``gate_proj``, then its gate, our ``up_proj``)."""

from __future__ import annotations

import numpy as np

from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.families.checkpoint_names import LEAF, TensorGetter, torch_layout

# Our layer's module -> (its transformers tensor under ``layers.N.``, (which part, of how many
# equal row blocks) or None: the whole tensor).
LAYER_NAMES = {
    "attention_norm": ("attn_norm", None),
    "q_proj": ("attn.Wqkv", (0, 3)),
    "k_proj": ("attn.Wqkv", (1, 3)),
    "v_proj": ("attn.Wqkv", (2, 3)),
    "o_proj": ("attn.Wo", None),
    "mlp_norm": ("mlp_norm", None),
    "mlp.gate_proj": ("mlp.Wi", (0, 2)),
    "mlp.up_proj": ("mlp.Wi", (1, 2)),
    "mlp.down_proj": ("mlp.Wo", None),
}
# Our top-level module -> its transformers name (the base model's, under the checkpoint prefix).
BASE_NAMES = {
    "embed_tokens": "embeddings.tok_embeddings",
    "embed_norm": "embeddings.norm",
    "final_norm": "final_norm",
}
# The classifier head's tensors sit outside the base model's prefix.
HEAD_NAMES = {"head_dense": "head.dense", "head_norm": "head.norm", "classifier": "classifier"}


def read_parameter(config: EncoderConfig, path: tuple, get: TensorGetter) -> tuple[str, np.ndarray]:
    """The tensor parameter ``path`` comes from, and its array (rows) in our layout."""
    leaf, part = LEAF[path[-1]], None
    if path[0] in HEAD_NAMES:
        name = f"{HEAD_NAMES[path[0]]}.{leaf}"
    elif path[0] == "layers":
        module, part = LAYER_NAMES[".".join(str(p) for p in path[2:-1])]
        name = f"{config.checkpoint_prefix}layers.{path[1]}.{module}.{leaf}"
    else:
        name = f"{config.checkpoint_prefix}{BASE_NAMES[path[0]]}.{leaf}"
    array = np.asarray(get(name))
    if part is not None:
        index, parts = part
        array = np.split(array, parts, axis=0)[index]
    return name, torch_layout(path, array)
