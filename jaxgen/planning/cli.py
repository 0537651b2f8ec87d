"""``jaxgen plan``: its flags and what each form prints."""

from __future__ import annotations

import dataclasses
import json
import sys

import jax
import jax.numpy as jnp

from jaxgen.backends.device_choice import DeviceDescription, auto_dtype
from jaxgen.config.engine_config import BACKENDS
from jaxgen.engine.decoding.speculative.plan import plan_verify
from jaxgen.loaders import model_config_only
from jaxgen.planning.capacity import DTYPE_BYTES, WEIGHT_BYTES_PER_PARAM, make_plan
from jaxgen.planning.capacity import auto_weight_bytes as gguf_kept_bytes
from jaxgen.planning.gpu_targets import GPU_TARGETS
from jaxgen.planning.hardware import DEVICES, overridden
from jaxgen.planning.tp_sweep import divisor_degrees, slice_spec, sweep_lines, sweep_tp
from jaxgen.quantization import kv_cache


def cmd_plan(args) -> int:
    if args.fit and args.target not in GPU_TARGETS:
        raise ValueError(f"--fit needs a GPU --target ({', '.join(GPU_TARGETS)})")
    if args.sweep_tp:
        if args.target is None or args.target == "cuda" or args.target in GPU_TARGETS:
            raise ValueError("--sweep-tp needs --target (a TPU slice such as v5e-8)")
        return cmd_sweep_tp(args)
    if args.target is not None:
        return cmd_plan_target(args)
    if args.compile:
        raise ValueError("--compile needs --target (a TPU slice such as v5e-4)")
    if args.attention_backend != "auto":
        raise ValueError("--attention-backend is for a GPU --target's compile")
    config = model_config_only(args.model)
    args.dtype = capacity_dtype(args.dtype, args.device, config)
    device = overridden(
        DEVICES[args.device], args.device_memory, args.bandwidth, args.peak_flops, args.dtype
    )
    plan = make_plan(
        config,
        device=device,
        dtype=args.dtype,
        context=args.context,
        page_size=args.page_size,
        memory_utilization=args.memory_utilization,
        tensor_parallel_degree=args.tensor_parallel_degree or 1,
        quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        max_loras=args.max_loras if args.enable_lora else 0,
        max_lora_rank=args.max_lora_rank,
        weight_bytes=gguf_kept_bytes(args.quantization, args.model, args.dtype),  # a GGUF's
    )
    print(
        f"model: {args.model or 'smollm2 (default)'}  device: {device.name} x"
        f"{args.tensor_parallel_degree or 1}  dtype: {args.dtype}"
    )
    print("\n".join(plan.lines(args.context, args.page_size)))
    if args.num_speculative_tokens is not None:
        verify = plan_verify(
            num_speculative_tokens=args.num_speculative_tokens,
            max_num_seqs=args.max_num_seqs,
            vocab_size=config.vocab_size,
            page_size=args.page_size,
            context=args.context,
            num_pages=plan.num_pages,
            critical_batch_size=plan.critical_batch_size,
        )
        print("\n".join(verify.lines(args.context, args.max_num_seqs)))
    return 0


def capacity_dtype(dtype: str | None, device: str, config) -> str:
    """The capacity plan's dtype: ``--dtype`` (bfloat16 when not given); ``auto``: what the
    engine's ``dtype="auto"`` loads on ``--device`` (float16 on a T4, float32 on a CPU)."""
    if dtype != "auto":
        return dtype or "bfloat16"
    if device in GPU_TARGETS:
        description = GPU_TARGETS[device].device()
    else:
        description = DeviceDescription("tpu" if device.startswith("tpu-") else "cpu")
    return jnp.dtype(auto_dtype(description, config.model_type)).name


