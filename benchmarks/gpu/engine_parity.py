"""Stage 4, greedy parity on the device: tiny random Llama, Qwen3 and Gemma 3 checkpoints built
there with transformers (``hf_parity_models.py``, in a process of its own that also computes
transformers' float32 greedy tokens), generated greedily by jaxgen in float32 with
``attention_backend="pallas-gpu"`` and ``"reference"``; all three token lists must be equal.
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
HERE = os.path.dirname(os.path.abspath(__file__))


def first_difference(a: list[list[int]], b: list[list[int]]) -> list[int] | None:
    """[prompt, position] of the first differing token, or None when equal."""
    for prompt, (x, y) in enumerate(zip(a, b, strict=True)):
        for position in range(max(len(x), len(y))):
            if position >= len(x) or position >= len(y) or x[position] != y[position]:
                return [prompt, position]
    return None


def jaxgen_tokens(path: str, backend: str, prompts, max_tokens: int, page_size: int):
    from jaxgen import LLM, SamplingParams

    llm = LLM(
        path,
        dtype="float32",
        attention_backend=backend,
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
            for name, path in ready["paths"].items():
                entry = result["models"].setdefault(name, {})
                for backend in BACKENDS:
                    if not budget.allows(5.0):
                        entry[backend] = "skipped (budget)"
                        continue
                    start = time.perf_counter()
                    entry[backend] = jaxgen_tokens(
                        path, backend, prompts, max_tokens, ctx.page_size
                    )
                    entry[f"{backend}_s"] = time.perf_counter() - start
                    log(f"parity {name} {backend}: {time.perf_counter() - start:.1f} s")
                ctx.partial(result)
        hf = wait_for(os.path.join(directory, "hf_tokens.json"), child, budget.deadline)
        if hf is None:
            raise RuntimeError("transformers' greedy tokens did not arrive: " + child_tail(child))
        result["hf_device"] = hf["device"]
        all_equal = True
        for name, entry in result["models"].items():
            entry["transformers"] = hf["tokens"][name]
            ran = {
                source: entry[source]
                for source in (*BACKENDS, "transformers")
                if isinstance(entry.get(source), list)
            }
            entry["first_difference"] = {
                f"{a} vs {b}": first_difference(ran[a], ran[b])
                for a, b in itertools.combinations(ran, 2)
            }
            entry["not_run"] = [s for s in (*BACKENDS, "transformers") if s not in ran]
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
