"""Parsers of one setting's value (integers, numbers, booleans, choices, lists, dtypes,
quantization, KV memory) and of an LMI ``serving.properties`` file; a bad value is a ``SettingsError`` that
names the setting and where it came from."""

from __future__ import annotations

import json
import re
from typing import Any

from jaxgen.config.byte_sizes import parse_kv_cache_memory

DTYPE_ALIASES = {
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "auto": "auto",
}


class SettingsError(ValueError):
    """A setting that cannot be parsed or is out of range; the message names its source."""


def parse_int(value: Any, name: str, source: str, minimum: int | None = None) -> int:
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except ValueError:
        raise SettingsError(f"{name} from {source} must be an integer, got {value!r}") from None
    if isinstance(number, bool) or (minimum is not None and number < minimum):
        raise SettingsError(f"{name} from {source} must be an integer >= {minimum}, got {value!r}")
    return number


def parse_float(value: Any, name: str, source: str, minimum: float = 0.0) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{name} from {source} must be a number, got {value!r}") from None
    if not number >= minimum or number == float("inf"):
        raise SettingsError(f"{name} from {source} must be a number >= {minimum}, got {value!r}")
    return number


def parse_bool(value: Any, name: str, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise SettingsError(f"{name} from {source} must be true or false, got {value!r}")


# TGI's QUANTIZE and LMI's option.quantize values whose meaning jaxgen's quantization agrees with
# (weights quantised at load: EETQ and bitsandbytes' 8-bit are per-channel int8 weight-only).
# Formats that need a pre-quantised checkpoint (awq, gptq, marlin, exl2) have no equivalent.
QUANTIZATION_ALIASES = {
    "auto": "auto",
    "none": "none",
    "int8": "int8",
    "int4": "int4",
    "fp8": "fp8",
    "w8a8": "w8a8",
    "w4a8": "w4a8",
    "eetq": "int8",
    "bitsandbytes": "int8",
    "bitsandbytes8": "int8",
}


def parse_choice(value: Any, name: str, source: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; the message lists them."""
    if str(value) not in choices:
        raise SettingsError(
            f"{name} from {source} must be one of {', '.join(choices)}, got {value!r}"
        )
    return str(value)


def parse_string_list(value: Any, name: str, source: str) -> tuple[str, ...]:
    """A list of strings: a list, a JSON list (vLLM's ``'["*"]'``) or comma-separated text."""
    if isinstance(value, (list, tuple)) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]  # one flag value: it may be a JSON list
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise SettingsError(f"{name} from {source} is not a JSON list: {value!r}") from None
        else:
            value = [item.strip() for item in text.split(",") if item.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise SettingsError(f"{name} from {source} must be a list of strings, got {value!r}")
    return tuple(value)


def parse_quantization(value: Any, source: str) -> str:
    quantization = QUANTIZATION_ALIASES.get(str(value).strip().lower())
    if quantization is None:
        raise SettingsError(
            f"quantization from {source} must be one of {', '.join(QUANTIZATION_ALIASES)}, "
            f"got {value!r}"
        )
    return quantization


def parse_dtype(value: Any, source: str) -> str:
    dtype = DTYPE_ALIASES.get(str(value).strip().lower())
    if dtype is None:
        raise SettingsError(
            f"dtype from {source} must be one of {', '.join(sorted(DTYPE_ALIASES))}, got {value!r}"
        )
    return dtype


def parse_memory(value: Any, source: str) -> int | float:
    """``kv_cache_memory``: see ``jaxgen.config.byte_sizes.parse_kv_cache_memory``."""
    try:
        return parse_kv_cache_memory(value, source)
    except ValueError as error:
        raise SettingsError(str(error)) from None


def read_properties(path: str) -> dict[str, str]:
    """A Java-style ``.properties`` file (``key=value``, ``key: value``; ``#``/``!`` comments)."""
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise SettingsError(f"cannot read properties file {path!r}: {error}") from None
    values: dict[str, str] = {}
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            values[line] = ""
        else:
            values[match.group(1)] = match.group(2).strip()
    return values
