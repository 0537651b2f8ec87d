"""Shape buckets: every device array of a step is padded to one of a small declared set of sizes,
so a steady workload compiles nothing new."""

from __future__ import annotations


def power_of_two_buckets(limit: int, start: int = 1) -> list[int]:
    """``start, 2*start, 4*start, ...`` up to and including the first value ``>= limit``."""
    buckets = [start]
    while buckets[-1] < limit:
        buckets.append(buckets[-1] * 2)
    return buckets


def bucket_for(n: int, buckets: list[int]) -> int:
    """The smallest bucket ``>= n`` (0 stays 0: an empty section has no rows at all)."""
    if n == 0:
        return 0
    for b in buckets:
        if b >= n:
            return b
    raise ValueError(f"size {n} exceeds the largest bucket {buckets[-1]}")


def next_power_of_two(n: int, minimum: int = 1) -> int:
    """The smallest power of two ``>= max(n, minimum)`` (for widths with no declared limit)."""
    return 1 << (max(n, minimum, 1) - 1).bit_length()
