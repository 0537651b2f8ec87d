"""JSON Schema's property dependencies, rewritten into keywords llguidance enforces.

``dependentRequired`` (``{"a": ["b"]}``: an object with ``a`` has ``b`` too),
``dependentSchemas`` (``{"a": S}``: an object with ``a`` matches ``S`` too), both 2019-09+,
and draft 4-7's ``dependencies`` (a list is the first, a schema the second) are keywords
llguidance does not implement: left alone, it compiles them only leniently, not enforced
(``jaxgen.structured_outputs.relaxations``). ``enforced_dependencies`` says the same with
keywords it does enforce, those of the draft the schema's ``$schema`` names (all three when
it names none; a keyword of another draft is no keyword there, and is left for llguidance to
report). Each dependency of an object schema on ``a`` becomes one ``allOf`` branch,
``{"anyOf": [{"properties": {"a": false}}, {"required": ["a", ...needs], "allOf": [S]}]}``
(``a`` absent, or present with what it needs), one per ``a`` when several keywords name it; one
on a property the schema requires anyway is added as it stands (its needs to ``required``, its
schema to ``allOf``), and a ``false`` schema forbids ``a`` (``{"properties": {"a": false}}``).
Each reads exactly as the keyword does, non-objects included (neither ``properties`` nor
``required`` applies to them).

llguidance expands each ``anyOf`` inside an ``allOf`` into alternatives of the whole object, so
``n`` conditional dependencies make ``2**n`` of them: an object with more than
``MAX_CONDITIONAL_DEPENDENCIES`` keeps its keywords (compiled leniently and reported relaxed,
as before). A keyword whose value is not a map of name lists and schemas is kept as well.
Objects whose dependencies meet at one place (``allOf`` branches, ``$ref`` targets) multiply
their alternatives; past llguidance's size limit, ``GrammarCompiler`` compiles the schema
leniently without the rewrite, and the dependencies are reported relaxed.

It runs on the schema as compiled (``StructuredOutputsParams.schema``: ``response_format``,
``structured_outputs``/``guided_json``, tool calls' arguments), after ``strict_schemas`` closed
it: closing reads the names a dependency requires (``schema_merges.names``) and a dependent
schema as applying where its object does, so the closed object declares every name either
branch may need, and the branches only forbid or require names (or add a dependent schema,
which closing saw already). Rewritten first, the branches would be parts merged with their
object, whose closure ``schema_merges`` leaves open in cases it closes today
(``patternProperties`` beside them).
"""

from __future__ import annotations

import re

from jaxgen.structured_outputs.strict_schemas import SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_VALUES

# Compile time doubles with each conditional dependency past 4, where an object compiles in
# about 20 ms (docs/measurements/2026-12-04-c4da3a3-schema-dependencies.md).
MAX_CONDITIONAL_DEPENDENCIES = 4
KEYWORDS = ("dependentRequired", "dependentSchemas", "dependencies")
# Subschemas walked besides strict_schemas' maps, lists and values: conditions and the rest.
_VALUES = SCHEMA_VALUES + ("not", "if", "contains", "propertyNames")
_LISTS = SCHEMA_LISTS + ("items",)
_LEGACY = re.compile(r"json-schema\.org/draft-0[3-7]/")
_CURRENT = re.compile(r"json-schema\.org/draft/20(19-09|20-12)/")


def enforced_dependencies(schema, max_conditional: int = MAX_CONDITIONAL_DEPENDENCIES):
    """A copy of ``schema`` (a dict, or a boolean schema) whose property dependencies, at every
    depth, are keywords llguidance enforces (see the module), but an object's with more than
    ``max_conditional`` conditional ones; the rest is shared, not copied. Only the keywords of
    the draft its ``$schema`` names are read (``draft_keywords``)."""
    return _walk(schema, draft_keywords(schema), max_conditional)


def draft_keywords(schema) -> tuple[str, ...]:
    """The dependency keywords of the draft a root ``schema``'s ``$schema`` names: drafts 3-7
    know ``dependencies`` only, 2019-09 and 2020-12 the other two; all three when it names
    none (what a schema that uses one means by it)."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if isinstance(uri, str) and _LEGACY.search(uri):
        return ("dependencies",)
    if isinstance(uri, str) and _CURRENT.search(uri):
        return ("dependentRequired", "dependentSchemas")
    return KEYWORDS


def _walk(schema, keywords: tuple[str, ...], max_conditional: int):
    if not isinstance(schema, dict):
        return schema
    rewritten = dict(schema)
    for key in SCHEMA_MAPS + ("dependencies",):
        if isinstance(rewritten.get(key), dict):
            rewritten[key] = {
                name: _walk(value, keywords, max_conditional)
                for name, value in rewritten[key].items()
            }
    for key in _LISTS:
        if isinstance(rewritten.get(key), list):
            rewritten[key] = [_walk(v, keywords, max_conditional) for v in rewritten[key]]
    for key in _VALUES:
        if isinstance(rewritten.get(key), dict):
            rewritten[key] = _walk(rewritten[key], keywords, max_conditional)
    return _rewritten(rewritten, keywords, max_conditional)


def dependencies_of(
    node: dict, keywords: tuple[str, ...] = KEYWORDS
) -> dict[str, tuple[list[str], list]] | None:
    """``node``'s dependencies by the property they depend on: the names it needs and the
    schemas it must match, gathered from each of ``keywords``; None when one's value is not a
    map of name lists (``dependentRequired``) or schemas (``dependentSchemas``) or either
    (``dependencies``)."""
    found: dict[str, tuple[list[str], list]] = {}
    for key in keywords:
        if key not in node:
            continue
        value = node[key]
        if not isinstance(value, dict):
            return None
        for name, dependency in value.items():
            needs, schemas = found.setdefault(name, ([], []))
            lists = key != "dependentSchemas"
            if lists and isinstance(dependency, list):
                if not all(isinstance(need, str) for need in dependency):
                    return None
                needs.extend(need for need in dependency if need not in needs)
            elif key != "dependentRequired" and isinstance(dependency, (dict, bool)):
                schemas.append(dependency)
            else:
                return None
    return found


def _rewritten(node: dict, keywords: tuple[str, ...], max_conditional: int) -> dict:
    dependencies = dependencies_of(node, keywords)
    if dependencies is None or not all(
        isinstance(node.get(k, []), list) for k in ("allOf", "required")
    ):
        return node
    required = list(node.get("required", []))
    for name in required:  # grows as it goes: what a required name needs is required too
        needs = dependencies.get(name, ([], []))[0] if isinstance(name, str) else []
        required.extend(need for need in needs if need not in required)
    branches, conditional = [], []
    for name, (needs, schemas) in dependencies.items():
        schemas = [schema for schema in schemas if schema is not True and schema != {}]
        if any(schema is False for schema in schemas):  # nothing matches: ``name`` is absent
            branches.append({"properties": {name: False}})
        elif name in required:
            branches.extend(schemas)
        elif needs or schemas:
            conditional.append(_conditional(name, needs, schemas))
    if len(conditional) > max_conditional:
        return node
    rewritten = {key: value for key, value in node.items() if key not in keywords}
    if required:
        rewritten["required"] = required
    if branches or conditional:
        rewritten["allOf"] = [*node.get("allOf", []), *branches, *conditional]
    return rewritten


def _conditional(name: str, needs: list[str], schemas: list) -> dict:
    """``name`` absent, or present with the names it ``needs`` and matching its ``schemas``."""
    present = {"required": [name, *(need for need in needs if need != name)]}
    if schemas:
        present["allOf"] = schemas
    return {"anyOf": [{"properties": {name: False}}, present]}
