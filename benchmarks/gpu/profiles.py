"""What the device check runs: the GPU's sizes and the CPU dry run's, stage by stage.

No jax or torch import here: the torch peer reads the same model shape.
"""

from __future__ import annotations

import dataclasses

from benchmarks import model_shapes

# The word tokenizer's special ids (bos 1, eos 2) on the 8B's shape.
LLAMA3_8B = {**model_shapes.LLAMA3_8B, "bos_token_id": 1, "eos_token_id": 2}

# The dry run's model: the 8B's family and layout at toy sizes.
TINY_LLAMA = {
    **LLAMA3_8B,
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
}

STAGES = (
    "machine",
    "kernel_correctness",
    "kernel_bandwidth",
    "gemm_bandwidth",
    "engine_parity",
    "end_to_end",
    "torch_peer",
    "bench_compare",
)


@dataclasses.dataclass(frozen=True)
class StageBudget:
    """A stage runs for at most ``max_s`` seconds and is skipped when fewer than ``min_s``
    remain of the whole run's budget."""

    max_s: float
    min_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class Profile:
    """Every size the stages use; ``GPU`` and ``DRY_RUN`` below."""

    name: str
    total_budget_s: float
    budgets: dict[str, StageBudget]
    interpret: bool  # Pallas kernels in the interpreter (CPU)
    # machine: a copy of copy_bytes, copy_loops times per timed call; matmul_size^3 bf16
    copy_bytes: int
    copy_loops: int
    matmul_size: int
    matmul_loops: int
    repeats: int
    # kernel correctness: the long context and the decode batch of the cases
    long_context: int
    very_long_context: int
    decode_batch: int
    correctness_cases: tuple[str, ...] | None  # None: every case
    # kernel bandwidth: (q heads, KV heads, head_dim), (batch, context) pairs, and the pairs
    # the kernel's variants are timed at
    bandwidth_heads: tuple[int, int, int]
    bandwidth_configs: tuple[tuple[int, int], ...]
    variant_configs: tuple[tuple[int, int], ...]
    variant_values: int | None  # values of each tuning argument timed (None: all found)
    rotation_bytes: int  # inputs rotated over at least this many bytes (several L2s)
    seconds_per_call: float  # kernel calls per timed jit call: about this long in all
    max_loops: int
    trace_kernels: bool  # each row's device time per call from a profiler trace
    # decode matmuls: the rows (a step's tokens) timed, and about how long a timed call runs
    gemm_rows: tuple[int, ...]
    gemm_seconds: float
    # engine parity
    parity_models: tuple[str, ...]
    parity_prompt_lens: tuple[int, ...]
    parity_max_tokens: int
    # end to end (and the torch peer)
    model: dict
    e2e_batches: tuple[int, ...]
    prompt_len: int
    output_len: int
    trace_batches: tuple[int, ...]
    trace_first_step: int
    trace_steps: int
    replay_steps: int
    e2e_knobs: dict  # engine knobs of the main end-to-end rows
    knob_settings: tuple[dict, ...]  # engine knobs tried at knob_batches as the budget allows
    # pallas-gpu's kernel options against the main rows, at knob_batches, right after them
    kernel_knob_settings: tuple[dict, ...]
    knob_batches: tuple[int, ...]
    # speculative decoding's rows (before the knob rows, as the budget allows): its verify
    # steps' cost per drafted length on the device, acceptance on the random model's output
    speculative_knobs: dict
    speculative_batches: tuple[int, ...]
    # bench compare
    compare_modes: tuple[str, ...]
    compare_num_prompts: int
    compare_input_len: int
    compare_outputs: tuple[int, ...]
    compare_slots: int


# n-gram prompt lookup as vLLM users write it (a random model's greedy output soon repeats
# itself, so drafts come from it).
# The main rows' knobs with the one-kernel split merge (pallas-gpu's ``pallas_merge``), then with
# the one-kernel K/V write too (``pallas_kv_write``), until they are the defaults: their share
# of a batch-1 step against XLA's three reductions and two scatters; then with cuBLAS's matmuls
# as well (``xla_gemm``) against XLA's Triton GEMMs.
GPU_KERNEL_KNOBS = (
    {"async_scheduling": True, "attention_kernel_options": {"pallas_merge": True}},
    {
        "async_scheduling": True,
        "attention_kernel_options": {"pallas_merge": True, "pallas_kv_write": True},
    },
    {
        "async_scheduling": True,
        "attention_kernel_options": {
            "pallas_merge": True,
            "pallas_kv_write": True,
            "xla_gemm": "cublas",
        },
    },
)
SPECULATIVE_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 5,
}

