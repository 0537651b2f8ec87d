"""The decode step compiled for a GPU by XLA's GPU compiler on this host (``jaxgen plan --target
t4|l4|a100|h100|h200``; jax's CUDA plugin, the gpu-compile extra, no GPU): what ``auto`` picks
compiles for every target (no Triton below compute capability 8.0), every pallas-gpu option and
pool the device check runs compiles to GPU code, and the launch counts docs/gpu.md quotes hold."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from jaxgen.backends.pallas_gpu import XLA_GEMMS
from jaxgen.cli import main
from jaxgen.config import ModelConfig
from jaxgen.planning import gpu_targets
from jaxgen.planning.gpu_compile import compile_decode_step_for_gpu, kernel_launches
from jaxgen.planning.gpu_targets import cuda_plugin_installed, resolve_gpu_target

needs_plugin = pytest.mark.skipif(
    not cuda_plugin_installed(), reason="needs the gpu-compile extra (jax's CUDA plugin)"
)

SMALL_LLAMA = dict(
    model_type="llama", vocab_size=4096, hidden_size=512, intermediate_size=1024,
    num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
    max_position_embeddings=4096, rope_theta=500000.0, tie_word_embeddings=False,
)  # fmt: skip

ENTRY = """HloModule jit_step

%fused_add (p0: f32[2], p1: f32[2]) -> f32[2] {
  %inner = f32[2]{0} fusion(%p0, %p1), kind=kLoop, calls=%other
}

