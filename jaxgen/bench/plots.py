"""Charts: the latency-throughput curve of a sweep and bar charts of comparisons (PNG)."""

from __future__ import annotations

import math

from jaxgen.bench.extra import require


def check_available() -> None:
    """Raises ``MissingExtra`` now, rather than after a long run, if charts cannot be drawn."""
    require("matplotlib", "jaxgen bench's charts")


def _pyplot():
    """matplotlib's pyplot on the file-only backend (an optional dependency: the bench extra)."""
    require("matplotlib", "jaxgen bench's charts").use("Agg")
    return require("matplotlib.pyplot", "jaxgen bench's charts")


def plot_curve(
    rows: list[dict],
    path: str,
    *,
    knee: int | None = None,
    efficiency: int | None = None,
    label_key: str = "concurrency",
    title: str = "latency vs throughput",
    predicted_knee: float | None = None,
) -> str:
    """Latency per output token against output throughput, one point per level, knee marked."""
    plt = _pyplot()
    xs = [r["throughput_tok_s"] for r in rows]
    ys = [r["latency_ms_per_token"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, ys, "o-", color="tab:blue", label="measured")
    for row, x, y in zip(rows, xs, ys, strict=True):
        ax.annotate(
            f"{label_key}={_short(row.get(label_key))}",
            (x, y),
            textcoords="offset points",
            xytext=(4, 6),
            fontsize=7,
        )
    if knee is not None:
        ax.plot(
            [xs[knee]],
            [ys[knee]],
            "r*",
            markersize=16,
            label=f"knee ({label_key}={_short(rows[knee].get(label_key))}: "
            "<10% more throughput per doubling)",
        )
    if efficiency is not None and efficiency != knee:
        ax.plot(
            [xs[efficiency]],
            [ys[efficiency]],
            "gD",
            markersize=9,
            label=f"max throughput/latency ({label_key}={_short(rows[efficiency].get(label_key))})",
        )
    if predicted_knee is not None:
        ax.plot([], [], " ", label=f"predicted knee: {label_key} ~ {predicted_knee:.0f}")
    ax.set_xlabel("output throughput (tokens/s)")
    ax.set_ylabel("latency (ms per output token)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_bars(
    rows: list[dict],
    path: str,
    *,
    value_key: str,
    label_key: str,
    group_key: str | None = None,
    ylabel: str = "",
    title: str = "",
) -> str:
    """Bars of ``value_key`` per ``label_key``, grouped by ``group_key`` (e.g. the scenario)."""
    plt = _pyplot()
    groups = list(dict.fromkeys(r.get(group_key, "") for r in rows)) if group_key else [""]
    labels = list(dict.fromkeys(r[label_key] for r in rows))
    width = 0.8 / max(len(labels), 1)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.2 * len(groups) + 1.5, 4), squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        members = [r for r in rows if not group_key or r.get(group_key, "") == group]
        for i, label in enumerate(labels):
            values = [r.get(value_key) for r in members if r[label_key] == label]
            value = values[0] if values and values[0] is not None else 0.0
            value = 0.0 if isinstance(value, float) and math.isnan(value) else value
            bar = ax.bar(i * width, value, width * 0.9, label=str(label))
            ax.bar_label(bar, fmt="%.0f", fontsize=7)
        ax.set_xticks([])
        ax.set_title(str(group), fontsize=9)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _short(value) -> str:
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:g}"
    return str(value)
