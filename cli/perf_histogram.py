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


# One window of a latency someone else summarised (librdkafka's stats, ~1 s each): how many
# samples it held and points (value ms, at most this fraction of its samples lie above).
WindowSummary = tuple[int, tuple[tuple[float, float], ...]]


def quantile_at_most(windows: list[WindowSummary], quantile: float) -> float | None:
    """An upper bound of the `quantile` (0-1) of every sample of `windows` together, from
    each window's own percentiles only (pure).

    A window's p99 of v says at most 1% of its samples lie above v, its maximum that none
    does. So at most sum(count_w * fraction_w(x)) samples of the run lie above x, where
    fraction_w(x) is the smallest fraction of w's points at or below x (1 when none is).
    The answer is the smallest point value x where that sum is within (1 - quantile) of
    all samples: the run's quantile is certainly not above it (it may be below). None
    without samples."""
    total = sum(count for count, _points in windows)
    if total <= 0:
        return None
    allowed = (1.0 - quantile) * total
    events = sorted(
        (value, fraction, w) for w, (_count, points) in enumerate(windows)
        for value, fraction in points
    )  # fmt: skip
    above = [1.0] * len(windows)  # each window's fraction above the sweep's value
    excess = float(total)  # samples that may lie above the sweep's value
    i = 0
    while i < len(events):
        value = events[i][0]
        while i < len(events) and events[i][0] == value:
            _value, fraction, w = events[i]
            if fraction < above[w]:
                excess -= windows[w][0] * (above[w] - fraction)
                above[w] = fraction
            i += 1
        if excess <= allowed * (1 + 1e-12):
            return value
    return None  # not reached when every window has a point of fraction 0 (its maximum)
