"""Where a JSON schema's object schemas meet: the plan ``strict_schemas`` closes a schema by.

An instance at one place of a document must match every schema that applies there at once: the
schema itself, its ``allOf`` branches, the target of its ``$ref``, its ``then``/``else`` and
``dependentSchemas``, and (one of) its ``anyOf``/``oneOf`` branches, each followed on through
its own. Those that declare properties or tuple items are the place's *parts*. Closing a part by
itself (``additionalProperties: false``) refuses what the other parts declare, and when one of
them requires it the schema admits nothing (``allOf: [{"$ref": A}, {"$ref": B}]`` where B
requires a property only A declares). So:

- a part that is the only part wherever it applies is closed in place (the usual case: an
  object schema, a ``$defs`` entry only ever used alone);
- a part that meets others anywhere is left open (``MergePlan.open``), and each place where two
  or more meet, or where a part left open applies alone, gets one closure for all of them: an
  ``allOf`` branch admitting exactly the names they declare (``properties``, ``required`` and
  the names ``dependentRequired`` or ``dependencies`` require), nested where a property's own
  schemas meet too (``MergePlan.closures``);
- a place is left open when its parts' names are not all known: a part with
  ``patternProperties``, ``additionalProperties`` (but ``false``) or ``unevaluatedProperties``
  of its own, a ``not`` about properties, a ``$ref`` that does not point into the document
  (or a ``$dynamicRef``), or ``minProperties`` above the names it declares (or over 1 beside
  optional properties: llguidance finds that closed object unsatisfiable).

``anyOf``/``oneOf`` branches are alternatives: where a schema has nothing but alternatives,
each branch is a place of its own (closed as it stands). ``not``, ``if``, ``contains`` and
``propertyNames`` are conditions, not shapes of the output: nothing in them is closed.
"""

from __future__ import annotations

from urllib.parse import unquote

OBJECT_KEYS = frozenset(
    (
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "required",
        "dependentRequired",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "prefixItems",
    )
)
# Values that are the schema of the output at a place of its own: each is a place.
PLACE_MAPS = ("properties", "patternProperties")
PLACE_VALUES = ("additionalProperties", "unevaluatedProperties", "additionalItems")
PLACE_VALUES += ("unevaluatedItems",)
PLACE_LISTS = ("prefixItems",)
# Values that apply at their parent's place (walked for the places inside them).
SHARED_MAPS = ("$defs", "definitions", "dependentSchemas", "dependencies")
SHARED_LISTS = ("allOf", "anyOf", "oneOf")
SHARED_VALUES = ("then", "else")
ALTERNATIVES = ("anyOf", "oneOf")
# A part with any of these admits names it does not list: a place it meets others at is left
# open (alone, it is closed in place, which respects them).
OPENS = ("patternProperties", "unevaluatedProperties")


def declares(node) -> bool:
    """Whether ``node`` is a part: it constrains an object's properties or tuple items."""
    if not isinstance(node, dict):
        return False
    if any(key in node for key in OBJECT_KEYS) or isinstance(node.get("items"), list):
        return True
    return any(isinstance(value, list) for value in _mapping(node, "dependencies").values())


def names(node: dict) -> list[str]:
    """The property names a part declares: ``properties``, ``required``, and those that
    ``dependentRequired`` and ``dependencies`` name, in order."""
    found = dict.fromkeys(_mapping(node, "properties"))
    found.update(dict.fromkeys(_required(node)))
    for key in ("dependentRequired", "dependencies"):
        for name, value in _mapping(node, key).items():
            if isinstance(value, list):
                found.update(dict.fromkeys((name, *(n for n in value if isinstance(n, str)))))
    return list(found)


def closable(node: dict) -> bool:
    """Whether closing ``node`` keeps what it admits satisfiable: it declares properties, says
    nothing of other properties itself, and needs no more properties than it names."""
    if not isinstance(node.get("properties", {}), dict):
        return False
    if "properties" not in node and "patternProperties" not in node:
        return False
    if "additionalProperties" in node or "unevaluatedProperties" in node:
        return False
    return "patternProperties" in node or _fewest(node) <= len(names(node))


def _fewest(node: dict) -> float:
    """``minProperties``, as closing must read it: over 1 beside optional properties counts as
    more than any, since llguidance then finds a closed object unsatisfiable (it counts only
    the properties ``additionalProperties`` would admit)."""
    fewest = _number(node.get("minProperties"))
    required = set(_required(node))
    if fewest > 1 and any(name not in required for name in _mapping(node, "properties")):
        return float("inf")
    return fewest


