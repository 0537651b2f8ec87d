"""Before any GPU time is spent, every engine step and kernel tuning the device check runs on the
GPU compiles for an H200 with XLA's GPU compiler here (jax's CUDA plugin, the gpu-compile extra;
no GPU): the end-to-end stage's kernel-option rows at its batch sizes, and the kernel-bandwidth
stage's default tuning variants at its 1 x 32k call (inside the step, as the engine calls the
kernel). A configuration that does not compile for sm_90 fails here, not in a device minute."""

from __future__ import annotations

import pytest

from benchmarks.gpu import profiles
from benchmarks.gpu.kernel_batches import tuning_variants, variant_tunings
from jaxgen.config import ModelConfig
from jaxgen.planning.gpu_compile import compile_decode_step_for_gpu
from jaxgen.planning.gpu_targets import cuda_plugin_installed
from pallas_kernels import ragged_paged_attention_gpu

pytestmark = pytest.mark.skipif(
    not cuda_plugin_installed(), reason="needs the gpu-compile extra (jax's CUDA plugin)"
)

PROFILE = profiles.GPU
# The profile's model over one layer: every layer compiles alike, and one is quicker.
ONE_LAYER = ModelConfig.from_hf_dict({**PROFILE.model, "num_hidden_layers": 1})
KERNEL_OPTIONS = [{}] + [
    knobs["attention_kernel_options"] for knobs in PROFILE.kernel_knob_settings
]


@pytest.mark.parametrize("batch", PROFILE.knob_batches)
@pytest.mark.parametrize(
    "options", KERNEL_OPTIONS, ids=["defaults"] + ["+".join(o) for o in KERNEL_OPTIONS[1:]]
)
def test_end_to_end_rows_compile_for_the_h200(batch, options):
    result = compile_decode_step_for_gpu(
        ONE_LAYER,
        "h200",
        max_num_seqs=batch,
        max_model_len=PROFILE.prompt_len + PROFILE.output_len,
        attention_kernel_options=options,
    )
    pallas = result["launches"]["pallas"]
    assert pallas["ragged_paged_attention_decode"] == 1
    assert ("kv_write" in pallas) == bool(options.get("pallas_kv_write"))
    if not options.get("pallas_merge"):
        assert "ragged_paged_attention_merge" not in pallas


@pytest.mark.parametrize(
    "tuning", variant_tunings(tuning_variants(ragged_paged_attention_gpu), PROFILE.variant_values)
)
def test_kernel_variants_compile_for_the_h200_at_32k(tuning):
    batch, context = max(PROFILE.variant_configs, key=lambda pair: pair[1])
    result = compile_decode_step_for_gpu(
        ONE_LAYER,
        "h200",
        max_num_seqs=batch,
        max_model_len=context,
        attention_kernel_options=tuning,
    )
    assert result["launches"]["pallas"]["ragged_paged_attention_decode"] == 1
    assert ("ragged_paged_attention_merge" in result["launches"]["pallas"]) == bool(
        tuning.get("pallas_merge")
    )
