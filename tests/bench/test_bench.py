"""Benchmark harness: unit tests of its arithmetic and files, and a tiny end-to-end smoke run."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from jaxgen.bench import metrics, peers, results, roofline, workloads
from jaxgen.bench.metrics import RequestTiming

TINY_KNOBS = ["--max-model-len", "256", "--kv-cache-memory", str(64 << 20)]
SWEEP_FIELDS = (
    "concurrency", "throughput_tok_s", "latency_ms_per_token", "ttft_p50_ms", "ttft_p90_ms",
    "ttft_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
    "requests_per_s",
)  # fmt: skip


# -- metrics -------------------------------------------------------------------------------------
def test_percentile_matches_numpy():
    rng = random.Random(0)
    for size in (1, 2, 7, 100):
        values = [rng.random() for _ in range(size)]
        for q in (0, 50, 90, 99, 100):
            assert metrics.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert math.isnan(metrics.percentile([], 50))
    with pytest.raises(ValueError):
        metrics.percentile([1.0], 101)


def test_find_knee_flattening_and_edges():
    levels = [1, 2, 4, 8, 16]
    assert metrics.find_knee(levels, [100, 190, 360, 380, 385]) == 2  # 4 -> 8 gains 5.6%
    assert metrics.find_knee(levels, [100, 200, 400, 800, 1600]) == 4  # never flattens: last
    assert metrics.find_knee([1, 4], [100, 115]) == 0  # 15% over two doublings = 7.5% each
    assert metrics.find_knee([1, 4], [100, 125]) == 1
    assert metrics.find_knee([], []) is None
    assert metrics.find_knee([1, 2, math.inf], [10, 19, 20]) == 1  # inf: one more doubling
    assert metrics.best_efficiency([100, 300, 400], [10, 12, 40]) == 1


def test_level_row_latency_fields():
    timings = []
    for i in range(4):
        t = RequestTiming(start=0.0, prompt_tokens=10)
        for k in range(5):  # first token at 0.1 s, then one every 0.02 s
            t.record_tokens(1, 0.1 + 0.02 * k + 0.01 * i)
        t.end = t.chunk_times[-1]
        timings.append(t)
    timings.append(RequestTiming(start=0.0, error="boom", end=0.5))
    row = metrics.level_row(timings, duration=1.0, concurrency=4)
    assert row["concurrency"] == 4 and row["num_failed"] == 1 and row["output_tokens"] == 20
    assert row["throughput_tok_s"] == pytest.approx(20.0)
    assert row["requests_per_s"] == pytest.approx(4.0)
    assert row["tpot_p50_ms"] == pytest.approx(20.0)
    assert row["itl_p99_ms"] == pytest.approx(20.0)
    assert row["ttft_p50_ms"] == pytest.approx(115.0)
    assert row["e2e_p99_ms"] == pytest.approx(1000 * (0.18 + 0.0297), rel=1e-3)
    assert row["latency_ms_per_token"] == pytest.approx(1000 * 0.195 / 5)
    assert metrics.add_cost(row, 3.6)["cost_per_1m_output_tokens"] == pytest.approx(50.0)


def test_arrival_offsets_rate_and_burst():
    offsets = workloads.arrival_offsets(4000, rate=5.0, burstiness=1.0, seed=1)
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and gaps.mean() == pytest.approx(0.2, rel=0.08)
    bursty = np.diff(workloads.arrival_offsets(4000, 5.0, burstiness=0.25, seed=1))
    assert bursty.mean() == pytest.approx(0.2, rel=0.15) and bursty.std() > 1.5 * gaps.std()
    assert workloads.arrival_offsets(3, float("inf")) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        workloads.arrival_offsets(3, 0.0)


# -- workloads -----------------------------------------------------------------------------------
def test_random_workload_lengths_and_vocab(smollm2_tokenizer):
    work = workloads.random_workload(smollm2_tokenizer, 5, 32, 7, seed=3)
    special = set(smollm2_tokenizer.all_special_ids)
    assert [len(r.prompt_token_ids) for r in work.requests] == [32] * 5
    assert all(not special & set(r.prompt_token_ids) for r in work.requests)
    assert work.output_tokens == 35 and work.describe()["mean_input_len"] == 32
    params = work.sampling_params()[0]
    assert params.ignore_eos and params.min_tokens == params.max_tokens == 7
    ranged = workloads.random_workload(smollm2_tokenizer, 50, 20, 10, range_ratio=0.5)
    assert {len(r.prompt_token_ids) for r in ranged.requests} <= set(range(10, 31))
    assert len({len(r.prompt_token_ids) for r in ranged.requests}) > 3


def test_chat_workload_distinct_through_template(smollm2_tokenizer):
    questions = workloads.chat_questions(400)
    assert len(set(questions)) == 400
    work = workloads.chat_workload(smollm2_tokenizer, 64, 64)
    assert len({tuple(r.prompt_token_ids) for r in work.requests}) == 64
    assert all("<|im_start|>assistant" in r.text for r in work.requests)
    assert 20 < work.input_tokens / 64 < 80


def test_jsonl_and_mixed_outputs(tmp_path, smollm2_tokenizer):
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"prompt": "Hello there"},
        {"messages": [{"role": "user", "content": "Hi"}], "output_len": 5},
        {"prompt_token_ids": [10, 11, 12], "max_tokens": 3},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    work = workloads.jsonl_workload(str(path), smollm2_tokenizer, 9)
    assert [r.output_len for r in work.requests] == [9, 5, 3]
    assert work.requests[2].prompt_token_ids == [10, 11, 12]
    mixed = workloads.with_mixed_outputs(work, (4, 8, 16))
    assert sorted(r.output_len for r in mixed.requests) == [4, 8, 16]
    path.write_text(json.dumps({"text": "x"}))
    with pytest.raises(ValueError):
        workloads.jsonl_workload(str(path), smollm2_tokenizer, 9)


def test_mixed_outputs_flag(smollm2_tokenizer):
    import argparse

    parser = argparse.ArgumentParser()
    workloads.add_workload_args(parser)
    args = parser.parse_args(["--input-len", "8", "--num-prompts", "6", "--mixed-outputs", "3,5"])
    work = workloads.workload_from_args(args, smollm2_tokenizer)
    assert sorted(r.output_len for r in work.requests) == [3, 3, 3, 5, 5, 5]
    for bad in ("3,x", "0,4"):
        args = parser.parse_args(["--input-len", "8", "--mixed-outputs", bad])
        with pytest.raises(ValueError, match="mixed-outputs"):
            workloads.workload_from_args(args, smollm2_tokenizer)


# -- results, parsing, roofline ------------------------------------------------------------------
def test_write_results_json_and_markdown(tmp_path):
    env = results.environment("jaxgen bench sweep --concurrency 1,2")
    assert env["cpu"] and env["cpu_cores"] >= 1 and env["jax_backend"]
    rows = [{"concurrency": 1, "throughput_tok_s": 12.345, "ttft_p50_ms": math.nan, "rate": math.inf},
            {"concurrency": 2, "throughput_tok_s": 1234.5, "ttft_p50_ms": 0.0123}]  # fmt: skip
    json_path, md_path = results.write_results(
        str(tmp_path), env, rows, title="t", columns={"concurrency": "c", "throughput_tok_s": "tok/s",
                                                     "ttft_p50_ms": "ttft"}, notes=["a note"])  # fmt: skip
    data = json.loads(open(json_path).read())
    assert next(iter(data)) == "command" and data["command"].startswith("jaxgen bench sweep")
    assert data["rows"][0]["ttft_p50_ms"] is None  # NaN is not JSON
    assert data["rows"][0]["rate"] == "inf"
    text = open(md_path).read()
    assert text.startswith("# t\n\nCommand: `jaxgen bench sweep")
    assert "| 1 | 12.3 | - |" in text and "| 2 | 1234 | 0.0123 |" in text and "- a note" in text
    assert results.load_rows(str(tmp_path))[1]["concurrency"] == 2


def test_parse_llama_batched_bench_table():
    text = """