def _required(node: dict) -> list[str]:
    value = node.get("required")
    return [name for name in value if isinstance(name, str)] if isinstance(value, list) else []


def _mapping(node: dict, key: str) -> dict:
    value = node.get(key)
    return value if isinstance(value, dict) else {}


class MergePlan:
    """What ``strict_schemas`` does at each path (a tuple of keys and indices from the root):
    ``open`` holds the parts that must not be closed in place, ``closures`` the ``allOf``
    branch to add at a place."""

    def __init__(self, root):
        self.root = root
        self.open: set[tuple] = set()
        self.closures: dict[tuple, dict] = {}
        self._shared: set[tuple] = set()  # parts that meet others at a place not their own
        self._merged: set[tuple] = set()  # places whose closure is their parent's
        self._groups: dict[tuple, tuple[list[tuple], bool]] = {}  # place -> its parts, known
        self._planned: set[tuple] = set()
        self._met: set[frozenset] = set()  # sets of parts whose children were merged
        self._closures: dict[frozenset, dict | None] = {}  # sets of parts -> their closure
        self._closing: set[frozenset] = set()
        for place in self._places():
            self._plan_place(place)
        for place, (parts, known) in self._groups.items():
            if place in self._merged or place in self._shared:
                continue
            if parts == [place] or (len(parts) == 1 and parts[0] not in self.open):
                continue  # closed in place
            closure = self._closure(parts, known) if parts else None
            if closure is not None:
                self.closures[place] = closure

    def at(self, path: tuple):
        node = self.root
        for key in path:
            node = node[key]
        return node

    def resolve(self, ref) -> tuple | None:
        """The path a local ``$ref`` (``#`` or ``#/json/pointer``) points to, else None."""
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        pointer = unquote(ref[1:])
        if not pointer:
            return ()
        if not pointer.startswith("/"):
            return None  # an anchor
        path, node = [], self.root
        for token in pointer[1:].split("/"):
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(node, list) and token.isdigit() and int(token) < len(node):
                path.append(int(token))
            elif isinstance(node, dict) and token in node:
                path.append(token)
            else:
                return None
            node = node[path[-1]]
        return tuple(path)

    def _applied(self, node: dict, path: tuple) -> list[tuple | None]:
        """The paths of what applies where ``node`` does besides its alternatives: ``allOf``,
        ``$ref`` (None: it does not point into the document), ``then``/``else``,
        ``dependentSchemas`` and ``dependencies`` schemas."""
        applied: list[tuple | None] = []
        if isinstance(node.get("allOf"), list):
            applied += [(*path, "allOf", i) for i in range(len(node["allOf"]))]
        if "$ref" in node:
            applied.append(self.resolve(node["$ref"]))
        if "$dynamicRef" in node or "$recursiveRef" in node:
            applied.append(None)  # resolved at validation time: its names are not known
        applied += [(*path, key) for key in SHARED_VALUES if isinstance(node.get(key), dict)]
        for key in ("dependentSchemas", "dependencies"):
            mapping = _mapping(node, key)
            applied += [(*path, key, name) for name, v in mapping.items() if isinstance(v, dict)]
        return applied

    @staticmethod
    def _alternatives(node: dict, path: tuple) -> list[tuple]:
        return [
            (*path, key, i)
            for key in ALTERNATIVES
            if isinstance(node.get(key), list)
            for i in range(len(node[key]))
        ]

    def _shapes(self, path: tuple) -> bool:
        """Whether the schema at ``path`` has parts of its own or leads to some."""
        node = self.at(path)
        if not isinstance(node, dict):
            return False
        return declares(node) or bool(self._applied(node, path) or self._alternatives(node, path))

    def _places(self):
        """Every place of the document: the root, then what ``PLACE_*`` name, anywhere."""
        pending = [((), True)]
        while pending:
            path, place = pending.pop()
            node = self.at(path)
            if not isinstance(node, dict):
                continue
            if place:
                yield path
            children = []
            for key in PLACE_MAPS + SHARED_MAPS:
                for name in _mapping(node, key):
                    children.append(((*path, key, name), key in PLACE_MAPS))
            for key in PLACE_LISTS + SHARED_LISTS + ("items",):
                if isinstance(node.get(key), list):
                    place = key not in SHARED_LISTS
                    children += [((*path, key, i), place) for i in range(len(node[key]))]
            for key in PLACE_VALUES + SHARED_VALUES + ("items",):
                if isinstance(node.get(key), dict):
                    children.append(((*path, key), key not in SHARED_VALUES))
            pending.extend(reversed(children))

    def _parts(self, paths) -> tuple[list[tuple], bool]:
        """The parts that apply where each of ``paths`` does, in order, and whether all their
        names are known."""
        parts, known, seen = [], True, set()
        pending = list(reversed(paths))
        while pending:
            path = pending.pop()
            if path is None:
                known = False
                continue
            if path in seen:
                continue
            seen.add(path)
            node = self.at(path)
            if not isinstance(node, dict):
                continue
            if declares(node):
                parts.append(path)
            if declares(node.get("not")):  # may need a property no part names
                known = False
            pending.extend(reversed(self._applied(node, path) + self._alternatives(node, path)))
        return parts, known

    def _plan_place(self, place: tuple) -> None:
        if place in self._planned:
            return
        self._planned.add(place)
        path, seen = place, {place}
        while isinstance(self.at(path), dict) and not declares(self.at(path)):
            node = self.at(path)  # a schema that only points on, or only has alternatives
            applied, alternatives = self._applied(node, path), self._alternatives(node, path)
            if alternatives and not applied:  # each alternative is a place of its own
                for alternative in alternatives:
                    self._plan_place(alternative)
                return
            if alternatives or len(applied) != 1 or applied[0] in seen or applied[0] is None:
                break
            path = applied[0]
            seen.add(path)
        parts, known = self._parts([place])
        self._groups[place] = (parts, known)
        if len(parts) > 1 or not known:
            self.open.update(parts)
            self._shared.update(part for part in parts if part != place)
        if len(parts) > 1:
            self._merge_children(parts)

    def _merge_children(self, parts: list[tuple]) -> None:
        """Marks where the same property or item of two parts meets (their schemas are parts
        of one place there too); recursively, each set of parts once."""
        if frozenset(parts) in self._met:
            return
        self._met.add(frozenset(parts))
        positions: dict[tuple, list[tuple]] = {}
        for part in parts:
            node = self.at(part)
            for key in PLACE_MAPS:
                for name in _mapping(node, key):
                    positions.setdefault((key, name), []).append((*part, key, name))
            for key in PLACE_VALUES + ("items",):
                if isinstance(node.get(key), dict):
                    positions.setdefault((key,), []).append((*part, key))
            for key in PLACE_LISTS + ("items",):
                for i in range(len(node.get(key) or ()) if isinstance(node.get(key), list) else 0):
                    positions.setdefault((key, i), []).append((*part, key, i))
        for where in positions.values():
            where = [path for path in where if self._shapes(path)]
            if len(where) < 2:
                continue
            inner, known = self._parts(where)
            if len(inner) < 2 and known and not (set(inner) & self.open):
                continue
            self._merged.update(where)
            self.open.update(inner)
            self._shared.update(inner)
            self._merge_children(inner)

    def _closure(self, parts: list[tuple], known: bool) -> dict | None:
        """The ``allOf`` branch that closes a place of ``parts`` (None: leave it open), built
        once per set of parts."""
        key = frozenset(parts)
        if key in self._closing:  # recursion: that place stays open
            return None
        if key not in self._closures:
            self._closing.add(key)
            self._closures[key] = self._close(parts) if known else None
            self._closing.discard(key)
        return self._closures[key]

    def _close(self, parts: list[tuple]) -> dict | None:
        nodes = [self.at(part) for part in parts]
        if not any("properties" in node for node in nodes):
            return None
        if any(key in node for node in nodes for key in OPENS):
            return None
        if any(node.get("additionalProperties") not in (None, False) for node in nodes):
            return None
        declared = list(dict.fromkeys(name for node in nodes for name in names(node)))
        if max(_fewest(node) for node in nodes) > len(declared):
            return None
        properties: dict[str, dict] = {}
        for name in declared:
            where = [
                (*p, "properties", name)
                for p, n in zip(parts, nodes, strict=True)
                if name in _mapping(n, "properties") and self._shapes((*p, "properties", name))
            ]
            inner, inner_known = self._parts(where) if len(where) > 1 else ([], True)
            if inner and (len(inner) > 1 or set(inner) & self.open):
                properties[name] = self._closure(inner, inner_known) or {}
            else:
                properties[name] = {}  # not ``true``: draft 4 has no boolean schemas
        return {"properties": properties, "additionalProperties": False}


def _number(value) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
