"""Replicas against tensor parallelism on one TPU slice: ``jaxgen plan --target SLICE --sweep-tp``.

For each tensor-parallel degree ``d`` that divides the slice's chips (and the model's query
heads), the slice holds ``chips / d`` replicas of the model. Per degree: each chip's weights and
KV pages, how many sequences of ``context`` tokens a replica holds, the bytes one decode step
reads per chip, and the slice's predicted output tokens/s when ``S`` sequences are in flight
across the slice (``S`` = 1 .. 256, spread over the replicas).

The prediction is a roofline, not a measurement. A decode step at batch ``b`` per replica takes

    t(b) = max(bytes(b) / HBM bandwidth, flops(b) / peak flops) + collectives(b)

per chip, where ``bytes(b)`` = the weights a step reads + ``b`` sequences' KV at ``context``
(from datasheet sizes, or with ``--compile`` the weight part calibrated by the bytes libtpu's
compiler counts for the engine's own decode step: a count, not a time), and ``collectives(b)``
= 2 all-reduces per layer of ``b x hidden`` activations over the degree's ring at the chip's
datasheet ICI bandwidth, plus an assumed fixed cost per all-reduce (``collective_latency_s``).
Nothing overlaps in this model, and nothing else is counted (no host time, no kernel
efficiency). Each sequence gets one token per step, so ``t(b)`` is also its time per output
token.
"""

from __future__ import annotations

import dataclasses
import math

from jaxgen.config import ModelConfig
from jaxgen.planning.hardware import CHIPS, Chip
from jaxgen.planning.tpu_targets import TARGETS

