"""Configuration: the model's (``ModelConfig``, read from a Hugging Face ``config.json`` by its
family's module in ``jaxgen.families``) and the engine's (``EngineConfig``, every knob declared once; ``knobs``
derives its flags, environment variables and properties keys, ``knob_table`` the docs'
table, ``speculative_config`` the speculative-decoding settings). What is kept on disk is
``jaxgen.caches``."""

from jaxgen.config.model_config import ModelConfig, MoEConfig, RopeScaling

__all__ = ["MoEConfig", "ModelConfig", "RopeScaling"]
