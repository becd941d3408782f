"""Prometheus metrics of the storage engine (names start with `automq_`; see docs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, Info

UPLOADS = Counter("automq_stream_uploads_total", "WAL uploads committed (one or more objects each)")
UPLOAD_BYTES = Counter("automq_stream_upload_bytes_total", "bytes of objects uploaded")
UPLOAD_LATENCY = Histogram(
    "automq_stream_upload_latency_seconds",
    "prepare + put + commit of one upload",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
WAL_CACHE_BYTES = Gauge("automq_stream_wal_cache_bytes", "acknowledged bytes not yet uploaded")
BLOCK_CACHE_BYTES = Gauge("automq_block_cache_bytes", "bytes held by the block cache")
BLOCK_CACHE_HITS = Counter("automq_block_cache_hits_total", "block reads served from the cache")
BLOCK_CACHE_MISSES = Counter("automq_block_cache_misses_total", "block reads that went to S3")
UPLOAD_DROPPED_BATCHES = Counter(
    "automq_stream_upload_dropped_batches_total",
    "acknowledged batches left out of uploads because the controller refused their stream for "
    "good (deleted, fenced by a newer epoch, already committed)",
)
WAL_USED_BYTES = Gauge("automq_wal_used_bytes", "bytes of the WAL not trimmed yet (incl. queued)")
WAL_CAPACITY_BYTES = Gauge("automq_wal_capacity_bytes", "size of the WAL ring")
UPLOAD_LAG = Gauge(
    "automq_stream_upload_lag_seconds",
    "age of the oldest acknowledged batch not uploaded yet (0 when none)",
)
UPLOAD_FAILING = Gauge(
    "automq_stream_upload_failing", "1 while the last upload attempt failed, else 0"
)
UPLOAD_ERRORS = Counter(
    "automq_stream_upload_errors", "WAL upload attempts that failed (each is retried)"
)
LAST_UPLOAD_ERROR = Info(
    "automq_stream_last_upload_error", "the last upload attempt's error (empty once one succeeds)"
)


def bind_upload_stats(stats: Callable[[], Any]) -> None:
    """Serve the WAL and upload-lag gauges from `stats()` (an `UploadStats`) at scrape time.

    One engine per broker process; a later engine (tests run several) takes the gauges
    over. `stats` runs on the scraping thread and must be cheap and thread-safe.
    """
    WAL_USED_BYTES.set_function(lambda: stats().wal_used_bytes)
    WAL_CAPACITY_BYTES.set_function(lambda: stats().wal_capacity_bytes)
    UPLOAD_LAG.set_function(lambda: stats().upload_lag_s)


def set_last_upload_error(error: str | None) -> None:
    """The outcome of an upload attempt: None when it succeeded, else its error."""
    if error is not None:
        UPLOAD_ERRORS.inc()
    UPLOAD_FAILING.set(0 if error is None else 1)
    LAST_UPLOAD_ERROR.info({"error": error or ""})