SLICE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Datasheet inter-chip interconnect bandwidth per chip (Cloud TPU's published Gbps / 8).
ICI_BYTES_PER_S = {"v5e": 1600e9 / 8, "v6e": 3584e9 / 8, "v5p": 4800e9 / 8}
# Assumed fixed cost of one all-reduce (launch and hops); not a datasheet number.
DEFAULT_COLLECTIVE_LATENCY_S = 10e-6


@dataclasses.dataclass(frozen=True, kw_only=True)
class SliceSpec:
    """A TPU slice: its chips' datasheet figures and how many there are."""

    target: str
    chip: Chip
    num_chips: int
    ici_bytes_per_s: float


def slice_spec(target: str) -> SliceSpec:
    """``v5e-8`` or a libtpu topology such as ``v5e:2x4``; ``ValueError`` naming the known ones.
    Datasheet only: no libtpu needed."""
    topology = TARGETS.get(target, target)
    generation, _, dims = topology.partition(":")
    try:
        num_chips = math.prod(int(d) for d in dims.split("x"))
    except ValueError:
        num_chips = 0
    if generation not in CHIPS or num_chips < 1:
        raise ValueError(
            f"unknown target {target!r}; choose one of {', '.join(TARGETS)} or a topology "
            f"such as v5e:2x2 (generations: {', '.join(CHIPS)})"
        )
    return SliceSpec(
        target=target,
        chip=CHIPS[generation],
        num_chips=num_chips,
        ici_bytes_per_s=ICI_BYTES_PER_S[generation],
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One tensor-parallel degree on the slice. ``fits`` is False when the weights (or one
    sequence of ``context``) do not fit a chip; the figures after it are then empty."""

    tensor_parallel_degree: int
    replicas: int
    fits: bool
    weight_bytes_per_chip: int
    kv_bytes_per_token_per_chip: int
    kv_pages_per_chip: int
    max_sequences_per_replica: int
    step_bytes_per_chip: float  # one decode step at ``step_bytes_batch`` sequences per replica
    step_bytes_batch: int
    step_bytes_source: str  # "compiler" (libtpu's count) or "datasheet model"
    step_seconds: dict[int, float]  # slice batch -> seconds per step (= per output token)
    tokens_per_s: dict[int, float]  # slice batch -> output tokens/s of the whole slice


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sweep:
    target: str
    chip: str
    num_chips: int
    context: int
    dtype: str
    latency_target_s: float
    rows: list[SweepRow]
    best_latency: tuple[int, int] | None  # (degree, slice batch) meeting the latency target
    best_throughput: tuple[int, int] | None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Roofline:
    """One degree's decode step time (see the module docstring)."""

    config: ModelConfig
    spec: SliceSpec
    degree: int
    itemsize: int
    context: int
    weights_read: float  # bytes per chip a step reads besides the KV
    kv_per_token: int  # bytes per chip
    collective_latency_s: float

    def step_bytes(self, batch: int) -> float:
        return self.weights_read + batch * self.context * self.kv_per_token

    def step_seconds(self, batch: int) -> float:
        config, chip = self.config, self.spec.chip
        # Matmuls (2 per active parameter) and attention (q.k and p.v over the context).
        flops = 2 * config.num_active_params * batch
        flops += 4 * batch * self.context * config.num_layers * config.num_heads * config.head_dim
        flops_time = flops / self.degree / chip.peak_bf16_flops
        memory_time = self.step_bytes(batch) / chip.bandwidth_bytes_per_s
        collectives = 0.0
        if self.degree > 1:  # 2 all-reduces a layer and one after the embedding
            message = batch * config.hidden_size * self.itemsize
            ring = 2 * (self.degree - 1) / self.degree * message / self.spec.ici_bytes_per_s
            collectives = (2 * config.num_layers + 1) * (self.collective_latency_s + ring)
        return max(memory_time, flops_time) + collectives


def divisor_degrees(num_chips: int, config: ModelConfig) -> list[int]:
    """Degrees that divide the slice and the query heads (what jaxgen's sharding accepts)."""
    return [d for d in range(1, num_chips + 1) if num_chips % d == 0 and config.num_heads % d == 0]


def weight_bytes_per_chip(config: ModelConfig, degree: int, bytes_per_param: float) -> int:
    """The chip's share: everything split ``degree`` ways, except the KV projections when the
    degree does not divide the KV heads (jaxgen replicates them then)."""
    total = config.num_params * bytes_per_param
    if config.num_kv_heads % degree:
        kv_proj = 2 * config.num_layers * config.hidden_size * config.num_kv_heads
        kv_proj *= config.head_dim * bytes_per_param
        return int((total - kv_proj) / degree + kv_proj)
    return int(total / degree)


def sweep_tp(
    config: ModelConfig,
    target: str,
    *,
    dtype: str = "bfloat16",
    weight_bytes_per_param: float | None = None,
    weights_label: str | None = None,
    context: int = 4096,
    page_size: int = 16,
    memory_utilization: float = 0.9,
    latency_target_s: float = 0.05,
    collective_latency_s: float = DEFAULT_COLLECTIVE_LATENCY_S,
    slice_batches: tuple[int, ...] = SLICE_BATCHES,
    compiled: dict[int, dict] | None = None,
) -> Sweep:
    """The sweep (see the module docstring). ``compiled`` maps a degree to
    ``compile_decode_step``'s result for it; those rows read the compiler's byte count.
    ``weight_bytes_per_param`` (quantised weights; default: ``dtype``'s size) and its
    ``weights_label`` (e.g. "int8") describe weights stored in another format than the KV."""
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}.get(dtype)
    if itemsize is None:
        raise ValueError(f"dtype must be bfloat16, float16 or float32, got {dtype!r}")
    if weight_bytes_per_param is not None and weight_bytes_per_param <= 0:
        raise ValueError(f"weight_bytes_per_param must be > 0, got {weight_bytes_per_param}")
    if context < 1 or page_size < 1:
        raise ValueError("context and page_size must be >= 1")
    if not 0 < memory_utilization <= 1:
        raise ValueError(f"memory_utilization must be in (0, 1], got {memory_utilization}")
    if latency_target_s <= 0:
        raise ValueError(f"latency_target_s must be > 0, got {latency_target_s}")
    spec = slice_spec(target)
    chip = spec.chip
    bytes_per_param = weight_bytes_per_param or itemsize
    active_fraction = config.num_active_params / config.num_params
    rows = []
    for degree in divisor_degrees(spec.num_chips, config):
        replicas = spec.num_chips // degree
        weights = weight_bytes_per_chip(config, degree, bytes_per_param)
        # The pallas-tpu backend gives each chip the KV heads its query heads read: a 1/degree
        # share, or one head when there are fewer KV heads than chips (as compile_decode_step).
        kv_per_token = config.kv_bytes_per_token(itemsize) // min(degree, config.num_kv_heads)
        free = chip.memory_bytes * memory_utilization - weights
        pages = max(int(free // (kv_per_token * page_size)), 0)
        pages_per_sequence = -(-context // page_size)
        max_sequences = pages // pages_per_sequence
        # An untied embedding table is not read by a step (only the rows of its tokens).
        unread = 0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size
        weights_read = (weights - unread * bytes_per_param / degree) * active_fraction
        source, batch_of_count = "datasheet model", 1
        if compiled and degree in compiled:
            step = compiled[degree]["decode_step"]
            batch_of_count = compiled[degree]["max_num_seqs"]
            # The compiler's count less the live KV it read: the step's fixed part.
            weights_read = max(step["bytes_accessed"] - step["live_kv_bytes"], 0.0)
            source = "compiler"

        roofline = _Roofline(
            config=config,
            spec=spec,
            degree=degree,
            itemsize=itemsize,
            context=context,
            weights_read=weights_read,
            kv_per_token=kv_per_token,
            collective_latency_s=collective_latency_s,
        )
        fits = weights < chip.memory_bytes * memory_utilization and max_sequences >= 1
        seconds, tokens = {}, {}
        if fits:
            for slice_batch in slice_batches:
                per_replica = -(-slice_batch // replicas)
                if per_replica > max_sequences:
                    continue
                seconds[slice_batch] = roofline.step_seconds(per_replica)
                tokens[slice_batch] = slice_batch / seconds[slice_batch]
        rows.append(
            SweepRow(
                tensor_parallel_degree=degree,
                replicas=replicas,
                fits=fits,
                weight_bytes_per_chip=weights,
                kv_bytes_per_token_per_chip=kv_per_token,
                kv_pages_per_chip=pages,
                max_sequences_per_replica=max_sequences,
                step_bytes_per_chip=roofline.step_bytes(batch_of_count) if fits else 0.0,
                step_bytes_batch=batch_of_count,
                step_bytes_source=source,
                step_seconds=seconds,
                tokens_per_s=tokens,
            )
        )
    points = [
        (row.tokens_per_s[b], row.tensor_parallel_degree, b)
        for row in rows
        for b in row.tokens_per_s
    ]
    within = [p for p in points if _seconds(rows, p) <= latency_target_s]
    best_latency = max(within)[1:] if within else None
    best_throughput = max(points)[1:] if points else None
    return Sweep(
        target=target,
        chip=chip.name,
        num_chips=spec.num_chips,
        context=context,
        dtype=f"{weights_label} weights, {dtype} KV" if weights_label else dtype,
        latency_target_s=latency_target_s,
        rows=rows,
        best_latency=best_latency,
        best_throughput=best_throughput,
    )


def _seconds(rows: list[SweepRow], point: tuple[float, int, int]) -> float:
    _, degree, batch = point
    row = next(r for r in rows if r.tensor_parallel_degree == degree)
    return row.step_seconds[batch]


def sweep_lines(sweep: Sweep) -> list[str]:
    """The sweep as a text table (tokens/s of the whole slice by slice batch)."""
    gb = 1e9
    batches = sorted({b for row in sweep.rows for b in row.tokens_per_s}) or list(SLICE_BATCHES)
    lines = [
        f"{sweep.num_chips} x {sweep.chip} ({sweep.target}), {sweep.dtype}, context "
        f"{sweep.context}: roofline predictions, not measurements",
        f"{'TP':>3} {'copies':>6} {'weights GB/chip':>15} {'KV pages/chip':>13} "
        f"{'seqs/copy':>9} {'step GB/chip':>12}  " + " ".join(f"{f'S={b}':>8}" for b in batches),
    ]
    for row in sweep.rows:
        head = (
            f"{row.tensor_parallel_degree:3} {row.replicas:6} "
            f"{row.weight_bytes_per_chip / gb:15.2f} "
        )
        if not row.fits:
            lines.append(head + "  does not fit a chip")
            continue
        cells = []
        for batch in batches:
            value = row.tokens_per_s.get(batch)
            mark = ""
            if (row.tensor_parallel_degree, batch) == sweep.best_latency:
                mark += "L"
            if (row.tensor_parallel_degree, batch) == sweep.best_throughput:
                mark += "T"
            cells.append(f"{'-' if value is None else f'{value:,.0f}{mark}':>8}")
        step = f"{row.step_bytes_per_chip / gb:.3f}" + (
            "c" if row.step_bytes_source == "compiler" else ""
        )
        lines.append(
            head + f"{row.kv_pages_per_chip:13,} {row.max_sequences_per_replica:9,} "
            f"{step:>12}  " + " ".join(cells)
        )
    lines.append(
        "S = sequences in flight on the slice (spread over the copies); cells: output tokens/s "
        "of the slice; '-': more sequences than the copies hold"
    )
    sources = sorted(
        {f"{r.step_bytes_batch} seq/copy ({r.step_bytes_source})" for r in sweep.rows if r.fits}
    )
    lines.append(
        "step GB/chip: bytes one decode step reads per chip at "
        + (", ".join(sources) or "-")
        + "; 'c' = libtpu's compiler count (a count, not a time)"
    )
    for name, best in (("latency", sweep.best_latency), ("throughput", sweep.best_throughput)):
        if best is None:
            what = (
                f"none meets {sweep.latency_target_s * 1e3:g} ms/token"
                if name == "latency"
                else "none"
            )
            lines.append(f"best for {name}: {what}")
            continue
        degree, batch = best
        row = next(r for r in sweep.rows if r.tensor_parallel_degree == degree)
        condition = (
            f" within {sweep.latency_target_s * 1e3:g} ms/token" if name == "latency" else ""
        )
        lines.append(
            f"best for {name}{condition} ({'L' if name == 'latency' else 'T'}): TP {degree} x "
            f"{row.replicas} copies at S={batch}: {row.tokens_per_s[batch]:,.0f} tokens/s, "
            f"{row.step_seconds[batch] * 1e3:.1f} ms/token"
        )
    return lines
