"""The time index of a partition: timestamp -> offset in O(log n) reads.

Kafka keeps a time index per segment (AutoMQ keeps it in a stream of its own). Here the
"segments" are the stream's pieces in object storage (the metadata's `ObjectRange`s, one per
uploaded object, oldest first) plus the tail still in the WAL. Each piece's largest timestamp
is the max timestamp of its last batch: one ranged read of one block, cached for the life of
the broker (objects never change). ListOffsets by timestamp binary-searches the pieces for the
first one whose largest timestamp reaches the target (O(log n) reads), then reads that piece's
batches and the records of the first batch that reaches it: the answer is the first *record*
at or after the timestamp, as Kafka answers. When timestamps grow with offsets (LogAppendTime,
or producers' CreateTime in order) this is exactly Kafka's answer; with producers' clocks out
of order a record in an earlier piece may be missed, as a sparse index would miss it.

MAX_TIMESTAMP (-3, KIP-734) is the record with the largest timestamp: the newest
`MAX_PIECES_FOR_MAX_TIMESTAMP` pieces are compared by their cached timestamps, then the
record is located in the best piece or in the WAL tail.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from controlplane.image import MetadataImage
from dataplane.formats.record_batch import InvalidRecordBatchError, parse_batches, record_timestamps
from dataplane.kafka.partition_backend import OffsetAndTimestamp
from dataplane.s3stream.storage import Stream

MAX_CACHED_PIECES = 200_000  # (object id, end offset) -> largest timestamp, per broker
SCAN_MAX_BYTES = 256 * 1024 * 1024  # the most one lookup reads after the binary search
READ_BYTES = 1024 * 1024
MAX_PIECES_FOR_MAX_TIMESTAMP = 1_000
NOT_FOUND = OffsetAndTimestamp(-1, -1)


@dataclass(frozen=True)
class StoredPiece:
    """One piece of a stream in object storage: offsets [start, end) in one object."""

    object_id: int
    start_offset: int
    end_offset: int
    size_bytes: int


def stored_pieces(image: MetadataImage | None, stream_id: int) -> list[StoredPiece]:
    """The stream's pieces in object storage, oldest first, with their byte sizes (pure;
    a stream-set object's bytes are shared by offset count among its streams)."""
    stream = image.streams.get(stream_id) if image is not None else None
    if stream is None:
        return []
    pieces = []
    for rng in stream.object_ranges:
        meta = image.objects.get(rng.object_id)
        if meta is None:
            continue
        span = rng.end_offset - rng.start_offset
        if rng.kind == "so":
            so = image.stream_objects.get(rng.object_id)
            total = (so.end_offset - so.start_offset) if so else span
        else:
            sso = image.stream_set_objects.get(rng.object_id)
            total = sum(r.end_offset - r.start_offset for r in sso.ranges) if sso else span
        size = meta.size_bytes * span // total if total > 0 else 0
        pieces.append(StoredPiece(rng.object_id, rng.start_offset, rng.end_offset, size))
    return pieces


class PieceTimestamps:
    """Largest timestamp of each stored piece, read once (bounded LRU).

    Thread-safety: safe from any thread; a piece read by two threads at once is read twice.
    """

    def __init__(self, max_entries: int = MAX_CACHED_PIECES):
        self._max_entries = max_entries
        self._cache: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._lock = threading.Lock()

    def max_timestamp(self, stream: Stream, piece: StoredPiece) -> int | None:
        """The max timestamp of the piece's last batch (None if it cannot be read)."""
        key = (piece.object_id, piece.end_offset)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        batches = stream.fetch(piece.end_offset - 1, piece.end_offset, 1)
        if not batches:
            return None
        headers = parse_batches(batches[-1].payload, verify_crc=False, client_origin=False)
        if not headers:
            return None
        ts = max(h.max_timestamp for h in headers)
        with self._lock:
            self._cache[key] = ts
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        return ts