GPU = Profile(
    name="gpu",
    total_budget_s=375.0,
    budgets={
        "machine": StageBudget(20, 5),
        "kernel_correctness": StageBudget(45, 15),  # 7-8 of 10 cases fitted 35 s (ea5bc0b)
        "kernel_bandwidth": StageBudget(60, 15),
        "gemm_bandwidth": StageBudget(60, 10),
        "engine_parity": StageBudget(45, 25),  # 30 s at 13f1313 left Gemma 3's reference out
        "end_to_end": StageBudget(145, 60),
        "torch_peer": StageBudget(80, 30),
        "bench_compare": StageBudget(120, 45),
    },
    interpret=False,
    copy_bytes=2 << 30,
    copy_loops=10,
    matmul_size=8192,
    matmul_loops=10,
    repeats=5,
    long_context=5000,
    very_long_context=32768,
    decode_batch=24,
    correctness_cases=None,
    bandwidth_heads=(32, 8, 128),
    bandwidth_configs=(
        (1, 1024),
        (16, 1024),
        (64, 1024),
        (256, 1024),
        (1, 4096),
        (16, 4096),
        (64, 4096),
        (256, 4096),
        (1, 32768),
    ),
    variant_configs=((64, 4096), (1, 32768)),
    variant_values=None,
    rotation_bytes=512 << 20,
    seconds_per_call=0.02,
    max_loops=500,
    trace_kernels=True,
    gemm_rows=(2, 64),  # a batch-1 decode step's rows (two sequence slots) and batch 64's
    gemm_seconds=0.005,
    parity_models=("llama", "qwen3", "gemma3"),
    parity_prompt_lens=(5, 17, 16, 33),
    parity_max_tokens=16,
    model=LLAMA3_8B,
    e2e_batches=(1, 64, 256, 16),
    prompt_len=1024,
    output_len=128,
    trace_batches=(1, 64, 256),
    trace_first_step=8,
    trace_steps=5,
    replay_steps=20,
    # The H200's first run (f075695): batch 1 decode 7.44 ms/step with the defaults, 5.70 with
    # num_scheduler_steps 8, 5.07 with async scheduling; batch 64 35.1 / 31.4 / 29.0.
    e2e_knobs={"async_scheduling": True},
    knob_settings=({}, {"num_scheduler_steps": 8}),
    kernel_knob_settings=GPU_KERNEL_KNOBS,
    knob_batches=(1, 64),
    # Shapes compile when met (a verify step's few buckets), not every one up front.
    speculative_knobs={"speculative_config": SPECULATIVE_CONFIG, "precompile": False},
    speculative_batches=(1,),
    compare_modes=("static", "paged", "continuous", "dynamic"),
    compare_num_prompts=32,
    compare_input_len=64,
    compare_outputs=(64, 128, 256),
    compare_slots=16,
)

DRY_RUN = dataclasses.replace(
    GPU,
    name="dry-run",
    total_budget_s=900.0,
    budgets={name: StageBudget(300, 1) for name in STAGES},
    interpret=True,
    copy_bytes=8 << 20,
    copy_loops=2,
    matmul_size=128,
    matmul_loops=2,
    repeats=2,
    long_context=70,
    very_long_context=150,
    decode_batch=5,
    correctness_cases=(
        "phi3 gqa3 d96 bf16 mixed, merge kernel",
        "llama3 gqa4 d128 bf16 mixed",
        "gqa4 d64 int8 decode window",
    ),
    bandwidth_heads=(4, 2, 64),
    bandwidth_configs=((2, 64),),
    variant_configs=((2, 64),),
    variant_values=1,
    rotation_bytes=64 << 10,
    seconds_per_call=0.0,
    max_loops=2,
    trace_kernels=True,
    gemm_rows=(2,),
    gemm_seconds=0.0,
    parity_models=("llama",),
    parity_prompt_lens=(5, 17),
    parity_max_tokens=6,
    model=TINY_LLAMA,
    e2e_batches=(2,),
    prompt_len=32,
    output_len=8,
    trace_batches=(2,),
    trace_first_step=2,
    trace_steps=2,
    replay_steps=2,
    e2e_knobs={"async_scheduling": True},
    knob_settings=({"num_scheduler_steps": 2},),
    kernel_knob_settings=GPU_KERNEL_KNOBS,
    knob_batches=(2,),
    speculative_batches=(2,),
    compare_modes=("paged",),
    compare_num_prompts=4,
    compare_input_len=8,
    compare_outputs=(4, 8),
    compare_slots=2,
)


def parse_ints(text: str | None) -> tuple[int, ...] | None:
    """``"256,64"`` -> ``(256, 64)``; None or empty -> None."""
    if not text:
        return None
    values = tuple(int(v) for v in text.split(","))
    if any(v < 1 for v in values):
        raise ValueError(f"batch sizes must be >= 1, got {text!r}")
    return values


def select(*, dry_run: bool, batches: str | None = None, compare_modes: str | None = None):
    """The GPU or dry-run profile, with the end-to-end / torch-peer batches and the compared
    modes narrowed to rerun what a run left out (``--batches 256 --compare-modes dynamic``)."""
    profile = DRY_RUN if dry_run else GPU
    changes = {}
    if parse_ints(batches):
        changes["e2e_batches"] = parse_ints(batches)
        changes["trace_batches"] = tuple(
            b for b in profile.trace_batches if b in changes["e2e_batches"]
        )
        for field in ("knob_batches", "speculative_batches"):
            changes[field] = tuple(
                b for b in getattr(profile, field) if b in changes["e2e_batches"]
            )
    if compare_modes:
        modes = tuple(compare_modes.split(","))
        known = ("static", "paged", "continuous", "dynamic")
        if set(modes) - set(known):
            raise ValueError(f"compare modes must be among {known}, got {compare_modes!r}")
        changes["compare_modes"] = modes
    return dataclasses.replace(profile, **changes) if changes else profile
