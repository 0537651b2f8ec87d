"""``jaxgen plan --enable-lora``: the LoRA slots' bytes it takes from the KV budget are the
bytes the engine's slots hold (one device, and per device under tensor parallelism)."""

from __future__ import annotations

from jaxgen import LLM
from jaxgen.planning.capacity import lora_slot_bytes, make_plan
from jaxgen.planning.hardware import DEVICES


def test_planned_lora_bytes_are_the_engines(tiny_model_dir):
    llm = LLM(
        tiny_model_dir,
        enable_lora=True,
        max_loras=3,
        max_lora_rank=8,
        max_model_len=64,
        kv_cache_memory=1 << 20,
    )
    config = llm.loaded.config
    held = llm.engine.lora.slots.nbytes
    assert lora_slot_bytes(config, max_loras=3, max_lora_rank=8, itemsize=4) == held
    device = DEVICES["h100"]
    without = make_plan(config, device=device, dtype="float32")
    with_lora = make_plan(config, device=device, dtype="float32", max_loras=3, max_lora_rank=8)
    assert with_lora.lora_bytes == held
    assert with_lora.kv_budget_bytes == without.kv_budget_bytes - held


def test_tensor_parallel_lora_bytes_split_as_the_shardings(tiny_model_dir):
    """Degree 2, on both devices together: each column-parallel A (q/k/v/gate/up: [hidden, L x
    R]) and row-parallel B (o/down: [L x R, hidden]) is whole on each device, so counted twice;
    the other halves are split, so counted once."""
    from jaxgen.loaders import load_model

    model = load_model(tiny_model_dir).config
    width, itemsize = 2 * 4, 4
    one = lora_slot_bytes(model, max_loras=2, max_lora_rank=4, itemsize=itemsize)
    two = lora_slot_bytes(model, max_loras=2, max_lora_rank=4, itemsize=itemsize, degree=2)
    whole_on_each = 7 * model.hidden_size * width * itemsize  # 5 column A's + 2 row B's a layer
    assert two - one == model.num_layers * whole_on_each
