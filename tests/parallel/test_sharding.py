"""Tensor parallelism: the rule table, plans, and sharded generation on simulated CPU devices.

Sharded runs happen in a fresh process (``tests/sharded_worker.py``): the device count must be
set before jax starts, and this pytest process may already have started it with one device.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxgen.config import ModelConfig
from jaxgen.layers.sharding import (
    KV_POOL_LOGICAL_AXES,
    LOGICAL_AXIS_RULES,
    ShardingPlan,
    logical_axes,
    make_mesh,
    param_logical_axes,
    path_name,
    resolve_rules,
)
from jaxgen.models.weights import abstract_model
from tests.family_models import save_tiny_model
from tests.sharded_worker import run_worker

SMOLLM2_SHAPE = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=2,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    tie_word_embeddings=True,
)


def tiny_config(**overrides) -> ModelConfig:
    base = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=8,
        num_kv_heads=2,
        head_dim=8,
    )
    return ModelConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def gqa_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    path = str(tmp_path_factory.mktemp("tiny-gqa8-2"))
    return save_tiny_model(path, smollm2_tokenizer, num_attention_heads=8, num_key_value_heads=2)


# -- the rule table (no devices needed) ------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": True}, {"qkv_bias": True, "o_bias": True, "mlp_bias": True}],
)
def test_every_parameter_declares_its_axes_once(overrides):
    _, state = abstract_model(tiny_config(**overrides), jnp.float32)
    for path, var in nnx.to_flat_state(state):
        name = path_name(path)
        matches = [axes for pattern, axes in param_logical_axes() if re.fullmatch(pattern, name)]
        assert len(matches) == 1, name
        assert len(matches[0]) == var.get_value().ndim, name
        assert set(matches[0]) - {None} <= dict(LOGICAL_AXIS_RULES).keys()


def test_rules_are_megatron_style():
    rules = dict(LOGICAL_AXIS_RULES)
    assert rules == {
        "vocab": "model",
        "embed": None,
        "heads": "model",
        "kv_heads": "model",
        "mlp": "model",
        "expert": None,
        "expert_mlp": "model",
    }
    assert logical_axes(("layers", 3, "self_attn", "q_proj", "kernel")) == ("embed", "heads")
    assert logical_axes(("layers", 0, "mlp", "down_proj", "kernel")) == ("mlp", "embed")
    assert logical_axes(("embed_tokens", "embedding")) == ("vocab", "embed")
    assert KV_POOL_LOGICAL_AXES[0] == "kv_heads"
    with pytest.raises(ValueError, match="no logical axes"):
        logical_axes(("layers", 0, "mystery", "kernel"))


def test_degree_not_dividing_query_heads_is_a_clear_error():
    with pytest.raises(
        ValueError, match=r"tensor_parallel_degree=2 .* 9 query heads \(3 KV heads\)"
    ):
        resolve_rules(ModelConfig(**SMOLLM2_SHAPE), 2)
    rules, notes = resolve_rules(ModelConfig(**SMOLLM2_SHAPE), 3)
    assert dict(rules)["kv_heads"] == "model" and not notes


def test_fallbacks_replicate_axes_that_do_not_split():
    rules, notes = resolve_rules(
        tiny_config(num_kv_heads=2, vocab_size=250, intermediate_size=100), 8
    )
    rules = dict(rules)
    assert rules["heads"] == "model"
    assert rules["kv_heads"] is None and rules["vocab"] is None and rules["mlp"] is None
    assert len(notes) == 3 and any("KV heads" in n for n in notes)


def test_plan_on_one_device():
    mesh = make_mesh(1, devices=jax.devices()[:1])
    plan = ShardingPlan.create(tiny_config(), mesh)
    array = np.arange(64 * 64, dtype=np.float32).reshape(64, 64)
    placed = plan(("layers", 0, "self_attn", "q_proj", "kernel"), array)
    np.testing.assert_array_equal(np.asarray(placed), array)
    assert plan.kv_sharding.spec == jax.sharding.PartitionSpec("model", None, None, None)


def test_too_few_devices_is_a_clear_error():
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        make_mesh(len(jax.devices()) + 1)


def test_llm_rejects_bad_degree_before_loading(tiny_model_dir):
    from jaxgen import LLM

    with pytest.raises(ValueError, match=r"4 query heads \(2 KV heads\)"):
        LLM(tiny_model_dir, tensor_parallel_degree=3)


# -- sharded runs on 8 simulated devices ------------------------------------------------------------
@pytest.mark.slow
def test_degrees_give_same_tokens_and_logits(mha_dir, gqa_dir):
    result = run_worker(
        "tp",
        {"mha": mha_dir, "gqa": gqa_dir, "degrees": [1, 2, 4, 8], "gqa_degrees": [1, 4]},
        num_devices=8,
    )
    tokens = result["tokens"]
    for degree in ("2", "4", "8"):
        assert tokens[degree] == tokens["1"], degree
        assert result["logits_max_diff"][degree] < 1e-4, degree
    # Parameters are really split: whole heads per device, row/column/vocab parallel.
    for degree in (2, 4, 8):
        params = result["params"][str(degree)]
        assert params["q_proj"]["shards"] == [[64, 64 // degree]] * degree
        assert params["k_proj"]["shards"] == [[64, 64 // degree]] * degree
        assert params["o_proj"]["shards"] == [[64 // degree, 64]] * degree
        assert params["up_proj"]["shards"] == [[64, 128 // degree]] * degree
        assert params["down_proj"]["shards"] == [[128 // degree, 64]] * degree
        assert params["embedding"]["shards"] == [[49152 // degree, 64]] * degree
        assert all(shape[0] == 8 // degree for shape in params["kv_pool"]["shards"])
    # GQA with 2 KV heads at degree 4: query heads split, KV projections and pool replicated.
    gqa = result["gqa"]
    assert gqa["4"]["tokens"] == gqa["1"]["tokens"]
    assert gqa["4"]["params"]["q_proj"]["shards"] == [[64, 16]] * 4
    assert gqa["4"]["params"]["k_proj"]["shards"] == [[64, 16]] * 4  # 2 heads x 8, whole
    assert all(shape[0] == 2 for shape in gqa["4"]["params"]["kv_pool"]["shards"])


@pytest.fixture(scope="module")
def head_dim_64_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    """2 query heads, 2 KV heads of 64 (an 8-bit pool's codes are 64 bytes a head beside one scale)."""
    path = str(tmp_path_factory.mktemp("tiny-hd64"))
    return save_tiny_model(
        path, smollm2_tokenizer, hidden_size=128, num_attention_heads=2, num_key_value_heads=2
    )


def check_kv_pool_cases(result: dict, cases: list) -> None:
    """Each degree's tokens equal degree 1's (same model, backend and pool dtype), and its pool
    is split over the KV heads as the degree allows (an 8-bit pool's codes and scales alike)."""
    for model, backend, kv_cache_dtype, degree in cases:
        case = result[f"{model} {backend} {kv_cache_dtype} {degree}"]
        eight_bit = kv_cache_dtype != "auto"
        assert case["backend"] == backend, case
        assert case["pool"] == ("QuantizedPages" if eight_bit else "ArrayImpl"), case
        # hd64 (2 layers, 2 KV heads of 64): codes + a bfloat16 scale per head, or float32.
        per_token = {"hd64": 528 if eight_bit else 2048, "gqa": 80 if eight_bit else 256}
        heads = 2 if degree == 1 or model == "gqa" else 1  # gqa at degree 4: replicated
        assert case["stats"] == {
            "kv_cache_dtype": kv_cache_dtype,
            "kv_bytes_per_token": per_token[model],
            "kv_bytes_per_token_per_device": per_token[model] * heads // 2,
        }
        if degree == 1:
            continue
        assert case["tokens"] == result[f"{model} {backend} {kv_cache_dtype} 1"]["tokens"], case
        pages, head_dim = case["values"][0][1], 64 if model == "hd64" else 8
        assert case["values"] == [[heads, pages, 16, head_dim]] * degree
        if eight_bit:
            assert case["scales"] == [[heads, pages, 16, 1]] * degree  # one scale per head
        spec = "P('model',)" if heads == 1 else "P()"
        assert case["spec"] == [spec] * (1 + eight_bit)  # after the steps too


@pytest.mark.slow  # 13-30 s on 2 cores: the default suite stays near 15 min
def test_8bit_kv_pool_under_tensor_parallelism(head_dim_64_dir):
    """An int8 pool at degree 2 gives degree 1's greedy tokens on the native cpu backend
    (its kernels inside shard_map), through paged batching with chunked prefill (16-token
    steps); each device holds its KV head's codes and scales."""
    cases = [["hd64", "cpu", "int8", degree] for degree in (1, 2)]
    result = run_worker(
        "kv_pool_tp", {"models": {"hd64": head_dim_64_dir}, "cases": cases}, num_devices=2
    )
    check_kv_pool_cases(result, cases)


@pytest.mark.slow
def test_kv_pools_under_tensor_parallelism_on_every_paired_backend(head_dim_64_dir, gqa_dir):
    """Degree 2 against degree 1: int8 on the reference backend (XLA's partitioner) and on
    pallas-gpu (interpreted, inside shard_map), fp8 and the float pool on cpu; and int8 on cpu
    at degree 4 over 2 KV heads (replicated: every device attends with every head)."""
    cases = [
        [model, backend, kv_cache_dtype, degree]
        for model, backend, kv_cache_dtype, degrees in (
            ("hd64", "reference", "int8", (1, 2)),
            ("hd64", "pallas-gpu", "int8", (1, 2)),
            ("hd64", "cpu", "fp8", (1, 2)),
            ("hd64", "cpu", "auto", (1, 2)),
            ("gqa", "cpu", "int8", (1, 4)),
        )
        for degree in degrees
    ]
    result = run_worker(
        "kv_pool_tp",
        {"models": {"hd64": head_dim_64_dir, "gqa": gqa_dir}, "cases": cases},
        num_devices=4,
        timeout=900,
    )
    check_kv_pool_cases(result, cases)


def test_pallas_gpu_8bit_pool_lowers_for_cuda_under_tensor_parallelism():
    """Lowered only (no GPU here): at degree 2 each layer's write and Triton kernels run inside
    shard_map on one device's KV head: its codes [1, P, S, 64] int8 and scales [1, P, S, 1]."""
    config = dict(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
    )
    result = run_worker(
        "cuda_lowering_tp", {"config": config, "kv_cache_dtype": "int8"}, num_devices=2
    )
    assert result["custom_calls"] == {"__gpu$xla.gpu.triton": 2}  # decode, prefill: private
    assert result["triton_kernels"] == [
        "ragged_paged_attention_decode",
        "ragged_paged_attention_prefill",
    ]
    assert sum(result["kernel_calls"].values()) == 2  # called once per layer
    assert result["shard_map_regions"] == 2
    pages = result["num_pages"]
    assert result["pool_shard_types"] == {
        f"tensor<1x{pages}x16x1xui16>": True,
        f"tensor<1x{pages}x16x64xi8>": True,
    }


@pytest.mark.slow
def test_quantized_weights_stay_quantised_under_tensor_parallelism(mha_dir):
    """int8 and int4 (group 32) weights placed on 2 simulated devices: still QuantizedWeights,
    values and scales split along the same axis (columns for q_proj, the input dim for o_proj,
    vocab for the tied embedding held as its head kernel), and the same tokens and logits as
    one device; 4 devices would split o_proj's 2 groups mid-group: a ValueError naming it."""
    result = run_worker("quantized_tp", {"mha": mha_dir, "kinds": ["int8", "int4"]}, num_devices=4)
    for kind, row in result.items():
        assert row["tokens"]["2"] == row["tokens"]["1"], kind
        assert row["logits_max_diff"]["2"] < 1e-4, kind
        placed = row["2"]
        assert {case["type"] for case in placed.values()} == {"QuantizedWeight"}
        values_rows = 64 if kind == "int8" else 32  # int4 packs two rows per byte
        assert placed["q_proj"]["values"] == [[values_rows, 32]] * 2, kind
        assert placed["q_proj"]["scales"] == [[2, 32]] * 2, kind
        assert placed["o_proj"]["values"] == [[values_rows // 2, 64]] * 2, kind
        assert placed["o_proj"]["scales"] == [[1, 64]] * 2, kind
        assert placed["embedding"]["values"] == [[64, 49152 // 2]] * 2, kind  # int8 head
        assert "layers.0.self_attn.o_proj.kernel" in row["degree4_error"], kind
        assert "group boundaries" in row["degree4_error"], kind


def test_bit_plane_weights_split_along_either_axis_exactly():
    """GGUF's 2-, 3-, 5- and 6-bit types kept as bit planes, placed on 2 and 4 simulated
    devices: split along the input dim (o_proj: each device whole 8-row blocks of planes, its
    super-blocks' scales and codes) or the columns (up_proj), the jitted dequantisation is the
    unsplit weight bit for bit without gathering it, and the matmul agrees; a split through
    4-bit codes' byte pairs is a ValueError naming the tensor."""
    qtypes = ["Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q5_K", "Q6_K"]
    result = run_worker("bit_planes_tp", {"qtypes": qtypes, "degrees": [2, 4]}, num_devices=4)
    bits = {"Q5_0": 5, "Q5_1": 5, "Q2_K": 2, "Q3_K": 3, "Q5_K": 5, "Q6_K": 6}
    for qtype in qtypes:
        for degree in (2, 4):
            depth_split = result[f"{qtype}/{degree}/o_proj"]
            column_split = result[f"{qtype}/{degree}/up_proj"]
            for case in (depth_split, column_split):
                assert case["exact"] and not case["all_gather"], (qtype, degree)
                assert case["matmul_error"] < 1e-4, (qtype, degree)
            rows = 1024 * bits[qtype] // 8
            assert depth_split["values"] == [[rows // degree, 64]] * degree, qtype
            assert column_split["values"] == [[rows, 64 // degree]] * degree, qtype
    assert result["Q2_K/2/o_proj"]["scale_codes"] == [[16, 64]] * 2  # 64 groups, two a byte
    assert result["Q6_K/4/o_proj"]["scale_codes"] == [[16, 64]] * 4
    error = result["split_error"]
    assert "layers.0.self_attn.o_proj.kernel" in error and "two 4-bit group codes a byte" in error


def test_streamed_weights_are_placed_as_xla_would_split_the_dot():
    """The pallas-tpu backend's weights inside shard_map: column-split (outputs split),
    depth-split (partial products summed over chips), replicated, and a vocab-split embedding
    used transposed as the LM head, whose 100,000 columns are padded to tile 4 x 128 lanes."""
    result = run_worker("streamed_weight", {}, num_devices=4)
    assert {name: case["split"] for name, case in result.items()} == {
        "columns": "columns",
        "depth": "depth",
        "replicated": None,
        "head": "columns",
    }
    assert result["head"]["stored"] == [100_352, 64]  # 4 x 196 x 128
    for name, case in result.items():
        assert case["max_error"] < 1e-4, name


@pytest.mark.slow
def test_smollm2_degree_3_matches_degree_1():
    result = run_worker("smollm2", {}, num_devices=8, timeout=600)
    assert "9 query heads (3 KV heads)" in result["degree2_error"]
    assert result["3"] == result["1"]
    params = result["params"]
    assert params["q_proj"]["shards"] == [[576, 192]] * 3  # 3 of 9 heads each
    assert params["k_proj"]["shards"] == [[576, 64]] * 3  # 1 of 3 KV heads each
    assert all(shape[0] == 1 for shape in params["kv_pool"]["shards"])


@pytest.mark.parametrize(
    "variant",
    ["qwen3", "gemma3", "phi3-longrope", "qwen2-moe-shared-expert", "falcon-40b-grouped"],
)
def test_every_family_parameter_declares_its_axes_once(variant):
    from tests.family_models import VARIANTS

    family, overrides = VARIANTS[variant]
    base = dict(
        model_type=family,
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    hf = {**base, **overrides}
    if family == "falcon":
        hf["ffn_hidden_size"] = 128
    config = ModelConfig.from_hf_dict(hf)
    _, state = abstract_model(config, jnp.float32)
    for path, var in nnx.to_flat_state(state):
        name = path_name(path)
        matches = [axes for pattern, axes in param_logical_axes() if re.fullmatch(pattern, name)]
        assert len(matches) == 1, name
        assert len(matches[0]) == var.get_value().ndim, name


def test_experts_fall_back_to_expert_parallel():
    from jaxgen.config import MoEConfig

    moe = MoEConfig(num_experts=8, num_experts_per_token=2, expert_size=10)
    rules, notes = resolve_rules(tiny_config(moe=moe), 4)
    rules = dict(rules)
    assert rules["expert"] == "model" and rules["expert_mlp"] is None
    assert any("expert parallel" in n for n in notes)
