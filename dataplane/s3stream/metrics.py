"""Prometheus metrics of the storage engine (names start with `automq_`; see docs)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

UPLOADS = Counter("automq_stream_uploads_total", "WAL uploads committed (one or more objects each)")
UPLOAD_BYTES = Counter("automq_stream_upload_bytes_total", "bytes of objects uploaded")
UPLOAD_LATENCY = Histogram("automq_stream_upload_latency_seconds",
                           "prepare + put + commit of one upload",
                           buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
WAL_CACHE_BYTES = Gauge("automq_stream_wal_cache_bytes", "acknowledged bytes not yet uploaded")
BLOCK_CACHE_BYTES = Gauge("automq_block_cache_bytes", "bytes held by the block cache")
BLOCK_CACHE_HITS = Counter("automq_block_cache_hits_total", "block reads served from the cache")
BLOCK_CACHE_MISSES = Counter("automq_block_cache_misses_total", "block reads that went to S3")
