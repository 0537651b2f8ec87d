"""The constraint ``tool_choice`` "required" or a named function puts on the output: a JSON
schema, enforced by the engine's constrained decoding (``SamplingParams.structured_outputs``)."""

from __future__ import annotations

from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.tool_calling.requests import ToolChoice


def tool_choice_schema(tools: list[dict], choice: ToolChoice) -> dict | None:
    """The JSON schema of the output ``choice`` forces, or None ("auto", "none").

    - named function: the output is that function's arguments (its ``parameters`` schema);
    - "required": a JSON list (at least one entry; exactly one without parallel calls) of
      ``{"name": <a tool's name>, "parameters": <that tool's arguments>}`` (vLLM's form).
    """
    by_name = {tool["function"]["name"]: tool["function"] for tool in tools or []}
    if choice.mode == "named":
        return by_name[choice.name]["parameters"]
    if choice.mode != "required":
        return None
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "const": name},
                "parameters": function["parameters"],
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for name, function in by_name.items()
    ]
    schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not choice.parallel:
        schema["maxItems"] = 1
    return schema


def tool_choice_constraint(tools: list[dict], choice: ToolChoice) -> StructuredOutputsParams | None:
    """``tool_choice_schema`` as the request's ``structured_outputs`` (None: unconstrained)."""
    schema = tool_choice_schema(tools, choice)
    return None if schema is None else StructuredOutputsParams(json=schema)
