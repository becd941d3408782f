"""Prometheus metrics of the object-store layer (prometheus_client).

Exported series (all `automq_` prefixed):

* `automq_object_store_requests_total{op,bucket_id,status}` - one per HTTP attempt, so retries
  show up; status is one of `STATUSES`.
* `automq_object_store_bytes_total{op,bucket_id}` - payload bytes received (get) or sent (put).
* `automq_object_store_request_latency_seconds{op}` - histogram, per attempt.
* `automq_object_store_merged_ranges_total{bucket_id}` - range reads served by a GET that was
  shared with other range reads (range-read merging).

Registration is idempotent: `ObjectStoreMetrics(registry)` looks the collectors up in the
registry before creating them, so re-importing this module, reloading it, or building many
`ObjectStorage` instances never raises "Duplicated timeseries". Tests that want isolated
counts pass their own `CollectorRegistry`.
"""

from __future__ import annotations

import threading
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

OPS = ("put", "get", "head", "delete", "list", "head_bucket")
STATUSES = (
    "ok",
    "not_found",
    "precondition_failed",
    "access_denied",
    "invalid_range",
    "client_error",
    "server_error",
    "timeout",
    "connection_error",
)
LATENCY_BUCKETS_S = (
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
    10.0,
    30.0,
    60.0,
)

_lock = threading.Lock()


def _get_or_create(
    cls: type,
    name: str,
    documentation: str,
    labelnames: tuple[str, ...],
    registry: CollectorRegistry | None,
    **kwargs: Any,
) -> Any:
    """Return the collector `name` already in `registry`, or register a new one."""
    with _lock:
        if registry is not None:
            # prometheus_client has no public lookup; this dict is stable since 0.4
            existing = getattr(registry, "_names_to_collectors", {}).get(name)
            if existing is not None:
                if (
                    not isinstance(existing, cls)
                    or tuple(getattr(existing, "_labelnames", ())) != labelnames
                ):
                    raise ValueError(
                        f"metric {name} is already registered with another type or other labels"
                    )
                return existing
        return cls(name, documentation, labelnames, registry=registry, **kwargs)


class ObjectStoreMetrics:
    """The collectors, bound to one registry (the global one by default)."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.registry = registry
        self.requests = _get_or_create(
            Counter,
            "automq_object_store_requests_total",
            "Object store HTTP attempts by operation, bucket id and outcome",
            ("op", "bucket_id", "status"),
            registry,
        )
        self.bytes = _get_or_create(
            Counter,
            "automq_object_store_bytes_total",
            "Object store payload bytes by operation (get: received, put: sent) and bucket id",
            ("op", "bucket_id"),
            registry,
        )
        self.latency = _get_or_create(
            Histogram,
            "automq_object_store_request_latency_seconds",
            "Object store latency of one HTTP attempt, by operation",
            ("op",),
            registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.merged_ranges = _get_or_create(
            Counter,
            "automq_object_store_merged_ranges_total",
            "Range reads served by a GET shared with other range reads",
            ("bucket_id",),
            registry,
        )

    def observe(
        self, op: str, bucket_id: int, status: str, latency_s: float, n_bytes: int = 0
    ) -> None:
        """Record one attempt."""
        bid = str(bucket_id)
        self.requests.labels(op=op, bucket_id=bid, status=status).inc()
        self.latency.labels(op=op).observe(max(latency_s, 0.0))
        if n_bytes > 0:
            self.bytes.labels(op=op, bucket_id=bid).inc(n_bytes)

    def count_merged(self, bucket_id: int, n_ranges: int) -> None:
        if n_ranges > 0:
            self.merged_ranges.labels(bucket_id=str(bucket_id)).inc(n_ranges)


_default: ObjectStoreMetrics | None = None


def default_metrics() -> ObjectStoreMetrics:
    """The process-wide metrics on prometheus_client's global REGISTRY."""
    global _default
    if _default is None:
        _default = ObjectStoreMetrics(REGISTRY)
    return _default
