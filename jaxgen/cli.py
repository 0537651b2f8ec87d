"""The ``jaxgen`` command line: generate, serve, run-batch, bench, plan, convert."""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import sys
import time

# Start-up (importing jax, flax and the engine; building the model and engine) leaves millions
# of long-lived objects, and the collector's full passes over them cost about a second of CPU
# before the first token. Collection pauses while this module imports and while a command sets
# up (``setting_up``); what start-up built is then frozen out of later passes.
_COLLECTING_AT_IMPORT = gc.isenabled()
gc.disable()

from jaxgen.bench import cli as bench_cli  # noqa: E402
from jaxgen.bench.extra import MissingExtra  # noqa: E402
from jaxgen.config.knobs import (  # noqa: E402
    GGUF_FILE_HELP,
    MODEL_HELP,
    REVISION_HELP,
    add_engine_flags,
    engine_kwargs,
)
from jaxgen.llm import LLM  # noqa: E402
from jaxgen.loaders import resolve_model  # noqa: E402
from jaxgen.loaders.convert import convert  # noqa: E402
from jaxgen.planning import cli as planning_cli  # noqa: E402
from jaxgen.sampling_params import SamplingParams  # noqa: E402

if _COLLECTING_AT_IMPORT:
    gc.enable()


@contextlib.contextmanager
def setting_up():
    """No garbage collection while the block runs (a command's start-up); afterwards the
    objects it left are frozen (never scanned again: they live as long as the process) and
    collection resumes as it was."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.freeze()
            gc.enable()


def cmd_convert(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    out = convert(
        resolve_model(args.model, revision=args.revision, gguf_file=args.gguf_file),
        args.out,
        dtype=args.dtype,
        tensor_parallel_degree=args.tensor_parallel_degree,
        force=args.force,
    )
    print(
        f"converted {args.model or 'smollm2'} -> {out} ({args.dtype}) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    return 0


def add_convert_parser(sub) -> None:
    """Registers the ``convert`` subcommand."""
    parser = sub.add_parser("convert", help="save a model as an orbax checkpoint for fast start-up")
    parser.add_argument("model", help=f"alias (smollm2), {MODEL_HELP.split(', ', 1)[1]}")
    parser.add_argument("out", help="output directory")
    parser.add_argument("--revision", default=None, help=REVISION_HELP)
    parser.add_argument("--gguf-file", default=None, help=GGUF_FILE_HELP)
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    parser.add_argument(
        "--tensor-parallel-degree",
        type=int,
        default=1,
        help="validate for and save from this many devices' shards",
    )
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty OUT")
    parser.set_defaults(func=cmd_convert)


def cmd_generate(args: argparse.Namespace) -> int:
    prompts = args.prompt or ["Write a haiku about the sea."]
    knobs = engine_kwargs(args)
    if (
        knobs["max_rolling_batch_size"] is None
    ):  # the run's own sequences: a pool and steps that size
        knobs["max_rolling_batch_size"] = len(prompts)
    if knobs["sampler_executables"] == "auto":  # the run's requests are all known: only the
        knobs["sampler_executables"] = "per-batch"  # stages they use are compiled
    with setting_up():
        llm = LLM(args.model, revision=args.revision, gguf_file=args.gguf_file, **knobs)
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    if args.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs:
        if len(outs) > 1:
            print(f"--- {out.prompt!r}")
        print(out.text)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Replaces this process with the server's own command line (``python -m serving``): the
    server is the layer above the engine, so the engine's command line never imports it."""
    argv = [sys.executable, "-m", "serving", *args.serve_arguments]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 1  # not reached


def cmd_run_batch(args: argparse.Namespace) -> int:
    """Replaces this process with ``python -m serving.launch.run_batch``: OpenAI batch files run
    through the server's app in process (the server's layer, as ``serve``)."""
    argv = [sys.executable, "-m", "serving.launch.run_batch", *args.serve_arguments]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 1  # not reached


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    gen.add_argument("prompt", nargs="*", help="prompt text (several prompts are batched)")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="apply the model's chat template")
    # Unset, the most sequences at once is the number of prompts (the KV pool is sized to it).
    add_engine_flags(gen, defaults={"max_rolling_batch_size": None})
    gen.set_defaults(func=cmd_generate)

    serve = sub.add_parser(
        "serve",
        help="start the HTTP server (TGI + OpenAI routes); `jaxgen serve --help` lists its flags",
        add_help=False,
    )
    serve.set_defaults(func=cmd_serve)

    batch = sub.add_parser(
        "run-batch",
        help="run an OpenAI batch file (-i requests.jsonl -o results.jsonl); "
        "`jaxgen run-batch --help` lists its flags",
        add_help=False,
    )
    batch.set_defaults(func=cmd_run_batch)

    planning_cli.add_parser(sub)
    add_convert_parser(sub)
    bench_cli.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command in ("serve", "run-batch"):  # every flag after it is the server's to parse
        args.serve_arguments = rest
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError, MissingExtra) as e:
        print(f"jaxgen: error: {e}", file=sys.stderr)
        return 2


def run() -> None:
    """The ``jaxgen`` program (``main`` on ``sys.argv``). ``generate`` then ends the process
    without tearing the interpreter down: once its answer is printed and flushed nothing is
    left to do (its caches are written before it returns), and unwinding jax's and the model's
    objects took 0.3-0.6 s of a one-line answer on a 2-core CPU."""
    code = main()
    if sys.argv[1:2] != ["generate"]:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


if __name__ == "__main__":
    run()