main: n_kv_max = 6656, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    40 |     64 |   64 |   6656 |    1.250 |  2048.00 |    9.750 |   420.10 |   11.000 |   605.09 |
"""
    (row,) = peers.parse_batched_bench(text)
    assert row["b"] == 64 and row["tg"] == 64 and row["t"] == pytest.approx(11.0)
    command = peers.batched_bench_command("/bin", "m.gguf", 40, 64, 64)
    assert command[command.index("-c") + 1] == str(64 * 104)


def test_roofline_prediction():
    # 1 TFLOP/s over 100 GB/s = 10 FLOP/byte; fp32 weights: B* = 10 * 4 / 2 = 20.
    assert roofline.critical_batch(1e12, 100e9, 4.0) == pytest.approx(20.0)
    assert roofline.kv_capacity(10_000, 160) == 62
    out = roofline.predict_knee(kv_pool_tokens=10_000, tokens_per_sequence=160, max_batch=64,
                                peak_flops=1e12, bandwidth=100e9)  # fmt: skip
    assert out["predicted_knee"] == pytest.approx(20.0)
    assert roofline.predict_knee(max_batch=8)["predicted_knee"] == 8


# -- end to end (tiny model) ---------------------------------------------------------------------
def test_offline_and_sweep_cli(tiny_model_dir, tmp_path):
    from jaxgen.cli import main

    out = tmp_path / "offline"
    argv = ["bench", "offline", "--model", tiny_model_dir, "--num-prompts", "4", "--input-len",
            "12", "--output-len", "6", "--out", str(out), "--quiet", *TINY_KNOBS]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    assert data["command"].startswith("jaxgen bench offline")
    cold, warm = data["rows"]
    assert (cold["pass"], warm["pass"]) == ("cold", "warm")
    assert warm["output_tokens"] == 24 and warm["length_mismatches"] == 0
    assert warm["kv_pages_peak"] > 0 and 0 <= warm["kv_waste"] < 1
    assert warm["steps"] > 0 and cold["kv_waste_mean"] is not None

    out = tmp_path / "sweep"
    argv = ["bench", "sweep", "--model", tiny_model_dir, "--concurrency", "1,2", "--num-prompts",
            "3", "--input-len", "8", "--output-len", "4", "--out", str(out), "--quiet",
            "--no-roofline", "--price-per-hour", "1.0", *TINY_KNOBS]  # fmt: skip
    assert main(argv) == 0
    data = json.loads((out / "results.json").read_text())
    rows = data["rows"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        assert all(row[f] is not None and row[f] >= 0 for f in SWEEP_FIELDS)
        assert row["num_failed"] == 0 and row["output_tokens"] == 12
        assert row["cost_per_1m_output_tokens"] > 0
    assert data["knee"]["knee_concurrency"] in (1, 2)
    assert data["prediction"]["max_batch"] == 64
    assert (out / "curve.png").stat().st_size > 1000
    assert "| concurrency |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_compare_modes_offline_and_arrivals(tiny_model_dir, tmp_path):
    from jaxgen.bench.compare import Scenario, run_compare, write_compare
    from jaxgen.loaders import load_model

    loaded = load_model(tiny_model_dir)
    scenarios = [
        Scenario("offline 8/6", 8, 6),
        Scenario("arrivals 8/4|8", 8, 4, mixed_outputs=(4, 8), arrivals=True),
    ]
    rows = run_compare(loaded, ["static", "paged"], scenarios, num_prompts=4,
                       max_model_len=64, max_rolling_batch_size=4, batch_size=2,
                       max_batch_delay=0.01, request_rate=50.0, progress=False)  # fmt: skip
    assert [(r["scenario"][:7], r["mode"]) for r in rows] == [
        (s, m) for s in ("offline", "arrival") for m in ("static", "paged")
    ]
    for row in rows:
        assert row["output_tok_s"] > 0 and row["kv_pages_peak"] > 0
    static, paged = rows[:2]  # static reserves max_model_len per slot; paged grows by pages
    assert static["kv_waste"] > paged["kv_waste"] and static["kv_waste_mean"] > 0.5
    assert rows[2]["output_tokens"] == 24  # 4 + 8 + 4 + 8 or a shuffle of it
    write_compare(str(tmp_path), results.environment("jaxgen bench compare"), rows, settings={})
    assert (tmp_path / "compare.png").exists() and (tmp_path / "results.md").exists()
    assert len(json.loads((tmp_path / "results.json").read_text())["rows"]) == 4


def test_sweep_over_http(tiny_model_dir, tmp_path):
    serving = pytest.importorskip("serving.testing")
    from jaxgen.bench import clients
    from jaxgen.bench.sweep import run_sweep, write_sweep
    from serving.app import create_app

    llm = serving.shared_llm(tiny_model_dir, **serving.TINY_ENGINE_KNOBS)
    tokenizer = llm.tokenizer
    with serving.ServerThread(create_app(llm)) as server:
        backend = clients.HTTPBackend(server.url)
        rows = run_sweep(
            backend,
            lambda count, seed: workloads.random_workload(tokenizer, count, 8, 5, seed=seed),
            [2.0, float("inf")],
            open_loop=True,
            num_prompts=3,
            warmup=False,
            progress=False,
        )
    assert [r["request_rate"] for r in rows] == [2.0, float("inf")]
    assert all(r["num_failed"] == 0 and r["output_tokens"] == 15 for r in rows)
    assert all(r["ttft_p50_ms"] > 0 and r["tpot_p50_ms"] > 0 for r in rows)
    work = workloads.random_workload(tokenizer, 3, 8, 5)
    write_sweep(str(tmp_path), results.environment("x"), rows, workload=work,
                backend_name=backend.name, open_loop=True)  # fmt: skip
    assert (tmp_path / "curve.png").exists()


def test_command_line_rebuilt_from_args(monkeypatch):
    from jaxgen.bench.commands import command_of
    from jaxgen.cli import build_parser

    monkeypatch.setattr("sys.argv", ["pytest", "-q"])
    args = build_parser().parse_args(["bench", "sweep", "--concurrency", "1,2", "--no-roofline"])
    assert command_of(args) == "jaxgen bench sweep --concurrency 1,2 --no-roofline"
    assert results.command_line(["/x/bin/jaxgen", "bench", "a b"]) == "jaxgen bench 'a b'"


def test_missing_bench_extra_is_named_before_anything_runs(monkeypatch, capsys):
    """Without matplotlib or torch (the core install), a command needing them stops at once,
    before loading a model, with an error naming the extra."""
    import sys

    from jaxgen.cli import main

    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
        argv = ["bench", "sweep", "--model", "/nonexistent", "--no-roofline", "--quiet"]
        assert main(argv) == 2
    error = capsys.readouterr().err
    assert "matplotlib" in error and "pip install 'jaxgen[bench]'" in error
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "torch", None)
        argv = ["bench", "peers", "--model", "/nonexistent", "--peers", "transformers", "--quiet"]
        assert main(argv) == 2
    error = capsys.readouterr().err
    assert "torch" in error and "pip install 'jaxgen[bench]'" in error
