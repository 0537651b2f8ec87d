"""The notebooks: committed without outputs, and each runs top to bottom (nbclient, kernel python3).

The slow suite runs every notebook top to bottom as a user would, on the embedded SmolLM2 (the
default model, a GGUF kept quantised), at ``SCALE = "small"``: one to four minutes each on a
2-core CPU, dominated by XLA compiling the step's shapes. ``JAXGEN_NOTEBOOK_MODEL`` points a
notebook at another checkpoint; run them by hand for real numbers (``jupyter nbconvert --execute
--to notebook``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 900


def _read(path: Path):
    import nbformat

    return nbformat.read(str(path), as_version=4)


def _execute(path: Path, monkeypatch, model: str | None):
    """Runs the notebook in a fresh python3 kernel (which inherits this environment)."""
    from nbclient import NotebookClient

    if model is None:
        monkeypatch.delenv("JAXGEN_NOTEBOOK_MODEL", raising=False)
    else:
        monkeypatch.setenv("JAXGEN_NOTEBOOK_MODEL", model)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    nb = _read(path)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK_DIR)}},
    )
    client.execute()
    return nb


def _text_outputs(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append(out.get("text", ""))
            elif "data" in out:
                parts.append(out["data"].get("text/plain", ""))
    return "\n".join(parts)


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS}
    assert {
        "01_quickstart.ipynb",
        "02_batching_strategies.ipynb",
        "03_sharding_and_capacity.ipynb",
        "04_serving.ipynb",
    } <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stripped(path):
    """Committed notebooks carry no outputs, execution counts or widget state."""
    import nbformat

    nb = _read(path)
    nbformat.validate(nb)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.get("outputs") == [], f"cell {i} has outputs: clear them before committing"
            assert cell.get("execution_count") is None, f"cell {i} has an execution_count"
    assert "widgets" not in nb.metadata


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_scales_from_one_variable(path):
    """Each notebook has ``SCALE = "small"`` near the top, so the default run stays small."""
    sources = [c.source for c in _read(path).cells[:4] if c.cell_type == "code"]
    assert any('SCALE = "small"' in s for s in sources)


@pytest.mark.slow
def test_quickstart_runs_on_default_model(monkeypatch):
    nb = _execute(NOTEBOOK_DIR / "01_quickstart.ipynb", monkeypatch, None)
    text = _text_outputs(nb)
    assert "Paris" in text
    assert "same seed, same tokens: ok" in text
    assert "compiles" in text


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["02_batching_strategies", "03_sharding_and_capacity", "04_serving"]
)
def test_notebook_runs_on_default_model(name, monkeypatch):
    nb = _execute(NOTEBOOK_DIR / f"{name}.ipynb", monkeypatch, None)
    text = _text_outputs(nb)
    if name == "02_batching_strategies":
        assert "knee at concurrency" in text
    elif name == "03_sharding_and_capacity":
        assert "greedy outputs identical" in text and "critical batch size" in text
        # The default model's kernels are kept quantised: codes and scales placed by columns.
        assert "codes: uint8 global shape (288, 576)" in text and "scales: " in text
        assert re.search(r"q_proj (codes|scales): (P|PartitionSpec)\(None, 'model'\)", text)
        assert "best for throughput (T): TP 8" in text  # section 6, the replicas-vs-TP sweep
    elif name == "04_serving" and "serving package: found" in text:
        assert "exit code: 0" in text


# The large scale's model, from its config.json on the hub (Qwen/Qwen2.5-1.5B-Instruct).
LARGE_MODELS = {
    "Qwen/Qwen2.5-1.5B-Instruct": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
        max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
        tie_word_embeddings=True,
    ),
}  # fmt: skip
# A T4's memory as CUDA reports it with ECC on (PyTorch's "14.75 GiB total capacity" on Colab):
# below nvidia-smi's 15,360 MiB and the datasheet's 16 GB.
T4_CUDA_BYTES = int(14.75 * 2**30)


def _scale_settings(path: Path, scale: str) -> dict:
    """``S[scale]`` of the notebook's ``S = {...}[SCALE]`` cell, evaluated from its source."""
    import ast

    for cell in _read(path).cells:
        if cell.cell_type != "code" or "}[SCALE]" not in cell.source:
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):
                table = node.value.value
                if isinstance(table, ast.Dict) and ast.unparse(node.targets[0]) == "S":
                    keys = [ast.literal_eval(key) for key in table.keys]
                    source = ast.unparse(table.values[keys.index(scale)])
                    return eval(source, {"__builtins__": {"dict": dict}})
    raise AssertionError(f"{path.name}: no S = {{...}}[SCALE] cell")


