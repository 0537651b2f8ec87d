"""Structured output in request bodies: OpenAI's ``response_format``, vLLM's ``structured_outputs``
(and its older ``guided_*`` fields), TGI's ``parameters.grammar``; each becomes a
``StructuredOutputsParams``. Its grammar is checked against the server's limits and compiled on a
compile lane (``serving.workers``) before generation starts, and the engine gets the compiled
matcher: a constraint over a limit, one llguidance refuses or cannot follow, or one that admits
no output is a 400 naming the field; a full compile queue is a 429."""

from __future__ import annotations

import asyncio

from jaxgen.engine.structured.grammar_threads import QueueFull
from jaxgen.structured_outputs import StructuredOutputsParams
from jaxgen.structured_outputs.limits import ConstraintTooLarge
from serving.validation import Fields, RequestError

GUIDED_FIELDS = {  # vLLM's older request fields
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def openai_structured_outputs(fields: Fields) -> StructuredOutputsParams | None:
    """The constraint of an OpenAI body (completions or chat), or None."""
    found = []
    response_format = fields.data.get("response_format")
    if response_format is not None:
        constraint = _response_format(response_format)
        if constraint is not None:
            found.append(("response_format", constraint))
    raw = fields.data.get("structured_outputs")
    if raw is not None:
        if not isinstance(raw, dict):
            raise fields.error("structured_outputs", "must be an object")
        kinds = {k: v for k, v in raw.items() if v is not None and v is not False}
        if "strict" in raw:  # false: the lenient reading of a ``json`` schema
            kinds["strict"] = raw["strict"]
        found.append(("structured_outputs", _params("structured_outputs", **kinds)))
    for key, kind in GUIDED_FIELDS.items():
        if fields.data.get(key) is not None:
            found.append((key, _params(key, **{kind: fields.data[key]})))
    if len(found) > 1:
        names = ", ".join(f"`{name}`" for name, _ in found)
        raise RequestError(f"only one of {names} may be given", param=found[1][0])
    return found[0][1] if found else None


def constraint_field(body: dict) -> str:
    """The body field a request's constraint came from."""
    for key in ("response_format", "structured_outputs", *GUIDED_FIELDS):
        if body.get(key) is not None:
            return key
    return "structured_outputs"


def _response_format(value) -> StructuredOutputsParams | None:
    fields = Fields(value, "response_format")
    kind = fields.data.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = Fields(fields.data.get("json_schema"), "response_format.json_schema")
        spec.string("name")
        strict = spec.boolean("strict", True)  # false: JSON Schema's lenient reading
        spec.string("description")
        schema = spec.data.get("schema")
        if schema is None:  # OpenAI's schema is optional: then any JSON object
            return StructuredOutputsParams(json_object=True)
        if not isinstance(schema, dict):
            raise spec.error("schema", "must be a JSON Schema object")
        return _params("response_format.json_schema.schema", json=schema, strict=strict)
    raise fields.error("type", "must be 'text', 'json_object' or 'json_schema'")


def tgi_grammar(parameters: Fields) -> StructuredOutputsParams | None:
    """TGI's ``parameters.grammar``: ``{"type": "json" | "json_schema" | "regex", "value": ...}``."""
    value = parameters.data.get("grammar")
    if value is None:
        return None
    grammar = Fields(value, "parameters.grammar")
    kind = grammar.string("type")
    body = grammar.data.get("value")
    if kind in ("json", "json_schema"):
        if isinstance(body, dict) and kind == "json_schema" and "schema" in body:
            body = body["schema"]  # TGI's json_schema: {"name", "schema"}
        if not isinstance(body, (dict, str)):
            raise grammar.error("value", "must be a JSON Schema (an object or its JSON text)")
        return _params("parameters.grammar.value", json=body)
    if kind == "regex":
        if not isinstance(body, str) or not body:
            raise grammar.error("value", "must be a non-empty regular expression")
        return _params("parameters.grammar.value", regex=body)
    raise grammar.error("type", "must be 'json', 'json_schema' or 'regex'")


def _params(param: str, **kinds) -> StructuredOutputsParams:
    try:
        return StructuredOutputsParams(**kinds)
    except (ValueError, TypeError) as error:
        raise RequestError(f"`{param}`: {error}"[:600], param=param) from None


def look_up(state, constraint: StructuredOutputsParams | None) -> tuple[object, int]:
    """``constraint``'s compiled matcher if it is cached (else None), and the size of its text
    (which compile lane it takes). Call it off the event loop: a large schema takes a while to
    serialise."""
    if constraint is None:
        return None, 0
    compiler = compiler_of(state)
    return compiler.cached(constraint), len(constraint.key())


async def compile_constraint(state, constraint: StructuredOutputsParams, param: str, size: int):
    """Builds ``constraint``'s matcher on its compile lane and returns it. Raises
    ``RequestError``: 429 when the lane's queue is full, 400 naming ``param`` when the
    constraint is refused. Cancelled while it waits in the queue, it never runs."""
    lane = state.workers.compile_lane(size)
    limits = state.settings.structured_output_limits
    try:
        future = lane.submit(compiler_of(state).build, constraint, limits)
    except QueueFull:
        state.metrics.rejected.labels(reason="grammar_queue").inc()
        raise RequestError(
            f"{lane.pending} grammar compiles are running or waiting, the most allowed "
            "(--max-queued-grammar-compiles); retry later",
            kind="overloaded",
        ) from None
    try:
        return await asyncio.wrap_future(future)
    except ConstraintTooLarge as error:
        flag = "--" + error.limit.replace("_", "-")
        message = str(error).replace(f"({error.limit})", f"({flag})")
        raise RequestError(f"`{param}`: {message}", param=param) from None
    except ValueError as error:
        raise RequestError(f"`{param}`: {error}"[:600], param=param) from None


def compiler_of(state):
    """The server's model's constraint compiler (``AsyncLLM.grammar_compiler``)."""
    return state.llm.grammar_compiler()
