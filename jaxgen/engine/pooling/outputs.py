"""What pooling requests return (vLLM's shapes): ``EmbeddingRequestOutput`` (``.outputs.embedding``),
``ClassificationRequestOutput`` (``.outputs.probs``), ``ScoringRequestOutput``
(``.outputs.score``)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class EmbeddingOutput:
    embedding: list[float]

    @property
    def hidden_size(self) -> int:
        return len(self.embedding)


@dataclasses.dataclass
class ClassificationOutput:
    probs: list[float]  # softmax over the labels (sigmoid for one); logits without activation

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclasses.dataclass
class ScoringOutput:
    score: float  # cosine similarity (an embedding model), or a cross-encoder's probability


@dataclasses.dataclass
class PoolingRequestOutput:
    """One input's result: ``outputs`` is its ``EmbeddingOutput``, ``ClassificationOutput`` or
    ``ScoringOutput``."""

    request_id: str
    outputs: object
    prompt_token_ids: list[int]
    finished: bool = True


class EmbeddingRequestOutput(PoolingRequestOutput):
    outputs: EmbeddingOutput


class ClassificationRequestOutput(PoolingRequestOutput):
    outputs: ClassificationOutput


class ScoringRequestOutput(PoolingRequestOutput):
    outputs: ScoringOutput