def _scan(stream: Stream, start: int, end: int, target: int, budget: list[int]):
    """The first record in [start, end) with a timestamp >= target (None if none)."""
    offset = start
    while offset < end and budget[0] > 0:
        batches = stream.fetch(offset, end, READ_BYTES)
        if not batches:
            return None
        for b in batches:
            budget[0] -= len(b.payload)
            for h in parse_batches(b.payload, verify_crc=False, client_origin=False):
                if h.max_timestamp < target or h.base_offset + h.last_offset_delta < start:
                    continue
                try:
                    for rec_offset, ts in record_timestamps(h):
                        if ts >= target and rec_offset >= start:
                            return OffsetAndTimestamp(rec_offset, ts)
                except InvalidRecordBatchError:
                    return OffsetAndTimestamp(max(h.base_offset, start), h.max_timestamp)
        offset = batches[-1].last_offset
    return None


def offset_for_timestamp(
    stream: Stream,
    pieces: list[StoredPiece],
    log_start: int,
    high_watermark: int,
    target: int,
    timestamps: PieceTimestamps,
) -> OffsetAndTimestamp:
    """The first record at or after `target` (see the module docstring)."""
    live = [p for p in pieces if p.end_offset > log_start]
    lo, hi = 0, len(live)  # binary search: the first piece whose largest timestamp >= target
    while lo < hi:
        mid = (lo + hi) // 2
        ts = timestamps.max_timestamp(stream, live[mid])
        if ts is not None and ts >= target:
            hi = mid
        else:
            lo = mid + 1
    budget = [SCAN_MAX_BYTES]
    start = max(live[lo].start_offset, log_start) if lo < len(live) else log_start
    if lo == len(live) and live:
        start = max(live[-1].end_offset, log_start)  # only the WAL tail can hold it
    found = _scan(stream, start, high_watermark, target, budget)
    return found if found is not None else NOT_FOUND


def max_timestamp_offset(
    stream: Stream,
    pieces: list[StoredPiece],
    log_start: int,
    high_watermark: int,
    timestamps: PieceTimestamps,
) -> OffsetAndTimestamp:
    """The record with the largest timestamp (the first one if several share it)."""
    live = [p for p in pieces if p.end_offset > log_start][-MAX_PIECES_FOR_MAX_TIMESTAMP:]
    best_ts, best_piece = -1, None
    for piece in live:
        ts = timestamps.max_timestamp(stream, piece)
        if ts is not None and ts > best_ts:
            best_ts, best_piece = ts, piece
    tail_start = max(live[-1].end_offset, log_start) if live else log_start
    tail_best = _largest(stream, tail_start, high_watermark)
    if tail_best is not None and tail_best.timestamp_ms > best_ts:
        return tail_best
    if best_piece is None:
        return NOT_FOUND
    start = max(best_piece.start_offset, log_start)
    found = _scan(stream, start, best_piece.end_offset, best_ts, [SCAN_MAX_BYTES])
    return found if found is not None else OffsetAndTimestamp(best_piece.end_offset - 1, best_ts)


def _largest(stream: Stream, start: int, end: int) -> OffsetAndTimestamp | None:
    """The record with the largest timestamp in [start, end) (bounded read)."""
    best: OffsetAndTimestamp | None = None
    offset, budget = start, SCAN_MAX_BYTES
    while offset < end and budget > 0:
        batches = stream.fetch(offset, end, READ_BYTES)
        if not batches:
            break
        for b in batches:
            budget -= len(b.payload)
            for h in parse_batches(b.payload, verify_crc=False, client_origin=False):
                if best is not None and h.max_timestamp <= best.timestamp_ms:
                    continue
                try:
                    for rec_offset, ts in record_timestamps(h):
                        if rec_offset >= start and (best is None or ts > best.timestamp_ms):
                            best = OffsetAndTimestamp(rec_offset, ts)
                except InvalidRecordBatchError:
                    best = OffsetAndTimestamp(h.base_offset, h.max_timestamp)
        offset = batches[-1].last_offset
    return best
