"""Peer engines on the same workload: transformers (static ``generate`` and continuous
``generate_batch``), llama-cpp-python (one stream) and llama.cpp's ``llama-batched-bench``."""

from __future__ import annotations

import os
import re
import subprocess
import time

from jaxgen.bench.extra import MissingExtra, require
from jaxgen.bench.workloads import Workload

BATCHED_BENCH_KEYS = ("pp", "tg", "b", "n_kv", "t_pp", "s_pp", "t_tg", "s_tg", "t", "s")


def result_row(engine: str, config: str, output_tokens: int, seconds: float, **extra) -> dict:
    """One engine's row of the peers table."""
    return {
        "engine": engine,
        "config": config,
        "output_tokens": output_tokens,
        "seconds": seconds,
        "output_tok_s": output_tokens / seconds if seconds else None,
        **extra,
    }


def failed_row(engine: str, config: str, error: BaseException | str) -> dict:
    """The row of an engine that could not run, with why."""
    return {"engine": engine, "config": config, "error": str(error)[:300]}


# -- transformers ------------------------------------------------------------------------------
def load_hf_model(model_path: str):
    """A PyTorch fp32 model from an HF directory or a GGUF file (dequantised by transformers)."""
    import torch  # optional: the bench extra (checked by run_peers)
    from transformers import AutoModelForCausalLM

    if os.path.isfile(model_path):
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(model_path), gguf_file=os.path.basename(model_path), dtype=torch.float32
        )
    else:
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    return model.eval()


def transformers_static(
    model, workload: Workload, batch_size: int = 32, pad_token_id: int = 0, progress: bool = True
) -> dict:
    """Left-padded batches through ``model.generate`` with ``min_new_tokens=max_new_tokens``."""
    import torch  # optional: the bench extra (checked by run_peers)
    from tqdm.auto import tqdm

    requests = workload.requests

    def run(batch, new_tokens: int) -> int:
        width = max(len(r.prompt_token_ids) for r in batch)
        ids = torch.full((len(batch), width), pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):
            ids[i, width - len(r.prompt_token_ids) :] = torch.tensor(r.prompt_token_ids)
            mask[i, width - len(r.prompt_token_ids) :] = 1
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=pad_token_id,
            )
        return (out.shape[1] - width) * len(batch)

    run(requests[:batch_size], 4)  # warm-up
    start, tokens = time.perf_counter(), 0
    batches = [requests[i : i + batch_size] for i in range(0, len(requests), batch_size)]
    for batch in tqdm(batches, desc="transformers generate", disable=not progress):
        tokens += run(batch, max(r.output_len for r in batch))
    return result_row(
        "transformers",
        f"generate, static batches of {batch_size}, fp32",
        tokens,
        time.perf_counter() - start,
        threads=torch.get_num_threads(),
    )


def transformers_continuous(model, workload: Workload, progress: bool = True) -> dict:
    """``model.generate_batch`` (continuous batching), exact lengths via an unreachable EOS."""
    import torch  # optional: the bench extra (checked by run_peers)
    from transformers import GenerationConfig

    if not hasattr(model, "generate_batch"):
        return failed_row("transformers", "generate_batch", "not in this transformers version")
    lengths = {r.output_len for r in workload.requests}
    if len(lengths) != 1:
        return failed_row("transformers", "generate_batch", "needs one output length")
    config = GenerationConfig(
        max_new_tokens=lengths.pop(), do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    prompts = workload.prompts()
    with torch.no_grad():  # not inference_mode: its cache updates tensors in place
        model.generate_batch(inputs=prompts[:4], generation_config=config)  # warm-up
        start = time.perf_counter()
        outputs = model.generate_batch(
            inputs=prompts, generation_config=config, progress_bar=progress
        )
        seconds = time.perf_counter() - start
    errors = [o.error for o in outputs.values() if o.error]
    if errors or len(outputs) != len(prompts):
        return failed_row(
            "transformers", "generate_batch", errors[0] if errors else "lost requests"
        )
    tokens = sum(len(o.generated_tokens) for o in outputs.values())
    return result_row(
        "transformers",
        "generate_batch (continuous batching), fp32",
        tokens,
        seconds,
        threads=torch.get_num_threads(),
    )


# -- llama.cpp -------------------------------------------------------------------------------
def llama_cpp_python_stream(
    gguf_path: str, workload: Workload, n_ctx: int = 2048, progress: bool = True
) -> dict:
    """One request at a time through llama-cpp-python (the bench extra)."""
    try:
        Llama = require("llama_cpp", "the llama-cpp-python row").Llama
    except MissingExtra as e:
        return failed_row("llama-cpp-python", os.path.basename(gguf_path), e)
    from tqdm.auto import tqdm

    llm = Llama(
        model_path=gguf_path, n_ctx=n_ctx, n_threads=os.cpu_count(), n_batch=512, verbose=False
    )

    def one(prompt: list[int], count: int) -> int:
        produced = 0
        for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):  # never stops at EOS
            produced += 1
            if produced >= count:
                break
        return produced

    one(workload.requests[0].prompt_token_ids, 4)  # warm-up
    start, tokens = time.perf_counter(), 0
    for r in tqdm(workload.requests, desc="llama-cpp-python", disable=not progress):
        tokens += one(r.prompt_token_ids, r.output_len)
    return result_row(
        "llama-cpp-python",
        f"one stream, {os.path.basename(gguf_path)}",
        tokens,
        time.perf_counter() - start,
        threads=os.cpu_count(),
    )


