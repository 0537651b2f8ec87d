"""The workload the speculative-decoding tests share (``test_speculative.py``,
``test_speculative_draft.py``): engine knobs that make chunked prefill, cut verify rows and
preemptions happen on the tiny model, and prompts that repeat spans (what drafts come from)."""

from __future__ import annotations

PAGE = 16


def speculation_knobs(config) -> dict:
    """A 16-token budget (prompts are prefilled in chunks, verify rows get cut) and a pool of 12
    pages of 16 tokens for up to four sequences of ~90 tokens (preemptions happen). Few shapes:
    plain and speculating engines share their compiled steps."""
    per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    return dict(
        max_model_len=128,
        max_rolling_batch_prefill_tokens=16,
        max_rolling_batch_size=4,
        page_size=PAGE,
        kv_cache_memory=13 * PAGE * per_token,
    )


def repeating_prompts() -> list[list[int]]:
    """Prompts that repeat spans (what prompt lookup drafts from), and one that does not."""
    return [
        [7, 8, 9, 10, 11, 12] * 3 + [300, 301],
        list(range(400, 420)) + list(range(400, 408)),
        [50, 60, 70, 80] * 6,
        list(range(900, 925)),
    ]
