"""``speculative_config``: vLLM's dict of speculative-decoding settings, validated."""

from __future__ import annotations

import dataclasses

from jaxgen.config.loaded_model import LoadedModel

METHODS = ("ngram", "draft_model")
# Draft tokens verified per sequence and step, at most: the verify row (k + 1 tokens) must fit
# the step's token budget beside the other rows; vLLM's n-gram default is far below this.
MAX_SPECULATIVE_TOKENS = 16
KEYS = (
    "method",
    "num_speculative_tokens",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "model",
    "quantization",
)
NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")
DRAFT_KEYS = ("model", "quantization")
# vLLM's old spellings of the n-gram method, given as ``model``.
NGRAM_MODEL_NAMES = ("[ngram]", "ngram")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Args:
    method: "ngram" (prompt lookup: draft the tokens that followed the latest n-gram's
        earliest earlier occurrence in the sequence) or "draft_model" (a smaller model with
        the target's vocabulary drafts, greedy or sampled as each request samples; a ``model``
        without ``method`` means it).
    num_speculative_tokens: draft tokens per sequence and step (1 to 16).
    prompt_lookup_min, prompt_lookup_max: the n-gram lengths tried, longest first (vLLM's
        defaults: both 5 when neither is given, else the one given for the other).
    model: the draft model: a path (HF directory, ``.gguf``, ``jaxgen convert`` output), an
        alias of the default model, or a loaded ``LoadedModel`` (Python only).
    quantization: the draft's weights as loaded (``EngineConfig.quantization``'s choices;
        "int4" of the target's own checkpoint makes an int4 self-draft).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 5
    prompt_lookup_max: int = 5
    model: object = None
    quantization: str = "auto"

    @classmethod
    def from_dict(cls, config: dict) -> SpeculativeConfig:
        """Parses vLLM's ``speculative_config`` dict; ``ValueError`` naming the bad key."""
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {config!r}")
        unknown = sorted(set(config) - set(KEYS))
        if unknown:
            raise ValueError(f"speculative_config has unknown key(s): {', '.join(unknown)}")
        model = config.get("model")
        if isinstance(model, str) and model in NGRAM_MODEL_NAMES + ("",):
            model = None
        method = config.get("method", "ngram" if model is None else "draft_model")
        if method == "[ngram]":
            method = "ngram"
        if method not in METHODS:
            raise ValueError(
                f"speculative_config.method must be one of {METHODS} (EAGLE and MTP heads are "
                f"not supported yet), got {method!r}"
            )
        k = config.get("num_speculative_tokens")
        _check_int(k, "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
        if method == "draft_model":
            return _draft_model(config, model, k)
        for key in DRAFT_KEYS:
            if key == "model" and model is None:
                continue
            if key in config:
                raise ValueError(f"speculative_config.{key} applies to method 'draft_model' only")
        low, high = config.get("prompt_lookup_min"), config.get("prompt_lookup_max")
        if low is None and high is None:
            low = high = 5
        low = high if low is None else low
        high = low if high is None else high
        _check_int(low, "prompt_lookup_min", 1, None)
        _check_int(high, "prompt_lookup_max", 1, None)
        if low > high:
            raise ValueError(
                f"speculative_config.prompt_lookup_min ({low}) must be <= prompt_lookup_max "
                f"({high})"
            )
        return cls(
            method=method, num_speculative_tokens=k, prompt_lookup_min=low, prompt_lookup_max=high
        )


def _draft_model(config: dict, model, k: int) -> SpeculativeConfig:
    """The draft-model settings: a ``model`` (path, alias or ``LoadedModel``) and its
    ``quantization``; the n-gram keys are refused."""
    from jaxgen.quantization import QUANTIZATION_CHOICES

    for key in NGRAM_KEYS:
        if key in config:
            raise ValueError(f"speculative_config.{key} applies to method 'ngram' only")
    if model is None:
        raise ValueError("speculative_config.model is required with method 'draft_model'")
    loaded = isinstance(model, LoadedModel)
    if not isinstance(model, str) and not loaded:
        raise ValueError(
            "speculative_config.model must be a path, an alias or a loaded model, "
            f"got {type(model).__name__}"
        )
    quantization = config.get("quantization", "auto")
    if quantization is None:
        quantization = "auto"
    if quantization not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"speculative_config.quantization must be one of {QUANTIZATION_CHOICES}, "
            f"got {quantization!r}"
        )
    if loaded and quantization != "auto":
        raise ValueError(
            "speculative_config.quantization applies to a model loaded from a path, not to a "
            "loaded model (load it quantised)"
        )
    return SpeculativeConfig(
        method="draft_model", num_speculative_tokens=k, model=model, quantization=quantization
    )


def _check_int(value, name: str, low: int, high: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"speculative_config.{name} must be an integer {bound}, got {value!r}")


def check_num_speculative_tokens(value) -> None:
    """A ``ValueError`` naming ``num_speculative_tokens`` unless it is an integer in [1, 16]
    (the capacity plan's and the ahead-of-time verify step's argument)."""
    if isinstance(value, bool) or not (
        isinstance(value, int) and 1 <= value <= MAX_SPECULATIVE_TOKENS
    ):
        raise ValueError(
            f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
            f"got {value!r}"
        )
