"""The GPU ragged paged-attention kernels lowered for CUDA from a CPU host (an abstract H100):
the Triton kernels a mixed and a decode-only step call, the batch-1 decode grid and its split
partials, and the plain-iota lanes of power-of-two head dims in the Triton IR."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from pallas_kernels import ragged_paged_attention_gpu
from pallas_kernels.gpu.abstract_device import abstract_gpu


def _lowered_for_cuda(head_dim, pool, *, num_tokens, max_seqs, width, group=4, **tuning):
    from jaxgen.quantization import kv_cache

    dtype = jnp.float32 if pool == "f32" else jnp.bfloat16
    kind = pool if pool in ("int8", "fp8") else "auto"
    pages = kv_cache.pool_shapes(kind, (8, 4096, 16, head_dim), dtype)
    i32 = jnp.int32
    shapes = (
        jax.ShapeDtypeStruct((num_tokens, 8 * group, head_dim), dtype),
        pages,
        pages,
        jax.ShapeDtypeStruct((max_seqs,), i32),
        jax.ShapeDtypeStruct((max_seqs, width), i32),
        jax.ShapeDtypeStruct((max_seqs + 1,), i32),
        jax.ShapeDtypeStruct((1,), i32),
    )
    call = functools.partial(
        ragged_paged_attention_gpu, soft_cap=30.0, sliding_window=512, **tuning
    )
    with abstract_gpu():
        return jax.jit(call).trace(*shapes).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize(
    "head_dim, pool",
    [
        (64, "bf16"),
        (96, "int8"),
        (128, "fp8"),
        (256, "f32"),
        *[
            pytest.param(d, p, marks=pytest.mark.slow)
            for d in (64, 96, 128, 256)
            for p in ("bf16", "f32", "int8", "fp8")
            if (d, p) not in {(64, "bf16"), (96, "int8"), (128, "fp8"), (256, "f32")}
        ],
    ],
)
def test_lowers_for_cuda(head_dim, pool):
    """Lowered only (no GPU here): both Triton kernels for a mixed step, on both decode paths;
    the decode kernel alone for a decode-only step, with or without splits; an 8-bit pool
    reaches them as codes and scales (no dequantised pool in the module)."""
    for decode_dot in (False, True):
        text = _lowered_for_cuda(
            head_dim, pool, num_tokens=256, max_seqs=16, width=64, decode_dot=decode_dot
        )
        assert text.count("__gpu$xla.gpu.triton") == 2
        assert "tensor<8x4096x16x" + str(head_dim) + "xf32>" not in text or pool == "f32"
    for num_splits, kernels in ((None, 1), (1, 1)):
        text = _lowered_for_cuda(
            head_dim,
            pool,
            num_tokens=16,
            max_seqs=16,
            width=64,
            decode_only=True,
            num_splits=num_splits,
        )
        assert text.count("__gpu$xla.gpu.triton") == kernels


def test_batch1_decode_fills_the_gpu():
    """Lowered for CUDA: a batch-1 step over 32k keys (2 sequence slots, 8 KV heads, GQA 4)
    launches 2 x 8 x 33 decode programs. The default (the MMA path) holds the group's 4 query
    rows padded to tl.dot's 16 (partial accumulators [33, 2, 8, 16, 128]), not the earlier
    kernel's 64; ``decode_dot=False`` holds just the 4 ([33, 2, 8, 4, 128])."""
    grid = "grid_x = 2 : i32, grid_y = 8 : i32, grid_z = 33 : i32"
    text = _lowered_for_cuda(128, "bf16", num_tokens=2, max_seqs=2, width=2048)
    assert grid in text
    assert "tensor<33x2x8x16x128xf32>" in text
    lane_sum = _lowered_for_cuda(
        128, "bf16", num_tokens=2, max_seqs=2, width=2048, decode_dot=False
    )
    assert grid in lane_sum
    assert "tensor<33x2x8x4x128xf32>" in lane_sum


def test_pallas_merge_lowers_for_cuda():
    """``pallas_merge=True``: the batch-1 step over 32k keys merges its 33 splits in one Triton
    kernel, grid (2 slots, 8 KV heads, 4 lane chunks of 32: 64 splits padded x 4 rows x 32
    lanes per program), and XLA has no reduction over the splits left; the merge writes the
    step's bfloat16 output itself (its result is the call's: no slice, cast or scatter after)."""
    text = _lowered_for_cuda(
        128, "bf16", num_tokens=2, max_seqs=2, width=2048, decode_only=True, pallas_merge=True
    )
    assert "ragged_paged_attention_merge" in text
    assert "grid_x = 2 : i32, grid_y = 8 : i32, grid_z = 4 : i32" in text
    assert "stablehlo.reduce" not in text
    merge = re.search(r"(%\w+) = stablehlo.custom_call[^\n]*ragged_paged_attention_merge", text)
    assert f"return {merge.group(1)} : tensor<2x32x128xbf16>" in text
    xla = _lowered_for_cuda(128, "bf16", num_tokens=2, max_seqs=2, width=2048, decode_only=True)
    assert "ragged_paged_attention_merge" not in xla and "stablehlo.reduce" in xla


def _triton_modules(text: str) -> dict[str, str]:
    """The Triton modules ``pallas_call(debug=True)`` printed, by kernel name."""
    modules = {}
    for match in re.finditer(r"^module @(\w+) \{$", text, flags=re.MULTILINE):
        end = re.compile(r"^\}", flags=re.MULTILINE).search(text, match.end())
        modules[match.group(1)] = text[match.end() : end.start() if end else len(text)]
    return modules


def _clamped_lane_ranges(module: str, lanes: int) -> list[str]:
    """The ``tt.make_range`` values of ``lanes`` elements that an ``arith.minsi`` clamps."""
    ranges = re.findall(
        rf"(%[\w#]+) = tt\.make_range \{{end = {lanes} : i32, start = 0 : i32\}}", module
    )
    clamped = []
    for name in ranges:
        operand = re.escape(name) + r"(?![\w#])"
        if re.search(rf"arith\.minsi ({operand}|%[\w#]+, {operand})", module):
            clamped.append(name)
    return clamped


@pytest.mark.parametrize("head_dim, clamped", [(128, False), (96, True)])
def test_power_of_two_lanes_are_a_plain_iota(head_dim, clamped, monkeypatch, capsys):
    """Where head_dim is a power of two the kernels index lanes with the plain iota: no
    ``arith.minsi`` on the 128-lane ``tt.make_range`` in the Triton IR of either kernel. A
    clamped lane index made Triton load every K/V element on its own (2-byte loads); the plain
    iota gives 16-byte, pipelined copies (on an H200 the MMA decode path went from 775 to 335 us
    a call at batch 64 x 4k). head_dim 96 keeps the clamped, masked lanes: it shows the check
    sees a clamp where there is one."""
    from jax.experimental import pallas as pl

    from pallas_kernels.gpu.ragged_paged_attention import kernel

    pallas_call = pl.pallas_call
    monkeypatch.setattr(
        kernel.pl, "pallas_call", functools.partial(pallas_call, debug=True), raising=True
    )
    # Shapes no other test lowers, so no cached trace skips the patched pallas_call.
    _lowered_for_cuda(head_dim, "bf16", num_tokens=24, max_seqs=3, width=24)
    modules = _triton_modules(capsys.readouterr().out)
    assert set(modules) == {"ragged_paged_attention_decode", "ragged_paged_attention_prefill"}
    for name, module in modules.items():
        assert "tt.make_range {end = 128 : i32, start = 0 : i32}" in module, name
        assert bool(_clamped_lane_ranges(module, 128)) == clamped, name
