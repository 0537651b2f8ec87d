"""jaxgen on a real GPU in one command: eight stages, each with its own time budget, the JSON
rewritten after every stage (and every step of a long one) so a timeout still returns what
finished, a log of everything, and a table printed last. benchmarks/gpu/README.md has the
details.

On the device (an H100 or H200), from the repository root, with ``.whl`` carried (a run's
``timeout_s`` of about 480; the check's own budget is 345 s):

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 timeout 420 python3 benchmarks/gpu/device_check.py --out $OUT

Before it, on a machine with pip access, ``bash benchmarks/gpu/fetch_wheels.sh`` puts the wheels
the device image lacks in ``.whl/`` (3.3 MB): llguidance 1.9.1 (every engine imports it), gguf
0.19.0, starlette 1.10.0 and uvicorn 0.54.0 (GGUF loading and the server; their own dependencies
are in the image).

On CPU, the same code at toy sizes (kernels in Pallas's interpreter);
tests/benchmarks/test_gpu_device_check.py runs it:

    python benchmarks/gpu/device_check.py --dry-run --out /tmp/device_check

Stages (``--stages`` picks some, e.g. to rerun what failed; ``--stage-budget NAME=SECONDS``):
  1. machine: device, versions, importable modules, copy bandwidth, bf16 matmul rate.
  2. kernel_correctness: the ragged paged-attention kernel vs its float32 reference.
  3. kernel_bandwidth: the kernel's bytes/s on 8B-shaped decode steps vs the copy bandwidth.
  4. gemm_bandwidth: the 8B's decode matmuls, weights cold, XLA's Triton GEMMs vs cuBLAS.
  5. engine_parity: tiny Llama / Qwen3 / Gemma 3 greedy tokens, pallas-gpu = reference =
     transformers.
  6. end_to_end (child process): random 8B bf16 model, 1,024-token prompts, 128 tokens, batch
     1/64/256/16: tok/s, decode ms/step vs the floor, compiles in the timed pass, a profiler
     trace at batch 1, 64 and 256; n-gram speculation at batch 1 and other knobs as the
     budget allows.
  7. torch_peer (child process, torch_peer.py): transformers on torch, same shapes.
  8. bench_compare (child process): the batching strategies at the 8B shape.

Out (at most 8 files come back from the device): device_check.json (everything),
device_check.log, end_to_end.json, torch_peer.json, bench_compare.json (the children's own
results, merged into device_check.json), e2e_trace_b1.json.gz, e2e_trace_b64.json.gz and
e2e_trace_b256.json.gz (Perfetto traces of a few decode steps: ui.perfetto.dev opens them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

# Before jax loads: the GPU is shared with child processes and the torch peer.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.gpu import device_memory, profiles, report  # noqa: E402
from benchmarks.gpu.children import Child  # noqa: E402
from benchmarks.gpu.report import (  # noqa: E402
    Budget,
    Report,
    command_output,
    log,
    read_json,
    write_json,
)

CHILD_STAGES = ("end_to_end", "torch_peer", "bench_compare")
DEFAULT_COMPILE_CACHE = "/tmp/jaxgen-device-check-xla-cache"


def stage_module(name: str):
    """The module that runs stage ``name`` (imported late: each imports jax)."""
    import importlib

    return importlib.import_module(f"benchmarks.gpu.{name}")


class Context:
    """What a stage sees: the profile, the arguments, where results go, the compile log."""

    def __init__(self, args, profile, partial, compile_log, report_data=None, early=None):
        from jaxgen.config.engine_config import EngineConfig

        self.args = args
        self.profile = profile
        self.out = args.out
        self.partial = partial  # called with the stage's result so far; writes it
        self.compile_log = compile_log
        self.page_size = args.page_size or EngineConfig().page_size
        self.backend = args.backend
        self.report_data = report_data or {}
        self.want_memory_analysis = True
        self.early = early if early is not None else {}  # processes started for a later stage

    def copy_bandwidth(self) -> float | None:
        """The machine stage's copy bandwidth (bytes/s), or the one passed to a child."""
        if self.args.copy_bandwidth:
            return self.args.copy_bandwidth
        machine = self.report_data.get("stages", {}).get("machine", {}).get("result", {})
        return machine.get("copy", {}).get("bandwidth_Bps")


