"""Tensor parallelism with ``jax.sharding``: a ("data", "model") mesh, one logical-axis rule table.

Every weight declares its logical axes once (``PARAM_LOGICAL_AXES``, by parameter path, and a
family's own parameters in its ``logical_axes``, ``jaxgen.families``); the rule
table (``LOGICAL_AXIS_RULES``) maps logical axes to mesh axes. Parameters are placed with
``NamedSharding`` as they load, through the loaders' ``place(path, array)`` hook, and the jitted
step then runs SPMD over whatever shardings its inputs carry: q/k/v/gate/up are column-parallel,
o/down row-parallel (XLA inserts the all-reduces), the embedding and LM head vocab-parallel, and
the KV pool is split over KV heads. The model itself knows nothing of this.

A degree that does not divide the query heads is a ``ValueError``. A degree that does not divide
the KV heads, the vocabulary or the MLP width replicates that axis instead (``ShardingPlan.notes``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxgen.config import ModelConfig
from jaxgen.families import family_logical_axes
from jaxgen.quantization.bit_planes import BLOCK_ROWS, PLANE_KINDS
from jaxgen.quantization.quantized_weight import QuantizedWeight, is_quantized


def path_name(path: Sequence) -> str:
    """``('layers', 0, 'mlp', 'up_proj', 'kernel')`` -> ``"layers.0.mlp.up_proj.kernel"``."""
    return ".".join(str(p) for p in path)


DATA_AXIS = "data"
MODEL_AXIS = "model"

# Logical axis -> mesh axis (None: replicated). The one table of rules.
LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
    ("vocab", MODEL_AXIS),
    ("embed", None),
    ("heads", MODEL_AXIS),
    ("kv_heads", MODEL_AXIS),
    ("mlp", MODEL_AXIS),
    # Mixture of experts: each expert split like an MLP (tensor parallel). Where the expert
    # width does not split but the expert count does, resolve_rules swaps these two (expert
    # parallel: whole experts per device).
    ("expert", None),
    ("expert_mlp", MODEL_AXIS),
)

# Parameter path (dotted, e.g. "layers.3.self_attn.q_proj.kernel") -> logical axes, one per dim.
# Kernels are [in, out]; q/k/v outputs are head-major, so splitting them splits whole heads.
PARAM_LOGICAL_AXES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r"embed_tokens\.embedding", ("vocab", "embed")),
    (r"lm_head\.kernel", ("embed", "vocab")),
    (r"lm_head\.bias", ("vocab",)),
    (r"layers\.\d+\.self_attn\.q_proj\.kernel", ("embed", "heads")),
    (r"layers\.\d+\.self_attn\.q_proj\.bias", ("heads",)),
    (r"layers\.\d+\.self_attn\.[kv]_proj\.kernel", ("embed", "kv_heads")),
    (r"layers\.\d+\.self_attn\.[kv]_proj\.bias", ("kv_heads",)),
    (r"layers\.\d+\.self_attn\.o_proj\.kernel", ("heads", "embed")),
    (r"layers\.\d+\.mlp\.(gate|up)_proj\.kernel", ("embed", "mlp")),
    (r"layers\.\d+\.mlp\.(gate|up)_proj\.bias", ("mlp",)),
    (r"layers\.\d+\.mlp\.down_proj\.kernel", ("mlp", "embed")),
    (r"layers\.\d+\.(self_attn\.o_proj|mlp\.down_proj)\.bias", ("embed",)),
    # The norms (LayerNorms have a bias too); a family's own (Gemma's feed-forward norms,
    # q/k norms, experts) are in its module's ``logical_axes`` (jaxgen.families).
    (r"(layers\.\d+\.(input|post_attention)_layernorm|norm)\.(weight|bias)", ("embed",)),
    (r"(local_|long_)?inv_freq", (None,)),
)

# The KV pool of each layer: [num_kv_heads, num_pages, page_size, head_dim].
KV_POOL_LOGICAL_AXES: tuple[str | None, ...] = ("kv_heads", None, None, None)


def param_logical_axes() -> tuple[tuple[str, tuple[str | None, ...]], ...]:
    """Every parameter rule: the shared ones, then each registered family's own."""
    return PARAM_LOGICAL_AXES + family_logical_axes()


def logical_axes(path: Sequence) -> tuple[str | None, ...]:
    """The logical axes declared for a parameter; ``ValueError`` for an undeclared one."""
    name = path_name(path)
    for pattern, axes in param_logical_axes():
        if re.fullmatch(pattern, name):
            return axes
    raise ValueError(
        f"parameter {name!r} has no logical axes in jaxgen.layers.sharding.PARAM_LOGICAL_AXES "
        "or its family's logical_axes (jaxgen.families)"
    )


