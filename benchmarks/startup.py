"""Start-up: the README's first command, ``jaxgen generate --chat "What is the capital of
France?"`` on the default model, in fresh processes.

Usage (from the repository root; ~1 min per run on a busy 2-core CPU):
  python benchmarks/startup.py [--runs 3] [--breakdown-runs 2] [--cache-dir DIR] [--json FILE]
  python benchmarks/startup.py --mode llm [--runs 3]    # ``jaxgen.LLM()`` ready
  python benchmarks/startup.py --mode serve [--runs 3]  # ``jaxgen serve`` healthy
  python benchmarks/startup.py --cache-dir DIR --keep-cache --breakdown-runs 0  # warm runs only

``--runs`` runs of the command itself (each a new process; the first with an empty
``JAXGEN_CACHE_DIR``, so it builds the native CPU kernels and compiles every executable; the
rest warm): wall seconds from launch to exit, user + system CPU seconds and peak RSS of the
process (``os.wait4``), and the answer. ``--breakdown-runs`` runs of the same job in a child
that times each phase from its launch (first again with an empty cache): ``import``
(``jaxgen.cli``, jax and flax), ``load`` (config, weights, tokenizer), ``engine`` (KV pool,
backend, parameter packing), ``first_token`` (the prefill step, its compiles included; its end
is the time to first token) and ``generate`` (the decode steps). ``--python`` and
``--pythonpath`` run another checkout's code with the same script (a before/after comparison).

``--mode llm``: ``--runs`` processes that build ``jaxgen.LLM()`` on the default model and exit;
``ready_s`` is launch to the constructor's return (a notebook cell's wait). ``--mode serve``:
``--runs`` servers (``jaxgen serve``, its usual precompile) polled on ``GET /health`` every
50 ms; ``healthy_s`` is launch to the first 200, then the server is stopped (SIGTERM). Both
first with an empty cache, then warm, with wall seconds, CPU seconds and peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PROMPT = "What is the capital of France?"
COMMAND = ["generate", "--chat", PROMPT]


def run_child(argv: list[str], env: dict) -> dict:
    """Runs ``argv``; its wall seconds, CPU seconds, peak RSS (MB) and output."""
    start = time.perf_counter()
    env = {**env, "STARTUP_LAUNCH": repr(time.time())}
    with tempfile.TemporaryFile() as err_file:
        process = subprocess.Popen(  # cwd: not a checkout, so PYTHONPATH picks the code
            argv, env=env, stdout=subprocess.PIPE, stderr=err_file, cwd=tempfile.gettempdir()
        )
        out = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)  # this child's own CPU time and peak RSS
        process.returncode = os.waitstatus_to_exitcode(status)
        err_file.seek(0)
        err = err_file.read()
    wall = time.perf_counter() - start
    if process.returncode != 0:
        raise RuntimeError(f"{argv} failed ({process.returncode}):\n{err.decode()[-3000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "stdout": out.decode().strip(),
    }


def breakdown() -> None:
    """The child of ``--breakdown-runs``: the CLI's job, phase by phase; prints one JSON line."""
    launch = float(os.environ["STARTUP_LAUNCH"])
    marks = {}
    import jax  # noqa: F401  (the CLI imports it through jaxgen.cli)

    import jaxgen.cli  # noqa: F401
    from jaxgen import LLM, SamplingParams
    from jaxgen.loaders import load_model

    try:  # as the command line does before it loads (a checkout without the module has none)
        from jaxgen.caches.compile_cache import enable_compile_cache

        enable_compile_cache()
    except ImportError:
        pass
    marks["import"] = time.time()
    # As the command line sets up (a checkout without ``setting_up`` collects garbage as usual).
    with getattr(jaxgen.cli, "setting_up", contextlib.nullcontext)():
        loaded = load_model(None)
        marks["load"] = time.time()
        # As `jaxgen generate` with one prompt (before it sized the engine to it: 64).
        llm = LLM(loaded, max_rolling_batch_size=int(os.environ.get("STARTUP_MAX_SEQS", "1")))
        marks["engine"] = time.time()
    tokenizer = llm.get_tokenizer()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    token_ids = tokenizer.encode(prompt, add_special_tokens=False)
    llm.engine.add_request("0", prompt, token_ids, SamplingParams(max_tokens=64, temperature=0))
    text = ""
    while llm.engine.has_unfinished():
        for out in llm.engine.step():
            if "first_token" not in marks and out.outputs and out.outputs[0].token_ids:
                marks["first_token"] = time.time()
            text = out.outputs[0].text
    marks["generate"] = time.time()
    phases, previous = {}, launch
    for name, stamp in marks.items():
        phases[name] = round(stamp - previous, 2)
        previous = stamp
    stats = llm.stats()
    print(
        json.dumps(
            {
                "phases_s": phases,
                "time_to_first_token_s": round(marks["first_token"] - launch, 2),
                "total_s": round(marks["generate"] - launch, 2),
                "load_seconds": round(loaded.load_seconds, 2)
                if hasattr(loaded, "load_seconds")
                else None,
                "compiles": stats.get("compiles"),
                "compile_cache_hits": stats.get("compile_cache_hits"),
                "kv_pool_bytes": stats.get("kv_pool_bytes"),
                "text": text,
            }
        )
    )


