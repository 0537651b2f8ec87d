"""What a drafted token costs on this machine, measured as the engine runs: the durations of
all-decode steps without drafts and with them, as moving averages. On a GPU a verify row is
nearly free (the step reads the weights once whatever its rows); on a CPU, where a step is
compute-bound at a few rows, a drafted token can cost half a step, and a draft pays only where
more than that share of its tokens is accepted. Plain Python: never imports jax."""

from __future__ import annotations

# Weight of the newest step in the moving averages, and steps of each kind seen before the
# ratio is trusted.
WEIGHT = 0.1
MIN_STEPS = 4
OUTLIER = 1.5


class DraftCost:
    """Moving averages, per batch size, of a step without drafts and of what each drafted
    token adds to it; ``ratio`` is the second over the first (None until both are known)."""

    def __init__(self):
        self.plain: dict[int, float] = {}  # rows -> seconds of a step without drafts
        self.plain_steps: dict[int, int] = {}
        self.per_token: float | None = None  # what a drafted token adds, in plain steps
        self.draft_steps = 0

    def observe(self, seconds: float, rows: int, drafted_tokens: int) -> None:
        """A step of ``rows`` decode rows (no prefill chunk), ``drafted_tokens`` of them
        drafts, took ``seconds`` from its batch's build to its tokens on the host."""
        if drafted_tokens == 0:
            plain = self.plain.get(rows)
            if plain is not None:  # a step the machine or the collector paused drags it less
                seconds = min(seconds, OUTLIER * plain)
            self.plain[rows] = _average(plain, seconds)
            self.plain_steps[rows] = self.plain_steps.get(rows, 0) + 1
            return
        plain = self.plain.get(rows)
        if plain is None or self.plain_steps[rows] < MIN_STEPS:
            return
        extra = max(seconds - plain, 0.0) / drafted_tokens / plain
        self.per_token = _average(self.per_token, extra)
        self.draft_steps += 1

    @property
    def ratio(self) -> float | None:
        """A drafted token's cost in steps without drafts, once measured."""
        return self.per_token if self.draft_steps >= MIN_STEPS else None


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else mean + WEIGHT * (value - mean)


def paying_length(acceptance: float, cost: float | None, length: int) -> int:
    """The longest draft, up to ``length``, whose last token is still worth its cost: token j
    of a draft is kept with probability ``acceptance`` ** j (each one after an accepted one)
    and costs ``cost`` steps. ``length`` when the cost is unknown; 0 when not even the first
    token pays."""
    if cost is None:
        return length
    paying, kept = 0, 1.0
    while paying < length:
        kept *= acceptance
        if kept <= cost:
            break
        paying += 1
    return paying
