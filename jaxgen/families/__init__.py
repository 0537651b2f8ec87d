"""Model families: what each supported family changes, one module a family (``llama``,
``mistral``, ``qwen2``, ``qwen3``, ``phi3``, ``gemma``, ``mixtral``, ``qwen_moe``,
``falcon``), each a :class:`ModelFamily` registered here; the config reader, the weight
loader, the GGUF reader, the sharding rules and the decoder stack look a family up here and
nowhere else. Plain Python (no JAX): this room sits below ``jaxgen.config``.

A family of one's own loads once registered::

    from jaxgen.families import ModelFamily, register_family
    register_family(ModelFamily(model_type="my_llama", architectures=("MyForCausalLM",),
                                config_fields=my_fields, read_parameter=my_reader))
"""

from __future__ import annotations

from jaxgen.families import falcon, gemma, llama, mistral, mixtral, phi3, qwen2, qwen3, qwen_moe
from jaxgen.families.family import LogicalAxes, ModelFamily

_FAMILIES: dict[str, ModelFamily] = {}


def register_family(family: ModelFamily) -> None:
    """Makes ``family`` load (by its ``model_type``, its ``architectures`` and, with a
    ``gguf_architecture``, from GGUF files); a ``model_type`` taken is a ``ValueError``."""
    if family.model_type in _FAMILIES:
        raise ValueError(f"model family {family.model_type!r} is already registered")
    _FAMILIES[family.model_type] = family


def unregister_family(model_type: str) -> None:
    """Forgets a registered family (a test's own, say)."""
    _FAMILIES.pop(model_type, None)


def families() -> tuple[ModelFamily, ...]:
    return tuple(_FAMILIES.values())


def family_of(model_type: str) -> ModelFamily:
    """The family of a ``ModelConfig.model_type``; ``ValueError`` naming the supported ones."""
    family = _FAMILIES.get(model_type)
    if family is None:
        raise ValueError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(_FAMILIES))}"
        )
    return family


def family_of_hf(hf: dict) -> ModelFamily:
    """The family of a ``config.json``: by ``model_type``, else by ``architectures``."""
    family = _FAMILIES.get(hf.get("model_type"))
    if family is not None:
        return family
    by_architecture = {a: f for f in _FAMILIES.values() for a in f.architectures}
    archs = hf.get("architectures") or []
    known = [by_architecture[a] for a in archs if a in by_architecture]
    if not known:
        name = archs[0] if archs else hf.get("model_type")
        raise ValueError(
            f"unsupported architecture {name!r}; supported: {', '.join(sorted(by_architecture))}"
        )
    return known[0]


def family_of_gguf(gguf) -> ModelFamily:
    """The family of an opened GGUF file (its ``general.architecture``; where families share
    one, as Llama and Mixtral do, the one whose ``gguf_accepts`` takes the file)."""
    for family in _FAMILIES.values():
        if family.gguf_architecture == gguf.architecture and family.gguf_accepts(gguf):
            return family
    supported = sorted({f.gguf_architecture for f in _FAMILIES.values() if f.gguf_architecture})
    raise ValueError(
        f"unsupported GGUF architecture {gguf.architecture!r}; supported: {', '.join(supported)}"
    )


def family_logical_axes() -> LogicalAxes:
    """Every registered family's own sharding rules (the shared ones are in
    ``jaxgen.layers.sharding``)."""
    seen, rules = set(), []
    for family in _FAMILIES.values():
        for rule in family.logical_axes:
            if rule not in seen:
                seen.add(rule)
                rules.append(rule)
    return tuple(rules)


for _family in (
    llama.FAMILY,
    mistral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    gemma.GEMMA2,
    gemma.GEMMA3,
    phi3.FAMILY,
    mixtral.FAMILY,
    qwen_moe.QWEN3_MOE,
    qwen_moe.QWEN2_MOE,
    falcon.FAMILY,
):
    register_family(_family)

__all__ = [
    "ModelFamily",
    "families",
    "family_logical_axes",
    "family_of",
    "family_of_gguf",
    "family_of_hf",
    "register_family",
    "unregister_family",
]