ENTRY %main.1 (p0: bf16[2,64], p1: bf16[64,128]) -> bf16[2,64] {
  %p0 = bf16[2,64]{1,0} parameter(0)
  %gemm_fusion_dot.2 = f32[4,2,128]{2,1,0} fusion(%p0, %p1), kind=kCustom, calls=%g, backend_config={"fusion_backend_config":{"kind":"__triton_nested_gemm_fusion"}}
  %custom-call.1 = (bf16[8,128]{1,0}, s8[4]{0}) custom-call(%a, %b), custom_call_target="__cublas$lt$matmul"
  %get-tuple-element.1 = bf16[8,128]{1,0} get-tuple-element(%custom-call.1), index=0
  %pallas_call.3 = bf16[2,4,64]{2,1,0} custom-call(%q), custom_call_target="__gpu$xla.gpu.triton", metadata={op_name="jit(step)/jit(ragged_paged_attention)/ragged_paged_attention_decode/pallas_call" scheduling_name="pallas_call.3"}
  %loop_add_fusion = bf16[2,64]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_add
  %copy.1 = s32[] copy(%c)
  %all-reduce-start = bf16[2,64]{1,0} all-reduce-start(%a), replica_groups={{0,1}}, to_apply=%sum
  %all-reduce-done = bf16[2,64]{1,0} all-reduce-done(%all-reduce-start)
  %bitcast.1 = bf16[2,64]{1,0} bitcast(%loop_add_fusion)
  ROOT %tuple = (bf16[2,64]{1,0}) tuple(%bitcast.1)
}
"""


def test_kernel_launches_reads_the_entry_computations_launches():
    assert kernel_launches(ENTRY) == {
        "total": 6,
        "gemm": 2,
        "pallas": {"ragged_paged_attention_decode": 1},
        "fusions": 1,
        "other": {"copy": 1, "all-reduce": 1},
    }


def test_gpu_targets_name_what_is_missing(monkeypatch):
    with pytest.raises(ValueError, match="choose one of t4, l4, a100, h100, h200"):
        resolve_gpu_target("v100")
    monkeypatch.setattr(gpu_targets, "cuda_plugin_installed", lambda: False)
    with pytest.raises(ValueError, match=r"jaxgen\[gpu-compile\]"):
        resolve_gpu_target("h100")
    config = gpu_targets.GPU_TARGETS["h200"].target_config()
    assert "core_count: 132" in config and "device_memory_size: 141000000000" in config
    t4 = gpu_targets.GPU_TARGETS["t4"].target_config()
    assert "cuda_compute_capability { major: 7 minor: 5 }" in t4
    assert "threads_per_core_limit: 1024" in t4 and "shared_memory_per_core: 65536" in t4


# What auto picks on each GPU (jaxgen.backends.device_choice), compiled: one layer, a few
# seconds each.
AUTO_CHOICES = {
    "t4": ("reference", "float16"),
    "l4": ("pallas-gpu", "bfloat16"),
    "a100": ("pallas-gpu", "bfloat16"),
    "h100": ("pallas-gpu", "bfloat16"),
    "h200": ("pallas-gpu", "bfloat16"),
}


@needs_plugin
@pytest.mark.parametrize("target", list(AUTO_CHOICES))
def test_autos_choice_compiles_for_every_gpu(target):
    config = ModelConfig.from_hf_dict({**SMALL_LLAMA, "num_hidden_layers": 1})
    result = compile_decode_step_for_gpu(config, target, max_num_seqs=4, max_model_len=1024)
    backend, dtype = AUTO_CHOICES[target]
    assert result["auto"] == {"attention_backend": backend, "dtype": dtype}
    assert (result["attention_backend"], result["dtype"]) == (backend, dtype)
    launches = result["launches"]
    if backend == "pallas-gpu":
        assert launches["pallas"] == {"ragged_paged_attention_decode": 1}
    else:  # no Triton kernel at all: XLA's fusions and cuBLAS GEMMs
        assert launches["pallas"] == {} and launches["gemm"] >= 4
    assert launches["total"] > 0 and result["per_gpu_bytes"]["kv_pool"] > 0


@needs_plugin
@pytest.mark.parametrize(
    "quantization, kv_cache_dtype", [("int8", "int8"), ("int4", "fp8"), ("fp8", "auto")]
)
def test_quantised_weights_and_pools_compile_for_a_t4(quantization, kv_cache_dtype):
    """The other bfloat16-touching parts on a GPU without bfloat16: an 8-bit pool's bfloat16
    scales, float16-scaled int8 / int4 weights and fp8 weights, in a float16 step."""
    config = ModelConfig.from_hf_dict({**SMALL_LLAMA, "num_hidden_layers": 1})
    result = compile_decode_step_for_gpu(
        config, "t4", max_num_seqs=4, max_model_len=1024, quantization=quantization,
        kv_cache_dtype=kv_cache_dtype,
    )  # fmt: skip
    assert (result["attention_backend"], result["dtype"]) == ("reference", "float16")
    assert result["quantization"] == quantization and result["launches"]["pallas"] == {}


@needs_plugin
def test_what_a_t4_cannot_run_is_refused_before_compiling():
    config = ModelConfig.from_hf_dict({**SMALL_LLAMA, "num_hidden_layers": 1})
    with pytest.raises(ValueError, match="^attention_backend='pallas-gpu'.*compute capability 7.5"):
        compile_decode_step_for_gpu(config, "t4", attention_backend="pallas-gpu")
    with pytest.raises(ValueError, match="^dtype='bfloat16'"):
        compile_decode_step_for_gpu(config, "t4", dtype=jnp.bfloat16)


@needs_plugin
def test_the_decode_step_compiles_for_an_h100_with_every_option():
    """The options the device check times (the split merge kernel, the K/V write kernel,
    cuBLAS) compile to GPU code; the merge kernel replaces XLA's merge (three reductions and a
    cast per layer) with one launch."""
    config = ModelConfig.from_hf_dict(SMALL_LLAMA)
    runs = {
        name: compile_decode_step_for_gpu(
            config, "h100", max_num_seqs=1, max_model_len=4096, attention_kernel_options=options
        )
        for name, options in {
            "default": None,
            "merge": {"pallas_merge": True},
            "kv_write": {"pallas_merge": True, "pallas_kv_write": True},
            "cublas": {"xla_gemm": "cublas"},
        }.items()
    }
    layers = config.num_layers
    default, merge = runs["default"]["launches"], runs["merge"]["launches"]
    assert runs["default"]["rows"] == 2  # the engine's smallest row bucket
    assert default["pallas"] == {"ragged_paged_attention_decode": layers}
    assert merge["pallas"] == {
        "ragged_paged_attention_decode": layers,
        "ragged_paged_attention_merge": layers,
    }
    assert default["per_layer"] - merge["per_layer"] == 3
    assert runs["kv_write"]["launches"]["pallas"]["kv_write"] == layers
    # cuBLAS: one call per projection (seven a layer) and the LM head's, none merged; XLA's
    # Triton GEMMs read merged dots' weights where they lie (Q, K and V as one launch).
    assert runs["cublas"]["launches"]["gemm"] == 7 * layers + 1
    assert default["gemm"] < runs["cublas"]["launches"]["gemm"]


@needs_plugin
@pytest.mark.parametrize(
    "overrides, kv_cache_dtype",
    [
        ({}, "int8"),
        ({}, "fp8"),
        ({"head_dim": 96, "hidden_size": 768}, "auto"),  # Phi-3's head_dim: padded in-kernel
        ({"head_dim": 256, "num_attention_heads": 4}, "auto"),
        ({"num_key_value_heads": 8}, "auto"),  # no GQA
    ],
    ids=["int8-pool", "fp8-pool", "head-dim-96", "head-dim-256", "gqa-1"],
)
def test_pools_and_head_dims_compile_for_an_h200(overrides, kv_cache_dtype):
    config = ModelConfig.from_hf_dict({**SMALL_LLAMA, **overrides, "num_hidden_layers": 1})
    result = compile_decode_step_for_gpu(
        config, "h200", max_num_seqs=16, max_model_len=2048, kv_cache_dtype=kv_cache_dtype
    )
    assert result["launches"]["pallas"]["ragged_paged_attention_decode"] == 1
    assert result["per_gpu_bytes"]["kv_pool"] > 0 and result["rows"] == 16


@needs_plugin
def test_tensor_parallel_steps_compile_for_two_gpus():
    """Degree 2 over two compile-only H100s: each runs the Triton kernels on its share of the
    heads (inside ``shard_map``) and the layers' partial sums meet in NCCL all-reduces; an int8
    pool's codes and scales are split the same way."""
    config = ModelConfig.from_hf_dict(SMALL_LLAMA)
    one = compile_decode_step_for_gpu(config, "h100", max_num_seqs=4)
    two = compile_decode_step_for_gpu(
        config, "h100", max_num_seqs=4, tensor_parallel_degree=2, kv_cache_dtype="int8"
    )
    layers = config.num_layers
    assert two["launches"]["pallas"]["ragged_paged_attention_decode"] == layers
    assert two["launches"]["other"]["all-reduce"] >= 2 * layers  # attention's and the MLP's
    assert "all-reduce" not in one["launches"]["other"]
    assert two["per_gpu_bytes"]["weights"] < 0.6 * one["per_gpu_bytes"]["weights"]
    with pytest.raises(ValueError, match="tensor_parallel_degree must be"):
        compile_decode_step_for_gpu(config, "h100", tensor_parallel_degree=0)


