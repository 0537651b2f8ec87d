"""``jaxgen bench peers``: jaxgen and its peers on one workload, one table with ratios."""

from __future__ import annotations

import gc
import os

from jaxgen.bench import peers, plots, results
from jaxgen.bench.extra import require
from jaxgen.bench.offline import headline, run_offline
from jaxgen.bench.workloads import workload_from_args
from jaxgen.llm import LLM
from jaxgen.loaders import resolve_model

PEERS_COLUMNS = {
    "engine": "engine",
    "config": "configuration",
    "output_tokens": "output tokens",
    "seconds": "seconds",
    "output_tok_s": "output tok/s",
    "jaxgen_ratio": "jaxgen / this",
    "error": "error",
}


def _guard(engine: str, config: str, run) -> dict:
    try:
        return run()
    except Exception as e:  # one peer failing must not lose the others' numbers
        return peers.failed_row(engine, config, f"{type(e).__name__}: {e}")


def run_peers(args, env: dict, engine_knobs: dict) -> list[dict]:
    """Runs jaxgen (warm pass), then each selected peer; writes results and ``peers.png``."""
    selected = {p.strip() for p in args.peers.split(",") if p.strip()}
    if selected & {"transformers", "transformers-continuous"}:  # fail before jaxgen's run
        require("torch", "jaxgen bench peers' transformers rows")
    progress = not args.quiet
    model_path = resolve_model(args.model)
    llm = LLM(args.model, **engine_knobs)
    tokenizer = llm.get_tokenizer()
    workload = workload_from_args(args, tokenizer)
    print(f"[peers] jaxgen {args.batching} on {workload.name}", flush=True)
    row = headline(run_offline(llm, workload, warmup=not args.no_warmup, use_tqdm=progress))
    slots = llm.engine.batching.num_slots
    rows = [
        peers.result_row(
            "jaxgen",
            f"LLM.generate, {args.batching}, {slots} slots, {args.dtype}",
            row["output_tokens"],
            row["seconds"],
            steps=row["steps"],
            kv_pages_peak=row["kv_pages_peak"],
            kv_waste=row["kv_waste"],
        )
    ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    del llm
    gc.collect()

    if selected & {"transformers", "transformers-continuous"}:
        print("[peers] transformers", flush=True)
        model = peers.load_hf_model(model_path)
        if "transformers" in selected:
            rows.append(
                _guard(
                    "transformers",
                    "generate",
                    lambda: peers.transformers_static(
                        model, workload, args.peer_batch_size, pad_id, progress
                    ),
                )
            )
        if "transformers-continuous" in selected:
            rows.append(
                _guard(
                    "transformers",
                    "generate_batch",
                    lambda: peers.transformers_continuous(model, workload, progress),
                )
            )
        del model
        gc.collect()
    gguf = model_path if model_path.endswith(".gguf") else None
    if "llama-cpp-python" in selected:
        if gguf is None:
            rows.append(peers.failed_row("llama-cpp-python", "-", "needs a .gguf model"))
        else:
            print("[peers] llama-cpp-python", flush=True)
            context = max(2048, workload.max_total_len)
            rows.append(
                _guard(
                    "llama-cpp-python",
                    os.path.basename(gguf),
                    lambda: peers.llama_cpp_python_stream(gguf, workload, context, progress),
                )
            )
    if "llama.cpp" in selected:
        if not args.llama_cpp_bin:
            rows.append(peers.failed_row("llama.cpp", "-", "pass --llama-cpp-bin DIR"))
        elif gguf is None:
            rows.append(peers.failed_row("llama.cpp", "-", "needs a .gguf model"))
        else:
            kinds = [k.strip() for k in args.llama_cpp_types.split(",") if k.strip()]
            rows += peers.llama_cpp_rows(
                args.llama_cpp_bin, gguf, workload, args.llama_cpp_work_dir, kinds
            )

    ours = rows[0]["output_tok_s"]
    for r in rows:
        if r.get("output_tok_s"):
            r["jaxgen_ratio"] = ours / r["output_tok_s"]
    notes = [
        f"Workload: {workload.name} ({workload.input_tokens} prompt tokens, exact output lengths "
        "with EOS ignored); output tok/s = output tokens / wall seconds, prefill included, "
        "after a warm-up.",
        "llama-batched-bench runs every sequence at the workload's mean prompt length (random "
        "tokens) with all sequences at once; its F32/F16 models are requantisations of the same "
        "GGUF, so the weights match jaxgen's fp32 dequantisation.",
        f"Model: {model_path}.",
    ]
    results.write_results(
        args.out,
        env,
        rows,
        title="jaxgen bench peers",
        columns=PEERS_COLUMNS,
        extra={"workload": workload.describe(), "engine": engine_knobs},
        notes=notes,
    )
    measured = [r for r in rows if r.get("output_tok_s")]
    for r in measured:
        r["label"] = f"{r['engine']}: {r['config'][:40]}"
    plots.plot_bars(
        measured,
        os.path.join(args.out, "peers.png"),
        value_key="output_tok_s",
        label_key="label",
        ylabel="output tokens/s",
        title=workload.name,
    )
    return rows
