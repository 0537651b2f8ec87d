"""The pallas-tpu backend: through the engine (kernels in TPU interpret mode on CPU) it gives
the reference backend's greedy tokens; its decode step compiles ahead of time for TPU slices
(libtpu's compiler, no TPU), with the kernels in the step and no copy of the pool."""

from __future__ import annotations

import importlib.util
import json

import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.config import ModelConfig

SMOLLM2_SHAPE = dict(  # two layers of SmolLM2-135M
    model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
    num_hidden_layers=2, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
    tie_word_embeddings=True,
)  # fmt: skip
LLAMA3_8B = dict(
    model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
    tie_word_embeddings=False,
)  # fmt: skip

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="libtpu (the tpu extra) is not installed"
)


@pytest.mark.slow
def test_engine_greedy_tokens_match_reference(tiny_loaded):
    prompts = [list(range(100, 140)), list(range(7, 30)), list(range(300, 303))]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    outs = {}
    # the last: the TPU kernels inside a multi-step call (4 decode steps in one scan)
    for backend, steps in (("reference", 1), ("pallas-tpu", 1), ("pallas-tpu", 4)):
        llm = LLM(
            tiny_loaded,
            max_model_len=128,
            kv_cache_memory=4 << 20,
            page_size=16,
            max_rolling_batch_prefill_tokens=16,  # chunked prefill beside decode rows
            max_rolling_batch_size=4,
            attention_backend=backend,
            num_scheduler_steps=steps,
        )
        assert llm.engine.runner.backend.name == backend
        outs[backend, steps] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert llm.stats()["kv_pages_used"] == 0
        assert (llm.stats()["multi_step_calls"] > 0) == (steps > 1)
    assert outs["pallas-tpu", 1] == outs["reference", 1]
    assert outs["pallas-tpu", 4] == outs["reference", 1]


@pytest.mark.slow
def test_engine_8bit_pool_greedy_tokens_match_reference(tiny_loaded):
    """An int8 pool: the TPU kernels (update + attention dequantising in VMEM) and the
    reference backend quantise alike (per token and KV head), so their greedy tokens agree."""
    prompts = [list(range(100, 140)), list(range(7, 30))]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    outs = {}
    for backend in ("reference", "pallas-tpu"):
        llm = LLM(
            tiny_loaded,
            max_model_len=256,
            kv_cache_memory=4 << 20,
            page_size=128,  # the TPU pool's scales put a page's tokens on 128 lanes
            max_rolling_batch_prefill_tokens=16,
            max_rolling_batch_size=4,
            attention_backend=backend,
            kv_cache_dtype="int8",
        )
        assert llm.engine.runner.backend.kv_cache_dtype == "int8"
        outs[backend] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs["pallas-tpu"] == outs["reference"]


@needs_libtpu
@pytest.mark.tpu_compile
@pytest.mark.slow
def test_default_model_compiles_for_v5e_1_within_the_floor():
    """SmolLM2-135M (its GGUF's config): the whole step, no copy of the 14 GB pool, counted
    bytes within 1.25x of weights + live KV in the pool's padded layout."""
    from jaxgen.backends import PallasTPUBackend
    from jaxgen.planning.ahead_of_time import compile_decode_step, config_from_path

    config = config_from_path(None)
    result = compile_decode_step(config, "v5e-1", max_model_len=2048, max_num_seqs=64)
    assert result["attention_backend"] == "pallas-tpu"
    assert {"ragged_paged_attention", "kv_cache_update"} <= set(result["kernels"])
    chip, step = result["per_chip_bytes"], result["decode_step"]
    assert chip["temp"] < 0.02 * chip["hbm"]
    assert chip["kv_pool"] >= 0.85 * (chip["hbm"] - chip["weights"])
    # head_dim 64 is padded to 128 lanes and 3 KV heads to 4: the kernel reads padded pages.
    padded_kv = PallasTPUBackend().kv_bytes_per_page(config, 16, "bfloat16") * 128 * 64
    assert step["bytes_accessed"] <= 1.25 * (chip["weights"] + padded_kv)  # 1.16x at e22a567


