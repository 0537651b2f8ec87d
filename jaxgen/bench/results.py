"""Results files: the run's context (command, machine, commit) plus rows, as JSON and Markdown."""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import shlex
import subprocess
import sys


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed (``jaxgen bench ...``)."""
    argv = list(sys.argv if argv is None else argv)
    if argv and os.path.basename(argv[0]) in ("jaxgen", "__main__.py", "cli.py"):
        argv[0] = "jaxgen"
    return shlex.join(argv)


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or the platform's description)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """``git rev-parse --short HEAD`` of this checkout (None outside git)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        timeout=10,
        cwd=os.path.dirname(os.path.abspath(__file__)),
    )
    return out.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def environment(command: str | None = None) -> dict:
    """Command line, machine (CPU, cores, load), accelerator, versions and commit."""
    import jax

    devices = jax.devices()
    env = {
        "command": command or command_line(),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "devices": f"{len(devices)} x {devices[0].device_kind}",
        "python": platform.python_version(),
        "git_commit": git_commit(),
    }
    return env


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if abs(value) >= 100:
            return f"{value:.0f}"
        return f"{value:.1f}" if abs(value) >= 1 else f"{value:.3g}"
    return str(value)


def markdown_table(rows: list[dict], columns: list[str] | dict[str, str]) -> str:
    """A Markdown table of ``rows``; ``columns`` maps keys to headers (or lists keys)."""
    headers = columns if isinstance(columns, dict) else {c: c for c in columns}
    lines = [
        "| " + " | ".join(headers.values()) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key)) for key in headers) + " |")
    return "\n".join(lines)


def context_block(env: dict) -> str:
    """The run's context as Markdown lines."""
    return "\n".join(
        [
            f"Command: `{env['command']}`",
            "",
            f"Machine: {env['cpu']}, {env['cpu_cores']} cores, load average {env['load_average_1m']} "
            f"at start; jax {env['jax_version']} ({env['jax_backend']}, {env['devices']}); "
            f"git {env['git_commit'] or 'unknown'}; {env['timestamp']}",
        ]
    )


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"  # e.g. request_rate=inf (all at once)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def write_results(
    out_dir: str,
    env: dict,
    rows: list[dict],
    *,
    title: str,
    columns: list[str] | dict[str, str],
    extra: dict | None = None,
    notes: list[str] | None = None,
) -> tuple[str, str]:
    """Writes ``results.json`` (context, extra, rows) and ``results.md`` (context + table)."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "results.json")
    md_path = os.path.join(out_dir, "results.md")
    payload = {"command": env["command"], "environment": env, **(extra or {}), "rows": rows}
    with open(json_path, "w") as f:
        json.dump(_clean(payload), f, indent=2)
        f.write("\n")
    parts = [f"# {title}", "", context_block(env), "", markdown_table(rows, columns)]
    if notes:
        parts += [""] + [f"- {note}" for note in notes]
    with open(md_path, "w") as f:
        f.write("\n".join(parts) + "\n")
    return json_path, md_path


def load_rows(out_dir: str) -> list[dict]:
    """The rows of a ``results.json`` written by ``write_results``."""
    with open(os.path.join(out_dir, "results.json")) as f:
        return json.load(f)["rows"]
