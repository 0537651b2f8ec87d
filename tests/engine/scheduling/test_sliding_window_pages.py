"""Page freeing for models whose every layer slides (Mistral-style): pages that left every
query's window go back to the pool as sequences advance, and greedy generation past several
windows still equals transformers' (paged, chunked prefill, prefix caching)."""

from __future__ import annotations

import numpy as np

from jaxgen import LLM, SamplingParams
from jaxgen.loaders import load_model
from tests.family_models import hf_greedy_tokens, save_tiny_model

WINDOW = 8
PAGE_SIZE = 4


def test_all_sliding_model_frees_out_of_window_pages_and_generates_as_transformers(
    tmp_path, smollm2_tokenizer
):
    path = save_tiny_model(str(tmp_path), smollm2_tokenizer, arch="mistral", sliding_window=WINDOW)
    loaded = load_model(path)
    assert loaded.config.every_layer_sliding_window == WINDOW
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 1000, n).tolist() for n in (19, 6, 11)]
    prompts.append(prompts[0])  # a prefix-cache hit on pages its twin released
    max_tokens = 30  # every sequence ends past several windows
    page_bytes = loaded.config.kv_bytes_per_token(4) * PAGE_SIZE
    llm = LLM(
        loaded,
        batching="paged",
        page_size=PAGE_SIZE,
        max_model_len=64,
        max_rolling_batch_prefill_tokens=16,
        max_rolling_batch_size=4,
        kv_cache_memory=16 * page_bytes,  # the four need 46 pages unfreed
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in outs] == hf_greedy_tokens(path, prompts, max_tokens)
    assert llm.stats()["kv_pages_used"] == 0


def test_pages_go_back_to_the_pool_while_a_sequence_decodes(tmp_path, smollm2_tokenizer):
    path = save_tiny_model(str(tmp_path), smollm2_tokenizer, arch="mistral", sliding_window=WINDOW)
    llm = LLM(path, batching="paged", page_size=PAGE_SIZE, max_model_len=64)
    engine = llm.engine
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    engine.add_request("a", None, list(range(100, 110)), params)
    used = []
    while engine.has_unfinished():
        engine.step()
        used.append(engine.stats()["kv_pages_used"])
    # 50 tokens would hold 13 pages; the window needs at most ceil((8 + 1) / 4) + 1 of them.
    assert max(used) <= 4
    assert used[-1] == 0