@pytest.mark.slow
@needs_libtpu
@pytest.mark.tpu_compile
def test_llama3_8b_shape_compiles_for_v5e_4(tmp_path):
    from jaxgen.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA3_8B))
    from jaxgen.planning.ahead_of_time import compile_decode_step

    result = compile_decode_step(
        ModelConfig.from_hf_dict(LLAMA3_8B), "v5e-4", max_model_len=2048, max_num_seqs=64
    )
    chip, step = result["per_chip_bytes"], result["decode_step"]
    assert result["num_chips"] == 4 and result["tensor_parallel_degree"] == 4
    assert result["attention_backend"] == "pallas-tpu"
    assert chip["temp"] < 0.02 * chip["hbm"]
    assert chip["kv_pool"] >= 0.85 * (chip["hbm"] - chip["weights"])
    # Projections streamed from HBM by the Pallas matmul; the floor is the weights a step reads
    # (not the untied embedding table, only its rows) plus every sequence's KV.
    assert "streamed_matmul_kernel" in result["kernels"]
    assert step["ratio"] <= 1.15  # 1.08 at this commit
    assert main(["plan", "--model", str(path), "--target", "bogus", "--compile"]) == 2


@needs_libtpu
@pytest.mark.tpu_compile
def test_kv_heads_fewer_than_chips_compile_for_v6e_8():
    """4 KV heads on 8 chips: each chip holds the one (repeated) KV head its query heads read."""
    from jaxgen.planning.ahead_of_time import compile_decode_step

    gqa = dict(LLAMA3_8B, num_hidden_layers=2, num_key_value_heads=4, vocab_size=32000)
    result = compile_decode_step(
        ModelConfig.from_hf_dict(gqa), "v6e-8", max_model_len=2048, max_num_seqs=64
    )
    chip = result["per_chip_bytes"]
    assert result["num_chips"] == 8 and result["attention_backend"] == "pallas-tpu"
    assert chip["temp"] < 0.02 * chip["hbm"]
    # one KV head per chip: 2 layers x 2 (K, V) x 128 lanes x 2 bytes per token
    assert chip["kv_pool"] == result["num_pages"] * 16 * 2 * 2 * 128 * 2


@needs_libtpu
@pytest.mark.tpu_compile
def test_multi_step_call_compiles_for_v5e_1():
    """The engine's multi-step call (4 decode steps in one scan) with int8 weights and an int8
    pool: the kernels inside the loop, the pool updated in place (no copy), and the call's
    counted bytes those of one step and its sampler (XLA counts a loop body once)."""
    from jaxgen.planning.ahead_of_time import compile_decode_step

    config = ModelConfig.from_hf_dict(SMOLLM2_SHAPE)
    results = {
        steps: compile_decode_step(
            config,
            "v5e-1",
            max_model_len=1024,
            max_num_seqs=32,
            page_size=128,
            quantization="int8",
            kv_cache_dtype="int8",
            num_scheduler_steps=steps,
        )
        for steps in (1, 4)
    }
    one, four = results[1], results[4]
    assert four["num_scheduler_steps"] == 4
    assert set(four["kernels"]) == set(one["kernels"])
    assert {
        "kv_cache_update_quantized",
        "ragged_paged_attention_quantized",
        "rotary_embedding",
        "streamed_gated_matmul_int8",
        "streamed_matmul_int8",
    } <= set(four["kernels"])
    chip = four["per_chip_bytes"]
    assert chip["kv_pool"] == one["per_chip_bytes"]["kv_pool"]
    assert chip["temp"] < 0.02 * chip["hbm"]  # the pool (>= 85% of HBM) is not copied
    # The scan's body also samples (every sampler stage, each behind a conditional the count
    # includes), which the one-step executable leaves to the sampler's own program: more than
    # one step's model bytes, but nowhere near four steps' (a copied pool or an unrolled loop).
    ratio = four["decode_step"]["bytes_accessed"] / one["decode_step"]["bytes_accessed"]
    assert 0.8 < ratio < 2.0, ratio
    with pytest.raises(ValueError, match="num_scheduler_steps must be an integer >= 1"):
        compile_decode_step(config, "v5e-1", num_scheduler_steps=0)


