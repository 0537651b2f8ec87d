"""Constraints built to hurt a grammar compiler: a chain of rules each one level deeper, and an
object of many optional properties."""

from __future__ import annotations


def grammar_chain(num_rules: int, lark: bool = False) -> str:
    """``root ::= r0``, ``r{i} ::= "a" r{i+1} | "b"``: each rule one level deeper. About 4,500
    of them overflow llguidance's native stack on a default 8 MiB thread stack."""
    if lark:
        rules = "".join(f'r{i}: "a" r{i + 1} | "b"\n' for i in range(num_rules))
        return f'start: r0\n{rules}r{num_rules}: "c"\n'
    rules = "".join(f'r{i} ::= "a" r{i + 1} | "b"\n' for i in range(num_rules))
    return f'root ::= r0\n{rules}r{num_rules} ::= "c"\n'


def optional_properties(count: int) -> dict:
    """An object of ``count`` optional integer properties: llguidance's parser holds 4 items
    per property in one row, and refuses rows over 2,000 items."""
    properties = {f"p{i}": {"type": "integer"} for i in range(count)}
    return {"type": "object", "properties": properties, "additionalProperties": False}
