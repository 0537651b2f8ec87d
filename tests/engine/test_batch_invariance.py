"""``batch_invariant=True``: a sequence's greedy tokens and logprobs are bitwise the same alone
and in batches of 2, 8 and 32 others, and after a prefix-cache hit (reference and cpu backends,
tiny random float32 model)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.backends import select_backend

BATCHES = [2, 8, 32]
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, logprobs=5, ignore_eos=True)


def random_prompts(count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, 40000) for _ in range(rng.randrange(3, 60))] for _ in range(count)]


TARGET = random_prompts(1, seed=99)[0][:11] + [1000 + i for i in range(30)]  # 41 tokens


def tokens_and_logprobs(llm, prompts, index: int = 0):
    """The ``index``-th prompt's generated tokens and its logprobs ([steps, 6] float32: the
    sampled token's and the top 5, by token id)."""
    out = llm.generate(prompts, [PARAMS] * len(prompts), use_tqdm=False)[index]
    logprobs = [[step[token] for token in sorted(step)] for step in out.logprobs]
    return list(out.token_ids), np.asarray(logprobs, np.float32)


def assert_bitwise(got, want):
    assert got[0] == want[0]
    assert got[1].shape == want[1].shape and np.array_equal(got[1], want[1])


def make_llm(model_dir, backend, **knobs):
    knobs.setdefault("max_rolling_batch_prefill_tokens", 4096)
    return LLM(
        model_dir, attention_backend=backend, max_model_len=256, batch_invariant=True, **knobs
    )


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_alone_equals_in_batches(tiny_model_dir, backend):
    llm = make_llm(tiny_model_dir, backend, enable_prefix_caching=False)
    alone = tokens_and_logprobs(llm, [TARGET])
    for size, seed in zip(BATCHES, range(len(BATCHES)), strict=True):
        others = random_prompts(size - 1, seed)
        assert_bitwise(tokens_and_logprobs(llm, [TARGET] + others), alone)
        middle = size // 2  # the target among others, not first
        prompts = others[:middle] + [TARGET] + others[middle:]
        assert_bitwise(tokens_and_logprobs(llm, prompts, middle), alone)


def test_prefix_cache_hit_equals_cold(tiny_model_dir):
    cold = tokens_and_logprobs(
        make_llm(tiny_model_dir, "reference", enable_prefix_caching=False), [TARGET]
    )
    llm = make_llm(tiny_model_dir, "reference")
    tokens_and_logprobs(llm, [TARGET[:32] + [7, 8, 9]])  # caches TARGET's first two pages
    before = llm.stats()["prefix_cache_hit_pages"]
    hit = tokens_and_logprobs(llm, random_prompts(7, seed=5) + [TARGET], index=7)
    assert llm.stats()["prefix_cache_hit_pages"] >= before + 2
    assert_bitwise(hit, cold)


def test_chunked_prefill_alone_equals_unchunked(tiny_model_dir):
    whole = tokens_and_logprobs(
        make_llm(tiny_model_dir, "reference", enable_prefix_caching=False), [TARGET]
    )
    chunked = make_llm(
        tiny_model_dir,
        "reference",
        enable_prefix_caching=False,
        max_rolling_batch_prefill_tokens=16,
        max_rolling_batch_size=8,
    )
    assert_bitwise(tokens_and_logprobs(chunked, [TARGET]), whole)


def test_only_reference_and_cpu_are_invariant():
    assert select_backend("reference", platform="cpu", batch_invariant=True).batch_invariant
    with pytest.raises(ValueError, match="batch_invariant"):
        select_backend("pallas-gpu", platform="cpu", batch_invariant=True)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_chunked_prefill_in_batches_equals_alone(tiny_model_dir, backend):
    alone = tokens_and_logprobs(
        make_llm(tiny_model_dir, backend, enable_prefix_caching=False), [TARGET]
    )
    llm = make_llm(
        tiny_model_dir, backend, enable_prefix_caching=False, max_rolling_batch_prefill_tokens=64
    )
    for size, seed in zip(BATCHES, range(len(BATCHES)), strict=True):
        others = random_prompts(size - 1, seed)
        assert_bitwise(tokens_and_logprobs(llm, others + [TARGET], size - 1), alone)


def test_quantised_weights_are_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="batch_invariant.*quantization='none'"):
        make_llm(tiny_model_dir, "reference", quantization="int8")