def cmd_plan_target(args) -> int:
    """``jaxgen plan --target SLICE --compile``: the engine's decode step compiled for a TPU
    (or for a GPU: ``--target t4``)."""
    gpus = ", ".join(GPU_TARGETS)
    if args.attention_kernel_options is not None and args.target not in GPU_TARGETS:
        raise ValueError(f"--attention-kernel-options is for a GPU --target ({gpus})")
    if args.attention_backend != "auto" and args.target not in GPU_TARGETS:
        raise ValueError(
            f"--attention-backend is for a GPU --target ({gpus}); a TPU's is pallas-tpu"
        )
    if args.quantization == "auto":
        raise ValueError(
            "--quantization auto (a GGUF's kept bytes) is for the capacity plan and --sweep-tp; "
            "a --target compile takes none, int8, int4 or fp8"
        )
    if args.target in GPU_TARGETS:
        return cmd_plan_gpu(args)
    # Ahead-of-time compiling imports the Pallas backends: here, not when the parser is built.
    from jaxgen.planning.ahead_of_time import (
        compile_decode_step,
        config_from_path,
        lower_decode_step_for_cuda,
        report_lines,
    )

    if args.target == "cuda":
        if args.num_scheduler_steps != 1:
            raise ValueError("--num-scheduler-steps is for a TPU --target's compile, not cuda")
        result = lower_decode_step_for_cuda(
            config_from_path(args.model),
            dtype=jnp.dtype(explicit_dtype(args.dtype) or jnp.bfloat16),
            max_model_len=args.max_model_len or args.context,
            max_num_seqs=args.max_num_seqs,
            page_size=args.page_size,
            tensor_parallel_degree=args.tensor_parallel_degree or 1,
            kv_cache_dtype=args.kv_cache_dtype,
        )
        if args.json:
            print(json.dumps(result))
            return 0
        print(f"model: {args.model or 'smollm2 (default)'}")
        print(f"lowered for CUDA in {result['lower_seconds']:.1f} s (lowered only: not compiled)")
        print(f"attention backend   {result['attention_backend']}")
        print(f"KV cache dtype      {result['kv_cache_dtype']}")
        if result["tensor_parallel_degree"] > 1:
            print(
                f"tensor parallel     {result['tensor_parallel_degree']} devices, "
                f"{result['shard_map_regions']} shard_map regions (one per layer)"
            )
        for name, count in sorted(result["kernel_calls"].items()):
            print(f"  Pallas kernel     {name} x {count} (one call per layer)")
        for name in result["triton_kernels"]:
            print(f"    Triton kernel   {name}")
        for name, count in sorted(result["custom_calls"].items()):
            print(f"  custom call       {name} ({count} kernel bodies)")
        return 0
    result = compile_decode_step(
        config_from_path(args.model),
        args.target,
        **compile_arguments(args),
        tensor_parallel_degree=args.tensor_parallel_degree,
        quantization=args.quantization,
        num_scheduler_steps=args.num_scheduler_steps,
        num_speculative_tokens=args.num_speculative_tokens,
    )
    return print_compiled(args, result, report_lines)


def compile_arguments(args) -> dict:
    """The flags a TPU target's and a GPU target's compile both take (``--dtype`` not given or
    ``auto``: None, what the engine's ``auto`` picks on the target)."""
    return dict(
        dtype=explicit_dtype(args.dtype),
        max_model_len=args.max_model_len or args.context,
        max_num_seqs=args.max_num_seqs,
        page_size=args.page_size,
        kv_cache_memory=args.kv_cache_memory,
        kv_cache_dtype=args.kv_cache_dtype,
    )


def explicit_dtype(dtype: str | None):
    """``--dtype`` as a dtype, or None for ``auto`` (and for no ``--dtype``)."""
    return None if dtype in (None, "auto") else jnp.dtype(dtype)


def print_compiled(args, result: dict, lines) -> int:
    """A compile's ``result`` as JSON (``--json``) or as its report ``lines``."""
    if args.json:
        print(json.dumps(result))
    else:
        print(f"model: {args.model or 'smollm2 (default)'}")
        print("\n".join(lines(result)))
    return 0


