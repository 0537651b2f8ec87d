"""The sampling parameters the OpenAI routes take as plain request fields, declared once.

Each row names a ``SamplingParams`` field that completions and chat read under the same name
(vLLM's extras beside OpenAI's): its type, default and bounds, and the values that leave it
unused (beam search refuses any other, ``openai.beam_search_requests``). The Responses API passes
these fields on to the chat request it runs as. A new plain sampling parameter is one row here
and its ``SamplingParams`` field (and, if it changes the distribution, the sampler's and
``DISTRIBUTION_FIELDS``); the fields with protocol-specific shapes (``stop``, ``seed``,
``logprobs``, ``logit_bias``, the constraint fields) and TGI's own parameters are read by their
routes.
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

    def read(self, fields: Fields):
        """The field's checked value (``RequestError`` naming it), or its default."""
        if self.kind == "boolean":
            return fields.boolean(self.name, self.default)
        bounds = dict(minimum=self.minimum, maximum=self.maximum)
        if self.kind == "integer":
            return fields.integer(self.name, self.default, **bounds)
        return fields.number(
            self.name, self.default, exclusive_minimum=self.exclusive_minimum, **bounds
        )


PLAIN_FIELDS = (
    PlainField("temperature", "number", 1.0, 0.0, 2.0),
    PlainField("top_p", "number", 1.0, 0.0, 1.0, exclusive_minimum=True, neutral=(1, 1.0)),
    PlainField("top_k", "integer", 0, -1, neutral=(0, -1)),
    PlainField("min_p", "number", 0.0, 0.0, 1.0, neutral=(0, 0.0)),
    PlainField("presence_penalty", "number", 0.0, -2.0, 2.0, neutral=(0, 0.0)),
    PlainField("frequency_penalty", "number", 0.0, -2.0, 2.0, neutral=(0, 0.0)),
    PlainField("repetition_penalty", "number", 1.0, 0.0, exclusive_minimum=True, neutral=(1, 1.0)),
    PlainField("min_tokens", "integer", 0, 0, neutral=(0,)),
    PlainField("ignore_eos", "boolean", False),
    PlainField("skip_special_tokens", "boolean", True),
)
PLAIN_NAMES = tuple(field.name for field in PLAIN_FIELDS)


def read_plain_fields(fields: Fields) -> dict:
    """Every plain field of a request body, checked: ``SamplingParams`` keyword arguments."""
    return {field.name: field.read(fields) for field in PLAIN_FIELDS}


def beam_neutral_values() -> dict[str, tuple]:
    """The plain fields beam search cannot honour, each with the values that leave it unused
    (None, not given, first)."""
    return {field.name: (None, *field.neutral) for field in PLAIN_FIELDS if field.neutral}
