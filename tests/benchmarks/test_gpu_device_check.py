"""The GPU device check (benchmarks/gpu/device_check.py): its dry run, the whole code path on
CPU at toy sizes, run once as the device runs it (one command, child processes included); and
its arithmetic (bytes, floors, trace busy time)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from benchmarks.gpu import floors
from benchmarks.gpu.engine_parity import first_difference
from benchmarks.gpu.kernel_bandwidth import loop_count
from benchmarks.gpu.kernel_batches import tuning_variants, variant_tunings
from benchmarks.gpu.profiles import DRY_RUN, GPU, STAGES, select
from benchmarks.gpu.report import format_table, jsonable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run's output folder, JSON and stdout."""
    out = tmp_path_factory.mktemp("device_check")
    # An empty cache of its own: the cold passes must compile, whatever ran before on this host.
    cache = tmp_path_factory.mktemp("device_check_cache")
    env = {
        **os.environ,
        "PYTHONPATH": REPO,
        "PYTHONUNBUFFERED": "1",
        "JAXGEN_CACHE_DIR": str(cache),
    }
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu/device_check.py", "--dry-run", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    with open(out / "device_check.json") as f:
        return out, json.load(f), done.stdout


def test_dry_run_finishes_every_stage(dry_run):
    out, data, stdout = dry_run
    statuses = {name: data["stages"][name]["status"] for name in STAGES}
    assert statuses == dict.fromkeys(STAGES, "ok")
    assert data["meta"]["profile"] == "dry-run"
    # the device returns at most 8 files, none deeper than two folders
    assert len(os.listdir(out)) <= 8
    assert stdout.rstrip().splitlines()[-1].startswith("bench_compare")  # the table is last


def test_dry_run_hands_device_memory_back_before_the_child_stages(dry_run):
    _, data, stdout = dry_run
    released = data["meta"]["released"]
    assert set(released) == {"peak_bytes", "gpu_used_before", "gpu_used_after"}
    log = stdout.index("device memory handed back")
    assert stdout.index("stage engine_parity: ok") < log < stdout.index("[end_to_end]")


def test_profile_narrowed_to_rerun_what_a_run_left_out():
    assert select(dry_run=False) is GPU
    profile = select(dry_run=False, batches="256,64", compare_modes="dynamic")
    assert profile.e2e_batches == (256, 64)
    assert profile.trace_batches == (64, 256)  # the GPU profile's, kept where batches has them
    assert profile.knob_batches == (64,)
    assert profile.compare_modes == ("dynamic",)
    assert select(dry_run=True, batches="2").e2e_batches == (2,)
    with pytest.raises(ValueError, match="batch sizes"):
        select(dry_run=False, batches="0")
    with pytest.raises(ValueError, match="compare modes"):
        select(dry_run=False, compare_modes="greedy")


def test_dry_run_kernel_stages(dry_run):
    _, data, _ = dry_run
    correctness = data["stages"]["kernel_correctness"]["result"]
    assert correctness["all_pass"] and len(correctness["cases"]) == 3
    # the one-kernel split merge's case reached the kernel with its tuning
    assert correctness["cases"][0]["tuning"] == {"pallas_merge": True, "num_splits": 4}
    for case in correctness["cases"]:
        assert case["non_finite_real"] == 0 and case["padding_max_abs"] == 0.0
        assert case["relative_error"] < case["tolerance"]
    bandwidth = data["stages"]["kernel_bandwidth"]["result"]
    defaults = [(r["batch"], r["context"]) for r in bandwidth["rows"] if not r["tuning"]]
    assert defaults == list(DRY_RUN.bandwidth_configs)
    # the kernel's variants (none for a kernel without tuning arguments), one value each here
    variants = [r["tuning"] for r in bandwidth["rows"] if r["tuning"]]
    assert variants == [{name: values[0]} for name, values in bandwidth["variants_tried"].items()]
    assert all(r["achieved_Bps"] > 0 for r in bandwidth["rows"])
    machine = data["stages"]["machine"]["result"]
    assert machine["copy"]["bandwidth_Bps"] > 0 and machine["matmul"]["flops_per_s"] > 0
    assert machine["importable"]["llguidance"]


def test_dry_run_parity_is_identical(dry_run):
    _, data, _ = dry_run
    parity = data["stages"]["engine_parity"]["result"]
    assert parity["all_identical"]
    tokens = parity["models"]["llama"]
    assert len(tokens["transformers"]) == len(DRY_RUN.parity_prompt_lens)
    assert all(len(t) == DRY_RUN.parity_max_tokens for t in tokens["pallas-gpu"])
    # the options not yet defaults (one-kernel merge and K/V write, cuBLAS) on the first model
    assert tokens["pallas-gpu options"] == tokens["reference"] == tokens["transformers"]