def cmd_plan_gpu(args) -> int:
    """``jaxgen plan --target t4``: the decode step compiled for the GPU by XLA's GPU compiler,
    on this host (``jaxgen.planning.gpu_compile``), with the backend and dtype the engine's
    ``auto`` picks there unless ``--attention-backend`` / ``--dtype`` say otherwise."""
    # On a host without a GPU, jax's CUDA plugin registers only if jax does not look for one.
    if not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")
    from jaxgen.planning.ahead_of_time import config_from_path
    from jaxgen.planning.gpu_compile import compile_decode_step_for_gpu, gpu_report_lines

    if args.num_scheduler_steps != 1 or args.num_speculative_tokens is not None:
        raise ValueError(
            "--num-scheduler-steps and --num-speculative-tokens are for a TPU --target"
        )
    if args.fit:
        return cmd_plan_gpu_fit(args, config_from_path(args.model))
    options = args.attention_kernel_options
    try:
        options = None if options is None else json.loads(options)
    except json.JSONDecodeError as error:
        raise ValueError(f"--attention-kernel-options must be a JSON object: {error}") from None
    if options is not None and not isinstance(options, dict):
        raise ValueError(f"--attention-kernel-options must be a JSON object, got {options!r}")
    result = compile_decode_step_for_gpu(
        config_from_path(args.model),
        args.target,
        **compile_arguments(args),
        attention_backend=args.attention_backend,
        quantization=args.quantization,
        attention_kernel_options=options,
        tensor_parallel_degree=args.tensor_parallel_degree or 1,
    )
    return print_compiled(args, result, gpu_report_lines)


def cmd_plan_gpu_fit(args, config) -> int:
    """``jaxgen plan --target t4 --fit``: whether an engine of these sizes fits the GPU (weights,
    pool, the largest step and the sampler compiled for it: ``jaxgen.planning.gpu_fit``)."""
    from jaxgen.planning.gpu_fit import EngineSizes, plan_gpu_fit

    sizes = EngineSizes(
        max_model_len=args.max_model_len or args.context,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory=args.kv_cache_memory,
        page_size=args.page_size,
    )
    fit = plan_gpu_fit(
        config,
        args.target,
        [sizes],
        dtype=explicit_dtype(args.dtype),
        attention_backend=args.attention_backend,
        memory_bytes=int(args.device_memory) if args.device_memory else None,
        extrapolate=args.extrapolate_layers,
    )
    if args.json:
        print(json.dumps({**dataclasses.asdict(fit), "peak": fit.peak, "fits": fit.fits}))
    else:
        print(f"model: {args.model or 'smollm2 (default)'}")
        print("\n".join(fit.lines()))
    return 0


