"""A batch call is all or nothing at admission: ``LLM.generate`` refusing one item (a token
outside the vocabulary, a constraint that does not compile) raises ``ValueError`` and leaves
none of the batch queued, so the next call runs only its own prompts."""

from __future__ import annotations

import pytest

from jaxgen import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture(scope="module")
def llm(tiny_loaded):
    return LLM(tiny_loaded, max_model_len=128, kv_cache_memory=4 << 20)


@pytest.mark.parametrize(
    "bad",
    [
        ([1, 2, 10**9], GREEDY),  # a token id outside the vocabulary
        ("Bad one", SamplingParams(max_tokens=4, structured_outputs={"regex": "("})),
    ],
    ids=["token id", "constraint"],
)
def test_a_refused_item_leaves_nothing_of_its_batch_queued(llm, bad):
    prompt, params = bad
    with pytest.raises(ValueError):
        llm.generate(["Hello there", "And you", prompt], [GREEDY, GREEDY, params], use_tqdm=False)
    engine = llm.engine
    assert not engine.has_unfinished()
    stats = engine.stats()
    assert stats["num_running"] == stats["num_waiting"] == 0
    assert stats["kv_pages_used"] == 0
    [again] = llm.generate(["Hello there"], GREEDY, use_tqdm=False)
    assert again.finished and len(again.outputs[0].token_ids) == 4
