"""``attention_kernel_options``: the pallas-gpu kernels' tuning arguments from the engine's
configuration (and its command line) to the backend, and the ValueErrors that name it."""

from __future__ import annotations

import argparse

import pytest

from jaxgen.backends import select_backend
from jaxgen.config.engine_config import EngineConfig
from jaxgen.config.knobs import add_engine_flags


def test_the_pallas_gpu_backend_gets_the_options():
    backend = select_backend(
        "pallas-gpu", platform="cpu", kernel_options={"pallas_merge": True, "num_splits": 3}
    )
    assert backend.interpret
    assert backend.tuning == (("num_splits", 3), ("pallas_merge", True))
    assert select_backend("pallas-gpu", platform="cpu").tuning == ()
    writer = select_backend("pallas-gpu", platform="cpu", kernel_options={"pallas_kv_write": True})
    assert writer.tuning == (("pallas_kv_write", True),)


def test_xla_gemm_picks_the_steps_compiler_options():
    """``xla_gemm``: XLA's Triton GEMMs (its default: no options) or cuBLAS's; the option
    compiles on CPU as well (XLA:CPU ignores it), so interpreted tests run the same step."""
    import jax
    import jax.numpy as jnp

    assert select_backend("pallas-gpu", platform="cpu").compiler_options is None
    triton = select_backend("pallas-gpu", platform="cpu", kernel_options={"xla_gemm": "triton"})
    assert triton.compiler_options is None
    cublas = select_backend("pallas-gpu", platform="cpu", kernel_options={"xla_gemm": "cublas"})
    assert cublas.compiler_options == {
        "xla_gpu_enable_triton_gemm": False,
        "xla_gpu_dot_merger_threshold_mb": 0,
    }
    matmul = jax.jit(jnp.matmul, compiler_options=cublas.compiler_options)
    assert float(matmul(jnp.ones((2, 3)), jnp.ones((3, 4)))[1, 2]) == 3.0


@pytest.mark.parametrize(
    "call",
    [
        lambda: select_backend("reference", kernel_options={"num_splits": 4}),
        lambda: select_backend("pallas-gpu", platform="cpu", kernel_options={"block": 4}),
        lambda: select_backend(
            "pallas-gpu",
            platform="cpu",
            kv_cache_dtype="int8",
            kernel_options={"pallas_kv_write": True},
        ),
        lambda: select_backend("pallas-gpu", platform="cpu", kernel_options={"xla_gemm": "tf"}),
        lambda: EngineConfig(attention_kernel_options=["num_splits"]),
        lambda: EngineConfig(attention_kernel_options={1: 2}),
    ],
    ids=[
        "other-backend",
        "unknown-argument",
        "kv-write-8-bit",
        "unknown-gemm",
        "not-a-dict",
        "non-string-name",
    ],
)
def test_bad_options_name_the_field(call):
    with pytest.raises(ValueError, match="attention_kernel_options"):
        call()


def test_command_line_takes_json():
    parser = argparse.ArgumentParser()
    add_engine_flags(parser)
    args = parser.parse_args(["--attention-kernel-options", '{"pallas_merge": true}'])
    assert args.attention_kernel_options == {"pallas_merge": True}
    with pytest.raises(SystemExit):
        parser.parse_args(["--attention-kernel-options", "[1]"])
