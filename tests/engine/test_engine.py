"""Every batching strategy gives the same greedy tokens as one-at-a-time decoding (real model, fp32),
whatever the arrival order, concurrency, pool size, prefill budget or prefix reuse."""

from __future__ import annotations

import pytest

from jaxgen import LLM, SamplingParams

TOPICS = ["the moon", "volcanoes", "honey bees", "the printing press", "jazz", "glaciers", "chess"]
SYSTEM = (
    "You are a careful assistant. Answer in plain English, in one or two sentences, "
    "without lists, and never mention that you are an AI model."
)
MAX_TOKENS = [12, 5, 16, 9, 14, 7, 11]


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer):
    out = []
    for topic in TOPICS:
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Tell me one fact about {topic}."},
        ]
        text = smollm2_tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        out.append(smollm2_tokenizer.encode(text, add_special_tokens=False))
    return out


def params_list():
    return [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for m in MAX_TOKENS]


def generate(loaded, prompts, order=None, **knobs):
    knobs.setdefault("max_model_len", 256)
    llm = LLM(loaded, **knobs)
    order = order or list(range(len(prompts)))
    params = params_list()
    outs = llm.generate([prompts[i] for i in order], [params[i] for i in order], use_tqdm=False)
    tokens = {i: out.token_ids for i, out in zip(order, outs, strict=True)}
    stats = llm.stats()
    assert stats["kv_pages_used"] == 0 and stats["num_running"] == 0 and stats["num_waiting"] == 0
    return [tokens[i] for i in range(len(prompts))], stats


@pytest.fixture(scope="module")
def reference(smollm2_loaded, prompts):
    tokens, _ = generate(smollm2_loaded, prompts, batching="none")
    assert [len(t) for t in tokens] == MAX_TOKENS
    return tokens


@pytest.mark.parametrize(
    "knobs",
    [
        pytest.param(dict(batching="static", batch_size=4), id="static", marks=pytest.mark.slow),
        pytest.param(
            dict(batching="dynamic", batch_size=3, max_batch_delay=0.01),
            id="dynamic",
            marks=pytest.mark.slow,
        ),
        pytest.param(dict(batching="continuous", max_rolling_batch_size=4), id="continuous"),
        pytest.param(dict(batching="paged"), id="paged"),
    ],
)
def test_strategies_match_one_at_a_time(knobs, smollm2_loaded, prompts, reference):
    tokens, stats = generate(smollm2_loaded, prompts, **knobs)
    assert tokens == reference


def test_paged_arrival_order_and_concurrency(smollm2_loaded, prompts, reference):
    order = [6, 2, 4, 0, 5, 1, 3]
    tokens, _ = generate(smollm2_loaded, prompts, order=order, max_rolling_batch_size=2)
    assert tokens == reference


def test_tiny_pool_forces_preemption(tiny_model_dir):
    """A 2-layer model, 8 usable pages and long outputs: sequences must be preempted and recomputed."""
    from jaxgen.loaders import load_model

    loaded = load_model(tiny_model_dir)
    rng = __import__("numpy").random.default_rng(1)
    prompts = [rng.integers(0, 1000, int(n)).tolist() for n in (20, 25, 30, 18, 22)]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    reference = LLM(loaded, batching="none", max_model_len=128).generate(
        prompts, params, use_tqdm=False
    )
    page_bytes = loaded.config.kv_bytes_per_token(4) * 16
    llm = LLM(
        loaded, max_model_len=128, kv_cache_memory=8 * page_bytes, enable_prefix_caching=False
    )
    outs = llm.generate(prompts, params, use_tqdm=False)
    stats = llm.stats()
    assert stats["preemptions"] > 0
    assert [o.token_ids for o in outs] == [r.token_ids for r in reference]
    assert stats["kv_pages_used"] == 0


def test_small_prefill_budget_chunks_prompts(smollm2_loaded, prompts, reference):
    tokens, _ = generate(
        smollm2_loaded, prompts, max_rolling_batch_prefill_tokens=16, max_rolling_batch_size=4
    )
    assert tokens == reference


def test_prefix_reuse_shares_pages(smollm2_loaded, prompts, reference):
    llm = LLM(smollm2_loaded, max_model_len=256)
    params = params_list()
    first = llm.generate(prompts[:1], params[:1], use_tqdm=False)
    rest = llm.generate(prompts[1:], params[1:], use_tqdm=False)
    stats = llm.stats()
    assert stats["prefix_cache_hit_pages"] >= len(prompts) - 1  # the shared system prompt
    assert [o.token_ids for o in first + rest] == reference
    assert rest[0].metrics["num_cached_tokens"] >= 16
    assert rest[0].num_cached_tokens == rest[0].metrics["num_cached_tokens"]  # vLLM's name
    assert first[0].num_cached_tokens == 0
    assert stats["kv_pages_used"] == 0


def test_no_compiles_in_steady_state(smollm2_loaded, prompts):
    llm = LLM(smollm2_loaded, max_model_len=256, enable_prefix_caching=False)
    params = params_list()
    llm.generate(prompts, params, use_tqdm=False)
    before = llm.stats()["compiles"]
    llm.generate(prompts, params, use_tqdm=False)
    assert llm.stats()["compiles"] == before