def test_dry_run_end_to_end_and_peer(dry_run):
    out, data, _ = dry_run
    e2e = data["stages"]["end_to_end"]["result"]
    (row,) = e2e["rows"]
    batch = DRY_RUN.e2e_batches[0]
    assert row["timed"]["output_tokens"] == batch * DRY_RUN.output_len
    assert row["timed"]["compiles"] == 0 and row["cold"]["compiles"] > 0
    assert row["timed"]["decode_steps"] > 0 and row["floor_ms"] > 0 and row["x_floor"] > 0
    with gzip.open(out / row["timed"]["trace_file"], "rt") as f:
        assert json.load(f)["traceEvents"]
    assert row["timed"]["profiler_s"] > 0  # traced: left out of its output tok/s
    # The main rows run with asynchronous scheduling, whose steps are not replayed; the knob
    # row (multi-step, with single steps among them) is, and holds the memory analysis.
    assert row["knobs"] == DRY_RUN.e2e_knobs and row["engine_stats"]["async_steps"] > 0
    assert "replay_device_ms_per_step" not in row and "memory_analysis" not in row
    # The kernel options' rows first (pallas-gpu: the one-kernel merge, then the K/V write too,
    # then cuBLAS's matmuls too), then speculation, then the knob settings.
    *kernel_rows, spec_row, knob_row = e2e["knob_rows"]
    assert [r["knobs"] for r in kernel_rows] == list(DRY_RUN.kernel_knob_settings)
    for kernel_row in kernel_rows:
        assert kernel_row["timed"]["output_tokens"] == batch * DRY_RUN.output_len
        assert kernel_row["timed"]["compiles"] == 0 and kernel_row["cold"]["compiles"] > 0
    assert spec_row["knobs"] == DRY_RUN.speculative_knobs
    assert spec_row["timed"]["output_tokens"] == batch * DRY_RUN.output_len
    # The prompts repeat themselves: n-gram lookup finds drafts, and their steps are timed.
    assert spec_row["engine_stats"]["spec_decode_num_drafts"] >= 1
    assert spec_row["draft_step_ms"] and "memory_analysis" not in spec_row
    assert knob_row["engine_stats"]["multi_step_calls"] > 0
    assert knob_row["timed"]["output_tokens"] == batch * DRY_RUN.output_len
    assert knob_row["replay_device_ms_per_step"] > 0
    analysis = knob_row["memory_analysis"]
    assert analysis["kv_pool_bytes"] > 0 and analysis["compiles"] == 0  # the step's own exe
    gemms = data["stages"]["gemm_bandwidth"]["result"]["rows"]
    assert [(r["name"], r["rows"], r["variant"]) for r in gemms] == [
        (name, rows, variant)
        for name, variants in (
            ("qkv", ("triton", "cublas")),
            ("qkv_3", ("triton", "triton-unmerged")),
            ("o", ("triton", "cublas")),
            ("gate_up", ("triton", "cublas")),
            ("down", ("triton", "cublas")),
        )
        for rows in DRY_RUN.gemm_rows
        for variant in variants
    ]
    assert all(r["achieved_Bps"] > 0 and "error" not in r for r in gemms)
    peer = data["stages"]["torch_peer"]["result"]
    assert [r["batch"] for r in peer["rows"]] == list(DRY_RUN.e2e_batches)
    assert all(r["new_tokens_per_sequence"] == DRY_RUN.output_len for r in peer["rows"])
    compare = data["stages"]["bench_compare"]["result"]
    assert [r["mode"] for r in compare["rows"]] == list(DRY_RUN.compare_modes)
    assert all(r["output_tok_s"] > 0 and r["compiles"] == 0 for r in compare["rows"])


