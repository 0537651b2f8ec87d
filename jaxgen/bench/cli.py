"""``jaxgen bench {offline,sweep,compare,peers}``: flags and entry points. What each command
runs is in ``jaxgen.bench.commands``, imported when one runs: ``jaxgen generate`` builds this
parser too, and should not import the benchmarks' clients, engines and plots to do so."""

from __future__ import annotations

import argparse
import os

from jaxgen.bench.workloads import add_workload_args
from jaxgen.config.knobs import add_engine_flags

DEFAULT_OUT = "bench-results"


def _command(name: str):
    """The entry point ``name`` of ``jaxgen.bench.commands``, imported when it runs."""

    def run(args: argparse.Namespace) -> int:
        from jaxgen.bench import commands
        from jaxgen.loaders import is_hub_id, resolve_model

        if is_hub_id(args.model) or args.revision is not None or args.gguf_file is not None:
            # A hub id is downloaded once, here: the engine, the workload's tokenizer and the
            # peers measured on the same file then all read the local files.
            args.model = resolve_model(args.model, revision=args.revision, gguf_file=args.gguf_file)
        return getattr(commands, name)(args)

    run.__name__ = name
    return run


cmd_offline = _command("cmd_offline")
cmd_sweep = _command("cmd_sweep")
cmd_compare = _command("cmd_compare")
cmd_peers = _command("cmd_peers")


def add_parser(subparsers) -> None:
    """Adds ``bench`` and its subcommands to the ``jaxgen`` command line."""
    bench = subparsers.add_parser("bench", help="benchmarks: offline, sweep, compare, peers")
    sub = bench.add_subparsers(dest="bench_command", required=True, parser_class=OptionsParser)

    _subcommand(sub, "offline", "offline throughput of LLM.generate", cmd_offline)
    sweep = _subcommand(
        sub, "sweep", "latency-throughput sweep over concurrency or rate", cmd_sweep
    )
    sweep.add_argument(
        "--concurrency", default="1,2,4,8,16,32,64", help="closed-loop client counts, e.g. 1,2,4,8"
    )
    sweep.add_argument(
        "--request-rate",
        default=None,
        help="open loop instead: request rates (req/s) to sweep, e.g. 1,2,4,inf",
    )
    sweep.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of inter-arrival gaps (1 = Poisson)",
    )
    sweep.add_argument(
        "--max-concurrency", type=int, default=None, help="open loop: most requests in flight"
    )
    sweep.add_argument("--url", default=None, help="benchmark a running server (OpenAI routes)")
    sweep.add_argument("--served-model-name", default=None, help="model name sent to --url")
    sweep.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        help="machine price per hour: adds cost per 1M output tokens",
    )
    sweep.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="datasheet peak TFLOP/s for the predicted knee",
    )
    sweep.add_argument(
        "--mem-bandwidth-gbs",
        type=float,
        default=None,
        help="datasheet memory bandwidth (GB/s) for the predicted knee",
    )
    sweep.add_argument(
        "--no-roofline",
        action="store_true",
        help="skip the matmul/matvec measurement behind the predicted knee",
    )

    # Every mode runs on the same KV budget: --kv-cache-memory, else what continuous reserves.
    compare = _subcommand(
        sub,
        "compare",
        "batching strategies on the same workloads",
        cmd_compare,
        workload=False,
        skip=("batching",),
        defaults={"max_rolling_batch_size": 32, "max_model_len": 512},
    )
    compare.add_argument("--modes", default="none,static,dynamic,continuous,paged")
    compare.add_argument("--scenario", default="all", choices=["1", "2", "3", "all"])
    compare.add_argument("--num-prompts", type=int, default=64)
    compare.add_argument("--request-rate", type=float, default=2.0, help="scenario 3 (req/s)")
    compare.add_argument("--burstiness", type=float, default=1.0, help="scenario 3")
    compare.add_argument("--seed", type=int, default=0)

    peers = _subcommand(sub, "peers", "transformers and llama.cpp on the same workload", cmd_peers)
    peers.add_argument(
        "--peers",
        default="transformers,transformers-continuous,llama-cpp-python,llama.cpp",
        help="which peers to run",
    )
    peers.add_argument(
        "--peer-batch-size",
        "--hf-batch-size",
        dest="peer_batch_size",
        type=int,
        default=32,
        help="transformers static batch size",
    )
    peers.add_argument("--llama-cpp-bin", default=None, help="folder with llama-batched-bench")
    peers.add_argument("--llama-cpp-types", default="F32,F16", help="requantisations to run")
    peers.add_argument("--llama-cpp-work-dir", default="/tmp/jaxgen-bench-llamacpp")


class OptionsParser(argparse.ArgumentParser):
    """An argument parser that lists the options added to it (``options``: argparse keeps its
    own list private), so a command can rebuild its command line from the parsed values."""

    def __init__(self, *args, **kwargs):
        self.options: list[argparse.Action] = []  # before argparse adds its --help
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.options.append(action)
        return action


def _subcommand(sub, name: str, summary: str, func, *, workload: bool = True, **engine_flags):
    """A ``jaxgen bench`` subcommand with the engine flags, ``--out``, ``--no-warmup``,
    ``--quiet`` and (``workload``) the workload flags."""
    parser = sub.add_parser(name, help=summary)
    add_engine_flags(parser, **engine_flags)
    parser.add_argument("--out", default=os.path.join(DEFAULT_OUT, name), help="results folder")
    parser.add_argument(
        "--no-warmup", action="store_true", help="skip the warm-up pass and precompiling"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    if workload:
        add_workload_args(parser)
    parser.set_defaults(func=func, parser=parser)
    return parser
