"""What a pooling model computes (``PoolerConfig``: which rows make a sequence's vector, whether
it is normalised) and what a request may change (``PoolingParams``, vLLM's name), read from
sentence-transformers' ``modules.json`` + ``1_Pooling/config.json`` when a checkpoint ships
them (Qwen3-Embedding, e5-mistral, most BERT embedders)."""

from __future__ import annotations

import dataclasses
import json
import os

POOLING_TYPES = ("LAST", "MEAN", "CLS")
# sentence-transformers' pooling modes -> ours (the others are refused by name).
SENTENCE_TRANSFORMERS_MODES = {"cls": "CLS", "mean": "MEAN", "lasttoken": "LAST"}
LEGACY_MODE_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "lasttoken",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}


@dataclasses.dataclass(frozen=True)
class PoolerConfig:
    """``pooling_type``: LAST (the last real token: decoders), MEAN (over the real tokens) or
    CLS (the first); ``normalize``: embeddings scaled to unit length; ``source``: where this
    was read ("sentence-transformers", or "default" for the model kind's default)."""

    pooling_type: str
    normalize: bool
    source: str = "default"

    def __post_init__(self):
        if self.pooling_type not in POOLING_TYPES:
            raise ValueError(
                f"pooling_type must be one of {POOLING_TYPES}, got {self.pooling_type!r}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolingParams:
    """Per-request pooling options (vLLM's ``PoolingParams``).

    Args:
        dimensions: keep the first ``dimensions`` of each embedding (Matryoshka truncation,
            then normalisation); only for models whose ``config.json`` says ``is_matryoshka``
            or lists ``matryoshka_dimensions``.
        normalize: embeddings to unit length (None: the model's pooler config says).
        activation: a classifier's probabilities (softmax; sigmoid for one label) rather than
            its logits (None: True).
    """

    dimensions: int | None = None
    normalize: bool | None = None
    activation: bool | None = None

    def __post_init__(self):
        d = self.dimensions
        if d is not None and (not isinstance(d, int) or isinstance(d, bool) or d < 1):
            raise ValueError(f"dimensions must be an integer >= 1, got {d!r}")
        for name in ("normalize", "activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be True, False or None, got {value!r}")


def sentence_transformers_pooler(path: str) -> PoolerConfig | None:
    """The pooler a sentence-transformers checkpoint directory declares (its ``modules.json``:
    a Pooling module, then Normalize or not), or None when it ships none. A module jaxgen does
    not run (a Dense projection, say) or a pooling mode other than cls, mean and lasttoken is a
    ``ValueError`` naming it."""
    modules_file = os.path.join(path, "modules.json") if os.path.isdir(path) else ""
    if not os.path.isfile(modules_file):
        return None
    with open(modules_file) as f:
        modules = json.load(f)
    kinds = [(m.get("type", "").rsplit(".", 1)[-1], m.get("path", "")) for m in modules]
    pooling = [module_path for kind, module_path in kinds if kind == "Pooling"]
    unknown = [kind for kind, _ in kinds if kind not in ("Transformer", "Pooling", "Normalize")]
    if unknown:
        raise ValueError(
            f"{modules_file}: sentence-transformers module {unknown[0]} is not supported"
        )
    if not pooling:
        return None
    with open(os.path.join(path, pooling[0], "config.json")) as f:
        mode = pooling_mode(json.load(f))
    if mode not in SENTENCE_TRANSFORMERS_MODES:
        raise ValueError(
            f"{modules_file}: pooling mode {mode!r} is not supported (cls, mean, lasttoken)"
        )
    normalize = any(kind == "Normalize" for kind, _ in kinds)
    return PoolerConfig(SENTENCE_TRANSFORMERS_MODES[mode], normalize, "sentence-transformers")


def pooling_mode(config: dict) -> str:
    """A Pooling module's one mode: ``pooling_mode`` (sentence-transformers 6) or the legacy
    ``pooling_mode_*`` flags; several modes (concatenated vectors) are refused."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in LEGACY_MODE_KEYS.items() if config.get(key)]
        mode = modes[0] if len(modes) == 1 else modes
    if not isinstance(mode, str):
        raise ValueError(f"pooling modes {mode!r}: exactly one mode is supported")
    return mode


def is_matryoshka(hf: dict) -> bool:
    """Whether a ``config.json`` allows truncated embeddings (vLLM's keys)."""
    return bool(hf.get("is_matryoshka") or hf.get("matryoshka_dimensions"))


def checkpoint_pooling(path: str) -> tuple[PoolerConfig | None, bool]:
    """A checkpoint directory's sentence-transformers pooler (or None) and whether its
    ``config.json`` allows Matryoshka truncation; (None, False) for a file (GGUF)."""
    if not os.path.isdir(path):
        return None, False
    config_file = os.path.join(path, "config.json")
    hf = {}
    if os.path.isfile(config_file):
        with open(config_file) as f:
            hf = json.load(f)
    return sentence_transformers_pooler(path), is_matryoshka(hf)