def make_mesh(
    tensor_parallel_degree: int = 1, data_parallel_size: int = 1, devices: Sequence | None = None
) -> Mesh:
    """A ``data_parallel_size x tensor_parallel_degree`` mesh with axes ("data", "model").

    Uses the first ``dp * tp`` of ``devices`` (default ``jax.devices()``: all processes' devices
    after ``jax.distributed.initialize``); each row is one model copy.
    """
    devices = list(jax.devices() if devices is None else devices)
    need = tensor_parallel_degree * data_parallel_size
    if tensor_parallel_degree < 1 or data_parallel_size < 1:
        raise ValueError("tensor_parallel_degree and data_parallel_size must be >= 1")
    if need > len(devices):
        raise ValueError(
            f"tensor_parallel_degree={tensor_parallel_degree} x data_parallel_size="
            f"{data_parallel_size} needs {need} devices, but {len(devices)} are available (on CPU, "
            f"set XLA_FLAGS=--xla_force_host_platform_device_count={need} before jax starts)"
        )
    grid = np.array(devices[:need], dtype=object).reshape(
        data_parallel_size, tensor_parallel_degree
    )
    return Mesh(grid, (DATA_AXIS, MODEL_AXIS))


def replica_meshes(mesh: Mesh) -> list[Mesh]:
    """One ("data"=1, "model"=tp) sub-mesh per row of ``mesh``: disjoint device groups."""
    return [Mesh(mesh.devices[i : i + 1], mesh.axis_names) for i in range(mesh.devices.shape[0])]


