"""``LLM(..., reasoning_parser=...)``'s ``chat`` on the scripted reasoning model: each
completion's thinking and answer apart (``text`` whole), a JSON schema on the answer only (the
thinking free), ``enable_thinking`` false, and an unknown parser refused before loading."""

from __future__ import annotations

import json

import jsonschema
import pytest

from jaxgen import LLM, SamplingParams
from jaxgen.reasoning import REASONING_PARSERS
from tests.reasoning.scripted_model import ANSWER, PLAIN_ANSWER, THINKING, USER

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=32)


@pytest.fixture(scope="module")
def llm(reasoning_model):
    return LLM(
        reasoning_model[0],
        reasoning_parser="deepseek_r1",
        max_model_len=128,
        kv_cache_memory=4 << 20,
        max_rolling_batch_size=4,
    )


def test_an_unknown_parser_is_refused_before_the_model_loads():
    with pytest.raises(ValueError, match="reasoning_parser") as caught:
        LLM("/no/such/model", reasoning_parser="r1")
    assert all(name in str(caught.value) for name in REASONING_PARSERS)


def test_chat_splits_the_thinking_from_the_answer(llm):
    (out,) = llm.chat(USER, GREEDY, use_tqdm=False)
    completion = out.outputs[0]
    assert completion.reasoning_content == completion.reasoning == THINKING
    assert completion.content == ANSWER
    assert completion.text == "<think>" + THINKING + "</think>" + ANSWER  # whole, as generated


def test_a_schema_constrains_the_answer_and_leaves_the_thinking_free(llm):
    params = SamplingParams(temperature=0.0, max_tokens=48, structured_outputs={"json": SCHEMA})
    (out,) = llm.chat(USER, params, use_tqdm=False)
    completion = out.outputs[0]
    assert completion.reasoning_content == THINKING  # no JSON: the grammar waited
    jsonschema.validate(json.loads(completion.content), SCHEMA)
    assert completion.finish_reason == "stop"


def test_thinking_off_is_all_answer(llm):
    (out,) = llm.chat(USER, GREEDY, chat_template_kwargs={"enable_thinking": False}, use_tqdm=False)
    completion = out.outputs[0]
    assert completion.reasoning_content is None and completion.content == PLAIN_ANSWER
