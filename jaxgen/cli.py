"""The ``jaxgen`` command line: generate, serve, bench, plan, convert."""

from __future__ import annotations

import argparse
import sys

from jaxgen.backends import BACKENDS
from jaxgen.quantization import QUANTIZATION_CHOICES
from jaxgen.quantization.kv_cache import KV_CACHE_DTYPES


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=None, help="alias, HF directory, .gguf or converted dir")
    parser.add_argument("--dtype", default="float32", help="float32, bfloat16, float16 or auto")
    parser.add_argument(
        "--batching", default="paged", choices=["none", "static", "dynamic", "continuous", "paged"]
    )
    parser.add_argument("--max-rolling-batch-size", type=int, default=64)
    parser.add_argument("--max-rolling-batch-prefill-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-batch-delay", type=float, default=0.1, help="seconds")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument(
        "--kv-cache-memory",
        type=float,
        default=None,
        help="bytes (> 1) or a fraction of free device memory (<= 1)",
    )
    parser.add_argument("--attention-backend", default="auto", choices=BACKENDS)
    parser.add_argument(
        "--quantization",
        default="auto",
        choices=QUANTIZATION_CHOICES,
        help="weights: auto (a GGUF stays quantised, a float checkpoint float), none, or "
        "int8 / int4 / fp8 quantised at load",
    )
    parser.add_argument(
        "--kv-cache-dtype", default="auto", choices=KV_CACHE_DTYPES, help="KV pool values"
    )


def engine_kwargs(args: argparse.Namespace) -> dict:
    """``LLM``/``AsyncLLM`` keyword arguments from parsed engine flags."""
    kv = args.kv_cache_memory
    if kv is not None:
        kv = int(kv) if kv > 1 else float(kv)
    return dict(
        dtype=args.dtype,
        batching=args.batching,
        max_rolling_batch_size=args.max_rolling_batch_size,
        max_rolling_batch_prefill_tokens=args.max_rolling_batch_prefill_tokens,
        batch_size=args.batch_size,
        max_batch_delay=args.max_batch_delay,
        page_size=args.page_size,
        max_model_len=args.max_model_len,
        kv_cache_memory=kv,
        attention_backend=args.attention_backend,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
    )


def cmd_generate(args: argparse.Namespace) -> int:
    from jaxgen import LLM, SamplingParams

    llm = LLM(args.model, **engine_kwargs(args))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    prompts = args.prompt or ["Write a haiku about the sea."]
    if args.chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    for out in outs:
        if len(outs) > 1:
            print(f"--- {out.prompt!r}")
        print(out.text)
    return 0


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
    _add_engine_args(gen)
    gen.set_defaults(func=cmd_generate)

    _add_optional_commands(sub)
    return parser


def _add_optional_commands(sub) -> None:
    """Subcommands whose modules live elsewhere (server, benchmarks, planner, converter)."""
    try:
        from serving.cli import add_serve_arguments, run_serve
    except ImportError:
        pass
    else:
        serve = sub.add_parser("serve", help="start the HTTP server (TGI + OpenAI routes)")
        add_serve_arguments(serve)
        serve.set_defaults(func=run_serve)
    for module in ("jaxgen.planner", "jaxgen.convert", "jaxgen.bench.cli"):
        try:
            mod = __import__(module, fromlist=["add_parser"])
        except ImportError:
            continue
        mod.add_parser(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, FileNotFoundError) as e:
        print(f"jaxgen: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
