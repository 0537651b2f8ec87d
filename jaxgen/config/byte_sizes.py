"""Sizes in bytes from text: ``kv_cache_memory``'s ``"64MiB"``, ``"2GiB"`` or a fraction."""

from __future__ import annotations

import re

BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1 << 10,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1 << 20,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1 << 30,
    "gib": 1 << 30,
}


def parse_kv_cache_memory(value, source: str = "the command line") -> int | float:
    """``kv_cache_memory`` from text: bytes (``"64MiB"``, ``"2GiB"``, ``67108864``) or a
    fraction of free memory (``"0.9"``). Raises ``ValueError`` naming ``source``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(value)
    else:
        text = str(value).strip().lower()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmg]?i?b?)", text)
    if match is None:
        raise ValueError(
            f"kv_cache_memory from {source} must be bytes (e.g. 64MiB) or a fraction in (0, 1], "
            f"got {value!r}"
        )
    number, unit = float(match.group(1)), match.group(2)
    if unit == "" and 0 < number <= 1:
        return number
    size = int(number * BYTE_UNITS[unit])
    if size < 1 << 10:
        raise ValueError(f"kv_cache_memory from {source} must be at least 1KiB, got {value!r}")
    return size
