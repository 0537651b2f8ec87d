"""JSON Schema keywords llguidance cannot enforce, read leniently and said so.

llguidance refuses a schema with a keyword it does not implement (``not``, ``if``/``then``/
``else``, ``uniqueItems``, ``contains``, ``propertyNames``..., and the property dependencies
``jaxgen.structured_outputs.dependencies`` does not rewrite: ``dependencies``,
``dependentRequired``, ``dependentSchemas``), a ``format`` it does not know, a ``oneOf`` whose
branches it cannot prove disjoint, or ``minProperties``/``maxProperties`` beside optional
properties. vLLM's ``guidance`` backend hands llguidance the schema as it is and refuses these.
jaxgen compiles such a schema a second time with llguidance's ``lenient`` option
(``RELAXED_OPTIONS``): the keywords it cannot enforce are left out (each only narrows what a schema
admits: the grammar admits a superset) and ``oneOf`` is read as ``anyOf``. Everything else in the
schema is still enforced, but an output may then break what was left out (two equal items under
``uniqueItems``, a match of ``not``).

Which keywords were relaxed is part of the result: ``relaxed_keywords`` reads them off the
compiled matcher (llguidance's grammar warnings), ``GrammarCompiler`` logs a warning when it
compiles one, every ``RequestOutput`` of a request whose grammar relaxed something lists them
(``RequestOutput.relaxed_keywords``), and the server's response names them in its
``X-Structured-Output-Relaxed`` header. A schema that must not be relaxed says so to
llguidance itself: ``"x-guidance": {"lenient": false}`` at its top level (then it is refused as
vLLM refuses it).
"""

from __future__ import annotations

import json
import re

# Options of llguidance's JSON compiler for the second compile (``lenient`` implies
# ``coerce_one_of``); given as defaults, so the schema's own ``x-guidance`` overrides them.
RELAXED_OPTIONS = {"lenient": True}

_UNIMPLEMENTED = re.compile(r"^Unimplemented keys: (\[.*\])$")
_FORMAT = re.compile(r"^Unknown format: (.*)$")
_TIMES = re.compile(r" \(\d+ times\)$")  # llguidance counts a repeated warning


def relaxed_keywords(matcher) -> list[str]:
    """The keywords ``matcher``'s grammar left out or read loosely, sorted: ``"oneOf"`` (read as
    ``anyOf``), the unimplemented keywords by name, ``"format: <name>"`` for an unknown
    format, ``"minProperties/maxProperties"``; any other grammar warning as llguidance words
    it. Empty for a grammar that enforces its whole constraint."""
    keywords = set()
    for warning in matcher.get_grammar_warnings():
        warning = _TIMES.sub("", warning.strip())
        if warning == "...":  # llguidance cut the list
            continue
        unimplemented = _UNIMPLEMENTED.match(warning)
        unknown_format = _FORMAT.match(warning)
        if warning.startswith("oneOf not fully supported"):
            keywords.add("oneOf")
        elif unimplemented:
            try:
                keywords.update(str(key) for key in json.loads(unimplemented.group(1)))
            except ValueError:
                keywords.add(warning)
        elif unknown_format:
            keywords.add(f"format: {unknown_format.group(1)}")
        elif warning.startswith("min/maxProperties"):
            keywords.add("minProperties/maxProperties")
        else:
            keywords.add(warning)
    return sorted(keywords)
