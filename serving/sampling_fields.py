"""The sampling parameters the routes take as plain request fields, declared once.

Each row names a ``SamplingParams`` field that completions and chat read under the same name
(vLLM's extras beside OpenAI's): its type, default and bounds, the values that leave it unused
(beam search refuses any other, ``openai.beam_search_requests``), and whether TGI's
``parameters`` take it too (``tgi``, with TGI's bounds where they differ). The Responses API
passes these fields on to the chat request it runs as. A new plain sampling parameter is one
row here and its ``SamplingParams`` field (and, if it changes the distribution, the sampler's
and ``DISTRIBUTION_FIELDS``); the fields with protocol-specific shapes (``stop``, ``seed``,
``logprobs``, ``logit_bias``, the constraint fields, TGI's ``max_new_tokens`` and
``do_sample``) are read by their routes.
"""

from __future__ import annotations

import dataclasses

from serving.validation import Fields


@dataclasses.dataclass(frozen=True)
class PlainField:
    """One plain sampling field: ``kind`` "number", "integer" or "boolean"."""

    name: str
    kind: str
    default: object
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    neutral: tuple = ()  # request values that leave it unused; () = beam search takes any
    tgi: bool = False  # TGI's ``parameters`` take it (same name)
    tgi_bounds: tuple | None = None  # TGI's (minimum, maximum) where they differ from OpenAI's

    def read(self, fields: Fields, default=..., bounds: tuple | None = None):
        """The field's checked value (``RequestError`` naming it), or ``default`` (the field's
        own unless given); ``bounds``: (minimum, maximum) instead of the field's."""
        default = self.default if default is ... else default
        if self.kind == "boolean":
            return fields.boolean(self.name, default)
        minimum, maximum = bounds or (self.minimum, self.maximum)
        if self.kind == "integer":
            return fields.integer(self.name, default, minimum=minimum, maximum=maximum)
        return fields.number(
            self.name,
            default,
            minimum=minimum,
            maximum=maximum,
            exclusive_minimum=self.exclusive_minimum,
        )


PLAIN_FIELDS = (
    PlainField("temperature", "number", 1.0, 0.0, 2.0, tgi=True, tgi_bounds=(0.0, None)),
    PlainField(
        "top_p", "number", 1.0, 0.0, 1.0, exclusive_minimum=True, neutral=(1, 1.0), tgi=True
    ),
    PlainField("top_k", "integer", 0, -1, neutral=(0, -1), tgi=True, tgi_bounds=(0, None)),
    PlainField("min_p", "number", 0.0, 0.0, 1.0, neutral=(0, 0.0)),
    PlainField("presence_penalty", "number", 0.0, -2.0, 2.0, neutral=(0, 0.0)),
    PlainField("frequency_penalty", "number", 0.0, -2.0, 2.0, neutral=(0, 0.0), tgi=True),
    PlainField(
        "repetition_penalty",
        "number",
        1.0,
        0.0,
        exclusive_minimum=True,
        neutral=(1, 1.0),
        tgi=True,
    ),
    PlainField("min_tokens", "integer", 0, 0, neutral=(0,)),
    PlainField("ignore_eos", "boolean", False),
    PlainField("include_stop_str_in_output", "boolean", False),
    PlainField("skip_special_tokens", "boolean", True),
)
PLAIN_NAMES = tuple(field.name for field in PLAIN_FIELDS)


def read_plain_fields(fields: Fields) -> dict:
    """Every plain field of a request body, checked: ``SamplingParams`` keyword arguments."""
    return {field.name: field.read(fields) for field in PLAIN_FIELDS}


def read_tgi_fields(parameters: Fields) -> dict:
    """The plain fields a TGI body's ``parameters`` take, checked under TGI's bounds; None
    where absent (TGI samples when a sampling knob was set)."""
    return {
        field.name: field.read(parameters, None, field.tgi_bounds)
        for field in PLAIN_FIELDS
        if field.tgi
    }


def defaults_for_absent(values: dict) -> dict:
    """``values`` with each None replaced by its field's default."""
    defaults = {field.name: field.default for field in PLAIN_FIELDS}
    return {name: defaults[name] if value is None else value for name, value in values.items()}


def beam_neutral_values() -> dict[str, tuple]:
    """The plain fields beam search cannot honour, each with the values that leave it unused
    (None, not given, first)."""
    return {field.name: (None, *field.neutral) for field in PLAIN_FIELDS if field.neutral}
