"""Every supported family against transformers (PyTorch, fp32) on tiny random checkpoints:
logits over prompts longer than the sliding windows, greedy generation through the engine
(paged, chunked prefill, preemption) token for token, and the config errors a user meets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxgen import LLM, SamplingParams
from jaxgen.config import ModelConfig
from jaxgen.evaluation.full_forward import full_sequence_logits
from jaxgen.loaders import load_model
from tests.family_models import VARIANTS, hf_greedy_tokens, save_family_model

LENGTHS = (3, 20, 41)  # windows are 8 tokens; LongRoPE's original context is 32


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, smollm2_tokenizer):
    """Builds each variant's checkpoint once per module, on first use."""
    cache = {}

    def get(variant: str) -> str:
        if variant not in cache:
            path = str(tmp_path_factory.mktemp(variant))
            cache[variant] = save_family_model(path, smollm2_tokenizer, variant)
        return cache[variant]

    return get


def hf_model(path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


# One variant per family by default (each covering its family's distinctive options); the rest
# (MQA and one-norm Falcon, top-1 Mixtral, ...) run with the slow tests.
LOGITS_FAST = (
    "qwen3-sliding",
    "gemma2",
    "gemma3",
    "phi3-longrope",
    "qwen3-moe",
    "falcon-40b-grouped",
)


@pytest.mark.parametrize(
    "variant",
    [v if v in LOGITS_FAST else pytest.param(v, marks=pytest.mark.slow) for v in sorted(VARIANTS)],
)
def test_logits_match_transformers(variant, family_dirs):
    path = family_dirs(variant)
    hf = hf_model(path)
    loaded = load_model(path)
    rng = np.random.default_rng(0)
    for length in LENGTHS:
        ids = rng.integers(0, loaded.config.vocab_size, length).tolist()
        ours = full_sequence_logits(loaded, ids)
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float().numpy()
        diff = float(np.abs(ours - ref).max())
        assert diff <= 1e-4, (variant, length, diff)


def test_variants_cover_the_options(family_dirs):
    configs = {v: load_model(family_dirs(v)).config for v in ("gemma2", "gemma3", "phi3-longrope")}
    gemma2 = configs["gemma2"]
    assert gemma2.attn_logit_softcap == 50.0 and gemma2.final_logit_softcap == 30.0
    assert gemma2.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    gemma3 = configs["gemma3"]
    assert gemma3.qk_norm and gemma3.local_rope_theta == 10000.0
    assert gemma3.rope_scaling.rope_type == "linear"
    longrope = configs["phi3-longrope"].rope_scaling
    assert longrope.rope_type == "longrope" and longrope.original_max_position_embeddings == 32
    assert longrope.attention_factor > 1.0


GENERATE_FAST = ("qwen3-sliding", "gemma2")
GENERATE_SLOW = (
    "qwen3-moe",
    "gemma3",
    "phi3",
    "mixtral-top1",
    "qwen2-moe-shared-expert",
    "falcon-mqa",
    "falcon-40b-grouped",
)


def check_engine_generation(
    path,
    *,
    lengths=(13, 21, 9, 17),
    prompts: list[list[int]] | None = None,
    preempt: bool = True,
    max_tokens: int = 14,
    prefix_caching: bool = False,
) -> dict:
    """Greedy tokens through a paged engine (prefill budget 16, 4 slots, a 5-page pool that
    preempts) equal transformers' ``generate``; returns the engine's stats."""
    if prompts is None:
        rng = np.random.default_rng(3)
        prompts = [rng.integers(0, 1000, int(n)).tolist() for n in lengths]
    expected = hf_greedy_tokens(path, prompts, max_tokens)
    loaded = load_model(path)
    page_bytes = loaded.config.kv_bytes_per_token(4) * 16
    llm = LLM(
        loaded,
        batching="paged",
        max_model_len=64,
        max_rolling_batch_prefill_tokens=16,
        max_rolling_batch_size=4,
        kv_cache_memory=(5 if preempt else 32) * page_bytes,
        enable_prefix_caching=prefix_caching,
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats()
    assert [o.token_ids for o in outs] == expected
    if preempt:
        assert stats["preemptions"] > 0
    assert stats["kv_pages_used"] == 0
    return stats


@pytest.mark.parametrize("variant", GENERATE_FAST)
def test_engine_greedy_matches_generate(variant, family_dirs):
    check_engine_generation(family_dirs(variant))


@pytest.mark.slow
@pytest.mark.parametrize("variant", GENERATE_SLOW)
def test_engine_greedy_matches_generate_slow(variant, family_dirs):
    check_engine_generation(family_dirs(variant))


def test_longrope_generation_across_the_original_context(family_dirs):
    """LongRoPE with an original context of 32: sequences growing past it (prompts of 21 and
    25 tokens, 16 new tokens) are recomputed with the long factors as transformers' Phi-3
    generation does; a 40-token prompt uses them from its first chunk; a 9-token one stays
    short. The prefix cache is on: the recomputed pages must not be confused with the short
    ones of the same tokens (the two 25-token prompts share them)."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 1000, n).tolist() for n in (21, 9, 40, 25)]
    stats = check_engine_generation(
        family_dirs("phi3-longrope"),
        prompts=[*prompts, prompts[-1]],
        max_tokens=16,
        prefix_caching=True,
    )
    assert stats["rope_recomputes"] >= 3


def test_falcon_alibi_names_the_field():
    with pytest.raises(ValueError, match="alibi"):
        ModelConfig.from_hf_dict(
            dict(
                model_type="falcon",
                vocab_size=10,
                hidden_size=8,
                num_hidden_layers=1,
                num_attention_heads=2,
                alibi=True,
            )
        )


def test_partial_rotary_names_the_field():
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        ModelConfig.from_hf_dict(
            dict(
                model_type="phi3",
                vocab_size=10,
                hidden_size=8,
                intermediate_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                partial_rotary_factor=0.5,
            )
        )


def test_unknown_architecture_lists_the_supported_ones():
    with pytest.raises(ValueError, match="Qwen3ForCausalLM.*Gemma2ForCausalLM|Gemma2.*Qwen3"):
        ModelConfig.from_hf_dict(dict(model_type="mamba", architectures=["MambaForCausalLM"]))


def test_sliding_window_kv_bytes_hold_at_most_the_window(family_dirs):
    config = load_model(family_dirs("gemma2")).config  # 3 layers: sliding, full, sliding
    per_layer_token = 2 * config.num_kv_heads * config.head_dim * 4
    assert config.kv_bytes_per_sequence(100, 4) == per_layer_token * (8 + 100 + 8)
    assert config.kv_bytes_per_sequence(5, 4) == per_layer_token * 15


@pytest.mark.slow  # about 2 minutes on 2 cores: eight engines and their compiles
def test_tensor_parallel_degrees_match_degree_1(family_dirs):
    """Qwen3 (dense) and Qwen3-MoE on 8 simulated devices: degrees 2 and 4 give degree 1's
    tokens and logits; experts split like an MLP (tensor parallel) or whole per device (expert
    parallel, the rules table's other choice)."""
    from tests.sharded_worker import run_worker

    models = {"dense": family_dirs("qwen3"), "moe": family_dirs("qwen3-moe")}
    args = {"models": models, "degrees": [1, 2, 4]}
    result = run_worker("families_tp", args, num_devices=8, timeout=600)
    for name in models:
        runs = result[name]
        for degree in ("2", "4"):
            assert runs[degree]["tokens"] == runs["1"]["tokens"], (name, degree)
            assert runs[degree]["logits_diff"] < 1e-4, (name, degree)
    moe = result["moe"]
    for degree in (2, 4):  # 8 experts of width 32, hidden 64
        assert moe[str(degree)]["expert_shards"] == [[8, 64, 32 // degree]] * degree
        assert moe[f"ep{degree}"]["expert_shards"] == [[8 // degree, 64, 32]] * degree
        assert moe[f"ep{degree}"]["logits_diff"] < 1e-4


@pytest.mark.parametrize(
    "backend", ["pallas-gpu", pytest.param("pallas-tpu", marks=pytest.mark.slow), "cpu"]
)
def test_every_backend_honours_soft_cap_and_sliding_window(backend, family_dirs):
    """Gemma 2 (attention soft cap, window 8 on alternate layers) over 20 tokens: each backend's
    kernels (Pallas ones interpreted on CPU) give the reference backend's logits."""
    from jaxgen.backends import resolve_backend_name

    if backend == "cpu" and resolve_backend_name("auto") != "cpu":
        pytest.skip("the native CPU kernels could not be built here")
    loaded = load_model(family_dirs("gemma2"))
    ids = np.random.default_rng(1).integers(0, loaded.config.vocab_size, 20).tolist()
    reference = full_sequence_logits(loaded, ids, backend="reference")
    ours = full_sequence_logits(loaded, ids, backend=backend)
    assert np.abs(ours - reference).max() <= 1e-4


def test_parameter_counts_of_published_shapes():
    """Mixtral-8x7B: 46.7B parameters, 12.7B read per token (2 of 8 experts, the LM head but
    not the untied embedding table); the planner's batch-1 floor reads the active ones."""
    from jaxgen.planning.capacity import make_plan
    from jaxgen.planning.hardware import DEVICES

    mixtral = ModelConfig.from_hf_dict(
        dict(
            model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
            num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
            num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=32768,
        )
    )  # fmt: skip
    assert round(mixtral.num_params / 1e9, 1) == 46.7
    assert round(mixtral.num_active_params / 1e9, 1) == 12.7
    plan = make_plan(mixtral, device=DEVICES["h100"], dtype="bfloat16")
    bandwidth = DEVICES["h100"].bandwidth_bytes_per_s
    assert plan.decode_floor_ms_batch1 == pytest.approx(
        mixtral.num_active_params * 2 / bandwidth * 1e3
    )
