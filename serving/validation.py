"""Request parsing and checking shared by the TGI and OpenAI routes.

Everything a client can get wrong raises ``RequestError``; each route family renders it in its
own error shape (TGI: 422 ``{"error", "error_type"}``; OpenAI: 400 ``{"error": {...}}``).
"""

from __future__ import annotations

import json
import math
import reprlib
from collections.abc import Callable
from typing import Any

from jaxgen.sampling_params import SamplingParams

MAX_SEED = (1 << 64) - 1
MIN_SEED = -(1 << 63)


class RequestError(Exception):
    """A request the server refuses.

    Args:
        message: shown to the client.
        param: the offending parameter (OpenAI's ``param``), if any.
        kind: "validation", "invalid_json", "too_large", "unsupported_media_type", "timeout",
            "overloaded", "unavailable", "conflict", "not_found", "model_not_found" or
            "generation"; each route family maps it to a status code.
        retry_after: seconds for the response's ``Retry-After`` (a sleeping model's 503).
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        kind: str = "validation",
        retry_after: int | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.kind = kind
        self.retry_after = retry_after

    @property
    def headers(self) -> dict[str, str] | None:
        """Response headers: a body read that timed out leaves the connection unusable; a
        refusal to retry later says when."""
        headers = {"connection": "close"} if self.kind == "timeout" else {}
        if self.retry_after is not None:
            headers["retry-after"] = str(self.retry_after)
        return headers or None


SLEEPING_RETRY_AFTER_S = 5  # what a request refused while the model sleeps is told to wait


def sleeping_error(message: str = "The model is sleeping (POST /wake_up wakes it)") -> RequestError:
    """The 503 of a request that arrives while the model sleeps, with ``Retry-After``."""
    return RequestError(message, kind="unavailable", retry_after=SLEEPING_RETRY_AFTER_S)


def check_content_type(content_type: str | None) -> None:
    """Refuses (415) a body declared as anything but JSON; no content type is taken as JSON."""
    if content_type is None:
        return
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type in ("", "application/json") or media_type.endswith("+json"):
        return
    raise RequestError(
        f"Content-Type must be application/json, got {content_type[:100]!r}",
        kind="unsupported_media_type",
    )


async def read_body(request, max_bytes: int) -> bytes:
    """The body's bytes, at most ``max_bytes`` (413 past them, before reading them all)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise RequestError(f"request body exceeds {max_bytes} bytes", kind="too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestError(f"request body exceeds {max_bytes} bytes", kind="too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_object(body: bytes) -> dict[str, Any]:
    """Parses a request body; raises ``RequestError`` for anything but a UTF-8 JSON object."""
    if not body.strip():
        raise RequestError("request body is empty; expected a JSON object", kind="invalid_json")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(
            f"request body is not valid UTF-8: {error}", kind="invalid_json"
        ) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise RequestError("request body is nested too deeply", kind="invalid_json") from None
    except ValueError as error:  # JSONDecodeError, huge integers, NaN/Infinity
        raise RequestError(
            f"request body is not valid JSON: {error}", kind="invalid_json"
        ) from None
    if not isinstance(value, dict):
        raise RequestError(
            f"request body must be a JSON object, got {_type_name(value)}", kind="invalid_json"
        )
    if "\\u" in text:  # escapes can smuggle in lone surrogates, which are not valid text
        _check_no_surrogates(value)
    return value


def _check_no_surrogates(value: Any) -> None:
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise RequestError(
                    "request body holds a lone UTF-16 surrogate escape, which is not valid text",
                    kind="invalid_json",
                ) from None


def _reject_constant(name: str):
    raise ValueError(f"{name} is not allowed")


