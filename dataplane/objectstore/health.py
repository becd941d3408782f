"""Write health per bucket, as seen by one process: the input of object-storage failover.

Every write (uploads and the broker's small probe writes) ends in `record_ok` or
`record_failure`; `snapshot()` says per bucket how long writes have been failing (since the
first failure after the last success) or healthy (since the last failure), with counts, the
last latency and the last error. Brokers send it with their heartbeats.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

MAX_ERROR_CHARS = 500


@dataclass(frozen=True)
class BucketHealth:
    """One bucket's write health at one moment."""

    bucket_id: int
    failing_for_ms: int  # 0 when the last write succeeded
    healthy_for_ms: int  # 0 while failing
    # time since the most recent failed write (None: none yet): lets the controller tell a
    # failure seen after its last switch from the memory of an outage before it
    last_failure_age_ms: int | None
    write_errors: int
    writes_ok: int
    last_latency_ms: float | None
    last_error: str | None


@dataclass
class _State:
    first_failure_s: float | None = None  # monotonic; None while healthy
    last_ok_s: float | None = None  # when the last successful write ended
    last_failure_s: float | None = None
    errors: int = 0
    ok: int = 0
    last_latency_ms: float | None = None
    last_error: str | None = None


class WriteHealthTracker:
    """Thread-safe: written by every writing thread, read by the heartbeat thread."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._started_s = clock()
        self._buckets: dict[int, _State] = {}

    def record_ok(self, bucket_id: int, latency_s: float) -> None:
        with self._lock:
            st = self._buckets.setdefault(bucket_id, _State())
            st.ok += 1
            st.first_failure_s = None
            st.last_ok_s = self._clock()
            st.last_latency_ms = latency_s * 1000

    def record_failure(
        self, bucket_id: int, error: BaseException | str, started_s: float | None = None
    ) -> None:
        """A failed write; `started_s` (monotonic, the same clock): when it began, so a
        write that hung until its timeout counts as failing from its start, but never from
        before a write that succeeded since (a request that hung through an outage and fails
        after the bucket recovered must not make the bucket look failing for the whole
        outage: that moved writes back to the failover bucket right after the operator had
        switched them to the recovered one)."""
        now = self._clock()
        with self._lock:
            st = self._buckets.setdefault(bucket_id, _State())
            st.errors += 1
            if st.first_failure_s is None:
                start = min(now, started_s) if started_s is not None else now
                if st.last_ok_s is not None:
                    start = max(start, st.last_ok_s)
                st.first_failure_s = start
            st.last_failure_s = now
            st.last_error = str(error)[:MAX_ERROR_CHARS]

    def failing_for_ms(self, bucket_id: int) -> int:
        """How long writes to `bucket_id` have been failing; 0 if the last one succeeded."""
        with self._lock:
            st = self._buckets.get(bucket_id)
            if st is None or st.first_failure_s is None:
                return 0
            return max(1, int((self._clock() - st.first_failure_s) * 1000))

    def snapshot(self) -> list[BucketHealth]:
        now = self._clock()
        with self._lock:
            out = []
            for bucket_id, st in sorted(self._buckets.items()):
                failing = st.first_failure_s is not None
                since_ok = st.last_failure_s if st.last_failure_s is not None else self._started_s
                out.append(
                    BucketHealth(
                        bucket_id=bucket_id,
                        failing_for_ms=max(1, int((now - st.first_failure_s) * 1000))
                        if failing
                        else 0,
                        healthy_for_ms=0 if failing else int((now - since_ok) * 1000),
                        last_failure_age_ms=None
                        if st.last_failure_s is None
                        else int((now - st.last_failure_s) * 1000),
                        write_errors=st.errors,
                        writes_ok=st.ok,
                        last_latency_ms=st.last_latency_ms,
                        last_error=st.last_error if failing else None,
                    )
                )
            return out