def resolve_rules(
    config: ModelConfig, tensor_parallel_degree: int
) -> tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]:
    """The rule table adjusted to a model: ((logical axis, mesh axis), ...) and fallback notes."""
    degree = tensor_parallel_degree
    if config.num_heads % degree:
        raise ValueError(
            f"tensor_parallel_degree={degree} does not divide the model's {config.num_heads} query "
            f"heads ({config.num_kv_heads} KV heads); use a divisor of {config.num_heads}"
        )
    rules = dict(LOGICAL_AXIS_RULES)
    notes = []
    moe = config.moe
    if moe is not None and moe.expert_size % degree and not moe.num_experts % degree:
        rules["expert"], rules["expert_mlp"] = rules["expert_mlp"], rules["expert"]
        notes.append(
            f"experts: expert parallel ({moe.expert_size} units do not split {degree} ways)"
        )
    for axis, size, what in (
        ("kv_heads", config.num_kv_heads, "KV heads"),
        ("vocab", config.vocab_size, "vocabulary entries"),
        ("mlp", config.intermediate_size, "MLP units"),
        ("expert", moe.num_experts if moe else 0, "experts"),
        ("expert_mlp", moe.expert_size if moe else 0, "expert MLP units"),
    ):
        if rules[axis] is not None and size % degree:
            rules[axis] = None
            notes.append(f"{axis}: replicated ({size} {what} do not split {degree} ways)")
    return tuple(rules.items()), tuple(notes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShardingPlan:
    """Where every weight and the KV pool of one model copy live on a mesh.

    Callable as the loaders' ``place(path, array)`` hook; ``sharding_for(path)`` also lets the
    orbax loader restore straight into the target shardings.
    """

    mesh: Mesh
    rules: tuple[tuple[str, str | None], ...]
    notes: tuple[str, ...] = ()

    @classmethod
    def create(cls, config: ModelConfig, mesh: Mesh) -> ShardingPlan:
        rules, notes = resolve_rules(config, mesh.shape[MODEL_AXIS])
        return cls(mesh=mesh, rules=rules, notes=notes)

    @property
    def tensor_parallel_degree(self) -> int:
        return self.mesh.shape[MODEL_AXIS]

    def spec(self, axes: Sequence[str | None]) -> PartitionSpec:
        """Logical axes -> ``PartitionSpec`` through the rules."""
        rules = dict(self.rules)
        return PartitionSpec(*(None if a is None else rules[a] for a in axes))

    def sharding_for(self, path: Sequence) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(logical_axes(path)))

    @property
    def kv_sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, self.spec(KV_POOL_LOGICAL_AXES))

    def quantized_shardings(self, path: Sequence, weight) -> QuantizedWeight:
        """Shardings of a ``QuantizedWeight``'s leaves (a ``QuantizedWeight`` of
        ``NamedSharding``s): values, scales and mins split along the weight's logical axes, as
        the float kernel would be (an embedding is held as its [hidden, vocab] head kernel).
        Columns split freely; the input dim only at group boundaries, which keeps bit planes'
        8-row blocks and 4-bit two-level codes' byte pairs whole (``ValueError`` naming the
        tensor otherwise)."""
        axes = logical_axes(path)
        if path[-1] == "embedding":
            axes = axes[::-1]
        spec = self.spec(axes)
        if spec[0] is not None:
            degree = self.mesh.shape[spec[0]]
            groups = weight.shape[0] // weight.group_size
            # Two-level scales split at super-block boundaries (their float16 rows) too.
            scale_rows = weight.scales.shape[0]  # groups, or super-blocks
            if groups % degree or scale_rows % degree:
                raise ValueError(
                    f"quantised weight {path_name(path)!r} ({weight.kind}, {groups} groups of "
                    f"{weight.group_size} along its input dim {weight.shape[0]}) cannot be split "
                    f"{degree} ways at group boundaries; use a tensor_parallel_degree dividing "
                    f"{scale_rows}, or quantization='none'"
                )
            packed_rows = [  # bit planes' bytes; 4-bit two-level codes, two groups a byte
                leaf.shape[0]
                for leaf in (weight.values, weight.scale_codes, weight.min_codes)
                if leaf is not None
            ]
            block = BLOCK_ROWS if weight.kind in PLANE_KINDS else 1
            if (weight.shape[0] // degree) % block or any(rows % degree for rows in packed_rows):
                raise ValueError(
                    f"quantised weight {path_name(path)!r} ({weight.kind}, {groups} groups of "
                    f"{weight.group_size}) cannot be split {degree} ways along its input dim "
                    f"{weight.shape[0]} at the boundaries of its packed codes (bit planes in "
                    f"blocks of {BLOCK_ROWS} rows, two 4-bit group codes a byte: rows "
                    f"{packed_rows}); use a tensor_parallel_degree dividing them"
                )
        sharding = NamedSharding(self.mesh, spec)
        return jax.tree_util.tree_map(lambda _: sharding, weight)

    def place_quantized(self, path: Sequence, weight) -> QuantizedWeight:
        """Places a ``QuantizedWeight`` (host or device leaves) per :meth:`quantized_shardings`."""
        shardings = self.quantized_shardings(path, weight)

        def place(leaf, sharding):
            if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
                return jax.device_put(leaf, sharding)
            host = np.asarray(leaf)
            return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

        return jax.tree_util.tree_map(place, weight, shardings)

    def __call__(self, path: Sequence, array: np.ndarray) -> jax.Array:
        """Places a host array; each device (of any process) gets only its own slice."""
        array = np.asarray(array)
        return jax.make_array_from_callback(
            array.shape, self.sharding_for(path), lambda index: array[index]
        )

    def place_state(self, state):
        """Re-places an existing parameter state (``nnx.State``) onto this plan's shardings
        (a ``QuantizedWeight`` stays quantised: :meth:`place_quantized`)."""
        leaves = []
        for path, var in nnx.to_flat_state(state):
            value = var.get_value()
            if is_quantized(value):
                value = self.place_quantized(path, value)
            elif isinstance(value, jax.Array) and value.is_fully_addressable:
                value = jax.device_put(value, self.sharding_for(path))
            else:
                value = self(path, np.asarray(value))
            leaves.append((path, var.replace(value)))
        return nnx.from_flat_state(leaves)


def shard_loaded(loaded, plan: ShardingPlan):
    """A ``LoadedModel`` whose parameters are re-placed onto ``plan`` (the original is untouched)."""
    return dataclasses.replace(loaded, params=plan.place_state(loaded.params))


class DeferredPlacement:
    """A loaders' ``place`` hook whose plans are made once the model config is known.

    The loader calls ``bind(config)`` right after reading the config: the degree is checked
    against the heads first (a clear ``ValueError`` before devices are counted or weights read),
    then the mesh is built and one ``ShardingPlan`` made per replica (``plans``); the loader
    places every weight with ``plans[0]`` as it converts it.
    """

    def __init__(
        self,
        tensor_parallel_degree: int,
        data_parallel_size: int = 1,
        devices: Sequence | None = None,
    ):
        self.tensor_parallel_degree = tensor_parallel_degree
        self.data_parallel_size = data_parallel_size
        self.devices = devices
        self.plans: list[ShardingPlan] = []

    def bind(self, config: ModelConfig) -> ShardingPlan:
        resolve_rules(config, self.tensor_parallel_degree)
        mesh = make_mesh(self.tensor_parallel_degree, self.data_parallel_size, self.devices)
        self.plans = [ShardingPlan.create(config, m) for m in replica_meshes(mesh)]
        return self.plans[0]

    def __call__(self, path: Sequence, array: np.ndarray) -> jax.Array:
        if not self.plans:
            raise RuntimeError("DeferredPlacement used before bind(config)")
        return self.plans[0](path, array)
