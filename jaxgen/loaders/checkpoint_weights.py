"""New weights for a running engine, read from a checkpoint directory
(``LLM.update_weights_from_path``, the server's ``POST /update_weights_from_disk``): an HF
checkpoint's ``config.json`` and safetensors, or a directory ``jaxgen convert`` wrote (orbax).

The weights are read as the engine's model was loaded: in its dtype, and quantised as it was
(``quantization="int8"`` quantises the new float checkpoint again), without the tokenizer (a
trainer's checkpoint need not carry one). Safetensors arrays stay on the host, so the engine
puts each straight into its sharding in one transfer (``WeightLayout.place``), which also
checks them against the model before any is swapped in.
"""

from __future__ import annotations

import os

from jaxgen.config.loaded_model import LoadedModel
from jaxgen.loaders.hf_checkpoint import hf_tensor_getter, load_hf_config
from jaxgen.loaders.orbax_checkpoint import METADATA_FILE, read_orbax_params
from jaxgen.models.weights import params_from_hf_tensors


def read_checkpoint_weights(path, like: LoadedModel):
    """The parameter state (an ``nnx.State``) of the checkpoint directory ``path``, read in
    ``like``'s dtype and quantisation. ``ValueError`` for a path that is not such a directory
    or a checkpoint that cannot be read (a tensor missing, a shape that differs)."""
    if not isinstance(path, str) or not path:
        raise ValueError(f"model_path must be a checkpoint directory, got {path!r}")
    if not os.path.isdir(path):
        raise ValueError(
            f"model_path {path!r} is not a directory: weights are read from an HF checkpoint "
            "directory (config.json and safetensors) or a jaxgen convert (orbax) directory"
        )
    try:
        if os.path.isfile(os.path.join(path, METADATA_FILE)):
            return read_orbax_params(path, dtype=like.dtype)
        _, params = params_from_hf_tensors(
            load_hf_config(path),
            hf_tensor_getter(path),
            dtype=like.dtype,
            place=_on_host,
            quantization=like.quantization,
        )
    except FileNotFoundError as error:  # no config.json, no safetensors
        raise ValueError(str(error)) from None
    return params


def _on_host(path: tuple, array):
    """The loaders' ``place`` hook that leaves each converted array on the host."""
    return array
