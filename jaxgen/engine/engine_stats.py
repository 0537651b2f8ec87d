"""An engine's counters, as ``LLM.stats()``, ``/metrics`` and the benchmarks read them."""

from __future__ import annotations

from jaxgen.engine.compiled import compile_counter


def engine_stats(engine) -> dict:
    """Pool, queue and step counters of an ``LLMEngine``."""
    allocator = engine.scheduler.allocator
    return {
        "batching": engine.config.batching,
        "kv_pages_total": allocator.num_usable_pages,
        "kv_pages_used": allocator.num_used_pages,
        "kv_pages_peak": engine.scheduler.kv_pages_peak,
        "kv_tokens_peak": engine.scheduler.kv_tokens_peak,
        "kv_cache_usage": allocator.num_used_pages / max(allocator.num_usable_pages, 1),
        "kv_bytes_per_token": engine.kv_bytes_per_token,
        "kv_pool_bytes": engine.runner.kv_cache_bytes,
        "kv_bytes_per_token_per_device": engine.kv_bytes_per_token_per_device,
        "page_size": engine.config.page_size,
        "max_model_len": engine.max_model_len,
        "num_running": len(engine.scheduler.running),
        "num_waiting": len(engine.scheduler.waiting),
        "preemptions": engine.scheduler.num_preemptions,
        "rope_recomputes": engine.scheduler.num_rope_recomputes,
        "prefix_cache_hit_pages": allocator.prefix_hits,
        "lora_adapters": len(engine.list_loras()),
        "lora_slot_loads": 0 if engine.lora is None else engine.lora.slot_loads,
        "lora_slot_bytes": 0 if engine.lora is None else engine.lora.slots.nbytes,
        "steps": engine.num_steps,
        "async_steps": engine.async_steps,
        "multi_step_calls": engine.multi_step_calls,
        "failed_steps": engine.failed_steps,
        "engine_dead": engine.dead is not None,
        "is_sleeping": engine.is_sleeping(),
        "sleep_level": engine.sleep_mode.level,
        "step_time_s": engine.step_time,
        "compiles": compile_counter.compile_count(),
        "compile_cache_hits": compile_counter.cache_hit_count(),
        "precompile_compiles": engine.precompile_compiles,
        "precompile_s": engine.precompile_seconds,
        "prompt_tokens_total": engine.prompt_tokens_total,
        "generation_tokens_total": engine.generation_tokens_total,
        "grammar_mask_s": engine.grammars.stats.mask_seconds,
        "grammar_masked_rows": engine.grammars.stats.masked_rows,
        "grammar_compile_s": engine.grammars.compiler.compile_seconds,
        **(engine.speculator.stats() if engine.speculator is not None else {}),
        **host_tier_stats(allocator.host),
    }


def host_tier_stats(host) -> dict:
    """The host KV tier's counters (``kv_offloading_size``): pages held and their capacity,
    prefix-hit pages copied back, pages and bytes moved each way; zeros without a tier."""
    if host is None:
        return {
            "host_kv_pages": 0,
            "host_kv_pages_total": 0,
            "host_kv_hit_pages": 0,
            "kv_offloaded_pages": 0,
            "kv_offloaded_bytes": 0,
            "kv_onloaded_bytes": 0,
        }
    return {
        "host_kv_pages": len(host),
        "host_kv_pages_total": host.capacity_pages,
        "host_kv_hit_pages": host.hit_pages,
        "kv_offloaded_pages": host.offloaded_pages,
        "kv_offloaded_bytes": host.offloaded_bytes,
        "kv_onloaded_bytes": host.onloaded_bytes,
    }
