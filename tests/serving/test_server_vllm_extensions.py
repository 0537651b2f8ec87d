"""vLLM's OpenAI-server extensions and small routes, as vLLM's own server tests send them (tiny
model, the openai SDK and httpx over loopback): ``return_token_ids``,
``return_tokens_as_token_ids``, vLLM's always-present null fields, completions ``logprobs`` with
the chosen token, ``stream_options.continuous_usage_stats``, ``n > 1`` streams (one choice per
chunk, one finish each), ``/v1/chat/completions/batch``, ``/tokenize`` of an open final turn and
its token strings, ``/invocations`` by body shape, ``/version`` and ``/v1/models/{id}``."""

from __future__ import annotations

import json

import jaxgen
from tests.serving.server_checks import PROMPT, chat_prompt_ids, engine_output, wait_idle

MESSAGES = [{"role": "user", "content": "Say something nice"}]


def test_version_and_one_model(http, oai):
    assert http.get("/version").json() == {"version": jaxgen.__version__}
    model = oai.models.retrieve("tiny")
    assert model.id == "tiny" and model.object == "model"
    missing = http.get("/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


def test_null_vllm_fields_when_not_asked(oai):
    out = oai.completions.create(model="tiny", prompt=PROMPT, max_tokens=3, temperature=0)
    choice = out.choices[0]
    assert choice.prompt_logprobs is None and choice.prompt_token_ids is None
    assert choice.token_ids is None
    chat = oai.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3, temperature=0)
    assert chat.prompt_logprobs is None and chat.prompt_token_ids is None
    assert chat.choices[0].token_ids is None


def test_completion_return_token_ids(oai, llm):
    out = oai.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logprobs=1,
        extra_body={"return_token_ids": True},
    )
    choice = out.choices[0]
    assert choice.prompt_token_ids == llm.tokenizer.encode(PROMPT)
    text, ids = engine_output(llm, PROMPT, max_tokens=6, temperature=0)
    assert choice.token_ids == list(ids) and choice.text == text
    stream = oai.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=6,
        temperature=0,
        logprobs=1,
        stream=True,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].prompt_token_ids == llm.tokenizer.encode(PROMPT)
    assert all(c.choices[0].model_extra.get("prompt_token_ids") is None for c in chunks[1:])
    streamed = [t for c in chunks for t in c.choices[0].token_ids]
    named = [int(t.removeprefix("token_id:")) for c in chunks for t in c.choices[0].logprobs.tokens]
    assert streamed == named == list(ids)


def test_tokens_as_token_ids_with_echo(oai, llm):
    out = oai.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=4,
        temperature=0,
        echo=True,
        logprobs=1,
        extra_body={"return_token_ids": True, "return_tokens_as_token_ids": True},
    )
    choice = out.choices[0]
    named = [int(t.removeprefix("token_id:")) for t in choice.logprobs.tokens]
    assert named == choice.prompt_token_ids + choice.token_ids
    for top in choice.logprobs.top_logprobs[1:]:
        assert all(key.startswith("token_id:") for key in top)
    assert choice.text.startswith(PROMPT)


def test_chat_return_token_ids_streamed(oai, llm):
    prompt_ids = chat_prompt_ids(llm, MESSAGES)
    full = oai.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    assert full.prompt_token_ids == prompt_ids
    ids = full.choices[0].token_ids
    assert llm.tokenizer.decode(ids, skip_special_tokens=True) == full.choices[0].message.content
    assert not full.choices[0].logprobs.content[0].token.startswith("token_id:")
    chunks = list(
        oai.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"return_token_ids": True},
        )
    )
    assert chunks[0].prompt_token_ids == prompt_ids
    assert all("prompt_token_ids" not in c.model_dump() for c in chunks[1:])
    assert [t for c in chunks[1:] for t in c.choices[0].token_ids] == ids


