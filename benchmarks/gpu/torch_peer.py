"""Stage 6, the torch peer: transformers' ``generate`` on the same GPU, same model shape and
workload as stage 5 (random Llama-3-8B-shaped bf16 weights, made on the device: meta device,
``to_empty``, then ``normal_``), static KV cache, greedy, every sequence ``output_len`` tokens.
Eager (``disable_compile=True``: transformers would otherwise torch.compile the decode step of
a static cache on its own); with ``--compile auto`` the compiled step is timed at batch 1 too
when the budget leaves time for its compile. Runs in its own process, started by
device_check.py; writes its JSON after every batch size.

    python benchmarks/gpu/torch_peer.py --out peer.json [--dry-run] [--deadline EPOCH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from benchmarks.gpu.profiles import select  # noqa: E402

COMPILE_NEEDS_S = 150.0  # a torch.compile of the 8B decode step, then its timed run


def write(path: str, data: dict) -> None:
    temporary = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(temporary, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(temporary, path)


def random_model(hf_config: dict, device: str):
    """The Llama of ``hf_config`` in bf16 on ``device``, random N(0, 0.02) weights, norms 1."""
    import torch
    import transformers

    fields = {k: v for k, v in hf_config.items() if k != "model_type"}
    config = transformers.LlamaConfig(**fields)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.to_empty(device=device)
    with torch.no_grad():
        for _, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                parameter.normal_(0.0, 0.02)
            else:
                parameter.fill_(1.0)
    # Buffers made on the meta device hold nothing: the RoPE tables are made again (on the CPU,
    # in float32; the constructor takes a device argument in some transformers versions only).
    rotary = type(model.model.rotary_emb)
    try:
        model.model.rotary_emb = rotary(config=model.config).to(device)
    except TypeError:
        model.model.rotary_emb = rotary(config=model.config, device="cpu").to(device)
    model.generation_config.eos_token_id = None  # every sequence runs to max_new_tokens
    model.generation_config.pad_token_id = 0
    return model.eval()


def generate_seconds(model, ids, new_tokens: int, *, compiled: bool) -> tuple[float, int]:
    """Wall seconds of one greedy ``generate`` (synchronised) and the tokens it returned."""
    import torch

    sync = torch.cuda.synchronize if ids.is_cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            cache_implementation="static",
            disable_compile=not compiled,
            pad_token_id=0,
        )
    sync()
    return time.perf_counter() - start, out.shape[1] - ids.shape[1]


def measure(model, batch: int, profile, device: str, *, compiled: bool) -> dict:
    """One batch size: a warm-up, then a one-token generate (the prefill) and a full one."""
    import torch

    ids = torch.randint(3, model.config.vocab_size, (batch, profile.prompt_len), device=device)
    generate_seconds(model, ids, 2, compiled=compiled)  # warm-up (and the compile, if any)
    first_s, _ = generate_seconds(model, ids, 1, compiled=compiled)
    total_s, made = generate_seconds(model, ids, profile.output_len, compiled=compiled)
    row = {
        "batch": batch,
        "compiled": compiled,
        "seconds": total_s,
        "new_tokens_per_sequence": made,
        "output_tok_s": batch * made / total_s,
        "prefill_s": first_s,
        "decode_ms_per_step": 1e3 * (total_s - first_s) / max(made - 1, 1),
    }
    if ids.is_cuda:
        row["max_memory_allocated"] = torch.cuda.max_memory_allocated()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--compile", choices=("off", "auto"), default="auto")
    parser.add_argument("--batches", default=None, help="e.g. 256,64 (default: the profile's)")
    args = parser.parse_args()
    profile = select(dry_run=args.dry_run, batches=args.batches)
    deadline = args.deadline or time.time() + profile.budgets["torch_peer"].max_s

    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    result = {
        "status": "partial",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "generate": "static cache, greedy, eager (disable_compile=True)",
        "rows": [],
    }
    start = time.perf_counter()
    model = random_model(profile.model, device)
    result["model_made_s"] = time.perf_counter() - start
    write(args.out, result)
    for batch in profile.e2e_batches:
        if deadline - time.time() < 10:
            result["rows"].append({"batch": batch, "skipped": "budget"})
            continue
        try:
            row = measure(model, batch, profile, device, compiled=False)
        except torch.cuda.OutOfMemoryError as error:
            row = {"batch": batch, "error": f"out of memory: {str(error)[:200]}"}
        result["rows"].append(row)
        print(f"torch peer b{batch}: {json.dumps(row)}", flush=True)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        write(args.out, result)
    if args.compile == "off" or device != "cuda":
        result["torch_compile"] = "not tried: " + ("--compile off" if device == "cuda" else "CPU")
    elif deadline - time.time() < COMPILE_NEEDS_S:
        result["torch_compile"] = f"not tried: under {COMPILE_NEEDS_S:.0f} s left"
    else:
        result["torch_compile"] = "batch 1, transformers' own compile of the static-cache step"
        try:
            result["rows"].append(measure(model, 1, profile, device, compiled=True))
        except Exception as error:
            result["torch_compile"] += f": failed: {type(error).__name__}: {str(error)[:300]}"
    result["status"] = "ok"
    if any("skipped" in row for row in result["rows"]):
        result["status"] = "partial"
    write(args.out, result)


if __name__ == "__main__":
    main()
