"""Beam search's parameters and results, as vLLM's ``LLM.beam_search`` names them."""

from __future__ import annotations

import dataclasses

# Candidates per beam and step: the top ``2 * beam_width`` tokens (vLLM's choice: enough that
# ``beam_width`` beams survive however many candidates end with EOS). The engine returns at most
# 20 top logprobs per row, so the widest beam is 10.
MAX_BEAM_WIDTH = 10
# |length_penalty| bound: length ** penalty stays a finite float for any context length.
MAX_LENGTH_PENALTY = 16.0


@dataclasses.dataclass
class BeamSearchParams:
    """How to run ``LLM.beam_search``.

    Args:
        beam_width: beams kept per prompt after each step (1 to ``MAX_BEAM_WIDTH``).
        max_tokens: tokens generated per beam (fewer when the model's context runs out).
        ignore_eos: keep extending beams past EOS (otherwise a beam that picks EOS is complete).
        temperature: must be 0: beams are scored with the model's raw log-probabilities.
        length_penalty: a beam's score is its cumulative logprob over ``length **
            length_penalty``, the length counting the prompt and not a final EOS (vLLM's
            ``get_beam_search_score``).
        include_stop_str_in_output: accepted for vLLM compatibility (no stop strings here).
    """

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        def check(ok: bool, name: str, what: str):
            if not ok:
                raise ValueError(f"{name} {what}, got {getattr(self, name)!r}")

        check(
            _int(self.beam_width) and 1 <= self.beam_width <= MAX_BEAM_WIDTH,
            "beam_width",
            f"must be an integer in [1, {MAX_BEAM_WIDTH}]",
        )
        check(_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "must be >= 1")
        check(isinstance(self.ignore_eos, bool), "ignore_eos", "must be True or False")
        check(
            _number(self.temperature) and self.temperature == 0,
            "temperature",
            "must be 0 (beam search scores the model's raw log-probabilities)",
        )
        check(
            _number(self.length_penalty) and abs(self.length_penalty) <= MAX_LENGTH_PENALTY,
            "length_penalty",
            f"must be a number in [-{MAX_LENGTH_PENALTY}, {MAX_LENGTH_PENALTY}]",
        )


@dataclasses.dataclass
class BeamSearchSequence:
    """One finished beam: the prompt's tokens then the generated ones (vLLM's layout)."""

    tokens: list[int]
    logprobs: list[dict[int, float]]  # per generated token: the candidates' logprobs that step
    cum_logprob: float = 0.0
    text: str | None = None  # the decoded ``tokens`` (prompt included, as vLLM's)
    finish_reason: str | None = None  # "stop" (ended with EOS) or "length"
    stop_reason: int | None = None  # the EOS token that ended it
    num_prompt_tokens: int = 0

    @property
    def output_token_ids(self) -> list[int]:
        """The generated tokens alone."""
        return self.tokens[self.num_prompt_tokens :]


@dataclasses.dataclass
class BeamSearchOutput:
    """The best ``beam_width`` sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


def beam_search_score(
    tokens: list[int], cum_logprob: float, eos_token_ids, length_penalty: float
) -> float:
    """vLLM's ``get_beam_search_score``: ``cum_logprob / length ** length_penalty``, the length
    counting the prompt and not a final EOS."""
    length = len(tokens)
    if tokens and tokens[-1] in eos_token_ids:
        length -= 1
    return cum_logprob / (length**length_penalty)


def _int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
