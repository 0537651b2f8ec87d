"""Pooling models: embeddings, classifier labels and scores from one forward pass over whole
sequences, with no KV pool (``PoolingEngine``; the step in ``pooling_runner``)."""

from jaxgen.engine.pooling.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    PoolingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from jaxgen.engine.pooling.pooler_config import PoolerConfig, PoolingParams
from jaxgen.engine.pooling.pooling_engine import PoolingEngine, PoolingInput
from jaxgen.engine.pooling.pooling_requests import (
    classify_outputs,
    embed_outputs,
    score_outputs,
)

__all__ = [
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "PoolerConfig",
    "PoolingEngine",
    "PoolingInput",
    "PoolingParams",
    "PoolingRequestOutput",
    "ScoringOutput",
    "ScoringRequestOutput",
    "classify_outputs",
    "embed_outputs",
    "score_outputs",
]