def cmd_sweep_tp(args) -> int:
    """``jaxgen plan --target SLICE --sweep-tp [--compile]``: replicas against tensor
    parallelism on the slice (see ``jaxgen.planning.tp_sweep``)."""
    from jaxgen.planning.ahead_of_time import compile_decode_step, config_from_path

    config = config_from_path(args.model)
    compiled = {}
    if args.compile:
        for degree in divisor_degrees(slice_spec(args.target).num_chips, config):
            try:
                compiled[degree] = compile_decode_step(
                    config,
                    args.target,
                    dtype=explicit_dtype(args.dtype),
                    max_model_len=args.context,
                    max_num_seqs=args.max_num_seqs,
                    page_size=args.page_size,
                    kv_cache_memory=args.kv_cache_memory,
                    tensor_parallel_degree=degree,
                )
            except ValueError as error:  # the weights (or one sequence) do not fit a chip
                print(f"TP {degree}: not compiled: {error}", file=sys.stderr)
    dtype = "bfloat16" if explicit_dtype(args.dtype) is None else args.dtype
    kept = gguf_kept_bytes(args.quantization, args.model, dtype)  # a GGUF's under auto, else None
    per_param = WEIGHT_BYTES_PER_PARAM.get(args.quantization, kept and kept / config.num_params)
    sweep = sweep_tp(
        config,
        args.target,
        dtype=dtype,
        weight_bytes_per_param=per_param,
        weights_label=None if per_param is None else args.quantization,
        context=args.context,
        page_size=args.page_size,
        memory_utilization=args.memory_utilization,
        latency_target_s=args.latency_target_ms / 1e3,
        collective_latency_s=args.collective_latency_us / 1e6,
        compiled=compiled,
    )
    if args.json:
        print(json.dumps(sweep.to_dict()))
    else:
        print(f"model: {args.model or 'smollm2 (default)'}")
        print("\n".join(sweep_lines(sweep)))
    return 0


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("plan", help="KV capacity and critical batch size")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="h100", choices=sorted(DEVICES))
    parser.add_argument("--device-memory", type=float, default=None, help="bytes per device")
    parser.add_argument("--bandwidth", type=float, default=None, help="bytes/s per device")
    parser.add_argument("--peak-flops", type=float, default=None, help="FLOP/s per device")
    parser.add_argument(
        "--dtype",
        default=None,
        choices=[*sorted(DTYPE_BYTES), "auto"],
        help="default: bfloat16 for the capacity plan, auto for a --target's compile; auto: "
        "what the engine's dtype='auto' loads on the device (float16 on a T4)",
    )
    parser.add_argument(
        "--quantization",
        default="none",
        choices=["none", "auto", *WEIGHT_BYTES_PER_PARAM],
        help="the weights: none (--dtype), int8 / int4 / fp8 (quantised at load), auto (a GGUF's "
        "tensors as a quantization='auto' load keeps them)",
    )
    parser.add_argument("--kv-cache-dtype", default="auto", choices=kv_cache.KV_CACHE_DTYPES)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--memory-utilization", type=float, default=0.9)
    parser.add_argument("--tensor-parallel-degree", type=int, default=None)
    parser.add_argument("--enable-lora", action="store_true", help="count the LoRA slots")
    parser.add_argument("--max-loras", type=int, default=1)
    parser.add_argument("--max-lora-rank", type=int, default=16)
    parser.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=None,
        help="speculative decoding's draft tokens per sequence: the verify step's rows, logits, "
        "pages and compute bound for --max-num-seqs sequences",
    )
    target = parser.add_argument_group(
        "compiled for a TPU slice or a GPU (the tpu or gpu-compile extra; no TPU or GPU needed)"
    )
    target.add_argument(
        "--target",
        default=None,
        help="v5e-1, v5e-4, v5e-8, v6e-1, v6e-4, v6e-8, v5p-8, v5e:2x2; "
        f"{', '.join(GPU_TARGETS)} (compiled by XLA's GPU compiler here: needs the gpu-compile "
        "extra, no GPU); cuda (lowered only)",
    )
    target.add_argument(
        "--attention-backend",
        default="auto",
        choices=BACKENDS,
        help="a GPU --target: the backend compiled (auto: the engine's choice on that GPU, "
        "reference below compute capability 8.0)",
    )
    target.add_argument("--compile", action="store_true", help="AOT-compile the decode step")
    target.add_argument("--max-model-len", type=int, default=None, help="default: --context")
    target.add_argument("--max-num-seqs", type=int, default=64)
    target.add_argument(
        "--kv-cache-memory", type=float, default=0.9, help="fraction of HBM left after weights"
    )
    target.add_argument(
        "--num-scheduler-steps",
        type=int,
        default=1,
        help="--compile: the multi-step call of that many decode steps (counts: one step)",
    )
    target.add_argument(
        "--attention-kernel-options",
        default=None,
        help="a GPU --target: the pallas-gpu backend's options as a JSON object, as the engine's "
        "attention_kernel_options",
    )
    target.add_argument(
        "--fit",
        action="store_true",
        help="a GPU --target: whether an engine of --max-model-len, --max-num-seqs, "
        "--max-num-batched-tokens and --kv-cache-memory fits (--device-memory: the GPU's bytes "
        "as CUDA reports them)",
    )
    target.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="--fit: a step's token budget"
    )
    target.add_argument(
        "--extrapolate-layers",
        action="store_true",
        help="--fit: compile 1 and 2 layers and extend to every layer (fast), not every layer",
    )
    target.add_argument("--json", action="store_true", help="one JSON object")
    target.add_argument(
        "--sweep-tp",
        action="store_true",
        help="every tensor-parallel degree dividing the slice: copies, capacity, predicted "
        "tokens/s (datasheet roofline; --compile calibrates it with compiler byte counts)",
    )
    target.add_argument(
        "--latency-target-ms", type=float, default=50.0, help="--sweep-tp: ms per output token"
    )
    target.add_argument(
        "--collective-latency-us",
        type=float,
        default=10.0,
        help="--sweep-tp: assumed fixed cost of one all-reduce",
    )
    parser.set_defaults(func=cmd_plan)
