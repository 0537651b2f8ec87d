"""What a constrained request asks its output to match (vLLM's ``StructuredOutputsParams`` names)."""

from __future__ import annotations

import dataclasses
import json as json_module

from jaxgen.reasoning.grammar_gate import ReasoningSpan
from jaxgen.structured_outputs.dependencies import enforced_dependencies
from jaxgen.structured_outputs.strict_schemas import strict_schema

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StructuredOutputsParams:
    """Exactly one kind of constraint on a request's generated text.

    Args:
        json: a JSON Schema (dict or its JSON text): the output is JSON matching it.
        json_object: any JSON object.
        regex: the output matches this regular expression (whole output).
        choice: the output is one of these strings.
        grammar: a Lark grammar (llguidance's dialect; GBNF is accepted and converted).
        strict: with ``json``, read the schema strictly (the default, as OpenAI's strict mode
            and vLLM's xgrammar): no property or array item it does not declare, unless it
            allows them (``additionalProperties``, ``items``); False gives JSON Schema's own
            lenient reading. See ``jaxgen.structured_outputs.strict_schemas``.
        reasoning: a ``jaxgen.reasoning.ReasoningSpan``: the constraint applies after the
            reasoning it names (free thinking, then the constrained answer). ``LLM.chat`` and
            the server's chat routes set it when a reasoning parser reads the output; not part
            of the grammar (``key``).
    """

    json: dict | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    strict: bool = True
    reasoning: ReasoningSpan | None = None

    def __post_init__(self):
        set_kinds = [kind for kind in KINDS if _is_set(kind, getattr(self, kind))]
        if len(set_kinds) != 1:
            field = set_kinds[1] if len(set_kinds) > 1 else "structured_outputs"
            raise ValueError(
                f"{field}: structured_outputs needs exactly one of {', '.join(KINDS)}, "
                f"got {set_kinds or 'none'}"
            )
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    parsed = json_module.loads(self.json)
                except ValueError as error:
                    raise ValueError(f"json: not valid JSON text ({error})") from None
                if not isinstance(parsed, (dict, bool)):
                    raise ValueError("json: a JSON Schema must be an object")
            elif not isinstance(self.json, dict):
                raise ValueError(f"json: must be a dict or a JSON string, got {self.json!r}")
        if self.reasoning is not None and not isinstance(self.reasoning, ReasoningSpan):
            raise ValueError(f"reasoning: must be a ReasoningSpan, got {self.reasoning!r}")
        if not isinstance(self.strict, bool):
            raise ValueError(f"strict: must be a bool, got {self.strict!r}")
        if not isinstance(self.json_object, bool):
            raise ValueError(f"json_object: must be a bool, got {self.json_object!r}")
        if self.regex is not None and not isinstance(self.regex, str):
            raise ValueError(f"regex: must be a string, got {self.regex!r}")
        if self.choice is not None:
            if (
                not isinstance(self.choice, (list, tuple))
                or not self.choice
                or not all(isinstance(c, str) and c for c in self.choice)
            ):
                raise ValueError(
                    f"choice: must be a list of non-empty strings, got {self.choice!r}"
                )
            object.__setattr__(self, "choice", list(self.choice))
        if self.grammar is not None and not (isinstance(self.grammar, str) and self.grammar):
            raise ValueError(f"grammar: must be a non-empty string, got {self.grammar!r}")

    @classmethod
    def from_value(cls, value) -> StructuredOutputsParams | None:
        """A ``StructuredOutputsParams``, a dict of its fields, or None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - set(KINDS) - {"strict"})
            if unknown:
                raise ValueError(
                    f"structured_outputs: unknown field(s) {unknown}; expected one of {KINDS}"
                )
            return cls(**value)
        raise ValueError(
            f"structured_outputs: must be a StructuredOutputsParams or a dict, got {value!r}"
        )

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if _is_set(kind, getattr(self, kind)))

    def key(self) -> str:
        """Canonical text of the constraint: the grammar cache's key."""
        value = getattr(self, self.kind)
        if self.kind == "json" and isinstance(value, str):
            value = json_module.loads(value)
        lenient = "(lenient)" if self.kind == "json" and not self.strict else ""
        return self.kind + lenient + ":" + json_module.dumps(value, sort_keys=True)

    def schema(self, dependencies: bool = True):
        """The JSON schema a ``json`` constraint compiles: strict unless ``strict`` is False;
        with ``dependencies``, its property dependencies said in keywords llguidance enforces
        (``jaxgen.structured_outputs.dependencies``), else left as they are."""
        value = json_module.loads(self.json) if isinstance(self.json, str) else self.json
        value = strict_schema(value) if self.strict else value
        return enforced_dependencies(value) if dependencies else value


def _is_set(kind: str, value) -> bool:
    return value is not False if kind == "json_object" else value is not None
