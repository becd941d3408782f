"""Time and size retention of the partitions a broker leads (Kafka's log retention).

Kafka deletes whole segments from the oldest while a segment is out of retention; here the
"segments" are the stream's pieces in object storage (`ObjectRange`s of the metadata: one per
uploaded object). A check (every `log.retention.check.interval.ms`, default 5 min) computes a
new log start offset per partition and trims the stream to it: the controller then marks the
objects that held only trimmed data destroyed and deletes them from their bucket after the
delay; partly trimmed objects are rewritten by compaction. Data still in the WAL (not
uploaded) is the active segment: it is never removed by retention.

- `retention.bytes` (>= 0): remove the oldest pieces while the rest still holds at least
  that many bytes (piece sizes: a stream object's size, or the stream's share of a
  stream-set object by offset count, an estimate).
- `retention.ms` (>= 0): remove the oldest pieces whose largest timestamp is older than
  now - retention.ms. The timestamp is the max timestamp of the piece's last batch (one
  ranged read, cached per piece, shared with the time index: `time_index.PieceTimestamps`),
  which equals Kafka's largest timestamp when timestamps grow with offsets.

Only topics whose `cleanup.policy` includes `delete` are touched.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from controlplane import topic_configs
from controlplane.image import MetadataImage
from dataplane.config import RETENTION_CHECK_INTERVAL_MS
from dataplane.kafka.time_index import PieceTimestamps, StoredPiece, stored_pieces

log = logging.getLogger(__name__)

MAX_TRIMS_PER_CHECK = 1_000  # partitions trimmed in one check (the rest wait for the next)


def retention_start_offset(
    pieces: list[StoredPiece],
    start_offset: int,
    now_ms: int,
    retention_ms: int,
    retention_bytes: int,
    max_timestamp: Callable[[StoredPiece], int | None],
) -> int | None:
    """The new log start offset, or None when nothing is out of retention (pure but for
    `max_timestamp`, called only on the oldest pieces until one is inside retention)."""
    live = [p for p in pieces if p.end_offset > start_offset]
    remaining = sum(p.size_bytes for p in live)
    new_start = None
    for piece in live:
        by_size = retention_bytes >= 0 and remaining - piece.size_bytes >= retention_bytes
        by_time = False
        if not by_size and retention_ms >= 0:
            ts = max_timestamp(piece)
            by_time = ts is not None and ts < now_ms - retention_ms
        if not (by_size or by_time):
            break
        remaining -= piece.size_bytes
        new_start = piece.end_offset
    return new_start


class RetentionManager:
    """Runs the retention check on a thread of its own over the partitions led here.

    Thread-safety: `check` may run on any thread (the manager's or a test's); it reads the
    image and the partition list, and trims through the partition (which serializes with
    appends and fetches itself); `PieceTimestamps` is thread-safe.
    """

    def __init__(
        self,
        image_fn: Callable[[], MetadataImage],
        partitions_fn: Callable[[], list],
        check_interval_ms: int = RETENTION_CHECK_INTERVAL_MS,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        timestamps: PieceTimestamps | None = None,
    ):
        self.image_fn = image_fn
        self.partitions_fn = partitions_fn
        self.check_interval_ms = check_interval_ms
        self.clock_ms = clock_ms
        self.last_check_ms: dict[tuple[str, int], int] = {}  # (topic id, partition) -> time
        # shared with the partitions' time index: each piece is read once per broker
        self.timestamps = timestamps or PieceTimestamps()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retention", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.check_interval_ms / 1000):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the next check tries again
                log.exception("retention check failed")

    def check(self) -> int:
        """One pass over the led partitions; returns how many were trimmed."""
        image = self.image_fn()
        trimmed = 0
        for plog in self.partitions_fn():
            if trimmed >= MAX_TRIMS_PER_CHECK or self._stop.is_set():
                break
            topic = image.topics.get(plog.topic_id)
            part = topic.partitions.get(plog.partition) if topic else None
            if part is None:
                continue
            configs = plog.configs()  # the topic's own, else the brokers' dynamic defaults
            policy = topic_configs.effective(configs, "cleanup.policy")
            if "delete" not in [p.strip() for p in policy.split(",")]:
                continue
            now_ms = self.clock_ms()
            new_start = retention_start_offset(
                stored_pieces(image, part.stream_id),
                plog.log_start_offset,
                now_ms,
                topic_configs.effective_int(configs, "retention.ms"),
                topic_configs.effective_int(configs, "retention.bytes"),
                lambda piece, plog=plog: self.timestamps.max_timestamp(plog.stream, piece),
            )
            self.last_check_ms[(plog.topic_id, plog.partition)] = now_ms
            if new_start is None or new_start <= plog.log_start_offset:
                continue
            try:
                plog.delete_records(new_start)
            except Exception as exc:  # noqa: BLE001 - a moved or fenced partition: next time
                log.warning("retention of %s-%d failed: %s", plog.topic, plog.partition, exc)
                continue
            trimmed += 1
            log.info("retention: %s-%d now starts at %d", plog.topic, plog.partition, new_start)
        return trimmed
