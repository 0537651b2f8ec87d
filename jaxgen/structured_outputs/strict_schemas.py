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
gets ``"additionalProperties": false``, and every array with ``prefixItems`` and no ``items``
gets ``"items": false``. A bare ``{"type": "object"}`` declares no properties and stays any
object (``json_object`` is one). The branches of an ``allOf``, and of an ``anyOf``/``oneOf``
beside properties of their own, are not closed themselves (each would refuse the others'
properties), only the schemas inside them.
"""

from __future__ import annotations

SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
SCHEMA_LISTS = ("prefixItems",)
ALTERNATIVES = ("anyOf", "oneOf")
SCHEMA_VALUES = ("additionalProperties", "items", "contains", "if", "then", "else", "not")


def strict_schema(schema):
    """A copy of ``schema`` (a dict, or a boolean schema) read strictly (see the module)."""
    return _close(schema, close_self=True)


def _close(schema, *, close_self: bool):
    if not isinstance(schema, dict):
        return schema
    closed = dict(schema)
    for key in SCHEMA_MAPS:
        if isinstance(closed.get(key), dict):
            closed[key] = {
                name: _close(value, close_self=True) for name, value in closed[key].items()
            }
    for key in SCHEMA_LISTS:
        if isinstance(closed.get(key), list):
            closed[key] = [_close(value, close_self=True) for value in closed[key]]
    declares_properties = "properties" in closed or "patternProperties" in closed
    for key in ALTERNATIVES:  # beside the parent's own properties, each branch stays open
        if isinstance(closed.get(key), list):
            closed[key] = [_close(v, close_self=not declares_properties) for v in closed[key]]
    if isinstance(closed.get("allOf"), list):
        closed["allOf"] = [_close(value, close_self=False) for value in closed["allOf"]]
    for key in SCHEMA_VALUES:
        if isinstance(closed.get(key), dict):
            closed[key] = _close(closed[key], close_self=True)
        elif key == "items" and isinstance(closed.get(key), list):  # draft 4-7 tuples
            closed[key] = [_close(value, close_self=True) for value in closed[key]]
    if not close_self:
        return closed
    open_keys = ("additionalProperties", "unevaluatedProperties")
    if declares_properties and not any(key in closed for key in open_keys):
        closed["additionalProperties"] = False
    if "prefixItems" in closed and "items" not in closed and "unevaluatedItems" not in closed:
        closed["items"] = False
    if isinstance(closed.get("items"), list) and "additionalItems" not in closed:
        closed["additionalItems"] = False
    return closed
