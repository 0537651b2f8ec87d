"""``jaxgen convert`` and orbax restore: bit-exact round trips, dtype casts, sharded restore."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from flax import nnx

from jaxgen.cli import main as cli_main
from jaxgen.loaders import load_model
from tests.sharded_worker import ENGINE, generate, run_worker


def flat_arrays(params) -> dict:
    return {path: np.asarray(var.get_value()) for path, var in nnx.to_flat_state(params)}


@pytest.fixture(scope="module")
def converted_dir(tiny_model_dir, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("converted") / "tiny")
    assert cli_main(["convert", tiny_model_dir, out]) == 0
    return out


def test_convert_writes_metadata_and_tokenizer(converted_dir):
    with open(os.path.join(converted_dir, "jaxgen_orbax.json")) as f:
        metadata = json.load(f)
    assert metadata["dtype"] == "float32" and metadata["config"]["num_heads"] == 4
    assert os.path.isdir(os.path.join(converted_dir, "params"))
    assert os.path.isfile(os.path.join(converted_dir, "tokenizer_config.json"))


@pytest.fixture(scope="module")
def reference_tokens(tiny_model_dir) -> list[list[int]]:
    """Greedy tokens of the original checkpoint on one device (the worker's prompts)."""
    from jaxgen import LLM

    return generate(LLM(tiny_model_dir, **ENGINE))


def test_round_trip_is_bit_exact(tiny_model_dir, converted_dir, reference_tokens):
    from jaxgen import LLM

    original, restored = load_model(tiny_model_dir), load_model(converted_dir)
    assert restored.config == original.config
    a, b = flat_arrays(original.params), flat_arrays(restored.params)
    assert a.keys() == b.keys()
    for path in a:
        assert a[path].dtype == b[path].dtype
        np.testing.assert_array_equal(a[path], b[path], err_msg=str(path))
    assert generate(LLM(converted_dir, **ENGINE)) == reference_tokens


def test_bfloat16_convert_and_cast_on_restore(tiny_model_dir, converted_dir, tmp_path):
    import jax.numpy as jnp

    out = str(tmp_path / "bf16")
    assert cli_main(["convert", tiny_model_dir, out, "--dtype", "bfloat16"]) == 0
    want = flat_arrays(load_model(tiny_model_dir, dtype="bfloat16").params)
    got = load_model(out, dtype="bfloat16")
    assert got.dtype == jnp.bfloat16
    for path, value in flat_arrays(got.params).items():
        np.testing.assert_array_equal(value, want[path], err_msg=str(path))
    cast = load_model(converted_dir, dtype="bfloat16")  # a float32 checkpoint restored as bf16
    kernel = cast.params["layers"][0]["mlp"]["up_proj"]["kernel"][...]
    assert kernel.dtype == jnp.bfloat16


def test_plain_place_hook_gets_host_arrays(converted_dir):
    seen = []

    def place(path, array):
        seen.append(type(array))
        return array * 0 + 1

    loaded = load_model(converted_dir, place=place)
    assert seen and all(t is np.ndarray for t in seen)
    assert float(np.asarray(loaded.params["norm"]["weight"][...]).min()) == 1.0


def test_convert_refuses_non_empty_output(tiny_model_dir, converted_dir, capsys):
    assert cli_main(["convert", tiny_model_dir, converted_dir]) == 2
    assert "not empty" in capsys.readouterr().err


@pytest.mark.slow  # 13-30 s on 2 cores: the default suite stays near 15 min
def test_restore_into_tensor_parallel_shardings(tiny_model_dir, tmp_path, reference_tokens):
    out = str(tmp_path / "tp2")
    result = run_worker("orbax", {"original": tiny_model_dir, "convert_to": out}, num_devices=4)
    assert result["params_equal"]
    assert result["tokens"] == reference_tokens
    params = result["params"]  # 4 query heads over 4 devices; 2 KV heads are replicated
    assert params["q_proj"]["shards"] == [[64, 16]] * 4
    assert params["k_proj"]["shards"] == [[64, 32]] * 4
    assert params["embedding"]["shards"] == [[49152 // 4, 64]] * 4