def test_tool_call_stream_keeps_every_token_id(oai):
    """Text a tool parser holds back still sends its token ids (in chunks with an empty delta,
    as logprobs are sent): the streamed ids add up to the whole answer's."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}  # fmt: skip
    body = dict(
        model="tiny",
        messages=MESSAGES,
        max_tokens=24,
        temperature=0,
        tools=[tool],
        tool_choice="required",
        extra_body={"return_token_ids": True},
    )
    full = oai.chat.completions.create(**body)
    chunks = list(oai.chat.completions.create(**body, stream=True))
    streamed = [t for c in chunks[1:] for choice in c.choices for t in choice.token_ids or []]
    assert streamed == full.choices[0].token_ids and streamed


def test_completion_logprobs_zero_hold_the_chosen_token(oai):
    out = oai.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=0, echo=True
    )
    lp = out.choices[0].logprobs
    assert lp.top_logprobs[0] is None  # the prompt's first token has no logprob
    for token, logprob, top in zip(
        lp.tokens[1:], lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True
    ):
        assert top == {token: logprob}


def test_continuous_usage_stats(oai):
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = list(
        oai.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=5, temperature=0, stream=True,
            stream_options=options,
        )
    )  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    counts = []
    for chunk in chunks[:-1]:
        usage = chunk.usage
        assert usage.prompt_tokens > 0 and usage.completion_tokens > 0
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
        counts.append(usage.completion_tokens)
    assert counts == sorted(counts) and counts[-1] == 5
    chat = list(
        oai.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, temperature=0, stream=True,
            stream_options=options,
        )
    )  # fmt: skip
    assert all(c.usage is not None for c in chat)
    assert chat[0].usage.completion_tokens == 0 and chat[-1].choices == []
    plain = list(
        oai.completions.create(
            model="tiny", prompt=PROMPT, max_tokens=3, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage is not None


def test_n_streams_one_choice_per_chunk_and_one_finish_each(oai, llm):
    text, _ = engine_output(llm, PROMPT, max_tokens=6, temperature=0)
    texts, finishes = ["", "", ""], [0, 0, 0]
    for chunk in oai.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=6, temperature=0, n=3, stream=True
    ):
        assert len(chunk.choices) == 1
        choice = chunk.choices[0]
        texts[choice.index] += choice.text
        finishes[choice.index] += choice.finish_reason is not None
    assert texts == [text] * 3 and finishes == [1, 1, 1]
    chat_finishes = [0, 0]
    for chunk in oai.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, n=2, stream=True
    ):
        assert len(chunk.choices) == 1
        chat_finishes[chunk.choices[0].index] += chunk.choices[0].finish_reason is not None
    assert chat_finishes == [1, 1]


def test_chat_completions_batch(http, oai, llm):
    conversations = [MESSAGES, [{"role": "user", "content": "Name a colour"}]]
    singles = [
        oai.chat.completions.create(model="tiny", messages=m, max_tokens=6, temperature=0)
        for m in conversations
    ]
    answer = http.post(
        "/v1/chat/completions/batch",
        json={"model": "tiny", "messages": conversations, "max_tokens": 6, "temperature": 0},
    )
    assert answer.status_code == 200, answer.text
    choices = answer.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    assert [c["message"]["content"] for c in choices] == [
        s.choices[0].message.content for s in singles
    ]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constrained = http.post(
        "/v1/chat/completions/batch",
        json={
            "model": "tiny",
            "messages": conversations,
            "max_tokens": 20,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": schema},
            },
        },
    ).json()
    for choice in constrained["choices"]:
        if choice["finish_reason"] == "stop":
            assert isinstance(json.loads(choice["message"]["content"])["a"], int)
    bad = http.post(
        "/v1/chat/completions/batch",
        json={"messages": [MESSAGES, [{"role": "wizard", "content": "x"}]]},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("messages[1]")
    assert wait_idle(llm)["num_waiting"] == 0
    streamed = http.post(
        "/v1/chat/completions/batch", json={"messages": [MESSAGES], "stream": True}
    )
    assert streamed.status_code == 400 and streamed.json()["error"]["param"] == "stream"


def test_tokenize_open_final_turn_and_token_strings(http, llm):
    tokenizer = llm.tokenizer
    messages = MESSAGES + [{"role": "assistant", "content": "Sure, here"}]
    body = {"messages": messages, "add_generation_prompt": False, "continue_final_message": True}
    tokens = http.post("/tokenize", json=body).json()["tokens"]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    assert tokens == tokenizer.encode(expected, add_special_tokens=False)
    assert tokenizer.decode(tokens).endswith("Sure, here")
    both = http.post("/tokenize", json={**body, "add_generation_prompt": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    strings = http.post("/tokenize", json={"prompt": "it is", "return_token_strs": True}).json()
    assert strings["token_strs"] == tokenizer.convert_ids_to_tokens(strings["tokens"])
    assert "Ġis" in strings["token_strs"]


def test_invocations_routes_by_body(http, llm):
    text, _ = engine_output(llm, PROMPT, max_tokens=4, temperature=0)
    completion = http.post(
        "/invocations", json={"prompt": PROMPT, "max_tokens": 4, "temperature": 0}
    ).json()
    assert completion["object"] == "text_completion" and completion["choices"][0]["text"] == text
    chat = http.post("/invocations", json={"messages": MESSAGES, "max_tokens": 2}).json()
    assert chat["object"] == "chat.completion"
    tgi = http.post(
        "/invocations", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 4}}
    ).json()
    assert tgi["generated_text"] == text
    bad = http.post("/invocations", json={"messages": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


def test_openapi_document_lists_the_routes(http):
    document = http.get("/openapi.json").json()
    assert document["openapi"].startswith("3.") and document["info"]["title"] == "jaxgen"
    paths = document["paths"]
    for path, method in (
        ("/v1/chat/completions", "post"),
        ("/v1/chat/completions/batch", "post"),
        ("/v1/models/{model}", "get"),
        ("/generate", "post"),
        ("/openapi.json", "get"),
    ):
        assert method in paths[path], path
    assert paths["/v1/models/{model}"]["get"]["parameters"][0]["name"] == "model"
