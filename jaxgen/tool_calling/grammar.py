"""The constraint ``tool_choice`` "required" or a named function puts on the output: a JSON
schema, enforced by the engine's constrained decoding (``SamplingParams.structured_outputs``)."""

from __future__ import annotations

from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.strict_schemas import strict_schema
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
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "const": name},
                "parameters": parameters,
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, parameters in by_name.items()
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not choice.parallel:
        schema["maxItems"] = 1
    return schema


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
