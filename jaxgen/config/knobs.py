"""Engine knobs as users meet them, all derived from ``EngineConfig``'s declarations: the
command-line flags of ``jaxgen generate``, ``jaxgen bench`` and ``jaxgen serve``, the environment
variables and ``serving.properties`` keys the server reads, and the knob table of
docs/configuration.md (``python -m jaxgen.config.knob_table --write docs/configuration.md``), with
the other servers' nearest knobs (``EQUIVALENTS``) beside them."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping

from jaxgen.config.byte_sizes import parse_kv_cache_memory
from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.knob_declaration import Knob

# How a knob's value is read from text, by its annotation on ``EngineConfig``.
KINDS = {
    "int": "int",
    "int | None": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
    "str | None": "str",
    "int | float | None": "memory",  # bytes (with units) or a fraction
    "dict | None": "json",  # a JSON object
}
MODEL_HELP = (
    "alias, HF directory, .gguf file, converted dir, or hub id (org/name; org/name:Q4_K_M for "
    "a GGUF repository's file)"
)
REVISION_HELP = "the hub id's branch, tag or commit (default: its main branch)"
GGUF_FILE_HELP = "the GGUF file of the hub repository (or of the local directory) to load"
DTYPE_HELP = "float32, bfloat16, float16 or auto (the server also takes fp32, bf16, fp16)"


@dataclasses.dataclass(frozen=True)
class KnobField:
    """One ``EngineConfig`` field: its name, default, kind of value and declaration."""

    name: str
    default: object
    kind: str
    knob: Knob

    @property
    def flag(self) -> str:
        """The command-line flag ("" for none)."""
        return "--" + self.name.replace("_", "-") if self.knob.flag is None else self.knob.flag


def knob_fields() -> list[KnobField]:
    """Every engine knob, in declaration order. A field declared without ``knob(...)`` gets no
    flag and no server names (``undeclared_fields`` lists them; tests/test_layout.py fails)."""
    fields = []
    for field in dataclasses.fields(EngineConfig):
        knob = field.metadata.get("knob", Knob(help="(not declared with knob(...))", flag=""))
        kind = KINDS.get(str(field.type), "str")
        fields.append(KnobField(field.name, field.default, kind, knob))
    return fields


def undeclared_fields() -> list[str]:
    """``EngineConfig`` fields declared without ``knob(...)`` or with an annotation ``KINDS``
    does not know: each needs one to be a flag and a row of the docs' table."""
    return [
        field.name
        for field in dataclasses.fields(EngineConfig)
        if "knob" not in field.metadata or str(field.type) not in KINDS
    ]


def environment_variables() -> dict[str, str]:
    """Environment variable -> knob name, for every variable ``jaxgen serve`` reads a knob from."""
    return {env: field.name for field in knob_fields() for env in field.knob.env}


def property_keys() -> dict[str, str]:
    """``serving.properties`` key -> knob name, for every key ``jaxgen serve`` reads a knob from."""
    return {key: field.name for field in knob_fields() for key in field.knob.properties}


# -- command lines ----------------------------------------------------------------------------------
def _memory_argument(text: str) -> int | float:
    try:
        return parse_kv_cache_memory(text, "--kv-cache-memory")
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _json_argument(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


_ARGUMENT_TYPES = {
    "int": int,
    "float": float,
    "str": None,
    "memory": _memory_argument,
    "json": _json_argument,
}


def add_engine_flags(
    parser: argparse.ArgumentParser,
    *,
    serve: bool = False,
    defaults: Mapping[str, object] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Adds ``--model``, ``--revision``, ``--gguf-file``, ``--dtype`` and the engine knobs'
    flags to ``parser``.

    Args:
        parser: the command's parser.
        serve: ``jaxgen serve``'s flags: every knob with a flag, each defaulting to None so that
            one not given falls through to the environment and properties. Otherwise the flags
            of ``generate`` and ``bench`` (no ``serve_only`` knob), with ``EngineConfig``'s
            defaults.
        defaults: other defaults for some knobs (a benchmark's own sizes).
        skip: knobs the command sets itself.
    """
    defaults = dict(defaults or {})
    added = []
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument(
        "--revision",
        default=None,
        help=REVISION_HELP + (" (env REVISION, HF_MODEL_REVISION)" if serve else ""),
    )
    parser.add_argument("--gguf-file", default=None, help=GGUF_FILE_HELP)
    parser.add_argument("--dtype", default=None if serve else "float32", help=DTYPE_HELP)
    for field in knob_fields():
        knob = field.knob
        if not field.flag or field.name in skip or (knob.serve_only and not serve):
            continue
        default = None if serve else defaults.get(field.name, field.default)
        added.append(field.name)
        help_text = knob.help
        if serve and knob.env:
            help_text += f" (env {', '.join(knob.env)})"
        elif not serve and default is not None and field.kind != "bool":
            help_text += f" (default {default})"
        if field.kind == "bool":  # a --no-... flag turns the knob off, any other turns it on
            turns_off = field.flag.startswith("--no-")
            parser.add_argument(
                field.flag,
                dest=field.name,
                action="store_const",
                const=not turns_off,
                default=default,
                help=f"turn off: {help_text}" if turns_off else help_text,
            )
            continue
        parser.add_argument(
            field.flag,
            dest=field.name,
            type=_ARGUMENT_TYPES[field.kind],
            # The server checks choices in its settings, where flags, environment and
            # serving.properties (and their aliases, e.g. TGI's QUANTIZE=eetq) get one message.
            choices=None if serve else knob.choices,
            default=default,
            help=help_text,
        )
    parser.set_defaults(engine_knob_names=tuple(added))


def engine_kwargs(args: argparse.Namespace) -> dict:
    """``LLM``/``AsyncLLM`` keyword arguments (``dtype`` and knobs) from parsed engine flags."""
    return {"dtype": args.dtype, **{name: getattr(args, name) for name in args.engine_knob_names}}
