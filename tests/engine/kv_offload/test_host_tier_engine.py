"""The host KV tier in a running engine: conversations whose histories overflow the device
pool give the same greedy tokens with the tier as without it, find their earlier turns' pages
on the host (prefix hits the pool alone loses), and leave pages, references and queues at
their start; bad sizes are refused at start naming ``kv_offloading_size``."""

from __future__ import annotations

import pytest

from jaxgen import LLM, SamplingParams

# 2 layers, K and V, 2 KV heads of 16, float32: 512 bytes a token, 8 KiB a 16-token page.
PAGE_BYTES = 2 * 2 * 2 * 16 * 4 * 16
KNOBS = dict(max_model_len=256, kv_cache_memory=24 * PAGE_BYTES, max_rolling_batch_size=4)
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def conversations(llm, turns: int = 4, count: int = 4) -> list[list[int]]:
    """``count`` conversations of ``turns`` turns, run turn by turn (all conversations' turn
    ``t`` in one batch): each turn's prompt is the history so far plus a new message."""
    histories = [[10 + c] * 3 + list(range(100 + 40 * c, 130 + 40 * c)) for c in range(count)]
    tokens = []
    for turn in range(turns):
        prompts = [h + [500 + 10 * turn + c] * 12 for c, h in enumerate(histories)]
        outs = llm.generate(prompts, PARAMS, use_tqdm=False)
        for c, out in enumerate(outs):
            histories[c] = prompts[c] + list(out.token_ids)
            tokens.append(list(out.token_ids))
    return tokens


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"async_scheduling": True},
        {
            "kv_cache_dtype": "int8",
            "kv_cache_memory": 24 * 2304,
        },  # 24 pages of int8 codes + scales,
    ],
    ids=["plain", "async", "int8-pool"],
)
def test_conversations_equal_without_the_tier_and_hit_the_host(tiny_model_dir, extra):
    knobs = {**KNOBS, **extra}
    plain = LLM(tiny_model_dir, **knobs)
    tiered = LLM(tiny_model_dir, kv_offloading_size=256 * PAGE_BYTES, **knobs)
    assert conversations(tiered) == conversations(plain)
    stats, base = tiered.stats(), plain.stats()
    assert stats["kv_offloaded_pages"] > 0 and stats["host_kv_hit_pages"] > 0
    assert stats["prefix_cache_hit_pages"] > base["prefix_cache_hit_pages"]
    page_bytes = stats["kv_bytes_per_token"] * 16
    assert stats["kv_onloaded_bytes"] == stats["host_kv_hit_pages"] * page_bytes
    assert 0 < stats["host_kv_pages"] <= stats["host_kv_pages_total"]
    assert stats["host_kv_pages_total"] == 256 * PAGE_BYTES // page_bytes
    allocator = tiered.engine.scheduler.allocator
    assert stats["kv_pages_used"] == 0 and not any(allocator.ref_counts)
    assert allocator.take_page_moves() == ([], [])


def test_no_compile_after_precompile_and_reset_empties_the_host(tiny_model_dir):
    llm = LLM(tiny_model_dir, kv_offloading_size=64 * PAGE_BYTES, precompile=True, **KNOBS)
    before = llm.stats()["compiles"]
    conversations(llm)
    stats = llm.stats()
    assert stats["host_kv_hit_pages"] > 0 and stats["compiles"] == before
    llm.engine.reset_prefix_cache()
    assert llm.stats()["host_kv_pages"] == 0


@pytest.mark.parametrize(
    "size, knobs, match",
    [
        (-1, {}, "kv_offloading_size must be bytes >= 0"),
        (1 << 60, {}, "more than this host's memory"),
        (100, {}, "holds no page"),
        (1 << 20, {"batching": "continuous"}, "needs batching='paged'"),
        (1 << 20, {"enable_prefix_caching": False}, "needs enable_prefix_caching"),
    ],
)
def test_bad_sizes_are_refused_at_start(tiny_model_dir, size, knobs, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny_model_dir, kv_offloading_size=size, **{**KNOBS, **knobs})


@pytest.mark.slow
def test_the_tier_under_tensor_parallelism(tiny_model_dir):
    """The pool split over 2 devices (KV heads): pages move whole, tokens equal degree 1's."""
    from tests.sharded_worker import run_worker

    result = run_worker(
        "kv_offload_tp", {"model": tiny_model_dir, "degrees": [1, 2]}, num_devices=2
    )
    assert result["2"]["tokens"] == result["1"]["tokens"]
    assert result["2"]["host_kv_hit_pages"] > 0 and result["2"]["kv_offloaded_pages"] > 0
