"""``jaxgen plan --quantization auto``: a GGUF's weights counted as a ``quantization="auto"``
load keeps them (bit planes, two-level scales; ``GGUFFile.kept_weight_bytes`` from the tensor
table), equal to the loaded parameters' bytes; a float checkpoint counted in its dtype."""

from __future__ import annotations

import json

import pytest
from flax import nnx

from jaxgen.loaders.gguf_loader import GGUFFile
from jaxgen.planning.capacity import auto_weight_bytes, make_plan
from jaxgen.planning.hardware import DEVICES
from jaxgen.quantization.stats import weight_stats
from tests.loaders.test_gguf_kept_models import load_tiny, write_tiny_gguf


@pytest.mark.parametrize("qtype", ["Q6_K", "Q5_K", "Q2_K", "Q4_K", "Q8_0"])
def test_kept_bytes_are_the_loaded_parameters(tmp_path, qtype):
    path = write_tiny_gguf(str(tmp_path / f"{qtype}.gguf"), qtype)
    loaded = load_tiny(path, "auto")  # float32: the norms' 4 bytes an element
    buffers = sum(
        var.get_value().nbytes
        for route, var in nnx.to_flat_state(loaded.params)
        if route[-1] == "inv_freq"  # rotary frequencies, computed, not read from the file
    )
    kept = auto_weight_bytes("auto", path, "float32")
    assert kept == weight_stats(loaded)["parameter_bytes"] - buffers
    assert kept == GGUFFile(path).kept_weight_bytes(4)
    plan = make_plan(
        loaded.config, device=DEVICES["h100"], dtype="float32", quantization="auto",
        weight_bytes=kept,
    )  # fmt: skip
    assert plan.weight_bytes == kept


def test_command_line_counts_a_gguf_kept_and_a_float_checkpoint_in_its_dtype(tmp_path, capsys):
    from jaxgen.cli import main

    path = write_tiny_gguf(str(tmp_path / "Q6_K.gguf"), "Q6_K")
    assert main(["plan", "--model", path, "--quantization", "auto", "--dtype", "float32"]) == 0
    assert "weight bytes" in capsys.readouterr().out
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GGUFFile(path).hf_config()))
    assert auto_weight_bytes("auto", str(config), "bfloat16") is None  # auto keeps it float
    assert auto_weight_bytes("none", path, "bfloat16") is None
    assert main(["plan", "--model", path, "--quantization", "auto", "--target", "v5e-1"]) == 2
    assert "--quantization auto" in capsys.readouterr().err
