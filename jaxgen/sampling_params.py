"""Per-request sampling parameters (vLLM's names and meanings); validated on construction."""

from __future__ import annotations

import dataclasses
import enum

from jaxgen.structured_outputs import StructuredOutputsParams


class RequestOutputKind(enum.IntEnum):
    """What an engine step reports of a running request (vLLM's values): everything so far,
    what is new since the last report, or nothing until it finishes (``LLM.generate``)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


# The fields that shape a row's next-token distribution (a draft model samples under them too,
# ``speculative.draft_model``); a new one is declared here and in ``SamplingParams``.
DISTRIBUTION_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
)


@dataclasses.dataclass(kw_only=True)
class SamplingParams:
    """How to sample one request. ``temperature=0`` means greedy.

    Args:
        n: parallel samples per prompt (they share the prompt's KV pages).
        max_tokens: most tokens to generate.
        min_tokens: EOS and stop tokens are suppressed until this many tokens were generated.
        temperature, top_k (0 or -1 = off), top_p, min_p: the usual sampling filters.
        repetition_penalty (1 = off), presence_penalty, frequency_penalty (0 = off).
        seed: per-request seed; the same seed gives the same tokens whatever the batch.
        stop: strings that end generation (matched on text, excluded from the output unless
            ``include_stop_str_in_output``).
        include_stop_str_in_output: keep the stop string that ended generation in the text.
        stop_token_ids: token ids that end generation (besides EOS unless ``ignore_eos``).
        ignore_eos: keep generating past EOS.
        logprobs: if an int k, return per generated token the sampled token's logprob plus the top k.
        skip_special_tokens: drop special tokens from the text.
        structured_outputs: constrain the output to a JSON schema, regex, choice or grammar
            (a ``StructuredOutputsParams`` or a dict of its fields).
        prompt_logprobs: if an int k, return per prompt token (after the first) its logprob
            given the prefix plus the top k (the first token's entry is None). A request asking
            for them does not reuse cached prefix pages: every position is computed.
        logit_bias: token id -> bias in [-100, 100] added to its logit before sampling.
        output_kind: a ``RequestOutputKind``: the outputs an engine step returns for the
            request (``LLM.generate`` asks for ``FINAL_ONLY``).
    """

    n: int = 1
    max_tokens: int | None = 16
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    prompt_logprobs: int | None = None
    logit_bias: dict[int, float] | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self.structured_outputs = StructuredOutputsParams.from_value(self.structured_outputs)
        _check(isinstance(self.n, int) and self.n >= 1, "n", "must be an integer >= 1", self.n)
        _check(
            not isinstance(self.output_kind, bool) and self.output_kind in tuple(RequestOutputKind),
            "output_kind",
            "must be a RequestOutputKind (0 cumulative, 1 delta, 2 final only)",
            self.output_kind,
        )
        self.output_kind = RequestOutputKind(self.output_kind)
        _check(
            self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens >= 1),
            "max_tokens",
            "must be an integer >= 1",
            self.max_tokens,
        )
        _check(
            isinstance(self.min_tokens, int) and self.min_tokens >= 0,
            "min_tokens",
            "must be an integer >= 0",
            self.min_tokens,
        )
        if self.max_tokens is not None:
            _check(
                self.min_tokens <= self.max_tokens,
                "min_tokens",
                "must be <= max_tokens",
                self.min_tokens,
            )
        _check(
            _num(self.temperature) and 0.0 <= self.temperature <= 100.0,
            "temperature",
            "must be in [0, 100]",
            self.temperature,
        )
        _check(
            isinstance(self.top_k, int) and self.top_k >= 0,
            "top_k",
            "must be an integer >= 0 (or -1 for off)",
            self.top_k,
        )
        _check(
            _num(self.top_p) and 0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]", self.top_p
        )
        _check(
            _num(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]", self.min_p
        )
        _check(
            _num(self.repetition_penalty) and self.repetition_penalty > 0,
            "repetition_penalty",
            "must be > 0",
            self.repetition_penalty,
        )
        _check(
            _num(self.presence_penalty) and -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            "must be in [-2, 2]",
            self.presence_penalty,
        )
        _check(
            _num(self.frequency_penalty) and -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            "must be in [-2, 2]",
            self.frequency_penalty,
        )
        _check(
            self.seed is None or (isinstance(self.seed, int) and not isinstance(self.seed, bool)),
            "seed",
            "must be an integer or None",
            self.seed,
        )
        _check(
            all(isinstance(s, str) and s for s in self.stop),
            "stop",
            "must be non-empty strings",
            self.stop,
        )
        _check(
            all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "must be non-negative integers",
            self.stop_token_ids,
        )
        _check(
            self.logprobs is None or (isinstance(self.logprobs, int) and 0 <= self.logprobs <= 20),
            "logprobs",
            "must be an integer in [0, 20] or None",
            self.logprobs,
        )

        _check(
            self.prompt_logprobs is None
            or (
                isinstance(self.prompt_logprobs, int)
                and not isinstance(self.prompt_logprobs, bool)
                and 0 <= self.prompt_logprobs <= 20
            ),
            "prompt_logprobs",
            "must be an integer in [0, 20] or None",
            self.prompt_logprobs,
        )
        self.logit_bias = _logit_bias(self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


MAX_LOGIT_BIAS = 100.0


def _logit_bias(bias) -> dict[int, float] | None:
    """``logit_bias`` checked: token ids (ints >= 0) to finite biases in [-100, 100]."""
    if not bias:
        return None
    _check(isinstance(bias, dict), "logit_bias", "must be a dict of token id -> bias", bias)
    for token, value in bias.items():
        _check(
            isinstance(token, int) and not isinstance(token, bool) and token >= 0,
            "logit_bias",
            "keys must be token ids (integers >= 0)",
            token,
        )
        _check(
            _num(value) and -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS,
            "logit_bias",
            "values must be numbers in [-100, 100]",
            value,
        )
    return {token: float(value) for token, value in bias.items()}


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x


def _check(ok: bool, name: str, what: str, value) -> None:
    if not ok:
        raise ValueError(f"{name} {what}, got {value!r}")
