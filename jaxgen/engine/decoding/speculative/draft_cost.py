"""What a draft costs on this machine, measured as the engine runs: the durations of all-decode
steps by their rows and drafted tokens, as moving averages. On a GPU a verify row is nearly
free (the step reads the weights once whatever its rows); on a CPU, where a step is
compute-bound at a few rows, a drafted token can cost half a step, and not every token the
same: the native kernels take token rows in register tiles of up to five, so a verify row's
cost grows in steps (on the default model's CPU step 1.05 / 1.19 / 1.46 / 1.80 steps for 1-4
drafted tokens, 3.9 for 8, whose 9 rows pass the tiles). A draft is cut to the length that
gives the most tokens per second (``best_length``). Plain Python: never imports jax."""

from __future__ import annotations

# Weight of the newest step in the moving averages, steps without drafts seen before their
# mean is trusted, and steps of one drafted length before theirs is.
WEIGHT = 0.1
MIN_STEPS = 4
MIN_DRAFT_STEPS = 2
OUTLIER = 1.5


class DraftCost:
    """Moving averages of a decode step's duration per (rows, drafted tokens); ``relative``
    gives a step with drafts in steps of the same rows without (None until measured)."""

    def __init__(self):
        self.seconds: dict[tuple[int, int], float] = {}  # (rows, drafted) -> mean seconds
        self.counts: dict[tuple[int, int], int] = {}
        self._points_of: dict[int, list[tuple[int, float]]] = {}  # until the next step

    def observe(self, seconds: float, rows: int, drafted_tokens: int) -> None:
        """A step of ``rows`` decode rows (no prefill chunk), ``drafted_tokens`` of its tokens
        drafts, took ``seconds`` from its batch's build to its tokens on the host."""
        key = (rows, drafted_tokens)
        mean = self.seconds.get(key)
        if mean is None or seconds * OUTLIER < mean:  # the first, or the mean began slow
            self.seconds[key] = seconds
        else:  # a step the machine or the collector paused drags the mean less
            self.seconds[key] = mean + WEIGHT * (min(seconds, OUTLIER * mean) - mean)
        self.counts[key] = self.counts.get(key, 0) + 1
        self._points_of.clear()

    def _plain(self, rows: int) -> float | None:
        if self.counts.get((rows, 0), 0) < MIN_STEPS:
            return None
        return self.seconds[(rows, 0)]

    def _points(self, rows: int) -> list[tuple[int, float]]:
        """(drafted, steps without drafts) of every measured drafted length of ``rows``
        (kept until the next step is observed: every candidate of a step asks)."""
        points = self._points_of.get(rows)
        if points is None:
            points = self._points_of[rows] = self._measure(rows)
        return points

    def _measure(self, rows: int) -> list[tuple[int, float]]:
        plain = self._plain(rows)
        if plain is None:
            return []
        return sorted(
            (drafted, mean / plain)
            for (num_rows, drafted), mean in self.seconds.items()
            if num_rows == rows and drafted and self.counts[(rows, drafted)] >= MIN_DRAFT_STEPS
        )

    @property
    def ratio(self) -> float | None:
        """What a drafted token adds to a step, in steps without drafts, averaged over the
        measured lengths (None until one is): the figure ``stats`` reports."""
        extras = [
            (cost - 1.0) / drafted
            for rows in {rows for rows, _ in self.seconds}
            for drafted, cost in self._points(rows)
        ]
        return max(sum(extras) / len(extras), 0.0) if extras else None

    def optimistic(self, rows: int, below: int) -> _Optimistic:
        """These costs with every drafted length of ``rows`` measured fewer than ``below``
        times no dearer than the cheapest per-token cost measured (``best_length`` takes it as
        its cost): what picks a length to try again (``Speculator``'s exploration)."""
        marginals = [
            (cost - 1.0) / drafted
            for drafted, cost in self._points(rows)
            if self.counts[(rows, drafted)] >= below
        ]
        return _Optimistic(self, below, max(min(marginals), 0.0) if marginals else None)

    def relative(self, rows: int, drafted: int) -> float | None:
        """A step of ``rows`` decode rows and ``drafted`` draft tokens, in steps of those rows
        without drafts: the measured mean, else a line through the measured lengths of these
        rows (past the longest, its mean cost a token), else ``ratio`` a token; None while
        nothing is measured."""
        if drafted == 0:
            return 1.0
        points = self._points(rows)
        if not points:
            ratio = self.ratio
            return None if ratio is None else 1.0 + drafted * ratio
        below = (0, 1.0)
        for point in points:
            if point[0] == drafted:
                return point[1]
            if point[0] > drafted:  # between two measured lengths
                (x0, y0), (x1, y1) = below, point
                return y0 + (y1 - y0) * (drafted - x0) / (x1 - x0)
            below = point
        longest, cost = below
        return cost + (drafted - longest) * max(cost - 1.0, 0.0) / longest


class _Optimistic:
    """``DraftCost.optimistic``: ``relative`` with the lengths measured fewer than ``below``
    times at most ``1 + drafted * marginal`` (unchanged without a trusted marginal)."""

    def __init__(self, cost: DraftCost, below: int, marginal: float | None):
        self.cost, self.below, self.marginal = cost, below, marginal

    def relative(self, rows: int, drafted: int) -> float | None:
        measured = self.cost.relative(rows, drafted)
        if self.marginal is None or self.cost.counts.get((rows, drafted), 0) >= self.below:
            return measured
        bound = 1.0 + drafted * self.marginal
        return bound if measured is None else min(measured, bound)


def best_length(acceptance: float, cost: DraftCost, rows: int, length: int) -> int:
    """The draft length, up to ``length``, that gives a step of ``rows`` decode rows the most
    tokens per second: token j of a draft is kept with probability ``acceptance`` ** j (each
    one after an accepted one), and a step with L drafted tokens costs ``cost.relative(rows,
    L)`` steps without. ``length`` while the cost is unknown; 0 when no draft pays."""
    best, best_rate = 0, 1.0
    gain, kept = 0.0, 1.0
    for drafted in range(1, length + 1):
        steps = cost.relative(rows, drafted)
        if steps is None:
            return length
        kept *= acceptance
        gain += kept
        rate = (rows + gain) / (rows * steps)
        if rate > best_rate:
            best, best_rate = drafted, rate
    return best