def batch_contexts(text: str) -> tuple[tuple[int, int], ...]:
    """``"1x32768,64x4096"`` as ``((1, 32768), (64, 4096))``."""
    try:
        pairs = tuple(tuple(int(n) for n in item.split("x")) for item in text.split(","))
    except ValueError:
        pairs = ()
    if not pairs or any(len(pair) != 2 or min(pair) < 1 for pair in pairs):
        raise argparse.ArgumentTypeError(f"expected BATCHxCONTEXT[,...], got {text!r}")
    return pairs


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "device_check_out")
    parser.add_argument("--dry-run", action="store_true", help="CPU, toy sizes")
    parser.add_argument("--budget", type=float, default=None, help="seconds for all stages")
    parser.add_argument("--stages", default=",".join(profiles.STAGES))
    parser.add_argument(
        "--stage-budget",
        action="append",
        default=[],
        metavar="STAGE=SECONDS",
        help="a stage's most seconds (repeatable), e.g. end_to_end=200",
    )
    parser.add_argument("--page-size", type=int, default=None, help="default: the engine's")
    parser.add_argument(
        "--kernel-tuning",
        type=json.loads,
        default=None,
        help="kernel variants to time: each value alone, e.g. '{\"num_splits\": [8, 32]}', or "
        'variants of several arguments, e.g. \'[{"num_splits": 49, "decode_num_stages": 3}]\' '
        "(default: found)",
    )
    parser.add_argument(
        "--variant-configs",
        type=batch_contexts,
        default=None,
        help="where the kernel variants are timed, e.g. 1x32768,64x4096 (default: the profile's)",
    )
    parser.add_argument("--peer-compile", choices=("off", "auto"), default="auto")
    parser.add_argument(
        "--batches",
        default=None,
        help="end-to-end and torch-peer batch sizes, e.g. 256,64 (default: the profile's)",
    )
    parser.add_argument(
        "--compare-modes",
        default=None,
        help="bench_compare's modes, e.g. dynamic (default: static,paged,continuous,dynamic)",
    )
    parser.add_argument(
        "--backend",
        choices=("pallas-gpu", "reference"),
        default="pallas-gpu",
        help="attention backend of the engine stages (pallas-gpu falls back to reference when "
        "every kernel case raised, so the engine is still measured)",
    )
    parser.add_argument(
        "--commit", default=None, help="recorded in the JSON (the device's copy has no .git)"
    )
    parser.add_argument(
        "--compile-cache",
        default=None,
        help=f"persistent XLA cache ('none': off; default {DEFAULT_COMPILE_CACHE} on the GPU)",
    )
    # Set by the parent for a child stage.
    parser.add_argument("--child", choices=CHILD_STAGES, help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--copy-bandwidth", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--matmul-rate", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--parent-bytes", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    unknown = set(args.stages.split(",")) - set(profiles.STAGES)
    if unknown:
        parser.error(f"unknown stages {sorted(unknown)}; choose from {profiles.STAGES}")
    budgets = {}
    for item in args.stage_budget:
        name, _, seconds = item.partition("=")
        if name not in profiles.STAGES or not seconds.replace(".", "", 1).isdigit():
            parser.error(f"--stage-budget takes STAGE=SECONDS, got {item!r}")
        budgets[name] = float(seconds)
    args.stage_budget = budgets
    try:
        profiles.select(dry_run=False, batches=args.batches, compare_modes=args.compare_modes)
    except ValueError as error:
        parser.error(str(error))
    return args


def profile_of(args) -> profiles.Profile:
    """The profile this run measures with (``--dry-run``, ``--batches``, ``--compare-modes``)."""
    return profiles.select(
        dry_run=args.dry_run, batches=args.batches, compare_modes=args.compare_modes
    )


def stage_budgets(args, profile) -> dict:
    """The profile's budgets with ``--stage-budget`` overrides."""
    return {
        name: profiles.StageBudget(args.stage_budget.get(name, budget.max_s), budget.min_s)
        for name, budget in profile.budgets.items()
    }


def setup_jax(args, profile):
    """The compile log and the persistent compile cache (on the GPU only by default)."""
    from benchmarks.gpu.compile_log import CompileLog, enable_persistent_cache

    cache = args.compile_cache or (None if args.dry_run else DEFAULT_COMPILE_CACHE)
    enable_persistent_cache(None if cache == "none" else cache)
    return CompileLog()


def child_main(args) -> int:
    """One stage in this process (started by the parent): results in ``<stage>.json``."""
    profile = profile_of(args)
    path = os.path.join(args.out, f"{args.child}.json")
    compile_log = setup_jax(args, profile)
    compile_log.label = args.child
    state = {"status": "running"}

    def partial(result: dict) -> None:
        state.update(result)
        state.update(compile_log.since((0, 0.0)), compile_entries=compile_log.entries)
        write_json(path, state)

    ctx = Context(args, profile, partial, compile_log)
    try:
        deadline = args.deadline or time.time() + profile.budgets[args.child].max_s
        result = stage_module(args.child).run(ctx, Budget(deadline))
        result.setdefault("status", "ok")
        partial(result)
        return 0
    except Exception as error:
        partial({"status": "error", "error": f"{type(error).__name__}: {error}"})
        state["traceback"] = traceback.format_exc()
        write_json(path, state)
        traceback.print_exc()
        return 1


def run_child(ctx, name: str, budget: Budget) -> dict:
    """Stage ``name`` in a child process; its JSON (partial if it ran out of time) back."""
    args = ctx.args
    path = os.path.join(args.out, f"{name}.json")
    if os.path.exists(path):
        os.remove(path)
    common = ["--out", args.out, "--deadline", str(budget.deadline)]
    common += ["--dry-run"] if args.dry_run else []
    common += ["--batches", args.batches] if args.batches else []
    if name == "torch_peer":
        script = os.path.join(REPO, "benchmarks", "gpu", "torch_peer.py")
        command = [sys.executable, script, "--out", path, "--deadline", str(budget.deadline)]
        command += ["--dry-run"] if args.dry_run else []
        command += ["--batches", args.batches] if args.batches else []
        command += ["--compile", args.peer_compile]
    else:
        machine = ctx.report_data["stages"].get("machine", {}).get("result", {})
        command = [sys.executable, os.path.abspath(__file__), "--child", name, *common]
        command += [
            "--page-size",
            str(ctx.page_size),
            "--parent-bytes",
            str(device_memory.parent_bytes()),
        ]
        command += ["--backend", args.backend]
        command += ["--compare-modes", args.compare_modes] if args.compare_modes else []
        for flag, value in (
            ("--copy-bandwidth", ctx.copy_bandwidth()),
            ("--matmul-rate", machine.get("matmul", {}).get("flops_per_s")),
            ("--compile-cache", args.compile_cache),
        ):
            if value:
                command += [flag, str(value)]
    child = Child(command, name)
    code = child.wait(budget.deadline + 5.0)
    result = read_json(path) or {}
    status = result.pop("status", None)
    if code is None:
        result["status"] = "timeout"
        result["note"] = "killed at its deadline; the result holds what it finished"
    elif code != 0 or status in (None, "running"):
        result["status"] = "error"
        result.setdefault("error", f"exit code {code}: " + " | ".join(child.tail[-5:]))
    else:
        result["status"] = status
    return result


def kernel_unusable(stage: dict) -> bool:
    """Whether every kernel case raised (the kernel does not compile or run here)."""
    rows = stage.get("result", {}).get("cases", [])
    return stage.get("status") == "error" or (bool(rows) and all("error" in r for r in rows))


def git_commit() -> str | None:
    return command_output(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])


