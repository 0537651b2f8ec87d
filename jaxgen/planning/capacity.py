"""Capacity planning: KV bytes per token, how many pages and sequences fit, and the critical batch
size where decode turns compute-bound. ``jaxgen plan`` prints it."""

from __future__ import annotations

import dataclasses
import os

from jaxgen.config import ModelConfig
from jaxgen.loaders import resolve_model
from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.planning.hardware import Chip
from jaxgen.quantization import kv_cache

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    num_params: int
    weight_bytes: int
    kv_bytes_per_token: int
    # Each device's share under tensor parallelism (what bounds the pages): see kv_shares.
    kv_bytes_per_token_per_device: int
    # Per token of a sequence of `context` tokens when sliding-window layers hold at most their
    # window (equal to kv_bytes_per_token without sliding layers). The page pool allocates
    # kv_bytes_per_token: it keeps every layer's pages for the sequence's whole length.
    kv_bytes_per_token_windowed: float
    kv_budget_bytes: int
    num_pages: int
    tokens_that_fit: int
    sequences_at_context: int
    critical_batch_size: float
    decode_floor_ms_batch1: float
    lora_bytes: int = 0  # the LoRA slots (enable_lora), on every device together

    def lines(self, context: int, page_size: int) -> list[str]:
        gib = 2**30
        return [
            f"parameters                  {self.num_params / 1e6:,.1f} M",
            f"weight bytes                {self.weight_bytes / gib:,.3f} GiB",
            f"KV bytes per token          {self.kv_bytes_per_token:,} B"
            f" ({self.kv_bytes_per_token_per_device:,} B per device)",
            f"  at {context} tokens, windowed {self.kv_bytes_per_token_windowed:,.0f} B"
            " (sliding-window layers hold at most their window)",
            *(
                [f"LoRA slots                  {self.lora_bytes / gib:,.3f} GiB"]
                if self.lora_bytes
                else []
            ),
            f"KV budget                   {self.kv_budget_bytes / gib:,.2f} GiB",
            f"pages of {page_size} tokens          {self.num_pages:,}",
            f"tokens that fit             {self.tokens_that_fit:,}",
            f"sequences of {context} tokens     {self.sequences_at_context:,}",
            f"critical batch size         {self.critical_batch_size:,.0f}"
            "  (decode turns compute-bound above this)",
            f"batch-1 decode floor        {self.decode_floor_ms_batch1:.3f} ms/token"
            " (weight bytes / bandwidth)",
        ]


# Bytes per parameter of each weight quantisation: codes plus float16 scales (and int4's minimums)
# per group of 32 inputs; fp8 has one scale per output channel.
WEIGHT_BYTES_PER_PARAM = {"int8": 1 + 2 / 32, "int4": 0.5 + 4 / 32, "fp8": 1.0}


def auto_weight_bytes(quantization: str, model: str | None, dtype: str) -> int | None:
    """The weights' bytes under ``quantization="auto"``: a GGUF's as a load keeps them (its
    quantised matrices at their kept bytes, bit planes and two-level scales included; other
    tensors in ``dtype``: ``GGUFFile.kept_weight_bytes``, from the tensor table); None for a
    float checkpoint, which ``auto`` keeps float, and for any other ``quantization``."""
    if quantization != "auto":
        return None
    path = resolve_model(model, config_only=True)
    if not os.path.isfile(path) or path.endswith(".json"):  # a directory, or a config.json
        return None
    return GGUFFile(path).kept_weight_bytes(DTYPE_BYTES[dtype])


def kv_shares(config: ModelConfig, tensor_parallel_degree: int, device: Chip) -> int:
    """How many ways a token's KV splits over ``tensor_parallel_degree`` devices, as the engine
    lays the pool out: the paired pool (reference, cpu, pallas-gpu) over KV heads when the degree
    divides them, else whole on every device; the pallas-tpu pool gives each chip
    ``1 / min(degree, KV heads)``."""
    degree, heads = tensor_parallel_degree, config.num_kv_heads
    if device.name.startswith("TPU"):
        return min(degree, heads)
    return degree if heads % degree == 0 else 1


