"""The plain sampling fields are declared once (``serving/sampling_fields.py``): each is a
``SamplingParams`` field with the same default; completions, chat and the Responses API read
them all, and beam search refuses exactly the ones it cannot honour."""

from __future__ import annotations

import dataclasses

import pytest

from jaxgen.sampling_params import SamplingParams
from serving.openai.beam_search_requests import NEUTRAL
from serving.openai.responses_requests import PASSED_FIELDS
from serving.sampling_fields import PLAIN_FIELDS, read_plain_fields
from serving.validation import Fields, RequestError

DEFAULTS = {field.name: field.default for field in dataclasses.fields(SamplingParams)}


@pytest.mark.parametrize("field", PLAIN_FIELDS, ids=lambda field: field.name)
def test_each_plain_field_is_a_sampling_param_with_its_default(field):
    assert field.name in DEFAULTS
    assert field.default == DEFAULTS[field.name]
    assert field.name in PASSED_FIELDS  # the Responses API passes it on
    if field.neutral:
        assert NEUTRAL[field.name][0] is None and DEFAULTS[field.name] in NEUTRAL[field.name]


def test_plain_fields_are_checked_naming_the_field():
    values = read_plain_fields(Fields({"top_k": 5, "ignore_eos": True, "min_p": 0.5}))
    assert SamplingParams(**values) == SamplingParams(top_k=5, ignore_eos=True, min_p=0.5)
    for body, param in (({"top_p": 0}, "top_p"), ({"min_tokens": -1}, "min_tokens")):
        with pytest.raises(RequestError) as error:
            read_plain_fields(Fields(body))
        assert error.value.param == param


def test_responses_take_every_plain_field(http):
    body = {"model": "tiny", "input": "Hi", "max_output_tokens": 6, "temperature": 0}
    answer = http.post("/v1/responses", json={**body, "min_tokens": 6, "ignore_eos": True})
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["output_tokens"] == 6
    refused = http.post("/v1/responses", json={**body, "min_p": 2})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "min_p"


TGI_VALUES = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 7,
    "frequency_penalty": 0.5,
    "repetition_penalty": 1.2,
}


def test_tgi_reads_its_fields_from_the_table():
    """The rows marked ``tgi`` are what TGI's ``parameters`` take, each reaching the
    ``SamplingParams`` under TGI's bounds (temperature above 2, top_k from 0)."""
    from serving.sampling_fields import defaults_for_absent, read_tgi_fields

    assert {field.name for field in PLAIN_FIELDS if field.tgi} == set(TGI_VALUES)
    values = read_tgi_fields(Fields(TGI_VALUES, "parameters"))
    assert values == TGI_VALUES
    assert read_tgi_fields(Fields({"temperature": 3.0}, "parameters"))["temperature"] == 3.0
    absent = defaults_for_absent(read_tgi_fields(Fields({}, "parameters")))
    assert SamplingParams(**absent) == SamplingParams()
    with pytest.raises(RequestError) as error:
        read_tgi_fields(Fields({"top_k": -1}, "parameters"))
    assert error.value.param == "parameters.top_k"


def test_tgi_generate_takes_every_tgi_field(http):
    body = {"inputs": "Hi", "parameters": {**TGI_VALUES, "max_new_tokens": 3, "seed": 1}}
    answer = http.post("/generate", json=body)
    assert answer.status_code == 200, answer.text
    refused = http.post("/generate", json={"inputs": "Hi", "parameters": {"top_p": 0}})
    assert refused.status_code in (400, 422) and "top_p" in refused.text