def test_decode_matmul_shapes_and_their_device_time():
    """The 8B's projections as the gemm stage times them (QKV also as three weights), and the
    products' device time: the trace's busy time less XLA's helper kernels (the chaining adds),
    cuBLAS's kernels kept."""
    from benchmarks.gpu.gemm_bandwidth import (
        MERGED_QKV_VARIANTS,
        XLA_GEMMS,
        gemm_device_us,
        linear_shapes,
        timed_products,
    )

    assert linear_shapes(GPU.model) == [
        ("qkv", 4096, 6144),
        ("o", 4096, 4096),
        ("gate_up", 4096, 14336),
        ("down", 14336, 4096),
    ]
    assert timed_products(GPU.model)[:3] == [
        ("qkv", 4096, (6144,), XLA_GEMMS),
        ("qkv_3", 4096, (4096, 1024, 1024), MERGED_QKV_VARIANTS),
        ("o", 4096, (4096,), XLA_GEMMS),
    ]
    traced = {
        "device_busy_us_per_call": 14.0,
        "kernels": [
            {"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "us_per_call": 11.5},
            {"name": "loop_add_fusion", "us_per_call": 1.5},
            {"name": "input_slice_fusion", "us_per_call": 1.0},
        ],
    }
    assert gemm_device_us(traced) == 11.5
    assert gemm_device_us({"trace_error": "no device events (CPU)"}) is None


def test_attention_bytes_and_decode_floor():
    # Llama-3-8B attention, batch 64 x 4k keys, bf16, pages of 16: K and V of every page, q, out
    kv = 2 * 64 * 256 * 16 * 8 * 128 * 2
    q_and_out = 2 * 64 * 32 * 128 * 2
    assert (
        floors.paged_attention_bytes(
            batch=64,
            context=4096,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            page_size=16,
            itemsize=2,
        )
        == kv + q_and_out
    )
    # a partly filled last page is read whole
    assert (
        floors.paged_attention_bytes(
            batch=1, context=17, num_heads=1, num_kv_heads=1, head_dim=1, page_size=16, itemsize=1
        )
        == 2 * 32 + 2
    )
    assert floors.mean_decode_context(1024, 128) == 1088
    assert floors.mean_decode_context(7, 1) == 7
    assert floors.streamed_weight_bytes(100, 10, tied=False) == 90
    assert floors.streamed_weight_bytes(100, 10, tied=True) == 100
    floor = floors.decode_floor_seconds(
        weight_bytes=15e9, kv_bytes_per_token=131072, context_tokens=64 * 1088, bandwidth=3e12
    )
    assert floor == pytest.approx((15e9 + 131072 * 64 * 1088) / 3e12)
    with pytest.raises(ValueError, match="bandwidth"):
        floors.decode_floor_seconds(
            weight_bytes=1, kv_bytes_per_token=1, context_tokens=1, bandwidth=0
        )
    assert floors.copy_bytes(10, loops=3) == 60
    assert floors.matmul_flops(2, 3, 4, loops=5) == 240


def test_device_busy_time_is_the_union_of_device_events():
    assert floors.interval_union_seconds([(0, 2), (1, 3), (5, 6), (5.5, 5.6)]) == 4
    assert floors.interval_union_seconds([]) == 0
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "ts": 0, "dur": 1000},  # host: not counted
        {"ph": "X", "pid": 2, "tid": 1, "ts": 10, "dur": 20},  # a kernel ...
        {"ph": "X", "pid": 2, "tid": 2, "ts": 0, "dur": 40},  # ... inside its module's span
        {"ph": "X", "pid": 2, "tid": 1, "ts": 100, "dur": 10},
    ]
    assert floors.device_busy_seconds(events) == pytest.approx(50e-6)
    assert floors.device_busy_seconds(events[:1] + events[2:3]) is None
    assert [floors.pow2_floor(v) for v in (0, 1, 2, 3, 1024, 1500.5)] == [1, 1, 2, 2, 1024, 1024]


def test_kernel_variants_found_from_the_signature():
    def kernel(
        q, *, scale=None, interpret=False, decode_use_dot=None, num_splits=None, merge=None, other=1
    ):
        return q

    assert tuning_variants(kernel) == {
        "decode_use_dot": [True, False],
        "num_splits": [1, 4, 16],
        "merge": [True, False],
    }
    assert tuning_variants(kernel, {"num_splits": [8]}) == {"num_splits": [8]}
    joint = [{"num_splits": 33, "decode_block_k": 128}]
    assert tuning_variants(kernel, joint) == joint
    assert variant_tunings(joint, None) == joint
    assert variant_tunings({"a": [1, 2], "b": [3]}, 1) == [{"a": 1}, {"b": 3}]
    assert tuning_variants(lambda q, *, block_q=None: q) == {}
    assert loop_count(10, 1.0, max_loops=50) == 50
    assert loop_count(10**12, 0.001, max_loops=50) == 2


def test_report_helpers():
    assert first_difference([[1, 2], [3]], [[1, 2], [3]]) is None
    assert first_difference([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == [1, 1]
    assert first_difference([[1]], [[1, 2]]) == [0, 1]
    assert jsonable({"a": (1, float("nan")), 2: None}) == {"a": [1, "nan"], "2": None}
    table = format_table([{"x": 1.23456, "y": None}], [("x", "X"), ("y", "Y")])
    assert table.splitlines() == ["X     Y", "1.23  -"]


def test_variant_configs_option():
    from benchmarks.gpu.device_check import parse_args

    args = parse_args(["--variant-configs", "1x32768,64x4096"])
    assert args.variant_configs == ((1, 32768), (64, 4096))
    assert parse_args([]).variant_configs is None
    for bad in ("1x", "0x64", "ax4", "1x2x3"):
        with pytest.raises(SystemExit):
            parse_args(["--variant-configs", bad])
