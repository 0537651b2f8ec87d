"""The device's own time for a jitted call of many kernel calls, from a ``jax.profiler`` trace:
what the accelerator was busy with, per kernel name, without the host's share of the loop (a
``fori_loop`` on a GPU copies its predicate to the host every iteration, and launches each
kernel of the body apart, so a small call's wall time is mostly the loop)."""

from __future__ import annotations

import collections
import shutil
import tempfile

import jax

from benchmarks.gpu.floors import device_events, interval_union_seconds, trace_file_events

# Kernels named in a row's breakdown: the largest by device time.
TOP_KERNELS = 8


def kernel_times(trace_events: list[dict], calls: int) -> dict | None:
    """Device busy time per call (the union of device events, microseconds) and the
    ``TOP_KERNELS`` kernel names with their microseconds and launches per call; None when the
    trace holds no device events."""
    events = device_events(trace_events)
    if not events:
        return None
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events]
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for event in events:
        entry = by_name[str(event.get("name", "?"))]
        entry[0] += float(event.get("dur", 0.0))
        entry[1] += 1
    top = sorted(by_name.items(), key=lambda item: -item[1][0])[:TOP_KERNELS]
    return {
        "device_busy_us_per_call": interval_union_seconds(spans) / calls,
        "kernels": [
            {"name": name, "us_per_call": total / calls, "launches_per_call": count / calls}
            for name, (total, count) in top
        ],
    }


def traced_kernel_times(run, calls: int) -> dict:
    """``run()`` (which blocks until done) under the profiler, read back as ``kernel_times``
    over ``calls`` kernel calls; a profiler that fails is recorded, never raised."""
    directory = tempfile.mkdtemp(prefix="jaxgen-kernel-trace-")
    try:
        jax.profiler.start_trace(directory, create_perfetto_trace=True)
        try:
            run()
        finally:
            jax.profiler.stop_trace()
        trace = trace_file_events(directory)
        if trace is None:
            return {"trace_error": "the profiler wrote no trace file"}
        times = kernel_times(trace[1], calls)
        return times if times is not None else {"trace_error": "no device events (CPU)"}
    except Exception as error:
        return {"trace_error": f"{type(error).__name__}: {error}"}
    finally:
        shutil.rmtree(directory, ignore_errors=True)
