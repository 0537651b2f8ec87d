"""The core install runs without torch: ``jaxgen generate`` on the default model in a process
where ``import torch`` fails, as on a machine that followed the README's first command."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BLOCK_TORCH_AND_RUN = """
import sys
sys.modules["torch"] = None  # `import torch` raises ImportError; find_spec("torch") is None
from jaxgen.cli import main
code = main(sys.argv[1:])
assert "torch" not in {name.split(".")[0] for name, mod in sys.modules.items() if mod is not None}
sys.exit(code)
"""


@pytest.mark.slow
def test_generate_runs_without_torch():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    args = ["generate", "--chat", "--max-tokens", "8", "What is the capital of France?"]
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH_AND_RUN, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Paris" in result.stdout, (result.stdout, result.stderr[-2000:])
    # transformers' advice about its own model classes is no concern of a jaxgen user.
    assert "PyTorch was not found" not in result.stderr, result.stderr[-2000:]
