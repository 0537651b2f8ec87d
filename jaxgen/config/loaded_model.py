"""``LoadedModel``: what every loader returns and every engine runs (``jaxgen.loaders``
makes one; it sits here, with the config it carries, so that settings below the loaders, a
draft model's among them, can name it)."""

from __future__ import annotations

import dataclasses

from jaxgen.config.model_config import ModelConfig


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
