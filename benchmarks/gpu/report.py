"""Where the device check's results go: one JSON file rewritten after every stage (and every
sub-step of a long one), a log that copies stdout, each stage's deadline, and the table printed
last."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import time

LOG_LIMIT_BYTES = 12 << 20  # files over 16 MiB do not come back from the device


def jsonable(value):
    """``value`` with numpy scalars and arrays, tuples and non-finite floats made JSON-safe."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy scalar or array
        return jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def write_json(path: str, data: dict) -> None:
    """Writes ``data`` to ``path`` through a temporary file beside it, so a reader (or a
    timeout) never sees half a file."""
    temporary = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(temporary, "w") as f:
        json.dump(jsonable(data), f, indent=1)
    os.replace(temporary, path)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


@dataclasses.dataclass(frozen=True)
class Budget:
    """A deadline (``time.time()`` seconds)."""

    deadline: float

    def remaining(self) -> float:
        return self.deadline - time.time()

    def allows(self, seconds: float) -> bool:
        return self.remaining() >= seconds


class Tee:
    """A text stream that writes to the terminal and to a log file (up to LOG_LIMIT_BYTES)."""

    def __init__(self, stream, path: str):
        self.stream = stream
        self.file = open(path, "a", buffering=1)
        self.written = 0
        self.lock = threading.Lock()

    def write(self, text: str) -> int:
        with self.lock:
            self.stream.write(text)
            if self.written < LOG_LIMIT_BYTES:
                self.file.write(text)
                self.written += len(text)
                if self.written >= LOG_LIMIT_BYTES:
                    self.file.write("\n[log truncated: the rest went to stdout only]\n")
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
        self.file.flush()

    def isatty(self) -> bool:
        return False


class Report:
    """The run's JSON: ``meta`` and one entry per stage, written to ``path`` on every change."""

    def __init__(self, path: str, meta: dict):
        self.path = path
        self.data = {"meta": meta, "stages": {}}
        self.write()

    def stage(self, name: str) -> dict:
        return self.data["stages"].setdefault(name, {})

    def update(self, name: str, **fields) -> None:
        self.stage(name).update(fields)
        self.write()

    def write(self) -> None:
        self.data["meta"]["written_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        write_json(self.path, self.data)


def command_output(command: list[str], timeout: float = 10.0, *, or_stderr: bool = False):
    """A short command's stripped stdout (``or_stderr``: its stderr when stdout is empty); None
    when it cannot run or says nothing."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or (or_stderr and done.stderr.strip()) or None


def log(message: str) -> None:
    """One timestamped line on stdout (the log gets it through the Tee)."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def format_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """A fixed-width text table of ``rows`` over ``columns`` (key, heading)."""

    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    table = [[heading for _, heading in columns]]
    table += [[cell(row.get(key)) for key, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(line, widths, strict=True))
        for line in table
    ]
    return "\n".join(lines)


def print_block(title: str, body: str) -> None:
    sys.stdout.write(f"\n== {title} ==\n{body}\n")
    sys.stdout.flush()
