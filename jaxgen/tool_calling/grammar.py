"""The constraint ``tool_choice`` "required" or a named function puts on the output: a JSON
schema, enforced by the engine's constrained decoding (``SamplingParams.structured_outputs``)."""

from __future__ import annotations

from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.strict_schemas import SCHEMA_MAPS, strict_schema
from jaxgen.tool_calling.requests import ToolChoice


def tool_choice_schema(
    tools: list[dict], choice: ToolChoice, lenient: frozenset[str] = frozenset()
) -> dict | None:
    """The JSON schema of the output ``choice`` forces, or None ("auto", "none"). Each tool's
    arguments are read strictly (no property the schema does not declare, unless it allows
    them: ``jaxgen.structured_outputs.strict_schemas``) except for the tools named in
    ``lenient`` (their ``function.strict`` is false).

    - named function: the output is that function's arguments (its ``parameters`` schema);
    - "required": a JSON list (at least one entry; exactly one without parallel calls) of
      ``{"name": <a tool's name>, "parameters": <that tool's arguments>}`` (vLLM's form).
    """
    by_name = {
        tool["function"]["name"]: _arguments_schema(tool["function"], lenient)
        for tool in tools or []
    }
    if choice.mode == "named":
        return by_name[choice.name]
    if choice.mode != "required":
        return None
    calls, definitions = [], {}
    for i, (name, parameters) in enumerate(by_name.items()):
        key = f"tool_{i}_parameters"
        rebased = _rebased(parameters, f"#/$defs/{key}")
        if rebased != parameters:  # it has "#..." pointers, which name its own root
            definitions[key] = rebased
            parameters = {"$ref": f"#/$defs/{key}"}
        calls.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "const": name},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not choice.parallel:
        schema["maxItems"] = 1
    if definitions:
        schema["$defs"] = definitions
    return schema


# Keywords whose values are data, not schemas: their "$ref" keys are left as they are.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})


def _rebased(schema, base: str):
    """``schema`` moved to pointer ``base`` of a larger document: each local ``$ref`` ``#/x``
    (``$defs``, ``definitions`` or any other path of its root, recursion included) becomes
    ``base/x``, and ``#`` becomes ``base``. So a tool whose ``parameters`` use ``$defs`` keeps
    its references when "required" puts it inside the list of calls."""
    if isinstance(schema, list):
        return [_rebased(item, base) for item in schema]
    if not isinstance(schema, dict):
        return schema
    rebased = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            rebased[key] = base + value[1:]
        elif key in SCHEMA_MAPS and isinstance(value, dict):  # names -> schemas
            rebased[key] = {name: _rebased(item, base) for name, item in value.items()}
        elif key in _DATA_KEYWORDS:
            rebased[key] = value
        else:
            rebased[key] = _rebased(value, base)
    return rebased


def _arguments_schema(function: dict, lenient: frozenset[str]) -> dict:
    parameters = function["parameters"]
    return parameters if function["name"] in lenient else strict_schema(parameters)


def tool_choice_constraint(
    tools: list[dict], choice: ToolChoice, lenient: frozenset[str] = frozenset()
) -> StructuredOutputsParams | None:
    """``tool_choice_schema`` as the request's ``structured_outputs`` (None: unconstrained);
    the schema is already as strict as each tool asked."""
    schema = tool_choice_schema(tools, choice, lenient)
    return None if schema is None else StructuredOutputsParams(json=schema, strict=False)
