"""One workload through one engine, step by step: each ``engine.step()`` timed and sorted into
the prefill phase (until every request has its first token) or the decode phase; a
``jax.profiler`` trace of a few decode steps; the last decode-only step's arguments kept, to
replay that step back to back (its device time without the host's work) and to read its
compiled memory analysis."""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import tempfile
import time

import jax

from benchmarks.gpu.floors import device_busy_seconds, median


class DecodeCapture:
    """Wraps ``runner.dispatch`` to keep the arguments of the last single decode-only step."""

    def __init__(self, runner):
        self.runner = runner
        self.original = runner.dispatch
        self.arrays = None
        self.flags = None
        runner.dispatch = self._dispatch

    def _dispatch(self, arrays, flags, *args, **kwargs):
        # args: prompt_targets, prompt_top and (asynchronous scheduling) the previous feed
        live = arrays[2].live_rows  # [[0, decode rows], [decode rows, all rows]]
        single = kwargs.get("num_steps", 1) == 1 and all(arg is None for arg in args)
        if single and live is not None and live[0][1] > 0 and live[1][0] == live[1][1]:
            self.arrays, self.flags = arrays, flags
        return self.original(arrays, flags, *args, **kwargs)

    def replay_seconds(self, steps: int) -> float | None:
        """Seconds per step of ``steps`` dispatches of the kept step, back to back (the device
        time once the host runs ahead; the step rewrites the same pool slots each time)."""
        if self.arrays is None:
            return None
        jax.block_until_ready(self.original(self.arrays, self.flags).result)
        start = time.perf_counter()
        for _ in range(steps):
            last = self.original(self.arrays, self.flags)
        jax.block_until_ready(last.result)
        return (time.perf_counter() - start) / steps

    def memory_analysis(self) -> dict | None:
        """The compiled decode step's memory analysis beside the KV pool's bytes: a temporary
        buffer as large as the pool would mean the K/V write copies the donated pool."""
        if self.arrays is None:
            return None
        runner = self.runner
        lowered = runner._step.lower(
            runner._param_arrays,
            runner.kv_cache,
            *self.arrays,
            flags=self.flags,
            head=None,
            flat_params=runner._flat_params,
        )
        analysis = lowered.compile().memory_analysis()
        fields = (
            "temp_size_in_bytes",
            "argument_size_in_bytes",
            "output_size_in_bytes",
            "alias_size_in_bytes",
            "generated_code_size_in_bytes",
        )
        out = {name: getattr(analysis, name, None) for name in fields}
        out["kv_pool_bytes"] = runner.kv_cache_bytes
        temp = out["temp_size_in_bytes"]
        out["temp_over_pool"] = temp / out["kv_pool_bytes"] if temp is not None else None
        return out


def _copy_trace(directory: str, destination: str) -> dict:
    """Copies the trace's Perfetto file to ``destination`` and reads its device busy time."""
    found = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
    if not found:
        found = glob.glob(os.path.join(directory, "**", "*.trace.json.gz"), recursive=True)
    if not found:
        return {"trace_error": "the profiler wrote no trace file"}
    shutil.copyfile(found[0], destination)
    with gzip.open(found[0], "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return {
        "trace_file": os.path.basename(destination),
        "device_busy_s": device_busy_seconds(events),
    }


def drive(
    engine,
    prompts: list[list[int]],
    params,
    *,
    tag: str,
    trace_to: str | None = None,
    trace_first_step: int = 8,
    trace_steps: int = 5,
) -> dict:
    """Runs ``prompts`` (all added at once) to the end; returns the per-phase timings. With
    ``trace_to``, decode calls ``trace_first_step`` .. + ``trace_steps`` run under the profiler
    (left out of the decode timings) and its Perfetto trace is copied to ``trace_to``."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, None, prompt, params)
    started: set[str] = set()
    final: dict[str, list[int]] = {}
    prefill = {"calls": 0, "steps": 0, "seconds": 0.0}
    decode_times, decode_steps, traced = [], [], {"calls": 0, "steps": 0, "seconds": 0.0}
    trace_dir = None
    begin = time.perf_counter()
    while engine.has_unfinished():
        decoding = len(started) == len(ids)
        tracing = (
            trace_to is not None
            and decoding
            and trace_dir is None
            and (len(decode_times) == trace_first_step)
        )
        if tracing:
            trace_dir = tempfile.mkdtemp(prefix="jaxgen-trace-")
            jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
        in_trace = trace_dir is not None and traced["calls"] < trace_steps and decoding
        steps_before = engine.num_steps
        start = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - start
        steps = engine.num_steps - steps_before
        for out in outputs:
            if out.outputs[0].token_ids:
                started.add(out.request_id)
            if out.finished:
                final[out.request_id] = list(out.outputs[0].token_ids)
        if in_trace:
            traced["calls"] += 1
            traced["steps"] += steps
            traced["seconds"] += seconds
            if traced["calls"] == trace_steps:
                jax.profiler.stop_trace()
        elif decoding:
            decode_times.append(seconds)
            decode_steps.append(steps)
        else:
            prefill["calls"] += 1
            prefill["steps"] += steps
            prefill["seconds"] += seconds
    total = time.perf_counter() - begin
    if trace_dir is not None and traced["calls"] < trace_steps:
        jax.profiler.stop_trace()  # the run ended inside the traced window
    decode_s, decode_n = sum(decode_times), sum(decode_steps)
    result = {
        "seconds": total,
        "output_tokens": sum(len(tokens) for tokens in final.values()),
        "requests": len(ids),
        "prefill_s": prefill["seconds"],
        "prefill_calls": prefill["calls"],
        "decode_steps": decode_n,
        "decode_ms_per_step": 1e3 * decode_s / decode_n if decode_n else None,
        "decode_ms_median_call": 1e3
        * median(t / n for t, n in zip(decode_times, decode_steps, strict=True) if n)
        if decode_n
        else None,
    }
    result["output_tok_s"] = result["output_tokens"] / total
    if trace_dir is not None:
        result["traced"] = traced
        result.update(_copy_trace(trace_dir, trace_to))
        busy = result.get("device_busy_s")
        if busy is not None and traced["steps"]:
            result["trace_device_ms_per_step"] = 1e3 * busy / traced["steps"]
            result["trace_wall_ms_per_step"] = 1e3 * traced["seconds"] / traced["steps"]
        shutil.rmtree(trace_dir, ignore_errors=True)
    return result
