"""Whether engines fit one GPU (``jaxgen.planning.gpu_fit``, ``jaxgen plan --target t4 --fit``):
pools sized as the engine sizes them, the largest step compiled for the GPU by XLA's GPU compiler
on this host (jax's CUDA plugin, the gpu-compile extra; no GPU)."""

from __future__ import annotations

import json

import pytest

from jaxgen.cli import main
from jaxgen.config import ModelConfig
from jaxgen.planning.gpu_fit import EngineSizes, plan_gpu_fit
from jaxgen.planning.gpu_targets import cuda_plugin_installed

pytestmark = pytest.mark.skipif(
    not cuda_plugin_installed(), reason="needs the gpu-compile extra (jax's CUDA plugin)"
)

SMALL_LLAMA = dict(
    model_type="llama", vocab_size=4096, hidden_size=512, intermediate_size=1024,
    num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
    max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False,
)  # fmt: skip
PAGE_BYTES = 2 * 1 * 2 * 16 * 128 * 2  # K and V, 1 layer, 2 KV heads, 16 tokens, head_dim 128, fp16


@pytest.fixture(autouse=True)
def _default_memory_fraction(monkeypatch):
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)  # jax's default: 0.75


def _config(**fields) -> ModelConfig:
    return ModelConfig.from_hf_dict({**SMALL_LLAMA, **fields})


def test_pools_are_sized_as_the_engine_sizes_them():
    """None: 0.9 of what the allocator has free; a fraction of what the engines before left;
    bytes: whole pages of them."""
    config = _config()
    engines = [
        EngineSizes(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64),
        EngineSizes(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
                    kv_cache_memory=0.5),
        EngineSizes(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
                    kv_cache_memory=100 * PAGE_BYTES + 7),
    ]  # fmt: skip
    fit = plan_gpu_fit(config, "t4", engines, sampler=False)
    assert (fit.dtype, fit.attention_backend) == ("float16", "reference")  # auto on a T4
    assert fit.allocator_limit == int(fit.memory * 0.75)
    free = fit.allocator_limit - fit.weights
    first, second, third = fit.kv_pools
    assert free * 0.9 - PAGE_BYTES < first <= free * 0.9 and first % PAGE_BYTES == 0
    assert (free - first) * 0.5 - PAGE_BYTES < second <= (free - first) * 0.5
    assert third == 100 * PAGE_BYTES
    step = fit.largest_step  # the top token bucket, block tables covering max_model_len
    assert (step["tokens"], step["seq_slots"], step["width_tokens"]) == (64, 4, 256)
    assert (
        step["temp"] > 0
        and fit.peak == fit.weights + sum(fit.kv_pools) + step["temp"] + (step["outputs"])
    )
    assert fit.fits and fit.sampler is None


def test_a_pool_past_the_allocator_does_not_fit_and_one_too_small_is_refused():
    config = _config()
    too_big = EngineSizes(max_model_len=256, max_num_seqs=4, max_num_batched_tokens=64,
                          kv_cache_memory=int(12e9))  # fmt: skip
    fit = plan_gpu_fit(config, "t4", [too_big], sampler=False)
    assert not fit.fits and "does not fit" in fit.lines()[-1]
    one_page = EngineSizes(max_model_len=256, kv_cache_memory=PAGE_BYTES)
    with pytest.raises(ValueError, match="kv_cache_memory"):
        plan_gpu_fit(config, "t4", [one_page], sampler=False)
    with pytest.raises(ValueError, match="engines"):
        plan_gpu_fit(config, "t4", [])


def test_extrapolated_layers_come_close_to_compiling_them_all():
    config = _config(num_hidden_layers=4)
    sizes = [EngineSizes(max_model_len=1024, max_num_seqs=8, max_num_batched_tokens=128)]
    full = plan_gpu_fit(config, "t4", sizes, sampler=False)
    fast = plan_gpu_fit(config, "t4", sizes, extrapolate=True, sampler=False)
    assert fast.extrapolated and not full.extrapolated
    exact, estimate = full.largest_step["temp"], fast.largest_step["temp"]
    assert abs(estimate - exact) <= 0.05 * exact


def test_a_gpu_with_triton_fits_with_pallas_gpu_and_its_decode_only_step():
    fit = plan_gpu_fit(_config(), "l4", [EngineSizes(max_model_len=256, max_num_seqs=4,
                                                     max_num_batched_tokens=64)], sampler=False)  # fmt: skip
    assert (fit.dtype, fit.attention_backend) == ("bfloat16", "pallas-gpu")
    assert fit.fits and fit.largest_step["tokens"] in (4, 64)


def test_plan_fit_on_the_command_line(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    args = ["plan", "--model", str(config), "--target", "t4", "--fit", "--max-model-len", "512",
            "--max-num-seqs", "8", "--max-num-batched-tokens", "64", "--kv-cache-memory", "0.5",
            "--device-memory", str(int(14.75 * 2**30))]  # fmt: skip
    assert main([*args, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["fits"] and result["attention_backend"] == "reference"
    assert result["memory"] == int(14.75 * 2**30)  # as CUDA reports a T4's with ECC on
    free = result["allocator_limit"] - result["weights"]
    assert free * 0.5 - PAGE_BYTES < result["kv_pools"][0] <= free * 0.5
    sampler = result["sampler"]  # compiled by default, over the largest step's 8 logits rows
    assert sampler["logits"] == 8 * 4096 * 4 and sampler["temp"] > 0
    assert result["peak"] >= result["weights"] + sum(result["kv_pools"]) + sum(sampler.values())
    assert main(args) == 0
    assert "fits" in capsys.readouterr().out.splitlines()[-1]
    assert main(["plan", "--model", str(config), "--target", "v5e-1", "--fit"]) == 2
    assert "--fit needs a GPU --target" in capsys.readouterr().err