def llm_ready() -> None:
    """The child of ``--mode llm``: builds ``jaxgen.LLM()``; prints one JSON line."""
    launch = float(os.environ["STARTUP_LAUNCH"])
    from jaxgen import LLM

    llm = LLM()
    ready = time.time()
    print(
        json.dumps(
            {"ready_s": round(ready - launch, 2), "kv_pool_bytes": llm.stats().get("kv_pool_bytes")}
        )
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_healthy(argv: list[str], env: dict, timeout_s: float = 600.0) -> dict:
    """Starts the server ``argv`` (on a free port), polls ``/health`` until 200, stops it:
    seconds to healthy, wall, CPU seconds and peak RSS (MB) of the server process."""
    port = free_port()
    start = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            [*argv, "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=log,
            cwd=tempfile.gettempdir(),
        )
        healthy = None
        while healthy is None and process.poll() is None:
            if time.perf_counter() - start > timeout_s:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        healthy = time.perf_counter() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - start
        if healthy is None:
            log.seek(0)
            raise RuntimeError(f"{argv} never became healthy:\n{log.read().decode()[-3000:]}")
    return {
        "healthy_s": round(healthy, 2),
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of the command (first cold)")
    parser.add_argument("--breakdown-runs", type=int, default=2, help="phase-timed runs")
    parser.add_argument("--cache-dir", default=None, help="JAXGEN_CACHE_DIR (default: a temp dir)")
    parser.add_argument(
        "--keep-cache",
        action="store_true",
        help="keep --cache-dir's contents (every run warm once it is filled) instead of "
        "emptying it before each series",
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run")
    parser.add_argument("--pythonpath", default=None, help="PYTHONPATH for the runs (a checkout)")
    parser.add_argument("--label", default="", help="a name for these runs in the output")
    parser.add_argument("--json", default=None, help="append the results as one JSON line here")
    parser.add_argument(
        "--mode",
        choices=("generate", "llm", "serve"),
        default="generate",
        help="what starts: the README's command (default), LLM() ready, or serve healthy",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-llm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        breakdown()
        return
    if args.child_llm:
        llm_ready()
        return
    if args.keep_cache and args.cache_dir is None:
        parser.error("--keep-cache needs --cache-dir (a new temporary directory starts empty)")
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="jaxgen-startup-")
    env = dict(os.environ, JAXGEN_CACHE_DIR=cache_dir, PYTHONUNBUFFERED="1")
    # As a user's Python runs: writing bytecode (a sandbox or CI may turn it off, and then every
    # module of jaxgen is compiled from source at each start, ~0.4 s on a 2-core CPU).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if args.pythonpath:
        env["PYTHONPATH"] = args.pythonpath
    # The ``jaxgen`` program as installed (``run``; a checkout from before it: ``main``).
    program = (
        "import sys, jaxgen.cli as c; (getattr(c, 'run', None) or (lambda: sys.exit(c.main())))()"
    )
    cli = [args.python, "-c", program]
    child = [args.python, os.path.abspath(__file__), "--child"]
    code = subprocess.run(
        [args.python, "-c", "import jaxgen, os; print(os.path.dirname(jaxgen.__file__))"],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"{args.label or 'runs'}: jaxgen from {code}", flush=True)
    results = {
        "label": args.label,
        "jaxgen": code,
        "mode": args.mode,
        "command": ["jaxgen", *COMMAND],
        "runs": [],
        "breakdown": [],
    }
    series = (
        ("runs", args.runs, cli + COMMAND),
        ("breakdown", args.breakdown_runs, child),
    )
    if args.mode == "llm":
        results["command"] = ["python", "-c", "jaxgen.LLM()"]
        series = (("runs", args.runs, [args.python, os.path.abspath(__file__), "--child-llm"]),)
    elif args.mode == "serve":
        results["command"] = ["jaxgen", "serve"]
        series = (("runs", args.runs, cli + ["serve"]),)
    for kind, count, argv in series:
        if not args.keep_cache:  # each series starts with an empty cache
            shutil.rmtree(cache_dir, ignore_errors=True)
        for index in range(count):
            if args.mode == "serve":
                result = serve_healthy(argv, env)
            else:
                result = run_child(argv, env)
            if kind == "breakdown" or args.mode == "llm":
                result.update(json.loads(result.pop("stdout").splitlines()[-1]))
            result["cache"] = "empty" if index == 0 and not args.keep_cache else "warm"
            results[kind].append(result)
            print(json.dumps({"label": args.label, kind: result}), flush=True)
    if args.cache_dir is None:
        shutil.rmtree(cache_dir, ignore_errors=True)
    if args.json:
        with open(args.json, "a") as handle:
            handle.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