def main(argv=None) -> int:
    device_memory.reset()
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.child:
        return child_main(args)
    profile = profile_of(args)
    log_path = os.path.join(args.out, "device_check.log")
    sys.stdout = report.Tee(sys.__stdout__, log_path)
    sys.stderr = report.Tee(sys.__stderr__, log_path)
    started = time.time()
    deadline = started + (args.budget or profile.total_budget_s)
    meta = {
        "argv": sys.argv,
        "profile": profile.name,
        "commit": args.commit or git_commit(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "budget_s": deadline - started,
        "stage_budgets_s": {
            name: budget.max_s for name, budget in stage_budgets(args, profile).items()
        },
    }
    out = Report(os.path.join(args.out, "device_check.json"), meta)
    compile_log = setup_jax(args, profile)
    from benchmarks.gpu import summary_table

    selected = [s for s in profiles.STAGES if s in args.stages.split(",")]
    budgets = stage_budgets(args, profile)
    early = {}  # transformers' parity process, started with the kernel checks
    for name in selected:
        if "engine_parity" in selected and name == "kernel_correctness":
            early["engine_parity"] = stage_module("engine_parity").start_transformers(profile)
        budget = budgets[name]
        allowed = min(budget.max_s, deadline - time.time())
        if allowed < budget.min_s:
            out.update(name, status="skipped", reason=f"{allowed:.0f} s left < {budget.min_s} s")
            log(f"stage {name}: skipped ({allowed:.0f} s left)")
            continue
        log(f"stage {name}: start (budget {allowed:.0f} s)")
        compile_log.label = name
        before = compile_log.snapshot()
        start = time.time()
        stage_budget = Budget(start + allowed)
        out.update(name, status="running", budget_s=allowed)
        ctx = Context(
            args, profile, lambda r, n=name: out.update(n, result=r), compile_log, out.data, early
        )
        compiles = {}
        try:
            if name in CHILD_STAGES and not device_memory.released():
                out.data["meta"]["released"] = released = device_memory.release()
                log(f"device memory handed back before the child stages: {released}")
            if name in CHILD_STAGES:
                result = run_child(ctx, name, stage_budget)
                compiles = {k: result.get(k) for k in ("compiles", "compile_s")}
            else:
                result = stage_module(name).run(ctx, stage_budget)
            status = result.pop("status", "ok")
            out.update(name, status=status, result=result)
        except Exception as error:
            out.update(name, status="error", error=f"{type(error).__name__}: {error}")
            out.stage(name)["traceback"] = traceback.format_exc()
            traceback.print_exc()
        compiles = compiles or compile_log.since(before)
        out.update(name, seconds=time.time() - start, **compiles)
        log(f"stage {name}: {out.stage(name)['status']} in {time.time() - start:.1f} s")
        if name == "kernel_correctness" and kernel_unusable(out.stage(name)):
            args.backend = "reference"
            out.data["meta"]["backend_fallback"] = "every kernel case raised: engine on reference"
            log("every kernel case raised: the engine stages run on the reference backend")
    for child, _ in early.values():  # its stage was skipped: nothing waits for it
        child.kill()
    out.data["meta"]["seconds"] = time.time() - started
    out.data["meta"]["compiles"] = compile_log.count
    out.data["meta"]["compile_s"] = compile_log.seconds
    out.data["meta"]["persistent_cache_hits"] = compile_log.cache_hits
    out.write()
    summary_table.print_tables(out.data)
    failed = [n for n, s in out.data["stages"].items() if s.get("status") in ("error", "timeout")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
