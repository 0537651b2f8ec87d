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
