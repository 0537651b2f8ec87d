"""vLLM's chat-template controls through ``LLM.chat``: ``continue_final_message`` continues a
prefilled assistant message, ``chat_template_kwargs`` reach the template, bad ones are a
``ValueError`` naming the argument."""

from __future__ import annotations

import pytest

from jaxgen import SamplingParams
from jaxgen.chat_template_options import ChatTemplateOptions

PREFILL = [
    {"role": "user", "content": "Name a book."},
    {"role": "assistant", "content": "The best book is"},
]


@pytest.mark.parametrize(
    "kwargs, param",
    [
        (dict(continue_final_message=True, add_generation_prompt=True), "continue_final_message"),
        (dict(continue_final_message="yes"), "continue_final_message"),
        (dict(chat_template_kwargs={"add_generation_prompt": True}), "chat_template_kwargs"),
        (dict(chat_template_kwargs="x"), "chat_template_kwargs"),
    ],
)
def test_bad_controls_name_the_argument(kwargs, param):
    with pytest.raises(ValueError, match=f"`{param}`"):
        ChatTemplateOptions.build(PREFILL, **kwargs)


def test_defaults():
    assert ChatTemplateOptions.build(PREFILL).add_generation_prompt
    continued = ChatTemplateOptions.build(PREFILL, continue_final_message=True)
    assert continued.template_arguments() == {
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    with pytest.raises(ValueError, match="assistant message last"):
        ChatTemplateOptions.build(PREFILL[:1], continue_final_message=True)


@pytest.mark.slow
def test_llm_chat_continues_the_final_message(smollm2_llm):
    params = SamplingParams(max_tokens=4, temperature=0)
    [out] = smollm2_llm.chat(PREFILL, params, continue_final_message=True, use_tqdm=False)
    assert out.prompt.endswith("<|im_start|>assistant\nThe best book is")
    [same] = smollm2_llm.generate(
        [smollm2_llm.get_tokenizer().encode(out.prompt, add_special_tokens=False)],
        params,
        use_tqdm=False,
    )
    assert out.outputs[0].text == same.outputs[0].text  # the continuation of the open message
    [closed] = smollm2_llm.chat(PREFILL, params, add_generation_prompt=False, use_tqdm=False)
    assert closed.prompt.endswith("The best book is<|im_end|>\n")
    with pytest.raises(ValueError, match="continue_final_message"):
        smollm2_llm.chat(PREFILL[:1], params, continue_final_message=True)
