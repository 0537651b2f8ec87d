"""Multi-host: the same engine code over two CPU processes joined by ``jax.distributed``.

Each process has 4 simulated devices; the mesh's "model" axis spans all 8 (both processes), so
every step's all-reduces cross the process boundary (gloo collectives over loopback). Both
processes run the same greedy generation, which must match a single-process run.
"""

from __future__ import annotations

import pytest

from tests.family_models import save_tiny_model
from tests.sharded_worker import ENGINE, generate, run_cluster


@pytest.fixture(scope="module")
def mha_dir(tmp_path_factory, smollm2_tokenizer) -> str:
    path = str(tmp_path_factory.mktemp("tiny-mha8-multihost"))
    return save_tiny_model(path, smollm2_tokenizer, num_attention_heads=8, num_key_value_heads=8)


@pytest.mark.slow  # about 60 s on a loaded 2-core CPU
def test_two_processes_degree_8_match_single_process(mha_dir):
    from jaxgen import LLM

    expected = generate(LLM(mha_dir, **ENGINE))
    results = run_cluster({"model": mha_dir}, num_processes=2, devices_per_process=4, timeout=400)
    assert sorted(r["process_index"] for r in results) == [0, 1]
    for result in results:
        assert result["process_count"] == 2
        assert result["global_devices"] == 8 and result["local_devices"] == 4
        assert result["q_proj_global_shape"] == [64, 64]
        assert result["q_proj_local_shards"] == [[64, 8]] * 4  # one head per device, 4 local
        assert result["tokens"] == expected
