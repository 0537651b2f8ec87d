"""What the mixture-of-experts families share: a router and per-expert projections stacked at
load (``[E, in, out]``), their sharding axes, and GGUF's stacked expert tensors split back into
the per-expert HF names. Mixtral and Qwen-MoE differ only in the names (``block``, ``names``)."""

from __future__ import annotations

import numpy as np

from jaxgen.families.checkpoint_names import hf_name, read_llama_named

# Our expert parameter -> its position in a family's ``names`` (gate, up, down).
_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# GGUF's stacked expert tensors [E, out, in], in the same order.
GGUF_EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")

EXPERT_AXES = (
    (r"layers\.\d+\.mlp\.router\.kernel", ("embed", None)),
    (r"layers\.\d+\.mlp\.experts\.(gate|up)_proj", ("expert", "embed", "expert_mlp")),
    (r"layers\.\d+\.mlp\.experts\.down_proj", ("expert", "expert_mlp", "embed")),
    (r"layers\.\d+\.mlp\.shared_expert\.(gate|up)_proj\.kernel", ("embed", "mlp")),
    (r"layers\.\d+\.mlp\.shared_expert\.down_proj\.kernel", ("mlp", "embed")),
    (r"layers\.\d+\.mlp\.shared_expert_gate\.kernel", ("embed", None)),
)


def is_expert_path(path: tuple) -> bool:
    """The router's or a stacked expert projection's parameter path."""
    return len(path) > 3 and path[2] == "mlp" and path[3] in ("router", "experts")


class ExpertNames:
    """A family's expert tensor names: ``block`` holds the router (``gate``) and
    ``experts.{e}.{name}``, ``names`` the (gate, up, down) projections' names."""

    def __init__(self, block: str, names: tuple[str, str, str]):
        self.block, self.names = block, names

    def read_parameter(self, config, path: tuple, get) -> np.ndarray:
        if not is_expert_path(path):
            return read_llama_named(config, path, get)
        prefix = f"model.layers.{path[1]}.{self.block}"
        if path[3] == "router":
            return np.asarray(get(f"{prefix}.gate.weight")).T
        name = self.names[_PROJECTIONS.index(path[4])]
        return np.stack(
            [
                np.asarray(get(f"{prefix}.experts.{e}.{name}.weight")).T
                for e in range(config.moe.num_experts)
            ]
        )

    def direct_name(self, config, path: tuple) -> str | None:
        return None if is_expert_path(path) else hf_name(path)

    def gguf_expert_names(self, name: str, num_experts: int) -> list[str] | None:
        """The HF names of the experts a stacked GGUF tensor holds, in order (None for any
        other tensor)."""
        parts = name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in GGUF_EXPERT_TENSORS:
            return None
        proj = self.names[GGUF_EXPERT_TENSORS.index(parts[2])]
        return [
            f"model.layers.{parts[1]}.{self.block}.experts.{expert}.{proj}.weight"
            for expert in range(num_experts)
        ]
