"""``LoadedModel``: what every loader returns and every engine runs."""

from __future__ import annotations

import dataclasses

from jaxgen.config import ModelConfig


@dataclasses.dataclass
class LoadedModel:
    """A model ready to run: config, graph, parameter state (device arrays) and tokenizer."""

    config: ModelConfig
    graphdef: object
    params: object
    tokenizer: object
    source: str
    dtype: object
    load_seconds: float
    quantization: str = "none"  # the ``quantization`` it was loaded with ("auto" resolved)