def _type_name(value: Any) -> str:
    return {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


# -- typed field access ---------------------------------------------------------------------------
class Fields:
    """Typed, checked access to one JSON object's fields; errors name the field (``prefix.name``)."""

    def __init__(self, data: Any, prefix: str = ""):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise RequestError(
                f"`{prefix or 'body'}` must be an object, got {_type_name(data)}",
                param=prefix or None,
            )
        self.data = data
        self.prefix = prefix

    def name(self, key: str) -> str:
        return f"{self.prefix}.{key}" if self.prefix else key

    def error(self, key: str, what: str) -> RequestError:
        shown = reprlib.repr(self.data.get(key))
        return RequestError(f"`{self.name(key)}` {what}, got {shown}", param=self.name(key))

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def integer(
        self,
        key: str,
        default: int | None = None,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int | None:
        value = self.data.get(key)
        if value is None:
            return default
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(key, "must be an integer")
        if minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be <= {maximum}")
        return value

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        exclusive_minimum: bool = False,
    ) -> float | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self.error(key, "must be a number")
        value = float(value)
        if not math.isfinite(value):
            raise self.error(key, "must be finite")
        if minimum is not None and (value < minimum or (exclusive_minimum and value == minimum)):
            raise self.error(key, f"must be {'>' if exclusive_minimum else '>='} {minimum}")
        if maximum is not None and value > maximum:
            raise self.error(key, f"must be <= {maximum}")
        return value

    def boolean(self, key: str, default: bool | None = None) -> bool | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, "must be a boolean")
        return value

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, "must be a string")
        return value

    def string_list(self, key: str, *, max_items: int, allow_single: bool = True) -> list[str]:
        """A list of non-empty strings (or one string when ``allow_single``)."""
        value = self.data.get(key)
        if value is None:
            return []
        if isinstance(value, str) and allow_single:
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise self.error(key, "must be a list of non-empty strings")
        if len(value) > max_items:
            raise self.error(key, f"must have at most {max_items} entries")
        return value

    def seed(self, key: str = "seed") -> int | None:
        return self.integer(key, minimum=MIN_SEED, maximum=MAX_SEED)

    def unsupported(self, key: str, *, allowed: Callable[[Any], bool] = lambda v: not v) -> None:
        """Refuses a feature jaxgen lacks unless the value is an allowed (neutral) one."""
        value = self.data.get(key)
        if value is not None and not allowed(value):
            raise self.error(key, "is not supported by this server")


# -- prompts and limits --------------------------------------------------------------------------
def check_token_ids(token_ids: Any, vocab_size: int, param: str) -> list[int]:
    """A non-empty list of token ids in ``[0, vocab_size)``."""
    if not isinstance(token_ids, list) or not token_ids:
        raise RequestError(f"`{param}` must be a non-empty list of token ids", param=param)
    for token in token_ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token < vocab_size:
            raise RequestError(
                f"`{param}` must hold integer token ids in [0, {vocab_size}), got {token!r}"[:200],
                param=param,
            )
    return token_ids


def check_lengths(
    num_input: int, max_new_tokens: int | None, limits, *, input_name: str, output_name: str
) -> int:
    """Checks the prompt against the limits; returns max new tokens (room left when None)."""
    if num_input == 0:
        raise RequestError(f"`{input_name}` must not be empty", param=input_name)
    if num_input > limits.max_input_tokens:
        raise RequestError(
            f"`{input_name}` must have at most {limits.max_input_tokens} tokens "
            f"(max_input_tokens). Given: {num_input}",
            param=input_name,
        )
    room = limits.max_total_tokens - num_input
    if max_new_tokens is None:
        return room
    if num_input + max_new_tokens > limits.max_total_tokens:
        raise RequestError(
            f"`{input_name}` tokens + `{output_name}` must be <= {limits.max_total_tokens} "
            f"(max_total_tokens). Given: {num_input} `{input_name}` tokens and {max_new_tokens} "
            f"`{output_name}`",
            param=output_name,
        )
    return max_new_tokens


def build_sampling_params(names: dict[str, str], **kwargs) -> SamplingParams:
    """``SamplingParams(**kwargs)``, its ``ValueError`` turned into a ``RequestError`` that names
    the API's parameter (``names`` maps SamplingParams fields to API names)."""
    try:
        return SamplingParams(**kwargs)
    except (ValueError, TypeError) as error:
        message = str(error)
        field = message.split(" ", 1)[0]
        api_name = names.get(field, field)
        if field in names:
            message = f"`{api_name}` " + message.split(" ", 1)[1]
        raise RequestError(message, param=api_name) from None
