"""The engine's parts, built from a loaded model and an ``EngineConfig``: the batching plan, the
KV pool, the scheduler over it, the step layout, the model runner, the grammar masks, and the
speculator when speculative decoding is on. ``LLMEngine`` drives them one step at a time."""

from __future__ import annotations

import dataclasses

from jaxgen.backends import select_backend
from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.speculative_config import SpeculativeConfig
from jaxgen.engine.decoding.speculative.draft_model import (
    DraftModelProposer,
    TargetShape,
    load_draft,
)
from jaxgen.engine.decoding.speculative.speculator import Speculator
from jaxgen.engine.decoding.speculative.verify_sampling import VerifyShapes
from jaxgen.engine.scheduling.batching import BatchingPlan, batching_plan
from jaxgen.engine.scheduling.kv_pool_plan import KVPoolPlan, plan_kv_pool
from jaxgen.engine.scheduling.scheduler import Scheduler
from jaxgen.engine.step.kv_page_mover import KVPageMover, page_axes
from jaxgen.engine.step.runner import ModelRunner
from jaxgen.engine.step.step_layout import StepLayout
from jaxgen.engine.structured.grammar_masks import GrammarMasks, grammar_compiler
from jaxgen.layers.lora import lora_targets
from jaxgen.lora import LoRAManager, LoRASlots, adapter_shardings


@dataclasses.dataclass
class EngineParts:
    max_model_len: int
    batching: BatchingPlan
    pool: KVPoolPlan
    scheduler: Scheduler
    layout: StepLayout
    runner: ModelRunner
    grammars: GrammarMasks
    speculator: Speculator | None  # speculative decoding (``speculative/``)
    verify_shapes: VerifyShapes | None  # with a speculator
    lora: LoRAManager | None = None  # multi-LoRA (``enable_lora``)


def build_engine_parts(
    loaded, config: EngineConfig, *, kv_sharding=None, engine_class=None
) -> EngineParts:
    """Plans the batching and the KV pool for ``loaded`` under ``config`` and builds the parts
    over them (``kv_sharding``: the pool's sharding under tensor parallelism, or None;
    ``engine_class``: the engine a draft model runs in, ``LLMEngine``)."""
    model_config = loaded.config
    max_model_len = config.max_model_len or min(model_config.max_position_embeddings, 2048)
    backend = select_backend(
        config.attention_backend,
        dtype=loaded.dtype,
        kv_sharding=kv_sharding,
        kv_cache_dtype=config.kv_cache_dtype,
        kernel_options=config.attention_kernel_options,
        batch_invariant=config.batch_invariant,
    )
    batching = batching_plan(config, max_model_len)
    batching = dataclasses.replace(
        batching,
        scheduler=dataclasses.replace(
            batching.scheduler,
            long_rope_threshold=model_config.rope_scaling.original_max_position_embeddings
            if model_config.rope_scaling.rope_type == "longrope"
            else None,
            sliding_window=model_config.every_layer_sliding_window,
            max_loras=config.max_loras if config.enable_lora else 0,
        ),
    )
    # The LoRA slots are allocated before the pool is planned: an accelerator's free memory,
    # which the pool takes a fraction of, is then what they leave.
    lora = build_lora(loaded, config, kv_sharding) if config.enable_lora else None
    pool = plan_kv_pool(
        config,
        batching,
        backend,
        model_config,
        loaded.dtype,
        max_model_len=max_model_len,
        kv_sharding=kv_sharding,
    )
    scheduler = Scheduler(batching.scheduler, pool.allocator)
    layout = StepLayout(
        page_size=config.page_size,
        max_num_seqs=batching.num_slots,
        max_num_batched_tokens=batching.scheduler.max_num_batched_tokens,
        max_model_len=max_model_len,
        min_decode_batch=batching.min_decode_batch,
        full_width_tables=backend.full_width_tables,
        mark_decode_only=backend.marks_decode_only_steps,
        lora=lora is not None,
    )
    runner = ModelRunner(
        loaded,
        num_pages=pool.num_pages,
        page_size=config.page_size,
        max_model_len=max_model_len,
        seq_cap=layout.seq_cap,
        attention_backend=backend,
        kv_sharding=kv_sharding,
        per_batch_executables={"auto": None, "shared": False, "per-batch": True}[
            config.sampler_executables
        ],
        lora_slots=None if lora is None else lora.slots,
        page_mover=None
        if pool.allocator.host is None
        else KVPageMover(page_axes(backend, model_config, config.page_size, loaded.dtype)),
    )
    grammars = GrammarMasks(
        grammar_compiler(loaded.tokenizer, model_config.vocab_size, model_config.eos_token_ids)
    )
    speculator = verify_shapes = None
    if config.speculative_config is not None:
        if batching.scheduler.sliding_window or batching.scheduler.long_rope_threshold:
            raise ValueError(
                "speculative_config is not supported for models whose every layer slides "
                "(pages are released behind the window) or with LongRoPE"
            )
        speculative = SpeculativeConfig.from_dict(config.speculative_config)
        proposer = None
        if speculative.method == "draft_model":
            target = TargetShape(
                max_model_len=max_model_len,
                max_num_seqs=batching.num_slots,
                max_num_batched_tokens=batching.scheduler.max_num_batched_tokens,
                num_pages=pool.num_pages,
                page_size=config.page_size,
            )
            draft = load_draft(speculative, loaded)
            proposer = DraftModelProposer(draft, config, target, engine_class)
        speculator = Speculator(
            speculative, proposer, idle_backoff=config.async_scheduling, seed=config.seed
        )
        verify_shapes = VerifyShapes(
            runner.sampling_shapes,
            layout.token_buckets[-1],
            max_draft_rows=layout.seq_cap * speculative.num_speculative_tokens,
        )
        runner.verify_shapes = verify_shapes
    return EngineParts(
        max_model_len=max_model_len,
        batching=batching,
        pool=pool,
        scheduler=scheduler,
        layout=layout,
        runner=runner,
        grammars=grammars,
        speculator=speculator,
        verify_shapes=verify_shapes,
        lora=lora,
    )


def build_lora(loaded, config: EngineConfig, kv_sharding=None) -> LoRAManager:
    """The LoRA slots of ``loaded``'s projections and their bookkeeping (``enable_lora``)."""
    targets = lora_targets(loaded.params)
    if not targets:
        raise ValueError(f"enable_lora: {loaded.config.model_type} has no projection LoRA targets")
    slots = LoRASlots(
        targets,
        max_loras=config.max_loras,
        max_rank=config.max_lora_rank,
        dtype=loaded.dtype,
        shardings=adapter_shardings(loaded.params, targets) if kv_sharding is not None else None,
    )
    return LoRAManager(slots, max_cpu_loras=config.max_cpu_loras)
