"""Speculative decoding on the Pallas attention backends, interpreted on the CPU (pallas-tpu and
pallas-gpu), tiny random Llama: the verify step's prefill-like rows of k + 1 tokens share decode
steps with plain rows and prefill chunks (16-token pages, rows crossing page ends), and greedy
output is token for token the same backend's output without speculation. The kernels' own verify-row layouts:
``tests/kernels/test_ragged_paged_attention_*.py``."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.backends import select_backend
from tests.engine.decoding.speculation_workload import PAGE, repeating_prompts, speculation_knobs

# pallas-tpu drafts up to 4 tokens, pallas-gpu up to 2: two verify row lengths between them, and
# each draft's length follows its acceptance (1 up to k).
BACKENDS = {"pallas-tpu": 4, "pallas-gpu": 2}


@pytest.fixture(scope="module", params=list(BACKENDS))
def engines(request, tiny_loaded):
    """The backend's engine without speculation and with n-gram prompt lookup."""
    backend, k = request.param, BACKENDS[request.param]
    knobs = dict(speculation_knobs(tiny_loaded.config), attention_backend=backend)
    # The same 13 pages in the backend's own layout (the TPU's pads head_dim to 128 lanes).
    page_bytes = select_backend(backend).kv_bytes_per_page(tiny_loaded.config, PAGE, jnp.float32)
    knobs["kv_cache_memory"] = 13 * page_bytes
    ngram = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3}
    return LLM(tiny_loaded, **knobs), LLM(tiny_loaded, **knobs, speculative_config=ngram)


@pytest.mark.slow
def test_greedy_output_identical(engines):
    """Same tokens as without speculation, drafts accepted, steps saved, every page returned."""
    plain, speculating = engines
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    prompts = repeating_prompts()
    expected = plain.generate(prompts, params, use_tqdm=False)
    got = speculating.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    stats = speculating.stats()
    assert stats["spec_decode_num_drafts"] > 0
    assert 0 < stats["spec_decode_num_accepted_tokens"] <= stats["spec_decode_num_draft_tokens"]
    assert stats["steps"] < plain.stats()["steps"]
    assert speculating.engine.scheduler.allocator.num_used_pages == 0
