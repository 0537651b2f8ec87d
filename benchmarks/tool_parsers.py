"""Host cost of reading tool calls from streamed output: each parser's ``ToolCallStream`` fed one
token's text at a time (the server feeds one piece per engine step), over outputs of a few
thousand characters in that parser's format (several calls, text around them), and over plain
text with no call. Prints microseconds per fed piece; compare with a decode step's milliseconds.

    python benchmarks/tool_parsers.py [--calls 40] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import time

from jaxgen.tool_calling import ToolCallStream

ARGUMENTS = {"city": "Paris", "unit": "celsius", "days": [1, 2, 3], "detail": {"hourly": True}}


def output(parser: str, calls: int) -> str:
    """``calls`` calls in the parser's format."""
    if parser == "hermes":
        block = '<tool_call>\n{"name": "get_weather", "arguments": %s}\n</tool_call>\n'
        return "Checking the weather.\n" + "".join(
            block % json.dumps(ARGUMENTS) for _ in range(calls)
        )
    if parser == "llama3_json":
        one = json.dumps({"name": "get_weather", "parameters": ARGUMENTS})
        return "<|python_tag|>" + "; ".join([one] * calls)
    if parser == "mistral":
        one = {"name": "get_weather", "arguments": ARGUMENTS}
        return "[TOOL_CALLS]" + json.dumps([one] * calls)
    one = 'get_weather(city="Paris", unit="celsius", days=[1, 2, 3], detail={"hourly": True})'
    return "[" + ", ".join([one] * calls) + "]"


def pieces(text: str, size: int = 4) -> list[str]:
    """About one token's text each."""
    return [text[i : i + size] for i in range(0, len(text), size)]


def time_stream(parser: str, text: str, repeats: int) -> tuple[float, int]:
    """Best-of-``repeats`` microseconds per fed piece, and the calls read."""
    parts = pieces(text)
    best = float("inf")
    for _ in range(repeats):
        stream = ToolCallStream("auto", parser=parser)
        start = time.perf_counter()
        for part in parts:
            stream.feed(part)
        stream.finish()
        best = min(best, time.perf_counter() - start)
    return best / len(parts) * 1e6, len(stream.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    plain = "The weather in Paris is mild, with light rain expected later. " * 60
    print(f"{'parser':<12} {'chars':>6} {'calls':>5} {'us/piece':>9} {'plain us/piece':>15}")
    for name in ("hermes", "llama3_json", "mistral", "pythonic"):
        text = output(name, args.calls)
        per_piece, found = time_stream(name, text, args.repeats)
        plain_piece, _ = time_stream(name, plain, args.repeats)
        print(f"{name:<12} {len(text):>6} {found:>5} {per_piece:>9.1f} {plain_piece:>15.1f}")


if __name__ == "__main__":
    main()
