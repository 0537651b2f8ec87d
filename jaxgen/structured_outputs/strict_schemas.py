"""Strict JSON schemas: no property or array item the schema does not declare.

JSON Schema reads an object schema without ``additionalProperties`` as admitting any other
property, and an array with ``prefixItems`` but no ``items`` as admitting any further item. A
model constrained by such a schema is free to invent properties (a tool call's arguments growing
``"type": "string", "maxLength": "30", ...`` until ``max_tokens``). OpenAI's strict mode and
vLLM's default grammar backend (xgrammar's ``strict_mode``) read them closed instead; so does
jaxgen unless a request asks for the lenient reading (``StructuredOutputsParams(strict=False)``,
``"strict": false`` on ``response_format.json_schema`` or a tool's ``function``).

``strict_schema`` returns the closed copy: every object schema that declares ``properties`` or
``patternProperties`` and says nothing of ``additionalProperties`` (or ``unevaluatedProperties``)
gets ``"additionalProperties": false`` (and a property it requires without declaring it,
``{}``), and every array with ``prefixItems`` and no ``items`` gets ``"items": false``. A bare
``{"type": "object"}`` declares no properties and stays any object (``json_object`` is one).

Closing never changes whether a schema admits a value: where object schemas meet (``allOf``
branches, a ``$ref`` and its siblings, a schema and its ``anyOf``/``oneOf`` branches), each
applying to the same object, none is closed by itself (each would refuse what the others
declare), however it is reached (a ``$defs`` entry used both alone and as an ``allOf`` branch
included); the place where they meet gets one ``allOf`` branch admitting exactly the names they
all declare, or stays open when those are not all known
(``jaxgen.structured_outputs.schema_merges``). ``not``, ``if`` and ``contains`` are conditions,
left as they are. An object with ``minProperties`` over 1 beside optional properties stays open
too: closed, llguidance finds it unsatisfiable.
"""

from __future__ import annotations

import copy

from jaxgen.structured_outputs.schema_merges import MergePlan, closable, names

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("prefixItems", "allOf", "anyOf", "oneOf")
SCHEMA_VALUES = ("additionalProperties", "unevaluatedProperties", "items", "additionalItems")
SCHEMA_VALUES += ("unevaluatedItems", "then", "else")


def strict_schema(schema):
    """A copy of ``schema`` (a dict, or a boolean schema) read strictly (see the module)."""
    if not isinstance(schema, dict):
        return schema
    return _close(schema, (), MergePlan(schema))


def _close(schema, path: tuple, plan: MergePlan):
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    for key in SCHEMA_MAPS + ("dependencies",):
        if isinstance(closed.get(key), dict):
            closed[key] = {
                name: _close(value, (*path, key, name), plan) for name, value in closed[key].items()
            }
    for key in SCHEMA_LISTS + ("items",):
        if isinstance(closed.get(key), list):
            closed[key] = [
                _close(value, (*path, key, i), plan) for i, value in enumerate(closed[key])
            ]
    for key in SCHEMA_VALUES:
        if isinstance(closed.get(key), dict):
            closed[key] = _close(closed[key], (*path, key), plan)
    if path not in plan.open:
        _close_in_place(closed)
    closure = plan.closures.get(path)
    branches = closed.get("allOf", [])
    if closure is not None and isinstance(branches, list) and closure not in branches:
        # A $ref moves into the allOf: drafts 4-7 ignore what stands beside a $ref.
        first = [{"$ref": closed.pop("$ref")}] if "$ref" in closed else []
        closed["allOf"] = [*first, *branches, copy.deepcopy(closure)]
    return closed


def _close_in_place(closed: dict) -> None:
    if closable(closed):
        missing = [name for name in names(closed) if name not in closed.get("properties", {})]
        if missing:
            closed["properties"] = {
                **closed.get("properties", {}),
                **{name: {} for name in missing},
            }
        closed["additionalProperties"] = False
    if "prefixItems" in closed and "items" not in closed and "unevaluatedItems" not in closed:
        closed["items"] = False
    if isinstance(closed.get("items"), list) and "additionalItems" not in closed:
        closed["additionalItems"] = False
