"""StructuredOutputsParams: exactly one kind, each checked; SamplingParams accepts a dict."""

import pytest

from jaxgen.sampling_params import SamplingParams
from jaxgen.structured_outputs import StructuredOutputsParams


def test_one_kind_each():
    assert StructuredOutputsParams(json={"type": "object"}).kind == "json"
    assert StructuredOutputsParams(json='{"type": "string"}').kind == "json"
    assert StructuredOutputsParams(json_object=True).kind == "json_object"
    assert StructuredOutputsParams(regex=r"\d+").kind == "regex"
    assert StructuredOutputsParams(choice=["yes", "no"]).kind == "choice"
    assert StructuredOutputsParams(grammar='start: "a"').kind == "grammar"


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({}, "structured_outputs"),
        ({"regex": "a", "choice": ["a"]}, "choice"),
        ({"json": "{not json"}, "json"),
        ({"json": 3}, "json"),
        ({"json_object": "yes"}, "json_object"),
        ({"regex": 5}, "regex"),
        ({"choice": ["a", ""]}, "choice"),
        ({"choice": []}, "choice"),
        ({"grammar": ""}, "grammar"),
    ],
)
def test_bad_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_converts_a_dict():
    params = SamplingParams(structured_outputs={"choice": ["a", "b"]})
    assert params.structured_outputs == StructuredOutputsParams(choice=["a", "b"])
    assert SamplingParams().structured_outputs is None
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs={"schema": {}})
    with pytest.raises(ValueError, match="structured_outputs"):
        SamplingParams(structured_outputs="json")


def test_key_is_canonical():
    a = StructuredOutputsParams(json={"type": "object", "required": ["a"]})
    b = StructuredOutputsParams(json='{"required": ["a"], "type": "object"}')
    assert a.key() == b.key()
    assert a.key() != StructuredOutputsParams(json={"type": "object"}).key()
