"""N-gram prompt lookup: draft the tokens that followed an earlier occurrence of the sequence's
last n tokens (no extra model; pays off when the output repeats spans of the prompt)."""

from __future__ import annotations

import numpy as np


def propose_ngram(token_ids: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``k`` draft tokens for the sequence ``token_ids``: for n from ``max_n`` down to
    ``min_n``, the earliest earlier occurrence of its last n tokens, and the tokens after it
    (vLLM's ``NgramProposer``); [] when no n-gram recurs."""
    if k < 1 or len(token_ids) < min_n + 1:
        return []
    tokens = np.asarray(token_ids, np.int64)
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], n)  # [L - n, n]
        matches = np.flatnonzero((windows == tokens[-n:]).all(axis=1))
        if matches.size:
            start = int(matches[0]) + n
            return tokens[start : start + k].tolist()
    return []


class NgramProposer:
    """The speculator's proposer for method "ngram": each sequence's lookup on its own."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n

    def propose(self, candidates: list, token_budget: int) -> list[list[int]]:
        """Up to k draft tokens for each ``Candidate`` (sequence, k) of ``candidates``
        (``token_budget`` is the speculator's to apply: a lookup costs nothing)."""
        return [propose_ngram(seq.token_ids, k, self.min_n, self.max_n) for seq, k, _ in candidates]
