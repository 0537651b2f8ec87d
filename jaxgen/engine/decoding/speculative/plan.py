"""What speculation costs a deployment, for ``jaxgen plan --num-speculative-tokens k``: the
verify rows' tokens, logits and sampler rows, the KV a draft holds for a step, where a verify
step turns compute-bound, and the weight reads per token it can save. Plain arithmetic."""

from __future__ import annotations

import dataclasses

from jaxgen.config.speculative_config import check_num_speculative_tokens

ACCEPTANCE_RATES = (0.3, 0.5, 0.7, 0.9)  # per draft token, for the tokens-per-step table


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifyPlan:
    """A full batch of speculating sequences, each verifying k draft tokens in one step."""

    num_speculative_tokens: int
    step_tokens: int  # token rows of a step where every sequence speculates: B (k + 1)
    extra_logits_rows: int  # LM-head and sampler rows beyond one per sequence: B k
    extra_logits_bytes: int  # those rows' float32 logits
    extra_pages_per_sequence: int  # pages a draft may hold for a step (freed on rejection)
    sequences_at_context: int  # sequences of ``context`` tokens that fit with a draft each
    critical_sequences: float  # speculating sequences above which a verify step is compute-bound
    tokens_per_step: dict[float, float]  # acceptance rate -> expected tokens a sequence gains

    def lines(self, context: int, max_num_seqs: int) -> list[str]:
        k = self.num_speculative_tokens
        gains = "  ".join(f"{rate:.1f}: {gain:.2f}" for rate, gain in self.tokens_per_step.items())
        return [
            f"speculation, k = {k} draft tokens per sequence and step:",
            f"  verify step of {max_num_seqs} sequences  {self.step_tokens:,} token rows"
            f" (k + 1 each; the token budget must hold them)",
            f"  extra LM-head / sampler rows  {self.extra_logits_rows:,}"
            f" ({self.extra_logits_bytes / 2**20:,.1f} MiB of float32 logits)",
            f"  KV a draft holds              up to {self.extra_pages_per_sequence} page(s) per"
            " sequence for a step (rejected slots rolled back)",
            f"  sequences of {context} tokens     {self.sequences_at_context:,} with a draft each",
            f"  compute-bound above           {self.critical_sequences:,.0f} speculating"
            " sequences (the decode critical batch / (k + 1))",
            f"  tokens per weight read        by acceptance rate {gains}",
        ]


def plan_verify(
    *,
    num_speculative_tokens: int,
    max_num_seqs: int,
    vocab_size: int,
    page_size: int,
    context: int,
    num_pages: int,
    critical_batch_size: float,
) -> VerifyPlan:
    """The verify step's costs for ``max_num_seqs`` sequences drafting k tokens each, beside a
    pool of ``num_pages`` pages and a decode critical batch size (``planner.Plan``).
    ``ValueError`` naming ``num_speculative_tokens`` when it is outside 1-16."""
    check_num_speculative_tokens(num_speculative_tokens)
    k = num_speculative_tokens
    extra_rows = max_num_seqs * k
    # A draft's k tokens start anywhere in a page: they reach at most ceil(k / page) pages more.
    extra_pages = -(-k // page_size)
    pages_per_sequence = -(-context // page_size) + extra_pages
    return VerifyPlan(
        num_speculative_tokens=k,
        step_tokens=max_num_seqs * (k + 1),
        extra_logits_rows=extra_rows,
        extra_logits_bytes=extra_rows * vocab_size * 4,
        extra_pages_per_sequence=extra_pages,
        sequences_at_context=num_pages // pages_per_sequence,
        critical_sequences=critical_batch_size / (k + 1),
        tokens_per_step={rate: expected_tokens(rate, k) for rate in ACCEPTANCE_RATES},
    )


def expected_tokens(acceptance_rate: float, k: int) -> float:
    """Tokens a sequence gains per verify step when each draft token is accepted with
    ``acceptance_rate`` independently: the accepted prefix plus the target's own token,
    (1 - a^(k+1)) / (1 - a)."""
    if acceptance_rate >= 1.0:
        return k + 1.0
    return (1 - acceptance_rate ** (k + 1)) / (1 - acceptance_rate)
