"""``Knob``: how one ``EngineConfig`` field meets its users (its flag, help text, and the names
``jaxgen serve`` reads it under), declared with the field by :func:`knob`."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Knob:
    """How one ``EngineConfig`` field meets its users.

    Args:
        help: what it means: the flag's ``--help`` and the docs' meaning column.
        flag: the command-line flag; None: ``--`` and the name with dashes; "": no flag. A
            boolean knob's flag turns it off if it starts with ``--no-``, else on.
        serve_only: only ``jaxgen serve`` takes the flag (``generate`` and ``bench`` use the
            same flag for something else, or have no use for it).
        choices: the values it accepts.
        minimum: the smallest integer the server's settings accept (EngineConfig checks more).
        default_text: the docs' default column, where the value alone says too little.
        env: environment variables ``jaxgen serve`` reads it from (first listed wins).
        properties: ``serving.properties`` keys ``jaxgen serve`` reads it from (also as LMI's
            ``OPTION_<KEY>`` environment variables).
    """

    help: str
    flag: str | None = None
    serve_only: bool = False
    choices: tuple[str, ...] | None = None
    minimum: int = 1
    default_text: str | None = None
    env: tuple[str, ...] = ()
    properties: tuple[str, ...] = ()


def knob(default, **declaration) -> dataclasses.Field:
    """An ``EngineConfig`` field with its ``Knob`` declaration as metadata."""
    return dataclasses.field(default=default, metadata={"knob": Knob(**declaration)})
