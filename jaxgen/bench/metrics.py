"""Latency bookkeeping: per-request timings, percentiles, one sweep level's row, the knee."""

from __future__ import annotations

import dataclasses
import math

PERCENTILES = (50, 90, 99)
KNEE_MIN_GAIN_PER_DOUBLING = 0.10


@dataclasses.dataclass
class RequestTiming:
    """Client-side times (seconds, one clock) of one streamed request."""

    start: float
    prompt_tokens: int = 0
    output_tokens: int = 0
    first_token: float | None = None
    chunk_times: list[float] = dataclasses.field(default_factory=list)  # arrivals with tokens
    end: float | None = None
    queue_s: float | None = None  # engine-side arrival -> first scheduled, when known
    error: str | None = None

    def record_tokens(self, count: int, now: float) -> None:
        """``count`` new tokens arrived at ``now``."""
        if count <= 0:
            return
        if self.first_token is None:
            self.first_token = now
        self.output_tokens += count
        self.chunk_times.append(now)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.first_token is not None

    @property
    def ttft(self) -> float:
        return self.first_token - self.start

    @property
    def e2e(self) -> float:
        return self.end - self.start

    @property
    def tpot(self) -> float | None:
        """Mean time per output token after the first (None for one-token outputs)."""
        if self.output_tokens < 2:
            return None
        return (self.end - self.first_token) / (self.output_tokens - 1)

    @property
    def inter_token(self) -> list[float]:
        """Gaps between successive chunks that carried tokens."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default); NaN if empty."""
    data = sorted(values)
    if not data:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    rank = (len(data) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(data) - 1)
    return data[low] + (data[high] - data[low]) * (rank - low)


def mean(values) -> float:
    data = list(values)
    return sum(data) / len(data) if data else math.nan


def distribution(name: str, seconds) -> dict:
    """``{name}_mean_ms``, ``{name}_p50_ms``, ... from values in seconds."""
    data = [1000.0 * s for s in seconds]
    row = {f"{name}_mean_ms": mean(data)}
    for q in PERCENTILES:
        row[f"{name}_p{q}_ms"] = percentile(data, q)
    return row


def level_row(timings: list[RequestTiming], duration: float, **labels) -> dict:
    """One sweep level's summary.

    ``throughput_tok_s`` = output tokens / ``duration`` (first start to last end);
    ``latency_ms_per_token`` = mean over requests of e2e / output tokens (what one user sees,
    TTFT included); TTFT/TPOT/ITL/e2e distributions; ``mean_in_flight`` by Little's law.
    """
    done = [t for t in timings if t.ok]
    output_tokens = sum(t.output_tokens for t in done)
    row = dict(labels)
    row.update(
        num_requests=len(timings),
        num_failed=len(timings) - len(done),
        duration_s=duration,
        output_tokens=output_tokens,
        input_tokens=sum(t.prompt_tokens for t in done),
        throughput_tok_s=output_tokens / duration if duration > 0 else math.nan,
        requests_per_s=len(done) / duration if duration > 0 else math.nan,
        latency_ms_per_token=mean(1000.0 * t.e2e / t.output_tokens for t in done),
        mean_in_flight=sum(t.e2e for t in done) / duration if duration > 0 else math.nan,
    )
    row.update(distribution("ttft", [t.ttft for t in done]))
    row.update(distribution("tpot", [t.tpot for t in done if t.tpot is not None]))
    row.update(distribution("itl", [gap for t in done for gap in t.inter_token]))
    row.update(distribution("e2e", [t.e2e for t in done]))
    queued = [t.queue_s for t in done if t.queue_s is not None]
    if queued:
        row.update(distribution("queue", queued))
    return row


def add_cost(row: dict, price_per_hour: float | None) -> dict:
    """Adds ``cost_per_1m_output_tokens`` (same currency as the hourly price)."""
    if price_per_hour is not None and row.get("throughput_tok_s"):
        row["cost_per_1m_output_tokens"] = price_per_hour / 3600.0 / row["throughput_tok_s"] * 1e6
    return row


def find_knee(xs, throughputs, min_gain: float = KNEE_MIN_GAIN_PER_DOUBLING) -> int | None:
    """Index of the knee: the first level after which throughput grows by less than ``min_gain``
    per doubling of the load (gain scaled by log2 of the load ratio). The last level if it never
    flattens; None for no data. ``xs`` must be increasing (concurrency or request rate; a last
    rate of ``inf`` counts as one doubling)."""
    points = [(x, y) for x, y in zip(xs, throughputs, strict=True)]
    if not points:
        return None
    for i in range(len(points) - 1):
        (x0, y0), (x1, y1) = points[i], points[i + 1]
        if not (x1 > x0 > 0) or not y0 > 0:
            continue
        doublings = math.log2(x1 / x0) if math.isfinite(x1) else 1.0  # rate "inf": one step
        gain_per_doubling = (y1 / y0 - 1.0) / doublings
        if gain_per_doubling < min_gain:
            return i
    return len(points) - 1


def best_efficiency(throughputs, latencies) -> int | None:
    """Index of the level with the most throughput per unit of latency."""
    scores = [
        y / lat if lat and lat > 0 else -1.0 for y, lat in zip(throughputs, latencies, strict=True)
    ]
    return max(range(len(scores)), key=scores.__getitem__) if scores else None
