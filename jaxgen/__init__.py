"""jaxgen: a JAX/XLA inference engine for LLMs (continuous batching over a paged KV pool)."""

from jaxgen.beam_search_params import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
from jaxgen.config import ModelConfig
from jaxgen.outputs import CompletionOutput, RequestOutput
from jaxgen.sampling_params import RequestOutputKind, SamplingParams
from jaxgen.structured_outputs import StructuredOutputsParams

__version__ = "0.1.0"


def __getattr__(name):  # lazy for start-up time: importing jaxgen does not import jax
    if name == "LLM":
        from jaxgen.llm import LLM

        return LLM
    if name == "AsyncLLM":
        from jaxgen.async_llm import AsyncLLM

        return AsyncLLM
    if name in _POOLING:  # jaxgen.engine.pooling imports jax
        from jaxgen.engine import pooling

        return getattr(pooling, name)
    raise AttributeError(name)


_POOLING = ("PoolingParams", "EmbeddingRequestOutput", "ScoringRequestOutput")
_POOLING += ("ClassificationRequestOutput",)


__all__ = [
    "LLM",
    "AsyncLLM",
    "RequestOutputKind",
    "SamplingParams",
    "BeamSearchParams",
    "BeamSearchOutput",
    "BeamSearchSequence",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "ModelConfig",
    *_POOLING,
]
