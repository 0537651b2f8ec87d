"""Stage 4, greedy parity on the device: tiny random Llama, Qwen3 and Gemma 3 checkpoints built
there with transformers (``hf_parity_models.py``, in a process of its own that also computes
transformers' float32 greedy tokens), generated greedily by jaxgen in float32 with
``attention_backend="pallas-gpu"`` and ``"reference"`` (the first model also with pallas-gpu's
options that are not yet its defaults); all token lists must be equal.
jax's float32 matmuls run at "highest" precision here (XLA's default may use tf32 on the GPU,
transformers' does not)."""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
import time

import jax

from benchmarks.gpu.children import Child
from benchmarks.gpu.report import log, read_json

BACKENDS = ("pallas-gpu", "reference")
# The first model also runs pallas-gpu with its options that are not yet defaults: the split
# merge in one kernel (over four splits of 16 keys, so the short prompts have splits to merge),
# the K/V write in one kernel and cuBLAS's matmuls; its tokens must be the others'.
OPTIONS_SOURCE = "pallas-gpu options"
KERNEL_OPTIONS = {
    "pallas_merge": True,
    "num_splits": 4,
    "decode_block_k": 16,
    "pallas_kv_write": True,
    "xla_gemm": "cublas",
}
HERE = os.path.dirname(os.path.abspath(__file__))


def first_difference(a: list[list[int]], b: list[list[int]]) -> list[int] | None:
    """[prompt, position] of the first differing token, or None when equal."""
    for prompt, (x, y) in enumerate(zip(a, b, strict=True)):
        for position in range(max(len(x), len(y))):
            if position >= len(x) or position >= len(y) or x[position] != y[position]:
                return [prompt, position]
    return None


def jaxgen_tokens(path: str, source: str, prompts, max_tokens: int, page_size: int):
    """``source``: a backend's name, or OPTIONS_SOURCE (pallas-gpu with KERNEL_OPTIONS)."""
    from jaxgen import LLM, SamplingParams

    options = KERNEL_OPTIONS if source == OPTIONS_SOURCE else None
    llm = LLM(
        path,
        dtype="float32",
        attention_backend="pallas-gpu" if options else source,
        attention_kernel_options=options,
        page_size=page_size,
        max_model_len=max(len(p) for p in prompts) + max_tokens + page_size,
        kv_cache_memory=16 << 20,
        max_rolling_batch_size=len(prompts),
        max_rolling_batch_prefill_tokens=128,
    )
    params = SamplingParams(
        temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True
    )
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [list(out.outputs[0].token_ids) for out in outs]


def wait_for(path: str, child: Child, deadline: float) -> dict | None:
    """``path``'s JSON once the child wrote it, waiting until ``deadline``; a file written
    before the deadline is read even when the stage's own work ran past it (on an H200 the
    tokens had been waiting 20 s when the stage, out of budget, gave up on them: ea5bc0b)."""
    while time.time() < deadline:
        data = read_json(path)
        if data is not None:
            return data
        if child.process.poll() is not None:
            break
        time.sleep(0.2)
    return read_json(path)


def start_transformers(profile) -> tuple[Child, str]:
    """Starts ``hf_parity_models.py`` (checkpoints, then transformers' tokens); the device
    check starts it a stage early, so torch's import overlaps the kernel checks."""
    directory = tempfile.mkdtemp(prefix="jaxgen-parity-")
    device = "cuda" if jax.default_backend() == "gpu" else "cpu"
    command = [
        sys.executable,
        os.path.join(HERE, "hf_parity_models.py"),
        "--dir",
        directory,
        "--models",
        ",".join(profile.parity_models),
        "--prompt-lens",
        ",".join(map(str, profile.parity_prompt_lens)),
        "--max-tokens",
        str(profile.parity_max_tokens),
        "--device",
        device,
    ]
    return Child(command, "hf parity"), directory


def run(ctx, budget) -> dict:
    child, directory = ctx.early.pop("engine_parity", None) or start_transformers(ctx.profile)
    result = {"matmul_precision": "highest", "page_size": ctx.page_size, "models": {}}
    try:
        ready = wait_for(os.path.join(directory, "ready.json"), child, budget.deadline)
        if ready is None:
            raise RuntimeError(
                "the transformers process wrote no checkpoints: " + child_tail(child)
            )
        prompts, max_tokens = ready["prompts"], ready["max_tokens"]
        result["prompt_lens"] = [len(p) for p in prompts]
        with jax.default_matmul_precision("highest"):
            for index, (name, path) in enumerate(ready["paths"].items()):
                entry = result["models"].setdefault(name, {})
                entry["sources"] = [*BACKENDS, OPTIONS_SOURCE] if index == 0 else [*BACKENDS]
                for source in entry["sources"]:
                    if not budget.allows(5.0):
                        entry[source] = "skipped (budget)"
                        continue
                    start = time.perf_counter()
                    entry[source] = jaxgen_tokens(path, source, prompts, max_tokens, ctx.page_size)
                    entry[f"{source}_s"] = time.perf_counter() - start
                    log(f"parity {name} {source}: {time.perf_counter() - start:.1f} s")
                ctx.partial(result)
        hf = wait_for(os.path.join(directory, "hf_tokens.json"), child, budget.deadline)
        if hf is None:
            raise RuntimeError("transformers' greedy tokens did not arrive: " + child_tail(child))
        result["hf_device"] = hf["device"]
        all_equal = True
        for name, entry in result["models"].items():
            entry["transformers"] = hf["tokens"][name]
            sources = (*entry["sources"], "transformers")
            ran = {s: entry[s] for s in sources if isinstance(entry.get(s), list)}
            entry["first_difference"] = {
                f"{a} vs {b}": first_difference(ran[a], ran[b])
                for a, b in itertools.combinations(ran, 2)
            }
            entry["not_run"] = [s for s in sources if s not in ran]
            entry["identical"] = len(ran) > 1 and all(
                v is None for v in entry["first_difference"].values()
            )
            all_equal &= entry["identical"] and not entry["not_run"]
        result["all_identical"] = all_equal
    finally:
        child.wait(time.time() + 10)
    return result


def child_tail(child: Child) -> str:
    return " | ".join(child.tail[-5:])


def summary(result: dict) -> str:
    models = result.get("models", {})
    same = [name for name, entry in models.items() if entry.get("identical")]
    differ = [name for name, entry in models.items() if not entry.get("identical")]
    partial = [
        f"{name} without {', '.join(entry['not_run'])}"
        for name, entry in models.items()
        if entry.get("not_run")
    ]
    text = f"{len(same)}/{len(models)} identical"
    text += f"; differ: {', '.join(differ)}" if differ else ""
    return text + (f"; compared {'; '.join(partial)}" if partial else "")