@needs_libtpu
@pytest.mark.tpu_compile
def test_bad_targets_are_clear_errors():
    from jaxgen.planning.ahead_of_time import compile_decode_step, resolve_target

    with pytest.raises(ValueError, match="v5e-1, v5e-4"):
        resolve_target("h100")
    config = ModelConfig.from_hf_dict(SMOLLM2_SHAPE)
    with pytest.raises(ValueError, match="tensor_parallel_degree=3"):
        compile_decode_step(config, "v5e-4", tensor_parallel_degree=3)
    with pytest.raises(ValueError, match="query heads"):
        compile_decode_step(config, "v5e-4")  # 9 heads do not split 4 ways


def test_decode_step_lowers_for_cuda_with_the_triton_kernel():
    """Lowered only: the step with the pallas-gpu backend calls the ragged kernel's wrapper (its
    decode and prefill Triton kernels) once per layer; nothing compiles or runs for a GPU here.
    On jax 0.11 this needs the abstract GPU the lowering runs under."""
    from jaxgen.planning.ahead_of_time import lower_decode_step_for_cuda

    config = ModelConfig.from_hf_dict(SMOLLM2_SHAPE)
    result = lower_decode_step_for_cuda(config, max_model_len=512, max_num_seqs=8)
    assert result["attention_backend"] == "pallas-gpu"
    assert result["custom_calls"] == {"__gpu$xla.gpu.triton": 2}
    assert result["triton_kernels"] == [
        "ragged_paged_attention_decode",
        "ragged_paged_attention_prefill",
    ]
    assert sum(result["kernel_calls"].values()) == config.num_layers


@needs_libtpu
@pytest.mark.parametrize("target", ["v5e-1", "v6e-1", "v5e-8"])
def test_autos_choice_compiles_for_the_notebook_tpu_slices(target):
    """The slices Colab and Kaggle lend: what auto picks there (pallas-tpu, bfloat16) compiles
    with its three kernels, one layer, a few seconds each."""
    from jaxgen.planning.ahead_of_time import compile_decode_step

    config = ModelConfig.from_hf_dict(
        dict(LLAMA3_8B, num_hidden_layers=1, hidden_size=512, intermediate_size=1024,
             num_attention_heads=8, num_key_value_heads=2, vocab_size=4096)
    )  # fmt: skip
    result = compile_decode_step(config, target, max_model_len=1024, max_num_seqs=4)
    assert result["auto"] == {"attention_backend": "pallas-tpu", "dtype": "bfloat16"}
    assert (result["attention_backend"], result["dtype"]) == ("pallas-tpu", "bfloat16")
    assert {"ragged_paged_attention", "kv_cache_update"} <= set(result["kernels"])
    assert result["tensor_parallel_degree"] == result["num_chips"] == int(target.split("-")[1])


@pytest.mark.parametrize("qtype, streamed", [("Q6_K", False), ("Q4_K", True)])
def test_kept_gguf_weights_stream_or_keep_xlas_dot(tmp_path, qtype, streamed):
    """A kept GGUF's matrices on the pallas-tpu backend: int4 codes (Q4_K) are streamed by the
    quantised Pallas matmul; bit planes (Q6_K's 6-bit codes) stay ``QuantizedWeight``s on XLA's
    dot, at the file's bytes; either way the logits are the reference backend's."""
    import numpy as np
    from flax import nnx

    from jaxgen.backends.pallas_tpu import PallasTPUBackend
    from jaxgen.backends.streamed_quantized_weight import StreamedQuantizedWeight
    from jaxgen.evaluation.agreement import sequence_logits
    from jaxgen.quantization import QuantizedWeight
    from tests.loaders.test_gguf_kept_models import VOCAB, load_tiny, write_tiny_gguf

    loaded = load_tiny(write_tiny_gguf(str(tmp_path / f"{qtype}.gguf"), qtype), "auto")
    params, _ = PallasTPUBackend(interpret=True).prepare_params(loaded.params, loaded.config)
    kernels = [var.get_value() for path, var in nnx.to_flat_state(params) if path[-1] == "kernel"]
    kind = StreamedQuantizedWeight if streamed else QuantizedWeight
    assert len(kernels) == 14 and all(isinstance(kernel, kind) for kernel in kernels)
    sequences = np.random.default_rng(0).integers(0, VOCAB, (2, 8))
    expected = sequence_logits(loaded, sequences, backend="reference")
    actual = sequence_logits(loaded, sequences, backend="pallas-tpu")
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)
