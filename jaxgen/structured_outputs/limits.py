"""Limits on what a structured-output constraint may hold, checked before it is compiled.

llguidance compiles grammars recursively in native code: a chain of a few thousand rules
overflows a thread's stack and kills the process, and converting GBNF to Lark (Python) takes
time quadratic in such a chain. JSON Schemas are capped at 5,000 properties (OpenAI's cap) and
50,000 enum values: measured on the default tokenizer (``benchmarks/enum_limit.py``), 50,000
values compile in under 0.4 s and 70 MiB, where llguidance itself refuses one enum of 60,000
(a choice compiles as one lexeme, as an enum does); nesting is capped for schemas, grammar
groups and chains of rule references alike. ``check_constraint`` measures a constraint without
compiling it (linear in its size, never recursive) and raises ``ConstraintTooLarge`` naming the
limit.
"""

from __future__ import annotations

import dataclasses
import json
import re

from jaxgen.structured_outputs import StructuredOutputsParams


@dataclasses.dataclass(frozen=True, kw_only=True)
class StructuredOutputLimits:
    """The most a constraint may hold (``jaxgen serve`` takes each as ``--<name>``, dashed).

    Args:
        max_constraint_bytes: the constraint's text: a grammar or regex, the choices, a JSON
            Schema as JSON.
        max_grammar_rules: rules of a grammar (GBNF or Lark).
        max_constraint_depth: nesting: subschemas within a schema, groups within a grammar
            rule or regex, and the longest chain of grammar rules each referring to the next.
        max_schema_properties: properties over a whole schema.
        max_enum_values: ``enum`` and ``const`` values over a whole schema; choices (llguidance
            refuses one enum of 60,000 values itself, after 0.3 s).
    """

    max_constraint_bytes: int = 256 << 10
    max_grammar_rules: int = 1000
    max_constraint_depth: int = 32
    max_schema_properties: int = 5000
    max_enum_values: int = 50_000

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field.name} must be an integer >= 1, got {value!r}")


