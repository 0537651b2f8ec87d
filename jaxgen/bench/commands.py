"""What each ``jaxgen bench`` command runs (its flags: ``jaxgen.bench.cli``)."""

from __future__ import annotations

import argparse
import copy
import os
import shlex
import sys

import jax.numpy as jnp

from jaxgen.async_llm import AsyncLLM
from jaxgen.bench import clients, plots, results, roofline
from jaxgen.bench.compare import MODES, run_compare, write_compare
from jaxgen.bench.offline import OFFLINE_COLUMNS, run_offline
from jaxgen.bench.peers_run import run_peers
from jaxgen.bench.sweep import parse_levels, run_sweep, write_sweep
from jaxgen.bench.workloads import tokenizer_for, workload_from_args
from jaxgen.config.knobs import engine_kwargs
from jaxgen.llm import LLM
from jaxgen.loaders import load_model


def command_of(args: argparse.Namespace) -> str:
    """The command line as typed, or rebuilt from ``args`` when called as a library."""
    argv = sys.argv
    if "bench" in argv[1:3]:
        return results.command_line(argv)
    parts = ["jaxgen", "bench", args.bench_command]
    for action in args.parser.options:
        if not action.option_strings or action.dest in ("help",):
            continue
        value = getattr(args, action.dest, None)
        if value == action.default:
            continue
        flag = (
            action.option_strings[-1]
            if len(action.option_strings[-1]) > 2
            else action.option_strings[0]
        )
        parts += [flag] if action.nargs == 0 else [flag, str(value)]
    return shlex.join(parts)


def _engine_kwargs(args: argparse.Namespace) -> dict:
    kwargs = engine_kwargs(args)
    kwargs["precompile"] = not args.no_warmup  # every step shape compiled before measuring
    return kwargs


def _print_table(path: str) -> None:
    with open(path) as f:
        print(f.read())


def cmd_offline(args: argparse.Namespace) -> int:
    env = results.environment(command_of(args))
    knobs = _engine_kwargs(args)
    llm = LLM(args.model, **knobs)
    workload = workload_from_args(args, llm.get_tokenizer())
    result = run_offline(llm, workload, warmup=not args.no_warmup, use_tqdm=not args.quiet)
    rows = [r for r in (result["cold"], result["warm"]) if r is not None]
    for row in rows:
        row["batching"] = args.batching
    _, md = results.write_results(
        args.out,
        env,
        rows,
        title="jaxgen bench offline",
        columns=OFFLINE_COLUMNS,
        extra={
            "model": llm.loaded.source,
            "load_seconds": llm.loaded.load_seconds,
            "engine": knobs,
            "workload": workload.describe(),
        },
        notes=[
            f"Model {llm.loaded.source}; workload {workload.name}; batching {args.batching}.",
            "output tok/s = output tokens / wall-clock seconds of LLM.generate (prefill "
            "included); the warm pass runs after the cold one with the prefix cache emptied.",
            "KV waste = 1 - kv_tokens_peak / (kv_pages_peak x page_size); host share of step "
            "= 1 - (time in the jitted step until ready) / engine step time.",
        ],
    )
    _print_table(md)
    return 0


def _workload_factory(args: argparse.Namespace, tokenizer):
    def make(count: int, seed: int):
        level_args = copy.copy(args)
        level_args.num_prompts, level_args.seed = count, seed
        return workload_from_args(level_args, tokenizer)

    return make


def cmd_sweep(args: argparse.Namespace) -> int:
    plots.check_available()
    env = results.environment(command_of(args))
    levels = parse_levels(args.concurrency)
    rates = parse_levels(args.request_rate, float) if args.request_rate else None
    engine = None
    if args.url:
        tokenizer = tokenizer_for(args.model)
        backend = clients.HTTPBackend(args.url, args.served_model_name)
        max_batch, bytes_per_param, kv_tokens = None, 4.0, None
    else:
        llm = LLM(args.model, **_engine_kwargs(args))
        tokenizer = llm.get_tokenizer()
        engine = AsyncLLM(engine=llm.engine)
        backend = clients.EngineBackend(engine)
        stats = llm.stats()
        max_batch = llm.engine.batching.num_slots
        bytes_per_param = float(jnp.dtype(llm.loaded.dtype).itemsize)
        kv_tokens = stats["kv_pages_total"] * stats["page_size"]
    make_workload = _workload_factory(args, tokenizer)
    sample = make_workload(args.num_prompts, args.seed)
    measured = None if args.no_roofline else roofline.measure_machine()
    prediction = roofline.predict_knee(
        kv_pool_tokens=kv_tokens,
        tokens_per_sequence=(sample.input_tokens + sample.output_tokens) / len(sample.requests),
        max_batch=max_batch,
        bytes_per_param=bytes_per_param,
        measured=measured,
        peak_flops=args.peak_tflops * 1e12 if args.peak_tflops else None,
        bandwidth=args.mem_bandwidth_gbs * 1e9 if args.mem_bandwidth_gbs else None,
    )
    try:
        rows = run_sweep(
            backend,
            make_workload,
            rates or levels,
            open_loop=rates is not None,
            max_concurrency=args.max_concurrency,
            num_prompts=args.num_prompts,
            burstiness=args.burstiness,
            seed=args.seed,
            warmup=not args.no_warmup,
            price_per_hour=args.price_per_hour,
            progress=not args.quiet,
        )
    finally:
        if engine is not None:
            engine.shutdown()
    knee = write_sweep(
        args.out,
        env,
        rows,
        workload=sample,
        backend_name=backend.name,
        open_loop=rates is not None,
        prediction=prediction,
    )
    _print_table(os.path.join(args.out, "results.md"))
    print(f"knee: {knee}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    plots.check_available()
    env = results.environment(command_of(args))
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise ValueError(f"--modes must list some of {', '.join(MODES)}, got {args.modes!r}")
    scenarios = [1, 2, 3] if args.scenario == "all" else [int(args.scenario)]
    loaded = load_model(args.model, dtype=args.dtype)
    knobs = _engine_kwargs(args)
    del knobs["dtype"]  # the model is loaded once, for every mode
    settings = dict(
        num_prompts=args.num_prompts,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        seed=args.seed,
        **knobs,
    )
    rows = run_compare(
        loaded, modes, scenarios, progress=not args.quiet, warmup=not args.no_warmup, **settings
    )
    write_compare(
        args.out, env, rows, settings={"model": loaded.source, "modes": modes, **settings}
    )
    _print_table(os.path.join(args.out, "results.md"))
    return 0


def cmd_peers(args: argparse.Namespace) -> int:
    plots.check_available()
    env = results.environment(command_of(args))
    run_peers(args, env, _engine_kwargs(args))
    _print_table(os.path.join(args.out, "results.md"))
    return 0