def lora_slot_bytes(
    config: ModelConfig, *, max_loras: int, max_lora_rank: int, itemsize: int, degree: int = 1
) -> int:
    """Bytes of the LoRA slots on all ``degree`` devices together: per layer, each dense
    projection's A ``[in, L x R]`` and B ``[L x R, out]`` (``jaxgen.lora.LoRASlots``); under
    tensor parallelism a column-parallel projection's A and a row-parallel one's B are whole on
    every device, the other halves split (``jaxgen.lora.adapter_shardings``). A mixture-of-
    experts layer's experts take no adapter: only its attention's slots are counted."""
    d, f, hd = config.hidden_size, config.intermediate_size, config.head_dim
    q, kv = config.num_heads * hd, config.num_kv_heads * hd
    column = [(d, q), (d, kv), (d, kv)]  # q/k/v: (in, out)
    row = [(q, d)]  # o
    mlp_column, mlp_row = [(d, f), (d, f)], [(f, d)]  # gate/up, down
    width = max_loras * max_lora_rank
    total = 0
    for layer in range(config.num_layers):
        cols, rows = column, row
        if not config.is_moe_layer(layer):
            cols, rows = column + mlp_column, row + mlp_row
        # per device: A whole + B / degree (column); A / degree + B whole (row)
        per_device = sum(n_in + n_out / degree for n_in, n_out in cols)
        per_device += sum(n_in / degree + n_out for n_in, n_out in rows)
        total += per_device * width * itemsize * degree
    return int(total)


def make_plan(
    config: ModelConfig,
    *,
    device: Chip,
    dtype: str = "bfloat16",
    context: int = 4096,
    page_size: int = 16,
    memory_utilization: float = 0.9,
    tensor_parallel_degree: int = 1,
    quantization: str = "none",
    kv_cache_dtype: str = "auto",
    max_loras: int = 0,
    max_lora_rank: int = 16,
    weight_bytes: int | None = None,
) -> Plan:
    """Capacity of ``device`` (times ``tensor_parallel_degree``) for ``config``; ``quantization``
    ("int8" / "int4" / "fp8") and ``kv_cache_dtype`` ("int8" / "fp8") count the quantised
    bytes: codes plus scales (``WEIGHT_BYTES_PER_PARAM``, ``kv_cache.bytes_per_token``);
    ``weight_bytes``, when given, are the weights' bytes instead (a GGUF kept under
    ``quantization="auto"``: :func:`auto_weight_bytes`). Pages
    are counted per device: each holds its share of every page (:func:`kv_shares`). The
    batch-1 decode floor reads the active parameters only (``ModelConfig.num_active_params``:
    the routed experts, and no untied embedding table). ``max_loras`` > 0 (``enable_lora``)
    takes the LoRA slots out of the budget before the pages (:func:`lora_slot_bytes`)."""
    itemsize = DTYPE_BYTES[dtype]
    if weight_bytes is None:
        per_param = WEIGHT_BYTES_PER_PARAM.get(quantization, itemsize)
        weight_bytes = int(config.num_params * per_param)
    kv_per_token = config.kv_bytes_per_token(itemsize)
    if kv_cache_dtype != "auto":
        kv_per_token = kv_cache.bytes_per_token(config)
    kv_per_device = -(-kv_per_token // kv_shares(config, tensor_parallel_degree, device))
    total_memory = device.memory_bytes * tensor_parallel_degree
    lora = 0
    if max_loras:
        lora = lora_slot_bytes(  # the slots take the model's float dtype
            config,
            max_loras=max_loras,
            max_lora_rank=max_lora_rank,
            itemsize=itemsize,
            degree=tensor_parallel_degree,
        )
    budget = max(int(total_memory * memory_utilization) - weight_bytes - lora, 0)
    num_pages = budget // tensor_parallel_degree // (kv_per_device * page_size)
    tokens = num_pages * page_size
    pages_per_seq = -(-context // page_size)
    flops = device.peak_flops.get(dtype) or max(device.peak_flops.values())
    flops *= tensor_parallel_degree
    bandwidth = device.bandwidth_bytes_per_s * tensor_parallel_degree
    # Decode at batch B: 2*P*B FLOPs against P*itemsize weight bytes read once per step.
    critical = flops * itemsize / (2 * bandwidth)
    # An 8-bit pool holds the same share of the float pool's windowed bytes as of its full ones.
    float_windowed = config.kv_bytes_per_sequence(context, itemsize) / context
    windowed = float_windowed * kv_per_token / config.kv_bytes_per_token(itemsize)
    return Plan(
        num_params=config.num_params,
        weight_bytes=weight_bytes,
        kv_bytes_per_token=kv_per_token,
        kv_bytes_per_token_per_device=kv_per_device,
        kv_bytes_per_token_windowed=windowed,
        kv_budget_bytes=budget,
        num_pages=num_pages,
        tokens_that_fit=tokens,
        sequences_at_context=num_pages // pages_per_seq,
        critical_batch_size=critical,
        lora_bytes=lora,
        decode_floor_ms_batch1=weight_bytes
        * config.num_active_params
        / config.num_params
        / bandwidth
        * 1e3,
    )