class ConstraintTooLarge(ValueError):
    """A constraint over a limit; ``limit`` names the ``StructuredOutputLimits`` field."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


def check_constraint(constraint: StructuredOutputsParams, limits: StructuredOutputLimits) -> None:
    """Raises ``ConstraintTooLarge`` (naming the constraint's kind and the limit) when
    ``constraint`` exceeds ``limits``."""
    kind = constraint.kind
    value = getattr(constraint, kind)
    if kind == "json":
        schema = json.loads(value) if isinstance(value, str) else value
        _check(kind, len(value) if isinstance(value, str) else _json_size(schema), limits, "bytes")
        _check_schema(schema, limits)
    elif kind == "regex":
        _check(kind, len(value.encode()), limits, "bytes")
        _check(kind, _group_depth(value), limits, "depth")
    elif kind == "choice":
        _check(kind, sum(len(choice.encode()) + 3 for choice in value), limits, "bytes")
        _check(kind, len(value), limits, "alternatives")
    elif kind == "grammar":
        _check(kind, len(value.encode()), limits, "bytes")
        shape = grammar_shape(value)
        _check(kind, shape.rules, limits, "rules")
        _check(kind, max(shape.group_depth, shape.chain_depth), limits, "depth")


_LIMITS = {  # what is measured -> (the field limiting it, how the message words it)
    "bytes": ("max_constraint_bytes", "{n} bytes; at most {limit}"),
    "rules": ("max_grammar_rules", "{n} rules; at most {limit}"),
    "depth": ("max_constraint_depth", "nesting {n} deep; at most {limit}"),
    "properties": ("max_schema_properties", "{n} properties; at most {limit}"),
    "alternatives": ("max_enum_values", "{n} enum values or choices; at most {limit}"),
}


def _check(kind: str, n: int, limits: StructuredOutputLimits, measure: str) -> None:
    field, wording = _LIMITS[measure]
    limit = getattr(limits, field)
    if n > limit:
        raise ConstraintTooLarge(f"{kind}: {wording.format(n=n, limit=limit)} ({field})", field)


# -- JSON Schema -------------------------------------------------------------------------------
def _json_size(value) -> int:
    return len(json.dumps(value, ensure_ascii=False).encode())


def _check_schema(schema, limits: StructuredOutputLimits) -> None:
    """Counts properties, enum values and subschema nesting over the whole schema without
    recursing, then checks them: a message gives the schema's real count, not where counting
    passed the limit."""
    properties = values = deepest = 0
    pending = [(schema, 0)]  # (subschema, its depth)
    while pending:
        node, depth = pending.pop()
        deepest = max(deepest, depth)
        if not isinstance(node, dict):
            continue
        for key, child in node.items():
            if key in ("enum", "const"):
                values += len(child) if key == "enum" and isinstance(child, list) else 1
            elif key in ("properties", "patternProperties", "$defs", "definitions"):
                if isinstance(child, dict):
                    if key == "properties":
                        properties += len(child)
                    pending.extend((sub, depth + 1) for sub in child.values())
            elif key in ("anyOf", "allOf", "oneOf", "prefixItems"):
                if isinstance(child, list):
                    pending.extend((sub, depth + 1) for sub in child)
            elif isinstance(child, dict) and key not in ("default", "examples"):
                pending.append((child, depth + 1))  # items, additionalProperties, not, if...
    _check("json", deepest, limits, "depth")
    _check("json", properties, limits, "properties")
    _check("json", values, limits, "alternatives")


# -- grammars ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GrammarShape:
    rules: int  # rule definitions
    group_depth: int  # deepest nesting of ( ), [ ] or { } in a rule
    chain_depth: int  # longest chain of rules, each referring to the next (cycles count once)


_GBNF_RULE = re.compile(r"^[ \t]*([A-Za-z_][\w\-]*)[ \t]*::=", re.M)
_LARK_RULE = re.compile(
    r"^[ \t]*[?!]?([A-Za-z_]\w*)(?:\.-?\d+)?(?:\[[^\]\n]*\])?[ \t]*:(?!:)", re.M
)
_NAME = re.compile(r"[A-Za-z_][\w\-]*")


def grammar_shape(text: str) -> GrammarShape:
    """Rules, group nesting and rule-reference depth of a GBNF or Lark grammar (llguidance's
    dialect), read without parsing it: quoted strings, character classes, regexes and
    comments are skipped, every other name is a reference."""
    gbnf = "::=" in text and re.search(r"(?m)^\s*(%llguidance\b|start\s*:)", text) is None
    rule = _GBNF_RULE if gbnf else _LARK_RULE
    starts = [(match.start(), match.end(), match.group(1)) for match in rule.finditer(text)]
    names = {name for _, _, name in starts}
    references: dict[str, set[str]] = {name: set() for name in names}
    group_depth = 0
    for index, (_, body_start, name) in enumerate(starts):
        body_end = starts[index + 1][0] if index + 1 < len(starts) else len(text)
        words, depth = _scan_body(text[body_start:body_end], gbnf)
        group_depth = max(group_depth, depth)
        references[name].update(word for word in words if word in names and word != name)
    return GrammarShape(len(starts), group_depth, _longest_chain(references))


# A rule body's tokens: quoted strings, character classes (GBNF) or regexes (Lark) and comments
# (skipped as one token each), names, and brackets. Unterminated quotes end at the line's end.
_STRING = r'"(?:[^"\\\n]|\\.)*"?|\'(?:[^\'\\\n]|\\.)*\'?'
_GBNF_TOKEN = re.compile(_STRING + r"|\[(?:[^\]\\\n]|\\.)*\]?|#[^\n]*|[A-Za-z_][\w\-]*|[(){}]")
_LARK_TOKEN = re.compile(_STRING + r"|//[^\n]*|/(?:[^/\\\n]|\\.)*/?|[A-Za-z_]\w*|[()\[\]{}]")


def _scan_body(body: str, gbnf: bool) -> tuple[list[str], int]:
    """The names a rule body mentions and its deepest group nesting."""
    words, depth, deepest = [], 0, 0
    for match in (_GBNF_TOKEN if gbnf else _LARK_TOKEN).finditer(body):
        token = match.group()
        first = token[0]
        if first in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif first in ")]}":
            depth = max(depth - 1, 0)
        elif first.isalpha() or first == "_":
            words.append(token)
    return words, deepest


def _longest_chain(references: dict[str, set[str]]) -> int:
    """Rules on the longest reference path, each cycle counted as one rule (iterative Tarjan,
    then the longest path through the strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    component: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    order: list[list[str]] = []  # components, each after every component it reaches
    for root in references:
        if root in index:
            continue
        work = [(root, iter(sorted(references[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(references[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = len(order)
                    members.append(member)
                    if member == node:
                        break
                order.append(members)
    longest = [1] * len(order)
    for number, members in enumerate(order):  # reached components come first
        for member in members:
            for child in references[member]:
                if component[child] != number:
                    longest[number] = max(longest[number], longest[component[child]] + 1)
    return max(longest, default=0)


_REGEX_TOKEN = re.compile(r"\\.|\[(?:[^\]\\]|\\.)*\]?|[()]")  # escapes and classes skipped


def _group_depth(regex: str) -> int:
    """Deepest nesting of groups in a regex (escapes and character classes skipped)."""
    depth = deepest = 0
    for match in _REGEX_TOKEN.finditer(regex):
        token = match.group()
        if token == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif token == ")":
            depth = max(depth - 1, 0)
    return deepest