@needs_plugin
def test_cublas_gemms_do_not_concatenate_the_weights_every_step():
    """XLA's dot merger joins dots that share an input; a cuBLAS call then needs the joined
    weights as one matrix, which XLA builds every step. ``xla_gemm="cublas"`` turns it off."""
    device = resolve_gpu_target("h100").devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    x = jax.ShapeDtypeStruct((2, 1024), jnp.bfloat16, sharding=sharding)
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16, sharding=sharding)

    def projections(x, wq, wk, wv):
        return x @ wq, x @ wk, x @ wv

    def compiled(options):
        return jax.jit(projections).trace(x, w, w, w).lower().compile(compiler_options=options)

    merged = compiled({"xla_gpu_enable_triton_gemm": False}).as_text()
    assert "bf16[1024,3072]{1,0} concatenate(" in merged  # the weights, joined every call
    separate = compiled(XLA_GEMMS["cublas"]).as_text()
    assert "concatenate(" not in separate and separate.count("__cublas$lt$matmul") == 3


@needs_plugin
def test_plan_prints_the_gpu_compile(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    args = ["plan", "--target", "h100", "--model", str(config), "--max-num-seqs", "4"]
    assert main([*args, "--json", "--attention-kernel-options", '{"pallas_merge": true}']) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["attention_kernel_options"] == {"pallas_merge": True}
    assert result["rows"] == 4 and result["launches"]["total"] > 0
    assert main([*args[:2], "t4", *args[3:]]) == 0  # the T4: auto's choice, said and compiled
    out = capsys.readouterr().out
    assert "kernel launches" in out and "compute capability 7.5), float16" in out
    assert "auto on this GPU: attention_backend reference, dtype float16" in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--target", "h100", "--attention-kernel-options", "[1]"], "must be a JSON object"),
        (["--target", "v5e-4", "--attention-kernel-options", "{}"], "GPU --target"),
        (["--target", "h100", "--sweep-tp"], "--sweep-tp needs"),
        pytest.param(
            ["--target", "t4", "--attention-backend", "pallas-gpu"],
            "attention_backend='pallas-gpu'",
            marks=needs_plugin,
        ),
        pytest.param(
            ["--target", "t4", "--dtype", "bfloat16"], "dtype='bfloat16'", marks=needs_plugin
        ),
        (["--target", "v5e-4", "--attention-backend", "reference"], "GPU --target"),
    ],
    ids=["options-not-an-object", "options-for-a-tpu", "sweep", "t4-triton", "t4-bf16", "tpu"],
)
def test_plan_gpu_target_bad_arguments(tmp_path, capsys, extra, message):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(SMALL_LLAMA))
    assert main(["plan", "--model", str(config), *extra]) == 2
    assert message in capsys.readouterr().err
