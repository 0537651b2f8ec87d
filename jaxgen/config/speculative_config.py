"""``speculative_config``: vLLM's dict of speculative-decoding settings, validated."""

from __future__ import annotations

import dataclasses

METHODS = ("ngram",)
# Draft tokens verified per sequence and step, at most: the verify row (k + 1 tokens) must fit
# the step's token budget beside the other rows; vLLM's n-gram default is far below this.
MAX_SPECULATIVE_TOKENS = 16
KEYS = ("method", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max", "model")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Args:
    method: "ngram" (prompt lookup: draft the tokens that followed the latest n-gram's
        earliest earlier occurrence in the sequence).
    num_speculative_tokens: draft tokens per sequence and step (1 to 16).
    prompt_lookup_min, prompt_lookup_max: the n-gram lengths tried, longest first (vLLM's
        defaults: both 5 when neither is given, else the one given for the other).
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    @classmethod
    def from_dict(cls, config: dict) -> SpeculativeConfig:
        """Parses vLLM's ``speculative_config`` dict; ``ValueError`` naming the bad key."""
        if not isinstance(config, dict):
            raise ValueError(f"speculative_config must be a dict, got {config!r}")
        unknown = sorted(set(config) - set(KEYS))
        if unknown:
            raise ValueError(f"speculative_config has unknown key(s): {', '.join(unknown)}")
        method = config.get("method", "ngram" if "model" not in config else None)
        if method == "[ngram]":
            method = "ngram"
        if method not in METHODS:
            raise ValueError(
                f"speculative_config.method must be one of {METHODS} (draft models, EAGLE and "
                f"MTP are not supported yet), got {method!r}"
            )
        if config.get("model") not in (None, "", "[ngram]", "ngram"):
            raise ValueError("speculative_config.model: a draft model is not supported yet")
        k = config.get("num_speculative_tokens")
        _check_int(k, "num_speculative_tokens", 1, MAX_SPECULATIVE_TOKENS)
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


def _check_int(value, name: str, low: int, high: int | None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"speculative_config.{name} must be an integer {bound}, got {value!r}")
