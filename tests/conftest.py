"""Shared fixtures: tiny random HF checkpoints (built with transformers, saved locally) and the
embedded default model. Nothing is downloaded."""

from __future__ import annotations

import os

# The suite runs on the CPU (Pallas kernels interpreted). With jax's CUDA plugin installed (the
# gpu-compile extra: GPU compiles without a GPU) jax would look for a GPU at start-up first.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

from tests.family_models import save_tiny_model  # noqa: E402

# Tests compile for TPU with libtpu (no chip): let test processes load it side by side.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def smollm2_gguf() -> str:
    from jaxgen.loaders.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_gguf):
    from jaxgen.loaders.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_gguf)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    """A 2-layer Llama (GQA 4/2, untied) with the SmolLM2 tokenizer."""
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny-llama")), smollm2_tokenizer)


@pytest.fixture(scope="module")
def tiny_loaded(tiny_model_dir):
    """The tiny model loaded (``LoadedModel``), once per module."""
    from jaxgen.loaders import load_model

    return load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf):
    """The HF transformers (PyTorch, fp32) reference, dequantised from the same GGUF file."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(smollm2_gguf), gguf_file=os.path.basename(smollm2_gguf), dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="session")
def smollm2_loaded():
    from jaxgen.loaders import load_model

    return load_model(None, dtype="float32")


@pytest.fixture(scope="session")
def smollm2_llm():
    """One paged engine on the default model, shared by the tests that only read from it."""
    from jaxgen import LLM

    return LLM(None, max_model_len=512, kv_cache_memory=256 << 20)


# -- the server tests' engine and clients -----------------------------------------------------------
# A module that tests the HTTP server defines its own ``server`` fixture (the settings differ);
# ``http`` and ``oai`` are clients of that module's server. A module with another engine defines
# its own ``llm``.
@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    """The tiny model's ``AsyncLLM`` with the server tests' knobs (one per process)."""
    from serving.testing import TINY_ENGINE_KNOBS, shared_llm

    return shared_llm(tiny_model_dir, **TINY_ENGINE_KNOBS)


@pytest.fixture(scope="module")
def http(server):
    """An httpx client of the module's ``server``."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def oai(server):
    """An OpenAI client of the module's ``server`` (no retries: a failure shows as it is)."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def fresh_executables(tmp_path, monkeypatch):
    """This process's compiled steps forgotten, as in a new process (jax's in-memory caches and
    the executable store's), with the store in ``tmp_path``: a test that counts compiles
    compiles, and what it writes stays its own."""
    import jax

    from jaxgen.engine.compiled import executable_store

    monkeypatch.setattr(executable_store, "store_directory", lambda: tmp_path)
    monkeypatch.setattr(executable_store, "_PROCESS_EXECUTABLES", {})
    monkeypatch.setattr(executable_store, "_PENDING", {})
    monkeypatch.setattr(executable_store, "_JOB", None)
    jax.clear_caches()
    return tmp_path
