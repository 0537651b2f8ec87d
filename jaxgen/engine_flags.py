"""Engine knobs as command-line flags, shared by ``jaxgen generate`` and ``jaxgen bench``."""

from __future__ import annotations

import argparse

from jaxgen.backends import BACKENDS


def add_engine_flags(parser: argparse.ArgumentParser) -> None:
    """Adds ``--model``, ``--dtype`` and the engine knobs' flags to ``parser``."""
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
    )
