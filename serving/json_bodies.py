"""JSON response bodies encoded in slices, so that encoding a large one on a thread never holds
the GIL (and so the event loop) for long.

``json.dumps`` is one C call: a 13 MB body (``/tokenize`` of 3.9 MB with its token strings)
holds the GIL for its whole encoding, whichever thread runs it. ``json_body`` encodes the same
value piece by piece (objects key by key, long arrays ``SLICE_ITEMS`` items at a time), each
piece one short ``json.dumps``; between pieces the interpreter may switch threads, so the event
loop runs every ``sys.getswitchinterval()``. The bytes are those of Starlette's
``JSONResponse`` (compact separators, ``ensure_ascii=False``, no NaN).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

SLICE_ITEMS = 512  # array items per ``json.dumps`` (tokens, token strings, logprob entries)
FEW_ITEMS = 64  # arrays up to this long are encoded item by item (choices, best_of sequences)


def dumps(value: Any) -> str:
    """``value`` as ``JSONResponse`` encodes it."""
    return json.dumps(
        value, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
    )


def json_body(value: Any) -> bytes:
    """The UTF-8 JSON text of ``value``, byte for byte ``JSONResponse(value).body``, encoded in
    short pieces (see the module docstring)."""
    return b"".join(json_pieces(value))


def json_pieces(value: Any) -> list[bytes]:
    """``json_body(value)`` in the pieces it is encoded in: one ``json.dumps`` each, of at most
    ``SLICE_ITEMS`` items of a long array."""
    pieces: list[bytes] = []
    _encode(value, pieces)
    return pieces


def _encode(value: Any, pieces: list[bytes]) -> None:
    if isinstance(value, dict) and value and all(isinstance(key, str) for key in value):
        separator = "{"
        for key, item in value.items():
            pieces.append(f"{separator}{dumps(key)}:".encode())
            _encode(item, pieces)
            separator = ","
        pieces.append(b"}")
    elif isinstance(value, list) and 0 < len(value) <= FEW_ITEMS:
        separator = b"["
        for item in value:
            pieces.append(separator)
            _encode(item, pieces)
            separator = b","
        pieces.append(b"]")
    elif isinstance(value, list) and value:
        separator = "["
        for start in range(0, len(value), SLICE_ITEMS):
            text = dumps(value[start : start + SLICE_ITEMS])
            pieces.append((separator + text[1:-1]).encode())
            separator = ","
        pieces.append(b"]")
    else:  # scalars, empty containers, objects with keys that are not strings
        pieces.append(dumps(value).encode())


class SlicedJSONResponse(JSONResponse):
    """A ``JSONResponse`` whose body ``json_body`` encodes (the same bytes, in short pieces):
    built on a thread for a large answer."""

    def render(self, content: Any) -> bytes:
        return json_body(content)


__all__ = ["SLICE_ITEMS", "SlicedJSONResponse", "json_body", "json_pieces"]
