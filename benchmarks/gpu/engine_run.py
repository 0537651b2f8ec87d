"""One workload through one engine, step by step: each ``engine.step()`` timed and sorted into
the prefill phase (until every request has its first token) or the decode phase; a
``jax.profiler`` trace of a few decode steps; the arguments of the fullest decode-only step
kept, to replay that step back to back (its device time without the host's work) and to read
its compiled memory analysis."""

from __future__ import annotations

import os
import shutil
import tempfile
import time

import jax

from benchmarks.gpu.floors import device_busy_seconds, median, trace_file_events


class DecodeCapture:
    """Keeps, through the runner's ``before_dispatch`` hook, the arguments of the single
    decode-only step with the most decode rows (the latest of those). Not the last one: when
    prefill takes several steps, requests start and finish a few steps apart, and the last
    steps hold only the requests admitted last (on an H200 at batch 64 the last step replayed
    below the batch-64 floor). Steps dispatched with asynchronous scheduling's previous feed
    are not kept."""

    def __init__(self, runner):
        self.runner = runner
        self.arrays = None
        self.decode_rows = 0
        runner.before_dispatch = self._dispatched

    def _dispatched(self, arrays, prompt_targets, num_steps: int, takes_feed: bool) -> None:
        live = arrays[2].live_rows  # [[0, decode rows], [decode rows, all rows]]
        single = num_steps == 1 and prompt_targets is None and not takes_feed
        if single and live is not None and live[0][1] > 0 and live[1][0] == live[1][1]:
            if live[0][1] >= self.decode_rows:
                self.arrays, self.decode_rows = arrays, int(live[0][1])

    def release(self) -> None:
        """Unhooks the runner and lets go of it (the hook and the runner refer to each other:
        without this the old KV pool outlives its engine)."""
        if self.runner is not None:
            self.runner.before_dispatch = None
        self.runner = self.arrays = None

    def replay_seconds(self, steps: int) -> float | None:
        """Seconds per step of ``steps`` dispatches of the kept step, back to back (the device
        time once the host runs ahead; the step rewrites the same pool slots each time)."""
        if self.arrays is None:
            return None
        dispatch = self.runner.dispatch
        self.runner.before_dispatch = None  # the replays are not candidates
        jax.block_until_ready(dispatch(self.arrays).result)
        start = time.perf_counter()
        for _ in range(steps):
            last = dispatch(self.arrays)
        jax.block_until_ready(last.result)
        return (time.perf_counter() - start) / steps

    def memory_analysis(self) -> dict | None:
        """The compiled decode step's memory analysis beside the KV pool's bytes: a temporary
        buffer as large as the pool would mean the K/V write copies the donated pool."""
        if self.arrays is None:
            return None
        runner = self.runner
        compiled = runner.compiled_step(self.arrays)
        analysis = compiled.memory_analysis()
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


class StepTrace:
    """A ``jax.profiler`` trace of ``steps`` engine calls, its Perfetto file copied to
    ``destination``; a profiler that fails is recorded, never raised (the run goes on)."""

    def __init__(self, destination: str, steps: int):
        self.destination = destination
        self.steps = steps
        self.directory = None
        self.active = False
        self.error = None
        self.calls = self.engine_steps = 0
        self.seconds = 0.0

    def start(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="jaxgen-trace-")
        try:
            jax.profiler.start_trace(self.directory, create_perfetto_trace=True)
            self.active = True
        except Exception as error:
            self.error = f"start_trace: {type(error).__name__}: {error}"

    def record(self, seconds: float, engine_steps: int) -> None:
        self.calls += 1
        self.engine_steps += engine_steps
        self.seconds += seconds
        if self.calls == self.steps:
            self.stop()

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        try:
            jax.profiler.stop_trace()
        except Exception as error:
            self.error = f"stop_trace: {type(error).__name__}: {error}"

    def result(self) -> dict:
        """What was traced, the file, and device busy time per step read from it."""
        if self.directory is None:
            return {}
        out = {"traced": {"calls": self.calls, "steps": self.engine_steps, "s": self.seconds}}
        try:
            if self.error is None:
                out.update(self._copy())
        except Exception as error:
            self.error = f"reading the trace: {type(error).__name__}: {error}"
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)
        if self.error:
            out["trace_error"] = self.error
        busy = out.get("device_busy_s")
        if busy is not None and self.engine_steps:
            out["trace_device_ms_per_step"] = 1e3 * busy / self.engine_steps
            out["trace_wall_ms_per_step"] = 1e3 * self.seconds / self.engine_steps
        return out

    def _copy(self) -> dict:
        trace = trace_file_events(self.directory)
        if trace is None:
            return {"trace_error": "the profiler wrote no trace file"}
        path, events = trace
        shutil.copyfile(path, self.destination)
        return {
            "trace_file": os.path.basename(self.destination),
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
    (left out of the decode timings) and its Perfetto trace is copied to ``trace_to``; the
    profiler's start and stop (``profiler_s``: 0.25 s at batch 1 and 0.9 s at batch 64 on an
    H200) are left out of ``output_tok_s``."""
    ids = [f"{tag}-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts, strict=True):
        engine.add_request(request_id, None, prompt, params)
    started: set[str] = set()
    final: dict[str, list[int]] = {}
    prefill = {"calls": 0, "steps": 0, "seconds": 0.0}
    decode_times, decode_steps = [], []
    trace = StepTrace(trace_to, trace_steps) if trace_to else None
    profiler_s = 0.0
    begin = time.perf_counter()
    try:
        while engine.has_unfinished():
            decoding = len(started) == len(ids)
            if trace and trace.directory is None and decoding:
                if len(decode_times) == trace_first_step:
                    start = time.perf_counter()
                    trace.start()
                    profiler_s += time.perf_counter() - start
            in_trace = trace is not None and trace.active
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
                start = time.perf_counter()
                trace.record(seconds, steps)  # stops the profiler after the last traced call
                profiler_s += time.perf_counter() - start
            elif decoding:
                decode_times.append(seconds)
                decode_steps.append(steps)
            else:
                prefill["calls"] += 1
                prefill["steps"] += steps
                prefill["seconds"] += seconds
    finally:
        if trace is not None:
            start = time.perf_counter()
            trace.stop()  # the run ended (or failed) inside the traced window
            profiler_s += time.perf_counter() - start
    total = time.perf_counter() - begin
    decode_s, decode_n = sum(decode_times), sum(decode_steps)
    per_call = [t / n for t, n in zip(decode_times, decode_steps, strict=True) if n]
    result = {
        "seconds": total,
        "output_tokens": sum(len(tokens) for tokens in final.values()),
        "requests": len(ids),
        "prefill_s": prefill["seconds"],
        "prefill_calls": prefill["calls"],
        "decode_steps": decode_n,
        "decode_ms_per_step": 1e3 * decode_s / decode_n if decode_n else None,
        "decode_ms_median_call": 1e3 * median(per_call) if per_call else None,
        "output_tok_s": sum(len(tokens) for tokens in final.values()) / (total - profiler_s),
    }
    if trace is not None:
        result["profiler_s"] = profiler_s
    if trace is not None:
        result.update(trace.result())
    return result
