"""``PoolingEngine``: pooling requests (embeddings, classifier logits) in bucketed batches.

Inputs are checked (non-empty, ids in the vocabulary, at most ``max_model_len`` tokens: a
``ValueError`` naming the limit), sorted by length so a batch pads little, and cut into
batches of at most ``max_rolling_batch_size`` sequences and ``max(max_rolling_batch_prefill_tokens,
L)`` padded tokens. A batch is padded to an (S, L) bucket (S a power of two, L one or one and
a half of a power of two; the last of each the limit itself) and run by ``PoolingRunner`` in one step, with no KV pool: each input's vector
is read back when its batch ends. One lock serialises callers (the server's threads), so
concurrent requests' inputs take turns a batch at a time.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from jaxgen.backends import select_backend
from jaxgen.config.encoder_config import EncoderConfig
from jaxgen.engine.compiled.buckets import bucket_for, power_of_two_buckets
from jaxgen.engine.pooling.pooler_config import PoolerConfig
from jaxgen.engine.pooling.pooling_runner import PoolingRunner

MIN_LENGTH_BUCKET = 16
DEFAULT_MAX_MODEL_LEN = 2048


@dataclasses.dataclass(frozen=True)
class PoolingInput:
    """One sequence to pool: its token ids and (a BERT pair's segments) token types."""

    token_ids: list[int]
    token_type_ids: list[int] | None = None


def capped_buckets(limit: int, start: int) -> list[int]:
    """Powers of two from ``start`` below ``limit``, then ``limit`` itself."""
    return [b for b in power_of_two_buckets(limit, start) if b < limit] + [limit]


def length_buckets(limit: int, start: int = MIN_LENGTH_BUCKET) -> list[int]:
    """``start`` and each power of two from it with its half-way point (16, 24, 32, 48, 64,
    96, ...) below ``limit``, then ``limit``: a short batch pads at most a third of its rows,
    and the executables stay two per doubling of the length."""
    steps = []
    for b in power_of_two_buckets(limit, start):
        steps += [b, b + b // 2]
    return sorted({b for b in steps if b < limit} | {limit})


class PoolingEngine:
    """Runs a pooling model's forward passes (see the module docstring).

    Args:
        loaded: the model (``LoadedModel``: a decoder's or an encoder's).
        pooler: how embeddings are pooled (None: the model has no pooling defined; only a
            classifier's logits are served).
        classify: the model's output is its sequence classifier's logits.
        matryoshka: embeddings may be truncated (``PoolingParams.dimensions``).
        backend: the engine's attention backend (its prepared weights serve the step).
        max_model_len, max_batch_size, max_batch_tokens: the limits (see the module docstring).
    """

    def __init__(
        self,
        loaded,
        pooler: PoolerConfig | None,
        *,
        classify: bool,
        backend,
        matryoshka: bool = False,
        max_model_len: int | None = None,
        max_batch_size: int = 64,
        max_batch_tokens: int = 512,
    ):
        config = loaded.config
        self.loaded = loaded
        self.pooler = pooler
        self.classifies = classify
        self.matryoshka = matryoshka
        self.tokenizer = loaded.tokenizer
        self.model_config = config
        self.is_encoder = isinstance(config, EncoderConfig)
        model_limit = (
            config.max_sequence_len
            if self.is_encoder
            else min(config.max_position_embeddings, DEFAULT_MAX_MODEL_LEN)
        )
        if max_model_len is not None and max_model_len > model_limit and self.is_encoder:
            raise ValueError(
                f"max_model_len {max_model_len} exceeds the encoder's {model_limit} positions"
            )
        self.max_model_len = max_model_len or model_limit
        self.max_batch_tokens = max_batch_tokens
        self.length_buckets = length_buckets(self.max_model_len)
        self.batch_buckets = capped_buckets(max_batch_size, 1)
        self.runner = PoolingRunner(
            loaded.graphdef,
            loaded.params,
            config,
            backend,
            pooling_type=pooler.pooling_type if pooler is not None else "CLS",
            classify=classify,
        )
        self.num_steps = 0
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, loaded, pooler, *, classify: bool, matryoshka: bool, config):
        """The engine for ``loaded`` under an ``EngineConfig`` (its backend, max_model_len,
        max_rolling_batch_size and max_rolling_batch_prefill_tokens); one device only."""
        if config.tensor_parallel_degree > 1 or config.data_parallel_size > 1:
            raise ValueError(
                "task: a pooling model runs on one device (tensor_parallel_degree and "
                "data_parallel_size 1)"
            )
        backend = select_backend(config.attention_backend, dtype=loaded.dtype)
        return cls(
            loaded,
            pooler,
            classify=classify,
            backend=backend,
            matryoshka=matryoshka,
            max_model_len=config.max_model_len,
            max_batch_size=config.max_rolling_batch_size,
            max_batch_tokens=config.max_rolling_batch_prefill_tokens,
        )

    @property
    def params(self):
        """The model's parameters as loaded (the step runs on the backend's prepared copy)."""
        return self.loaded.params

    def stats(self) -> dict:
        """What ``LLM.stats()`` reports of a pooling model."""
        task = "classify" if self.classifies else "embed"
        return {"task": task, "num_steps": self.num_steps, "compiles": self.compiles}

    @property
    def compiles(self) -> int:
        """Executables made so far: one per (S, L) bucket run."""
        return len(self.runner.shapes)

    def check(self, token_ids, param: str = "input") -> None:
        """A ``ValueError`` naming ``param`` for an empty input, an id outside the vocabulary,
        or more than ``max_model_len`` tokens (naming the limit)."""
        if not token_ids:
            raise ValueError(f"{param} is empty")
        if len(token_ids) > self.max_model_len:
            raise ValueError(
                f"{param} has {len(token_ids)} tokens, more than this model's maximum context "
                f"length (max_model_len) of {self.max_model_len} tokens"
            )
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"{param} holds token id {bad[0]} outside the vocabulary of {vocab}")

    def run(self, inputs: list[PoolingInput]) -> list[np.ndarray]:
        """Each input's pooled vector [D] (a classifier: its logits [C]), float32, in order."""
        for index, item in enumerate(inputs):
            self.check(item.token_ids, f"input {index}" if len(inputs) > 1 else "input")
        order = sorted(range(len(inputs)), key=lambda i: len(inputs[i].token_ids))
        results: list[np.ndarray | None] = [None] * len(inputs)
        with self._lock:
            for batch in self._batches(order, inputs):
                vectors = self._run_batch([inputs[i] for i in batch])
                for i, vector in zip(batch, vectors, strict=False):
                    results[i] = vector
        return results

    def _batches(self, order: list[int], inputs: list[PoolingInput]) -> list[list[int]]:
        """``order`` (shortest first) cut into batches within the size and token limits."""
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            length = bucket_for(len(inputs[i].token_ids), self.length_buckets)
            fits = len(current) < self.batch_buckets[-1]
            if fits:  # the padded batch, with this input, within the token budget
                rows = bucket_for(len(current) + 1, self.batch_buckets)
                fits = rows * length <= max(self.max_batch_tokens, length)
            if current and not fits:
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    def _run_batch(self, batch: list[PoolingInput]) -> np.ndarray:
        longest = max(len(item.token_ids) for item in batch)
        length = bucket_for(longest, self.length_buckets)
        rows = bucket_for(len(batch), self.batch_buckets)
        token_ids = np.zeros((rows, length), np.int32)
        token_types = np.zeros((rows, length), np.int32)
        lengths = np.zeros(rows, np.int32)
        for row, item in enumerate(batch):
            n = len(item.token_ids)
            token_ids[row, :n] = item.token_ids
            if item.token_type_ids is not None:
                token_types[row, :n] = item.token_type_ids
            lengths[row] = n
        out = self.runner.run(token_ids, token_types, lengths)
        self.num_steps += 1
        return out[: len(batch)]
