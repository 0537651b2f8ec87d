"""The tool-call formats models are trained to write, one reader each, and the registry.

A format says where a run of calls (a *section*) may begin: ``markers`` anywhere in the output,
``leading_markers`` only at its start (after whitespace). ``read(text, start, final)`` reads the
section that begins at ``start`` and returns ``Read(calls, end, status)``:

- ``"done"``: the section ended at ``end``; ``calls`` are its calls.
- ``"incomplete"``: more text is needed (only when ``final`` is False); ``calls`` are those
  already complete, which a stream may send on.
- ``"malformed"``: the text at ``end`` is not a call; ``calls`` before it stand, the rest of the
  output is plain content.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re

from jaxgen.tool_calling.calls import ParsedCall, call_from_json, call_from_object

_DECODER = json.JSONDecoder()


@dataclasses.dataclass(frozen=True)
class Read:
    calls: list[ParsedCall]
    end: int
    status: str  # "done", "incomplete" or "malformed"


def skip_whitespace(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def read_object(text: str, i: int, final: bool, keys: tuple[str, ...]):
    """One JSON call object at ``i``: ``(call, end, status)``; status None when read."""
    try:
        value, end = _DECODER.raw_decode(text, i)
    except ValueError:
        return None, i, "malformed" if final else "incomplete"
    call = call_from_object(value, keys)
    return call, end, None if call is not None else "malformed"


def read_json_list(
    text: str, i: int, final: bool, keys: tuple[str, ...], progress: dict | None = None
) -> Read:
    """``[{call}, {call}, ...]`` starting at ``i`` (which holds ``[``). ``progress`` (kept by the
    caller between reads of a growing text) resumes after the calls already read."""
    start = i
    calls, i = _resume(progress, start, i + 1)
    while True:
        i = skip_whitespace(text, i)
        if i == len(text):
            return Read(calls, i, "malformed" if final else "incomplete")
        if text[i] == "]" and calls:
            return Read(calls, i + 1, "done")
        call, end, status = read_object(text, i, final, keys)
        if status is not None:
            return Read(calls, i, status)
        calls.append(call)
        i = skip_whitespace(text, end)
        if i == len(text):
            return Read(calls, i, "malformed" if final else "incomplete")
        if text[i] == ",":
            i += 1
            _save(progress, start, calls, i)
        elif text[i] == "]":
            return Read(calls, i + 1, "done")
        else:
            return Read(calls, i, "malformed")


def _resume(progress: dict | None, start: int, default: int) -> tuple[list[ParsedCall], int]:
    """The calls read so far in the section at ``start`` and where to go on."""
    if progress is not None and start in progress:
        calls, i = progress[start]
        return list(calls), i
    return [], default


def _save(progress: dict | None, start: int, calls: list[ParsedCall], i: int) -> None:
    if progress is not None:
        progress[start] = (tuple(calls), i)


class ToolCallFormat:
    """Base class: a format's markers and its section reader. An instance serves one output
    (it may keep its place between reads of the growing text)."""

    name = ""
    markers: tuple[str, ...] = ()
    leading_markers: tuple[str, ...] = ()
    # Whether the output text must keep special tokens for the markers to survive decoding.
    needs_special_tokens = False

    def read(self, text: str, start: int, final: bool) -> Read:
        raise NotImplementedError


class HermesFormat(ToolCallFormat):
    """Hermes / Qwen: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one
    block per call, text allowed around them."""

    name = "hermes"
    markers = ("<tool_call>",)
    close = "</tool_call>"

    def read(self, text: str, start: int, final: bool) -> Read:
        body_start = start + len(self.markers[0])
        close = text.find(self.close, body_start)
        if close == -1:
            if not final:
                return Read([], start, "incomplete")
            body, end = text[body_start:], len(text)  # an unclosed last block still counts
        else:
            body, end = text[body_start:close], close + len(self.close)
        call = call_from_json(body, ("arguments", "parameters"))
        if call is None:
            return Read([], start, "malformed")
        return Read([call], end, "done")


class Llama3JsonFormat(ToolCallFormat):
    """Llama 3.1-3.3 JSON calls: ``{"name": ..., "parameters": {...}}`` as the whole reply, or
    after ``<|python_tag|>``; several calls separated by ``;``."""

    name = "llama3_json"
    markers = ("<|python_tag|>",)
    leading_markers = ("{",)
    needs_special_tokens = True

    def __init__(self):
        self._progress: dict = {}

    def read(self, text: str, start: int, final: bool) -> Read:
        i = start
        if text.startswith(self.markers[0], i):
            i += len(self.markers[0])
        calls, i = _resume(self._progress, start, i)
        while True:
            i = skip_whitespace(text, i)
            if i == len(text):
                return Read(calls, i, "malformed" if final else "incomplete")
            if text[i] != "{":
                return Read(calls, i, "malformed")
            call, end, status = read_object(text, i, final, ("parameters", "arguments"))
            if status is not None:
                return Read(calls, i, status)
            calls.append(call)
            j = skip_whitespace(text, end)
            if j < len(text) and text[j] == ";":
                i = j + 1
                _save(self._progress, start, calls, i)
                continue
            if j == len(text) and not final:
                return Read(calls, end, "incomplete")  # a ";" may follow
            return Read(calls, end, "done")


class MistralFormat(ToolCallFormat):
    """Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (tokenizers up to v7)
    or ``[TOOL_CALLS]name[ARGS]{...}`` per call (v11 and later)."""

    name = "mistral"
    markers = ("[TOOL_CALLS]",)
    needs_special_tokens = True
    _name = re.compile(r"[A-Za-z0-9_.\-]+")
    _args = "[ARGS]"
    _call_id = re.compile(r"\[CALL_ID\][A-Za-z0-9]*")

    def __init__(self):
        self._progress: dict = {}

    def read(self, text: str, start: int, final: bool) -> Read:
        keys = ("arguments", "parameters")
        i = skip_whitespace(text, start + len(self.markers[0]))
        if i == len(text):
            return Read([], start, "malformed" if final else "incomplete")
        if text[i] == "[":
            listed = read_json_list(text, i, final, keys, self._progress)
            end = listed.end if listed.calls or listed.status == "done" else start
            return Read(listed.calls, end, listed.status)
        if text[i] == "{":
            call, end, status = read_object(text, i, final, keys)
            return Read([call], end, "done") if status is None else Read([], start, status)
        match = self._name.match(text, i)
        if match is None:
            return Read([], start, "malformed")
        j = match.end()
        call_id = self._call_id.match(text, j)
        if call_id is not None:
            j = call_id.end()
        rest = text[j : j + len(self._args)]
        if not text.startswith(self._args, j):
            partial = not final and (self._args.startswith(rest) or "[CALL_ID]".startswith(rest))
            return Read([], start, "incomplete" if partial else "malformed")
        try:
            arguments, end = _DECODER.raw_decode(text, j + len(self._args))
        except ValueError:
            return Read([], start, "malformed" if final else "incomplete")
        call = call_from_object({"name": match.group(), "arguments": arguments}, ("arguments",))
        return Read([call], end, "done") if call else Read([], start, "malformed")


class PythonicFormat(ToolCallFormat):
    """Llama 3.2 / Llama 4 / ToolACE pythonic calls: ``[get_weather(city="Paris"), f(x=1)]`` as
    the whole reply (optionally inside ``<|python_start|>...<|python_end|>``); keyword arguments
    with Python literal values."""

    name = "pythonic"
    leading_markers = ("[", "<|python_start|>")
    needs_special_tokens = True
    _end = "<|python_end|>"

    def __init__(self):
        self._scans: dict[int, _BracketScan] = {}  # by list start: a stream scans text once

    def read(self, text: str, start: int, final: bool) -> Read:
        i = start
        if text.startswith("<|python_start|>", i):
            i = skip_whitespace(text, i + len("<|python_start|>"))
        if i == len(text) or text[i] != "[":
            return Read([], start, "malformed" if final or i < len(text) else "incomplete")
        close = self._scans.setdefault(i, _BracketScan(i)).close(text)
        if close == -1:
            return Read([], start, "malformed" if final else "incomplete")
        try:
            tree = ast.parse(text[i : close + 1], mode="eval")
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return Read([], start, "malformed")
        calls = _python_calls(tree.body)
        if calls is None:
            return Read([], start, "malformed")
        end = skip_whitespace(text, close + 1)
        if text.startswith(self._end, end):
            return Read(calls, end + len(self._end), "done")
        if not final and self._end.startswith(text[end:]):  # the end tag may follow
            return Read(calls, close + 1, "incomplete")
        return Read(calls, close + 1, "done")


class _BracketScan:
    """Finds the bracket that closes the one at ``start``, skipping brackets inside quoted
    strings; it keeps its place, so text that grows is scanned once."""

    def __init__(self, start: int):
        self.pos = start
        self.depth = 0
        self.quote: str | None = None
        self.escape = False
        self.found = -1

    def close(self, text: str) -> int:
        """The closing bracket's index, or -1 if ``text`` does not hold it yet."""
        if self.found != -1:
            return self.found
        for pos in range(self.pos, len(text)):
            char = text[pos]
            if self.quote is not None:
                if self.escape:
                    self.escape = False
                elif char == "\\":
                    self.escape = True
                elif char == self.quote:
                    self.quote = None
            elif char in "\"'":
                self.quote = char
            elif char in "[({":
                self.depth += 1
            elif char in "])}":
                self.depth -= 1
                if self.depth == 0:
                    self.found = pos
                    return pos
        self.pos = len(text)
        return -1


_PYTHON_NAMES = {"true": True, "false": False, "null": None}


def _python_value(node):
    if isinstance(node, ast.Name) and node.id in _PYTHON_NAMES:
        return _PYTHON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_python_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {
            _python_value(k): _python_value(v) for k, v in zip(node.keys, node.values, strict=True)
        }
    return ast.literal_eval(node)


def _python_calls(node) -> list[ParsedCall] | None:
    if not isinstance(node, ast.List) or not node.elts:
        return None
    calls = []
    for element in node.elts:
        if not isinstance(element, ast.Call) or element.args:
            return None
        name = ast.unparse(element.func)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", name):
            return None
        try:
            arguments = {kw.arg: _python_value(kw.value) for kw in element.keywords}
            text = json.dumps(arguments, ensure_ascii=False)
        except (ValueError, TypeError, SyntaxError, AttributeError, RecursionError):
            return None
        if None in arguments:  # **kwargs
            return None
        calls.append(ParsedCall(name, text))
    return calls


class RequiredFormat(ToolCallFormat):
    """The output ``tool_choice="required"`` constrains the model to: a JSON list of
    ``{"name": ..., "parameters": {...}}`` (vLLM's form)."""

    name = "required"
    leading_markers = ("[",)

    def __init__(self):
        self._progress: dict = {}

    def read(self, text: str, start: int, final: bool) -> Read:
        return read_json_list(text, start, final, ("parameters", "arguments"), self._progress)


TOOL_CALL_PARSERS: dict[str, type[ToolCallFormat]] = {
    "hermes": HermesFormat,
    "llama3_json": Llama3JsonFormat,
    "mistral": MistralFormat,
    "pythonic": PythonicFormat,
}


def get_format(name: str) -> ToolCallFormat:
    """The format called ``name`` (one of ``TOOL_CALL_PARSERS`` or "required")."""
    if name == "required":
        return RequiredFormat()
    if name not in TOOL_CALL_PARSERS:
        raise ValueError(
            f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)} or 'auto', got {name!r}"
        )
    return TOOL_CALL_PARSERS[name]()


def detect_parser(chat_template: str | None) -> str:
    """The parser a chat template's tool format calls for; "hermes" when the template has no
    tool support (jaxgen then renders tools in Hermes form, see ``rendering``) or no known
    marker."""
    template = chat_template or ""
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<tool_call>" in template:
        return "hermes"
    if "<|python_start|>" in template or "[func_name1(" in template:
        return "pythonic"
    if "<|python_tag|>" in template or '"parameters"' in template:
        return "llama3_json"
    return "hermes"
