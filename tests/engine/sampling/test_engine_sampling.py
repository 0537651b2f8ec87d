"""Sampling through the engine (tiny model): seeds, top_k=1, stop strings and tokens, n > 1,
min_tokens, and AsyncLLM streaming and abort."""

from __future__ import annotations

import asyncio

import pytest

from jaxgen import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_loaded):
    return LLM(
        tiny_loaded,
        max_model_len=256,
        kv_cache_memory=32 << 20,
        max_rolling_batch_size=8,
        max_rolling_batch_prefill_tokens=128,
    )


PROMPTS = ["The history of paged memory", "Once upon a time", "def fibonacci(n):", "Dear diary,"]


def test_seeded_requests_reproduce_whatever_the_batch(llm):
    params = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1234)
    alone = llm.generate(PROMPTS[1], params, use_tqdm=False)[0].token_ids
    others = [SamplingParams(max_tokens=12, temperature=0.8, seed=i) for i in range(3)]
    batch = llm.generate(
        [PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]],
        [others[0], params, others[1], others[2]],
        use_tqdm=False,
    )
    assert batch[1].token_ids == alone
    again = llm.generate(
        PROMPTS[1],
        SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, seed=1235),
        use_tqdm=False,
    )[0].token_ids
    assert again != alone


def test_top_k_one_equals_greedy(llm):
    greedy = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0), use_tqdm=False)
    top1 = llm.generate(
        PROMPTS, SamplingParams(max_tokens=10, temperature=1.3, top_k=1), use_tqdm=False
    )
    assert [o.token_ids for o in greedy] == [o.token_ids for o in top1]


def test_stop_string_cut_across_token_boundaries(llm, smollm2_tokenizer):
    full = llm.generate(
        PROMPTS[2], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True), use_tqdm=False
    )[0]
    text = full.text
    assert len(text) > 12
    # A stop string that starts inside one token and ends inside a later one.
    start = len(text) // 2
    stop = text[start : start + 5]
    assert stop.strip()
    cut = llm.generate(
        PROMPTS[2],
        SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop]),
        use_tqdm=False,
    )[0]
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.find(stop)]
    assert cut.outputs[0].stop_reason == stop
    kept = llm.generate(
        PROMPTS[2],
        SamplingParams(
            max_tokens=30,
            temperature=0.0,
            ignore_eos=True,
            stop=[stop],
            include_stop_str_in_output=True,
        ),
        use_tqdm=False,
    )[0]
    assert kept.text == text[: text.find(stop) + len(stop)]
    assert kept.outputs[0].stop_reason == stop


def test_stop_token_ids_and_min_tokens(llm):
    base = llm.generate(
        PROMPTS[0], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True), use_tqdm=False
    )[0].token_ids
    stop_token = base[5]
    first = base.index(stop_token)
    out = llm.generate(
        PROMPTS[0],
        SamplingParams(
            max_tokens=20, temperature=0.0, ignore_eos=True, stop_token_ids=[stop_token]
        ),
        use_tqdm=False,
    )[0]
    assert out.token_ids == base[: first + 1] and out.finish_reason == "stop"
    late = llm.generate(
        PROMPTS[0],
        SamplingParams(
            max_tokens=20,
            temperature=0.0,
            ignore_eos=True,
            stop_token_ids=[stop_token],
            min_tokens=first + 2,
        ),
        use_tqdm=False,
    )[0]
    assert stop_token not in late.token_ids[: first + 2]


def test_parallel_samples_share_prompt_pages(llm):
    prompt = " ".join(["shared prefix words"] * 20)
    before = llm.stats()["prefix_cache_hit_pages"]
    out = llm.generate(
        prompt, SamplingParams(n=3, max_tokens=8, temperature=1.0, seed=7), use_tqdm=False
    )[0]
    assert len(out.outputs) == 3
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1  # seed + index per sample
    assert llm.stats()["prefix_cache_hit_pages"] > before
    assert llm.stats()["kv_pages_used"] == 0


def test_penalties_and_logprobs_run(llm):
    out = llm.generate(
        PROMPTS[3],
        SamplingParams(
            max_tokens=10,
            temperature=0.0,
            repetition_penalty=1.3,
            frequency_penalty=0.5,
            presence_penalty=0.5,
            logprobs=3,
        ),
        use_tqdm=False,
    )[0]
    assert len(out.logprobs) == len(out.token_ids)
    assert all(len(entry) >= 3 for entry in out.logprobs)


@pytest.mark.parametrize(
    "knobs", [{}, {"async_scheduling": True}, {"num_scheduler_steps": 4}], ids=str
)
def test_async_streaming_and_abort(tiny_loaded, knobs):
    """AsyncLLM streams, aborts mid-stream and frees the pages; with asynchronous scheduling
    (steps dispatched ahead of their tokens) or multi-step decoding (tokens read a few steps
    at a time) the streamed text is the same."""
    from jaxgen import AsyncLLM
    from jaxgen.config.engine_config import EngineConfig
    from jaxgen.engine.llm_engine import LLMEngine

    engine = LLMEngine(
        tiny_loaded,
        EngineConfig(
            max_model_len=256,
            kv_cache_memory=32 << 20,
            max_rolling_batch_size=8,
            max_rolling_batch_prefill_tokens=128,
            **knobs,
        ),
    )
    llm = AsyncLLM(engine=engine)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)

    async def main():
        pieces = []
        async for out in llm.generate(PROMPTS[1], params, request_id="stream"):
            pieces.append(out.outputs[0].text)
            last = out
        assert last.finished and last.finish_reason == "length"
        streamed = "".join(pieces)

        async def consume_then_stop():
            count = 0
            async for _ in llm.generate(
                PROMPTS[0],
                SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True),
                request_id="long",
            ):
                count += 1
                if count == 3:
                    await llm.abort("long")
            return count

        count = await consume_then_stop()
        for _ in range(100):
            if llm.stats()["kv_pages_used"] == 0 and llm.stats()["num_running"] == 0:
                break
            await asyncio.sleep(0.05)
        with pytest.raises(ValueError, match="temperature"):
            async for _ in llm.generate("x", SamplingParams(temperature=-1)):
                pass
        return streamed, count

    try:
        streamed, count = asyncio.run(main())
    finally:
        llm.shutdown()
    full = (
        LLM(tiny_loaded, max_model_len=256, kv_cache_memory=32 << 20)
        .generate(PROMPTS[1], params, use_tqdm=False)[0]
        .text
    )
    assert streamed == full
    assert count >= 3
    stats = llm.stats()
    assert stats["kv_pages_used"] == 0 and stats["num_running"] == 0


@pytest.mark.slow
def test_pallas_backend_matches_reference_with_small_chunks(tiny_loaded):
    """Through the engine: Pallas kernels (interpret mode on CPU) give the reference's tokens."""
    prompts = [list(range(100, 140)), list(range(7, 30)), list(range(300, 303))]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = {}
    for backend in ("reference", "pallas"):
        llm = LLM(
            tiny_loaded,
            max_model_len=128,
            kv_cache_memory=4 << 20,
            page_size=8,
            max_rolling_batch_prefill_tokens=16,
            max_rolling_batch_size=4,
            attention_backend=backend,
        )
        outs[backend] = [o.token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert outs["pallas"] == outs["reference"]