def _engines(name: str, settings: dict, config) -> list:
    """The engines the notebook builds at this scale, by the sizes that take memory."""
    from jaxgen.config.byte_sizes import parse_kv_cache_memory
    from jaxgen.planning.gpu_fit import EngineSizes

    if name == "02_batching_strategies":  # five strategies and AsyncLLM, one pool size each
        slots, max_len = settings["slots"], settings["max_model_len"]
        pool = config.kv_bytes_per_token(2) * max_len * slots
        sizes = [(1, max_len), (slots, slots * max_len), (slots, slots * max_len), (slots, 512),
                 (2 * slots, 512), (max(settings["levels"]), 512)]  # fmt: skip
        return [EngineSizes(max_model_len=max_len, max_num_seqs=seqs, max_num_batched_tokens=tokens,
                            kv_cache_memory=pool) for seqs, tokens in sizes]  # fmt: skip
    kv = settings["kv_cache_memory"]
    kv = parse_kv_cache_memory(kv) if isinstance(kv, str) else kv
    engine = EngineSizes(max_model_len=settings["max_model_len"], kv_cache_memory=kv)
    # Section 3 of notebook 03: one engine on one device, one tensor-parallel (one GPU: degree 1).
    return [engine, engine] if name == "03_sharding_and_capacity" else [engine]


def _t4_fit(path: Path, monkeypatch, *, sampler: bool):
    """The notebook's large scale on a T4, as the planner sees it (skips without jax's CUDA
    plugin, which holds XLA's GPU compiler)."""
    from jaxgen.planning.gpu_targets import cuda_plugin_installed

    if not cuda_plugin_installed():
        pytest.skip("needs the gpu-compile extra (jax's CUDA plugin)")
    from jaxgen.config import ModelConfig
    from jaxgen.planning.gpu_fit import plan_gpu_fit

    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)  # jax's default: 0.75
    small, large = _scale_settings(path, "small"), _scale_settings(path, "large")
    assert small["model"] is None  # the default run stays on the embedded model, offline
    assert large["model"] in LARGE_MODELS and large["dtype"] == "auto"
    config = ModelConfig.from_hf_dict(LARGE_MODELS[large["model"]])
    assert 1e9 <= config.num_params <= 3e9
    fit = plan_gpu_fit(config, "t4", _engines(path.stem, large, config),
                       memory_bytes=T4_CUDA_BYTES, extrapolate=True, sampler=sampler)  # fmt: skip
    assert (fit.dtype, fit.attention_backend) == ("float16", "reference")
    assert abs(fit.weights - 2 * config.num_params) < 1e-3 * fit.weights  # 2 bytes a parameter
    assert fit.fits, "\n".join(fit.lines())
    return fit


# Notebook 02 builds six engines of five step shapes (tens of seconds of compiling): slow only.
@pytest.mark.parametrize(
    "path", [p for p in NOTEBOOKS if p.stem != "02_batching_strategies"], ids=lambda p: p.stem
)
def test_large_scale_fits_a_t4(path, monkeypatch):
    """``SCALE = "large"`` on a T4: its model (1-3B parameters, from the hub) in what ``auto``
    picks there (float16, the reference backend), the engines the notebook builds, and their
    largest step compiled for a T4 by XLA's GPU compiler (1 and 2 layers, extended to every
    layer) fit jax's share of the T4's memory."""
    _t4_fit(path, monkeypatch, sampler=False)


def test_quickstart_large_pool_leaves_room_a_default_one_would_not(monkeypatch):
    """The quickstart's ``kv_cache_memory=0.75`` and why not the default (None: 0.9 of the free
    memory): on a T4 that pool leaves less than its largest step's temporaries."""
    import dataclasses

    fit = _t4_fit(NOTEBOOK_DIR / "01_quickstart.ipynb", monkeypatch, sampler=False)
    from jaxgen.config import ModelConfig
    from jaxgen.planning.gpu_fit import plan_gpu_fit

    large = _scale_settings(NOTEBOOK_DIR / "01_quickstart.ipynb", "large")
    config = ModelConfig.from_hf_dict(LARGE_MODELS[large["model"]])
    engine = _engines("01_quickstart", large, config)[0]
    default = plan_gpu_fit(config, "t4", [dataclasses.replace(engine, kv_cache_memory=None)],
                           memory_bytes=T4_CUDA_BYTES, extrapolate=True, sampler=False)  # fmt: skip
    assert default.largest_step == fit.largest_step and default.kv_pools[0] > fit.kv_pools[0]
    assert not default.fits, "\n".join(default.lines())


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_large_scale_fits_a_t4_with_the_sampler(path, monkeypatch):
    """As above for every notebook, the sampler over the largest step's logits compiled too."""
    fit = _t4_fit(path, monkeypatch, sampler=True)
    assert fit.sampler["temp"] > 0
