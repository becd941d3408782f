"""Which compacted partitions the log cleaner cleans in a run (Kafka's
`LogCleanerManager.grabFilthiestCompactedLog`), as pure functions.

A partition's log is split by its cleaner checkpoint (the offset up to which the last run
cleaned it, kept in the metadata: `StreamMetaState.cleaned_offset`) into a *clean* part
(objects ending at or below it: each key at most once) and a *dirty* part (the rest).

* `min.cleanable.dirty.ratio`: the partition is cleaned when dirty bytes / (clean + dirty
  bytes) is strictly greater than the ratio (as Kafka compares).
* `max.compaction.lag.ms`: a partition below the ratio is still cleaned when its oldest
  dirty data is older than the lag (Kafka takes the first batch timestamp of the first
  dirty segment; here the max timestamp of the first batch of the first dirty object,
  read only when this rule can matter: below the ratio and a lag shorter than "never").
* A partition with no dirty bytes is never cleaned (nothing new to map).

`min.compaction.lag.ms` is not decided here: it bounds the range inside a run (the range
stops at the first object holding a batch younger than the lag, `compact_topics`).

Pure module: no I/O (the first dirty timestamp comes from the caller's function).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

NEVER_MS = 2**63 - 1  # max.compaction.lag.ms default: Long.MAX_VALUE


@dataclass(frozen=True)
class CleanDecision:
    """Whether to clean a partition now, and why (reported in the run's result)."""

    clean: bool
    reason: str
    dirty_ratio: float


def dirty_ratio(clean_bytes: int, dirty_bytes: int) -> float:
    """The dirty share of the partition's cleanable bytes (0.0 for an empty log)."""
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total > 0 else 0.0


def decide(
    clean_bytes: int,
    dirty_bytes: int,
    min_cleanable_dirty_ratio: float,
    max_compaction_lag_ms: int,
    now_ms: int,
    first_dirty_timestamp_ms: Callable[[], int | None],
) -> CleanDecision:
    """Clean the partition now? (see the module doc). `first_dirty_timestamp_ms` is called
    at most once, only when the partition is below the ratio and the lag is finite; it
    returns None or a negative value when the timestamp is unknown (never due then)."""
    ratio = dirty_ratio(clean_bytes, dirty_bytes)
    if dirty_bytes <= 0:
        return CleanDecision(False, "no dirty data since the last run", ratio)
    if ratio > min_cleanable_dirty_ratio:
        return CleanDecision(True, f"dirty ratio {ratio:.3f} > min.cleanable.dirty.ratio", ratio)
    if 0 <= max_compaction_lag_ms < NEVER_MS:
        first_ms = first_dirty_timestamp_ms()
        if first_ms is not None and first_ms >= 0 and first_ms < now_ms - max_compaction_lag_ms:
            return CleanDecision(
                True, f"dirty data older than max.compaction.lag.ms ({ratio:.3f} dirty)", ratio
            )
    return CleanDecision(
        False,
        f"dirty ratio {ratio:.3f} <= min.cleanable.dirty.ratio {min_cleanable_dirty_ratio}",
        ratio,
    )
