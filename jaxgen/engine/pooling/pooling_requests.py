"""Pooling requests on a ``PoolingEngine``: prompts to inputs, and vectors to what
``LLM.embed``, ``LLM.classify`` and ``LLM.score`` return (and the server's routes send).

- embed: each prompt's pooled vector, truncated to ``dimensions`` (Matryoshka models only)
  and normalised as the pooler (or the request) says;
- classify: a sequence classifier's probabilities (softmax; sigmoid of one logit) or, with
  ``activation=False``, its logits;
- score: pairs of texts (one against many, or many against as many), scored by a
  cross-encoder (the pair tokenized together, ``[CLS] a [SEP] b [SEP]``, its probability) or
  by an embedding model (the cosine of the two embeddings).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxgen.engine.pooling.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)
from jaxgen.engine.pooling.pooler_config import PoolingParams
from jaxgen.engine.pooling.pooling import class_probabilities, finish_embedding
from jaxgen.engine.pooling.pooling_engine import PoolingEngine, PoolingInput


def prompt_token_ids(tokenizer, prompts, param: str = "prompts") -> list[list[int]]:
    """A str, a list of str, a token-id list or a list of them, to token-id lists (text with
    the tokenizer's special tokens, as sentence-transformers and vLLM tokenize it)."""
    if isinstance(prompts, str):
        prompts = [prompts]
    elif prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        prompts = [list(prompts)]
    if not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(f"{param} must be a str, a non-empty list of str or of token-id lists")
    lists = []
    for prompt in prompts:
        if isinstance(prompt, str):
            lists.append(tokenizer.encode(prompt, add_special_tokens=True))
        elif isinstance(prompt, Sequence) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            lists.append(list(prompt))
        else:
            raise ValueError(f"{param} must be a str, a list of str or of token-id lists")
    return lists


def embedding_vectors(
    engine: PoolingEngine, token_lists: list[list[int]], params: PoolingParams | None = None
) -> list[np.ndarray]:
    """Each input's embedding, as ``params`` asks (see the module docstring)."""
    params = params or PoolingParams()
    if engine.pooler is None or engine.classifies:
        raise ValueError(
            "this model has no pooling defined for embeddings (it is a sequence classifier); "
            "load it with task='embed' to pool its hidden states"
        )
    check_dimensions(engine, params.dimensions)
    normalize = engine.pooler.normalize if params.normalize is None else params.normalize
    vectors = engine.run([PoolingInput(tokens) for tokens in token_lists])
    return [finish_embedding(v, dimensions=params.dimensions, normalize=normalize) for v in vectors]


def check_dimensions(engine: PoolingEngine, dimensions: int | None) -> None:
    """``dimensions`` is only for Matryoshka models, and at most the embedding's size."""
    if dimensions is None:
        return
    if not engine.matryoshka:
        raise ValueError(
            "dimensions: this model does not support Matryoshka truncation (its config.json "
            "sets neither is_matryoshka nor matryoshka_dimensions)"
        )
    size = engine.model_config.hidden_size
    if dimensions > size:
        raise ValueError(f"dimensions {dimensions} exceeds the embedding size {size}")


def class_vectors(
    engine: PoolingEngine, inputs: list[PoolingInput], params: PoolingParams | None = None
) -> list[np.ndarray]:
    """Each input's class probabilities (or logits, ``activation=False``)."""
    if not engine.classifies:
        raise ValueError("this model has no sequence classifier (classify and cross-encoder score)")
    logits = engine.run(inputs)
    if params is not None and params.activation is False:
        return logits
    return [class_probabilities(row) for row in logits]


def score_pairs(text_1, text_2) -> list[tuple]:
    """vLLM's pairing: one query against each of ``text_2``, or the two lists zipped."""
    first = [text_1] if isinstance(text_1, str) else list(text_1)
    second = [text_2] if isinstance(text_2, str) else list(text_2)
    if not first or not second:
        raise ValueError("score needs at least one text on each side")
    if len(first) == 1:
        return [(first[0], text) for text in second]
    if len(first) != len(second):
        raise ValueError(
            f"score: text_1 has {len(first)} texts and text_2 {len(second)}; give one text_1 "
            "or as many as text_2"
        )
    return list(zip(first, second, strict=True))


def pair_inputs(tokenizer, pairs: list[tuple[str, str]]) -> list[PoolingInput]:
    """Each pair tokenized together as the cross-encoder was trained (token types where its
    tokenizer makes them: BERT's, not RoBERTa's)."""
    inputs = []
    for first, second in pairs:
        if not isinstance(first, str) or not isinstance(second, str):
            raise ValueError("score: every text must be a str")
        encoded = tokenizer(first, second)
        inputs.append(PoolingInput(list(encoded["input_ids"]), encoded.get("token_type_ids")))
    return inputs


def scores(engine: PoolingEngine, pairs: list[tuple[str, str]], params=None):
    """Each pair's score and the token ids it was computed from (see the module docstring)."""
    tokenizer = engine.tokenizer
    if engine.classifies:
        inputs = pair_inputs(tokenizer, pairs)
        results = class_vectors(engine, inputs, params)
        return [float(r[0]) if r.shape[0] == 1 else float(r[-1]) for r in results], [
            item.token_ids for item in inputs
        ]
    first = prompt_token_ids(tokenizer, [a for a, _ in pairs], "text_1")
    second = prompt_token_ids(tokenizer, [b for _, b in pairs], "text_2")
    vectors = embedding_vectors(engine, first + second, params)
    halves = vectors[: len(pairs)], vectors[len(pairs) :]
    values = [cosine(a, b) for a, b in zip(*halves, strict=True)]
    return values, [a + b for a, b in zip(first, second, strict=True)]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))


def embed_outputs(engine, prompts, params, new_id) -> list[EmbeddingRequestOutput]:
    """``LLM.embed``'s outputs; ``new_id()`` names each request."""
    token_lists = prompt_token_ids(engine.tokenizer, prompts)
    vectors = embedding_vectors(engine, token_lists, params)
    return [
        EmbeddingRequestOutput(new_id(), EmbeddingOutput(v.tolist()), tokens)
        for v, tokens in zip(vectors, token_lists, strict=True)
    ]


def classify_outputs(engine, prompts, params, new_id) -> list[ClassificationRequestOutput]:
    """``LLM.classify``'s outputs."""
    token_lists = prompt_token_ids(engine.tokenizer, prompts)
    results = class_vectors(engine, [PoolingInput(tokens) for tokens in token_lists], params)
    return [
        ClassificationRequestOutput(new_id(), ClassificationOutput(r.tolist()), tokens)
        for r, tokens in zip(results, token_lists, strict=True)
    ]


def score_outputs(engine, text_1, text_2, params, new_id) -> list[ScoringRequestOutput]:
    """``LLM.score``'s outputs, one per pair."""
    values, token_lists = scores(engine, score_pairs(text_1, text_2), params)
    return [
        ScoringRequestOutput(new_id(), ScoringOutput(value), tokens)
        for value, tokens in zip(values, token_lists, strict=True)
    ]
