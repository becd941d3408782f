"""Latency histogram of `automqctl perf`: log-spaced buckets, constant memory, mergeable.

The load generator's child processes count their latencies here and send the bucket counts
to the parent, which merges them per interval and for the whole run. A percentile is the
geometric middle of its bucket: within 0.5% of the exact sample percentile.
"""

from __future__ import annotations

import math
from collections import Counter

MIN_MS = 0.001  # values below (or a clock step backwards) count as this
GROWTH = 1.01  # each bucket is 1% wider than the one before
_LOG_GROWTH = math.log(GROWTH)


def bucket_of(ms: float) -> int:
    """The bucket index of a latency in milliseconds (pure)."""
    if ms <= MIN_MS:
        return 0
    return int(math.log(ms / MIN_MS) / _LOG_GROWTH)


def bucket_value(index: int) -> float:
    """The value a bucket stands for: its geometric middle (pure)."""
    return MIN_MS * GROWTH ** (index + 0.5)


class LatencyHistogram:
    """Counts of latencies per bucket; at most a few thousand buckets whatever the count
    (1 microsecond to 10 minutes is about 2,000). Not thread-safe: one owner, or a lock."""

    __slots__ = ("counts", "count")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0

    def add(self, ms: float) -> None:
        index = bucket_of(ms)
        self.counts[index] = self.counts.get(index, 0) + 1
        self.count += 1

    def add_many(self, values: list[float], scale: float = 1.0) -> None:
        """Add `value * scale` ms for each value: one pass for a batch (a load generator
        at 150,000 records/s spent a quarter of its CPU adding them one call at a time)."""
        if not values:
            return
        lowest = MIN_MS / scale
        factor = scale / MIN_MS
        log = math.log
        step = _LOG_GROWTH
        # Counter counts in C; the comprehension is bucket_of inlined
        batch = Counter([int(log(v * factor) / step) if v > lowest else 0 for v in values])
        self.merge(batch)

    def merge(self, counts: dict[int, int]) -> None:
        """Add another histogram's bucket counts (as sent between processes)."""
        for index, n in counts.items():
            self.counts[index] = self.counts.get(index, 0) + n
            self.count += n

    def percentile(self, p: float) -> float | None:
        """The p-th percentile (0-100) by the same rank rule as a sorted sample list:
        the value at rank min(n - 1, int(p / 100 * n)); None when empty."""
        if not self.count:
            return None
        rank = min(self.count - 1, int(p / 100 * self.count))
        seen = 0
        for index in sorted(self.counts):
            seen += self.counts[index]
            if seen > rank:
                return bucket_value(index)
        return bucket_value(max(self.counts))  # not reached: the counts sum to count
