"""How a Fetch request's byte budget is shared by the partitions read concurrently.

A Fetch names many partitions; a consumer catching up from the object store waits for each
one's ranged GETs, so the handler reads them at once rather than one after the other. The
response still keeps Kafka's limits: each partition at most its `partition_max_bytes`, the
whole at most the request's `max_bytes` (the first partition read may exceed it by one batch,
so a consumer always progresses). Reading at once means the budgets are given out before the
reads return: a wave takes partitions in request order while the sum of their budgets fits
what is left; if the wave returned less than it was given, the next wave reads the following
partitions with what is left. A wave reads at most `MAX_PARTITIONS_PER_WAVE` partitions, so
one consumer of many partitions waiting for GETs holds only that many of the broker's I/O
threads, and other clients' reads (e.g. tail reads from memory) still find threads. Pure
logic: no I/O.
"""

from __future__ import annotations

MAX_PARTITIONS_PER_WAVE = 8  # of the broker's 16 Kafka I/O threads


def next_wave(
    partition_max_bytes: list[int],
    total_bytes: int,
    max_bytes: int,
    max_partitions: int = MAX_PARTITIONS_PER_WAVE,
) -> list[int]:
    """Budgets of the next wave: for the first partitions still to be read (their
    `partition_max_bytes`, in request order), given `total_bytes` already in the response
    and the request's `max_bytes`; at most `max_partitions` of them. Empty when nothing is
    left to give; each budget is at least 1 (a partition read returns at least one batch
    when it has one)."""
    left = max_bytes - total_bytes
    budgets: list[int] = []
    for wanted in partition_max_bytes:
        if left <= 0 or len(budgets) >= max_partitions:
            break
        budget = max(min(wanted, left), 1)
        budgets.append(budget)
        left -= budget
    return budgets
