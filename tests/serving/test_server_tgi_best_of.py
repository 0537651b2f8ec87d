"""TGI's ``best_of`` on ``/generate``: sampled sequences, each with its own seed, the one of the
highest mean token logprob answered and the others in ``details.best_of_sequences``; 422s for
what TGI's router refuses."""

from __future__ import annotations

import pytest

from serving.app import create_app
from serving.settings.resolve import ServerSettings
from serving.testing import ServerThread
from tests.serving.server_checks import PROMPT


@pytest.fixture(scope="module")
def server(llm, tiny_model_dir):
    settings = ServerSettings(model=tiny_model_dir, served_model_name="tiny", max_best_of=3)
    with ServerThread(create_app(llm, settings)) as running:
        running.llm = llm
        yield running


def mean_logprob(sequence: dict) -> float:
    return sum(t["logprob"] for t in sequence["tokens"]) / len(sequence["tokens"])


def test_best_of_answers_the_best_sequence_and_lists_the_others(http):
    parameters = {"max_new_tokens": 6, "do_sample": True, "best_of": 3, "details": True}
    response = http.post(
        "/generate",
        json={"inputs": PROMPT, "parameters": {**parameters, "return_full_text": True}},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    details = body["details"]
    others = details["best_of_sequences"]
    assert len(others) == 2
    assert body["generated_text"].startswith(PROMPT)
    best = {"generated_text": body["generated_text"], **details}
    sequences = [best, *others]
    for sequence in sequences:
        assert set(sequence) >= {
            "generated_text",
            "finish_reason",
            "generated_tokens",
            "seed",
            "prefill",
            "tokens",
        }
        assert sequence["generated_tokens"] == len(sequence["tokens"]) == 6
        assert sequence["finish_reason"] == "length"
        assert sequence["generated_text"].startswith(PROMPT)
        assert all(t["logprob"] <= 0 for t in sequence["tokens"])
    assert len({s["seed"] for s in sequences}) == 3
    assert mean_logprob(best) == max(mean_logprob(s) for s in sequences)
    # Each sequence's seed reproduces it alone (best_of 1).
    for sequence in sequences:
        alone = http.post(
            "/generate",
            json={
                "inputs": PROMPT,
                "parameters": {"max_new_tokens": 6, "do_sample": True, "seed": sequence["seed"]},
            },
        )
        assert alone.status_code == 200, alone.text
        assert PROMPT + alone.json()["generated_text"] == sequence["generated_text"]
    plain = http.post(
        "/generate", json={"inputs": PROMPT, "parameters": parameters | {"details": False}}
    )
    assert list(plain.json()) == ["generated_text"]
    one = http.post("/generate", json={"inputs": PROMPT, "parameters": {"details": True}})
    assert one.json()["details"]["best_of_sequences"] is None


def test_info_reports_max_best_of(http):
    assert http.get("/info").json()["max_best_of"] == 3


@pytest.mark.parametrize(
    "parameters,stream,message",
    [
        ({"best_of": 4, "do_sample": True}, False, "`parameters.best_of` must be <= 3"),
        ({"best_of": 0, "do_sample": True}, False, "`parameters.best_of` must be >= 1"),
        ({"best_of": "2", "do_sample": True}, False, "`parameters.best_of` must be an integer"),
        ({"best_of": 2}, False, "you must use sampling when `best_of` is > 1"),
        ({"best_of": 2, "temperature": 0.0}, False, "you must use sampling when `best_of`"),
        ({"best_of": 2, "top_k": 5, "seed": 3}, False, "`seed` must not be set when `best_of`"),
        ({"best_of": 2, "do_sample": True}, True, "`best_of` != 1 is not supported when stream"),
    ],
)
def test_best_of_refusals(http, server, parameters, stream, message):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 2, **parameters}}
    responses = [http.post("/generate_stream", json=body)] if stream else []
    responses.append(http.post("/", json={**body, "stream": stream}))
    for response in responses:
        assert response.status_code == 422, response.text
        assert response.json()["error"].startswith(message)
        assert response.json()["error_type"] == "validation"
    assert server.llm.num_unfinished == 0
