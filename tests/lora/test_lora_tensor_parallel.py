"""Multi-LoRA under tensor parallelism (a fresh process with 4 simulated CPU devices): one mixed
batch of two adapters and the base model gives the same greedy tokens as transformers + peft
and logprobs equal to the unsharded engine's at degrees 2 and 4; A and B split as their base
kernels (column-parallel q_proj: A whole, B's columns split; row-parallel o_proj: A's rows
split, B whole)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.family_models import save_tiny_model
from tests.lora.peft_adapters import peft_greedy, save_adapter
from tests.sharded_worker import run_worker

pytestmark = pytest.mark.slow

PROMPTS = [[17, 301, 52, 9, 440, 1200, 33], [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]]


@pytest.fixture(scope="module")
def lora_checkpoints(tmp_path_factory, smollm2_tokenizer):
    root = tmp_path_factory.mktemp("lora-tp")
    base = save_tiny_model(
        str(root / "base"), smollm2_tokenizer, num_attention_heads=8, num_key_value_heads=4
    )
    adapters = {
        "all-r8": save_adapter(base, str(root / "all-r8"), seed=1, r=8, alpha=16),
        "attn-r4": save_adapter(
            base, str(root / "attn-r4"), seed=2, r=4, alpha=8, targets=("q_proj", "o_proj")
        ),
    }
    return base, adapters


def test_adapters_under_tensor_parallelism_equal_unsharded_and_peft(lora_checkpoints):
    base, adapters = lora_checkpoints
    args = {"model": base, "adapters": adapters, "prompts": PROMPTS, "degrees": [1, 2, 4]}
    result = run_worker("lora_tp", args, num_devices=4, timeout=600)
    paths = [None, *adapters.values()]
    expected = [
        peft_greedy(base, path, prompt, 5, merged=False) for prompt in PROMPTS for path in paths
    ]
    for degree in ("1", "2", "4"):
        assert result[degree]["tokens"] == [tokens for tokens, _ in expected], degree
        diff = np.abs(np.array(result[degree]["logprobs"]) - np.array(result["1"]["logprobs"]))
        assert diff.max() < 1e-4, (degree, diff.max())
        peft_diff = np.abs(np.array(result[degree]["logprobs"]) - [lp for _, lp in expected])
        assert peft_diff.max() < 2e-4, (degree, peft_diff.max())
        print(
            f"degree {degree}: max |Δ logprob| vs degree 1 {diff.max():.2e}, vs peft {peft_diff.max():.2e}"
        )
    # Two slots of rank 8: width 16; hidden size and projection widths from the checkpoint.
    q_a, q_b = result["4"]["slots"]["q_proj"]
    o_a, o_b = result["4"]["slots"]["o_proj"]
    assert len({tuple(s) for s in q_a}) == 1 and q_a[0][1] == 16  # A whole on every device
    assert q_b[0][1] * 4 == sum(s[1] for s in q_b)  # B's columns split 4 ways
    assert o_a[0][0] * 4 == sum(s[0] for s in o_a)  # A's rows split 4 ways
    assert len({tuple(s) for s in o_b}) == 1 and o_b[0][0] == 16  # B whole
    assert result["1"]["slots"]["q_proj"][1] == [[16, sum(s[1] for s in q_b)]]  # one device
