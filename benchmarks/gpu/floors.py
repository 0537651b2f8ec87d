"""The device check's arithmetic: bytes a step must move, the time floors they give, and device
busy time read from a trace. Pure functions (no jax), unit-tested on CPU."""

from __future__ import annotations

import dataclasses
import glob
import gzip
import json
import os
import statistics


def copy_bytes(num_bytes: int, loops: int = 1) -> int:
    """Bytes a copy of ``num_bytes`` moves ``loops`` times: each pass reads and writes them."""
    return 2 * num_bytes * loops


def matmul_flops(m: int, n: int, k: int, loops: int = 1) -> float:
    """Floating-point operations of ``loops`` products [m, k] @ [k, n]."""
    return 2.0 * m * n * k * loops


@dataclasses.dataclass(frozen=True)
class DecodeAttention:
    """One decode attention call's sizes: ``batch`` sequences of ``context`` keys each, over a
    pool of pages of ``page_size`` tokens."""

    batch: int
    context: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int

    @property
    def pages(self) -> int:
        """Pages per sequence (a partly filled last page counts whole)."""
        return -(-self.context // self.page_size)

    def kv_bytes(self, itemsize: int) -> int:
        """Bytes of every page of each sequence's K and V (whole pages, as the pool holds them)."""
        page_bytes = self.page_size * self.num_kv_heads * self.head_dim * itemsize
        return 2 * self.batch * self.pages * page_bytes

    def bytes_moved(self, itemsize: int) -> int:
        """The fewest bytes the call moves: its K and V pages, the queries read and the outputs
        written."""
        q_and_out = 2 * self.batch * self.num_heads * self.head_dim * itemsize
        return self.kv_bytes(itemsize) + q_and_out


def paged_attention_bytes(*, itemsize: int, **sizes: int) -> int:
    """The fewest bytes one decode attention call of ``DecodeAttention(**sizes)`` moves: every
    page of each sequence's K and V (whole pages, as the pool holds them), the queries read and
    the outputs written."""
    return DecodeAttention(**sizes).bytes_moved(itemsize)


def mean_decode_context(prompt_len: int, output_len: int) -> float:
    """Mean keys a decode step reads per sequence while ``output_len`` tokens follow a prompt of
    ``prompt_len``: the first token comes from the prefill, steps 2..output_len read
    prompt_len + 1 .. prompt_len + output_len - 1 keys."""
    if output_len < 2:
        return float(prompt_len)
    return prompt_len + output_len / 2


def streamed_weight_bytes(param_bytes: int, embedding_bytes: int, *, tied: bool) -> int:
    """Weight bytes one decode step reads: every parameter but an untied embedding table, of
    which a step gathers only its tokens' rows (a tied one is read whole as the LM head)."""
    return param_bytes if tied else param_bytes - embedding_bytes


def decode_floor_seconds(
    *, weight_bytes: float, kv_bytes_per_token: float, context_tokens: float, bandwidth: float
) -> float:
    """The memory floor of one decode step: weights plus the live KV (``context_tokens`` summed
    over the batch) read once at ``bandwidth`` bytes/s."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    return (weight_bytes + kv_bytes_per_token * context_tokens) / bandwidth


def median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def interval_union_seconds(intervals) -> float:
    """Length of the union of ``[start, end)`` intervals (any order, overlapping or nested)."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def trace_file_events(directory: str) -> tuple[str, list[dict]] | None:
    """The Perfetto trace ``jax.profiler`` wrote under ``directory`` and its events, or None
    when it wrote none."""
    pattern = os.path.join(directory, "**", "{}")
    found = glob.glob(pattern.format("perfetto_trace.json.gz"), recursive=True)
    found = found or glob.glob(pattern.format("*.trace.json.gz"), recursive=True)
    if not found:
        return None
    with gzip.open(found[0], "rt") as f:
        data = json.load(f)
    return found[0], data["traceEvents"] if isinstance(data, dict) else data


def device_events(trace_events: list[dict]) -> list[dict] | None:
    """The complete ("X") events of every process named ``/device:...`` in a Chrome/Perfetto
    trace (``jax.profiler`` writes one); None when the trace holds no device process (CPU)."""
    devices = {
        event["pid"]
        for event in trace_events
        if event.get("ph") == "M"
        and event.get("name") == "process_name"
        and str(event.get("args", {}).get("name", "")).startswith("/device:")
    }
    if not devices:
        return None
    return [e for e in trace_events if e.get("ph") == "X" and e.get("pid") in devices and "ts" in e]


def device_busy_seconds(trace_events: list[dict]) -> float | None:
    """Time the accelerator was busy in a trace: the union of its device events
    (``device_events``), in seconds (timestamps are microseconds); None without a device."""
    events = device_events(trace_events)
    if events is None:
        return None
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events]
    return interval_union_seconds(spans) / 1e6


def pow2_floor(value: float) -> int:
    """The largest power of two <= ``value`` (1 below 2)."""
    value = int(value)
    return 1 if value < 2 else 1 << (value.bit_length() - 1)
