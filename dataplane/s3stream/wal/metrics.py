"""Prometheus metrics of the WALs (process-wide, registered once).

The collectors are module-level singletons, so any number of WAL instances can
be constructed in one process. If this module is loaded twice (e.g. reloaded),
the already-registered collectors are reused instead of registering again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from prometheus_client import REGISTRY, Counter, Histogram

__all__ = [
    "APPEND_BYTES",
    "APPEND_LATENCY",
    "BATCH_BYTES",
    "CORRUPT_BYTES",
    "CORRUPT_RECORDS",
    "FSYNCS",
]

_C = TypeVar("_C")

_LATENCY_BUCKETS_SECONDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
_BATCH_BUCKETS_BYTES = tuple(float(4096 * 4**i) for i in range(8))  # 4 KiB .. 64 MiB


def _get_or_create(name: str, factory: Callable[[], _C]) -> _C:
    existing = getattr(REGISTRY, "_names_to_collectors", {}).get(name)
    if existing is not None:
        return existing  # type: ignore[return-value]
    return factory()


APPEND_BYTES: Counter = _get_or_create(
    "automq_wal_append_bytes_total",
    lambda: Counter(
        "automq_wal_append_bytes", "Bytes of records acknowledged by WALs (headers included)."
    ),
)
FSYNCS: Counter = _get_or_create(
    "automq_wal_fsyncs_total",
    lambda: Counter("automq_wal_fsyncs", "fsync/fdatasync calls made by WALs."),
)
APPEND_LATENCY: Histogram = _get_or_create(
    "automq_wal_append_latency_seconds",
    lambda: Histogram(
        "automq_wal_append_latency_seconds",
        "Time from append() to acknowledgement.",
        buckets=_LATENCY_BUCKETS_SECONDS,
    ),
)
BATCH_BYTES: Histogram = _get_or_create(
    "automq_wal_batch_bytes",
    lambda: Histogram(
        "automq_wal_batch_bytes", "Bytes written per group commit.", buckets=_BATCH_BUCKETS_BYTES
    ),
)
CORRUPT_RECORDS: Counter = _get_or_create(
    "automq_wal_corrupt_records_total",
    lambda: Counter(
        "automq_wal_corrupt_records",
        "Valid WAL records a scan had to drop because corruption before them broke the chain "
        "(restart or failover; a torn tail is not counted).",
    ),
)
CORRUPT_BYTES: Counter = _get_or_create(
    "automq_wal_corrupt_bytes_total",
    lambda: Counter(
        "automq_wal_corrupt_bytes",
        "Bytes of the WAL ring spanned by the records counted in automq_wal_corrupt_records.",
    ),
)
