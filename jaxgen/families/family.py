"""``ModelFamily``: everything one model family changes, declared once in that family's module.

A family is the ``model_type`` of a ``config.json`` and what differs for it: how its config
reads (``config_fields``), which decoder blocks it stacks (``blocks``: a kind
``jaxgen.models`` builds), how its checkpoint names its tensors (``read_parameter``,
``direct_name``), how its parameters split under tensor parallelism (``logical_axes``, added to
the rules every family shares in ``jaxgen.layers.sharding``), and how llama.cpp's converter
wrote it to GGUF (``gguf_*``). The defaults are the Llama family's; a new family states only
what it changes, and ``jaxgen.families.register_family`` makes it load."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxgen.families import gguf_names
from jaxgen.families.checkpoint_names import llama_direct_name, read_llama_named

LogicalAxes = tuple[tuple[str, tuple[str | None, ...]], ...]


def _always(gguf) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """One family (see the module docstring). ``config_fields(hf)`` -> ``ModelConfig`` fields;
    ``read_parameter(config, path, get)`` -> the array of a parameter path in our layout, from
    ``get(tensor name)``; ``direct_name(config, path)`` -> the one tensor that is exactly that
    parameter (a quantised checkpoint's tensor is kept as it is) or None; ``gguf_accepts(gguf)``
    picks between the families of one GGUF architecture; ``gguf_config(gguf)`` -> a
    ``config.json``-style dictionary; ``gguf_tensor_name(name, gguf_names)`` -> its HF name;
    ``gguf_expert_names(name, num_experts)`` -> the HF names of a stacked expert tensor's
    slices (None: not one); ``gguf_rows(gguf, name, rows)`` undoes a converter's row order;
    ``gguf_norm_offset`` is what the converter added to every norm weight."""

    model_type: str
    architectures: tuple[str, ...]  # config.json ``architectures`` that load as this family
    config_fields: Callable[[dict], dict]
    blocks: str = "llama"  # the decoder layer and final norm ``jaxgen.models`` builds
    read_parameter: Callable = read_llama_named
    direct_name: Callable = llama_direct_name
    logical_axes: LogicalAxes = ()
    mlp_projections: int = 3  # matrices of a dense MLP (gate, up, down), for parameter counts
    float16_stable: bool = True  # False: activations exceed float16's range (use float32)
    gguf_architecture: str | None = None  # ``general.architecture``; None: no GGUF form
    gguf_accepts: Callable = _always
    gguf_config: Callable | None = None  # default: gguf_names.gguf_config for model_type
    gguf_tensor_name: Callable = gguf_names.gguf_tensor_name
    gguf_expert_names: Callable | None = None
    gguf_rows: Callable | None = None
    gguf_norm_offset: float = 0.0

    def gguf_hf_config(self, gguf) -> dict:
        """The ``config.json``-style dictionary of a GGUF file of this family."""
        if self.gguf_config is None:
            return gguf_names.gguf_config(gguf, self.model_type)
        return self.gguf_config(gguf)