def quantize(bin_dir: str, source: str, kind: str, work_dir: str) -> str:
    """``llama-quantize --allow-requantize source out kind`` (cached in ``work_dir``)."""
    os.makedirs(work_dir, exist_ok=True)
    stem = os.path.splitext(os.path.basename(source))[0]
    out = os.path.join(work_dir, f"{stem}.{kind}.gguf")
    if not os.path.isfile(out):
        subprocess.run(
            [
                os.path.join(bin_dir, "llama-quantize"),
                "--allow-requantize",
                source,
                out + ".tmp",
                kind,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        os.replace(out + ".tmp", out)
    return out


def parse_batched_bench(text: str) -> list[dict]:
    """The result rows of ``llama-batched-bench``'s table (keys ``BATCHED_BENCH_KEYS``)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(BATCHED_BENCH_KEYS):
            continue
        try:
            values = [float(c) for c in cells]
        except ValueError:
            continue
        row = dict(zip(BATCHED_BENCH_KEYS, values, strict=True))
        for key in ("pp", "tg", "b", "n_kv"):
            row[key] = int(row[key])
        rows.append(row)
    return rows


def batched_bench_command(
    bin_dir: str, model: str, prompt_len: int, output_len: int, parallel: int
) -> list[str]:
    """``llama-batched-bench -m MODEL -c CTX -b 2048 -ub 512 -npp P -ntg N -npl B``."""
    context = parallel * (prompt_len + output_len)
    return [
        os.path.join(bin_dir, "llama-batched-bench"),
        "-m",
        model,
        "-c",
        str(context),
        "-b",
        "2048",
        "-ub",
        "512",
        "-npp",
        str(prompt_len),
        "-ntg",
        str(output_len),
        "-npl",
        str(parallel),
        "-t",
        str(os.cpu_count()),
    ]


def llama_batched_bench(bin_dir: str, model: str, workload: Workload, label: str) -> dict:
    """Batched decoding of ``len(workload)`` sequences at the workload's mean prompt length.

    Output throughput = B x TG / T (prefill included), like the other rows.
    """
    count = len(workload.requests)
    prompt_len = max(1, round(workload.input_tokens / count))
    output_len = max(1, round(workload.output_tokens / count))
    command = batched_bench_command(bin_dir, model, prompt_len, output_len, count)
    done = subprocess.run(command, capture_output=True, text=True)
    rows = parse_batched_bench(done.stdout + "\n" + done.stderr)
    config = f"llama-batched-bench {label}, -npp {prompt_len} -ntg {output_len} -npl {count}"
    if done.returncode != 0 or not rows:
        return failed_row("llama.cpp", config, done.stderr.strip()[-300:] or "no result rows")
    r = rows[-1]
    return result_row(
        "llama.cpp",
        config,
        r["b"] * r["tg"],
        r["t"],
        prefill_s=r["t_pp"],
        decode_tok_s=r["s_tg"],
        command=" ".join(command),
    )


def llama_cpp_rows(
    bin_dir: str, gguf_path: str, workload: Workload, work_dir: str, kinds=("F32", "F16")
) -> list[dict]:
    """``llama-batched-bench`` on the original GGUF and on F32/F16 requantisations of it."""
    rows = []
    models = [("original " + _quant_label(gguf_path), gguf_path)]
    for kind in kinds:
        try:
            models.append((kind, quantize(bin_dir, gguf_path, kind, work_dir)))
        except (OSError, subprocess.CalledProcessError) as e:
            rows.append(failed_row("llama.cpp", f"llama-quantize {kind}", getattr(e, "stderr", e)))
    for label, path in models:
        print(f"[peers] llama-batched-bench {label}", flush=True)
        rows.append(llama_batched_bench(bin_dir, path, workload, label))
    return rows


def _quant_label(path: str) -> str:
    match = re.search(r"\.(Q\d\w*|F16|F32|BF16)\.gguf$", os.path.basename(path), re.IGNORECASE)
    return match.group(1) if match else os.path.basename(path)
