"""LogCache: the recent, acknowledged batches of every stream, in memory.

Appends land here once the WAL has made them durable. Batches not yet uploaded wait for
the uploader; uploaded ones stay for tail reads until the byte budget needs the room (oldest
uploaded first). Pure data structure, no I/O; the caller serializes access with its lock.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from dataplane.formats.stream_records import StreamRecordBatch


@dataclass
class _StreamCache:
    batches: list[StreamRecordBatch] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)  # base offsets, for bisect
    uploaded_end: int = -1  # offsets below it are in committed objects

    def append(self, batch: StreamRecordBatch) -> None:
        self.batches.append(batch)
        self.starts.append(batch.base_offset)

    def drop_head(self, count: int) -> int:
        dropped = sum(b.size_bytes for b in self.batches[:count])
        del self.batches[:count]
        del self.starts[:count]
        return dropped


class LogCache:
    """Per-stream ordered batches with a byte budget for already-uploaded data."""

    def __init__(self, max_uploaded_bytes: int):
        self.max_uploaded_bytes = max_uploaded_bytes
        self._streams: dict[int, _StreamCache] = {}
        self.total_bytes = 0
        self.pending_upload_bytes = 0
        # (batch, wal next offset, monotonic s it was acknowledged), in WAL order
        self._pending: list[tuple[StreamRecordBatch, int, float]] = []
        # streams in the order their uploaded data became evictable
        self._evictable: OrderedDict[int, None] = OrderedDict()

    # ------------------------------------------------------------ write side

    def put(
        self, batch: StreamRecordBatch, wal_next_offset: int, acked_s: float | None = None
    ) -> None:
        """Add an acknowledged batch (in WAL order); `acked_s` is when it was acknowledged
        (time.monotonic(), the default), for the upload lag."""
        cache = self._streams.setdefault(batch.stream_id, _StreamCache())
        if cache.batches and cache.batches[-1].last_offset != batch.base_offset:
            raise ValueError(
                f"stream {batch.stream_id}: batch at {batch.base_offset} does not "
                f"follow {cache.batches[-1].last_offset}"
            )
        cache.append(batch)
        self.total_bytes += batch.size_bytes
        self.pending_upload_bytes += batch.size_bytes
        self._pending.append(
            (batch, wal_next_offset, time.monotonic() if acked_s is None else acked_s)
        )

    def pending_wal_end(self) -> int:
        """WAL offset just past the last batch not uploaded yet (-1 if none)."""
        return self._pending[-1][1] if self._pending else -1

    def oldest_pending_acked_s(self) -> float | None:
        """When the oldest batch not uploaded yet was acknowledged (None if none)."""
        return self._pending[0][2] if self._pending else None

    def take_pending(
        self, max_bytes: int, up_to_wal_offset: int | None = None
    ) -> tuple[list[StreamRecordBatch], int]:
        """Up to `max_bytes` of not-yet-uploaded batches in WAL order (at least one), none
        past `up_to_wal_offset`, and the WAL offset up to which the WAL may be trimmed once
        they are committed."""
        taken: list[StreamRecordBatch] = []
        size = 0
        wal_end = -1
        i = 0
        while i < len(self._pending) and (
            not taken or size + self._pending[i][0].size_bytes <= max_bytes
        ):
            batch, wal_next, _ = self._pending[i]
            if up_to_wal_offset is not None and wal_next > up_to_wal_offset:
                break
            taken.append(batch)
            size += batch.size_bytes
            wal_end = wal_next
            i += 1
        return taken, wal_end

    def mark_uploaded(self, batches: list[StreamRecordBatch]) -> None:
        """The first len(batches) pending batches are committed: they become evictable."""
        n = len(batches)
        assert [p[0] for p in self._pending[:n]] == batches, "uploads must follow WAL order"
        del self._pending[:n]
        for batch in batches:
            self.pending_upload_bytes -= batch.size_bytes
            cache = self._streams.get(batch.stream_id)
            if cache is not None:
                cache.uploaded_end = max(cache.uploaded_end, batch.last_offset)
                self._evictable[batch.stream_id] = None
                self._evictable.move_to_end(batch.stream_id)
        self._evict()

    def _evict(self) -> None:
        uploaded = self.total_bytes - self.pending_upload_bytes
        while uploaded > self.max_uploaded_bytes and self._evictable:
            stream_id, _ = self._evictable.popitem(last=False)
            cache = self._streams.get(stream_id)
            if cache is None:
                continue
            n = bisect.bisect_right([b.last_offset for b in cache.batches], cache.uploaded_end)
            dropped = cache.drop_head(n)
            self.total_bytes -= dropped
            uploaded -= dropped

    def drop_stream(self, stream_id: int) -> None:
        """Forget a stream (closed after its data was uploaded)."""
        cache = self._streams.pop(stream_id, None)
        if cache is None:
            return
        if any(p[0].stream_id == stream_id for p in self._pending):
            self._streams[stream_id] = cache  # still to upload: keep it
            return
        self.total_bytes -= sum(b.size_bytes for b in cache.batches)
        self._evictable.pop(stream_id, None)

    # ------------------------------------------------------------ read side

    def start_offset(self, stream_id: int) -> int | None:
        """Lowest offset the cache can serve for the stream (None if it holds nothing)."""
        cache = self._streams.get(stream_id)
        if cache is None or not cache.batches:
            return None
        return cache.batches[0].base_offset

    def has_pending(self, stream_id: int) -> bool:
        cache = self._streams.get(stream_id)
        return (
            cache is not None
            and bool(cache.batches)
            and cache.batches[-1].last_offset > cache.uploaded_end
        )

    def read(
        self, stream_id: int, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """Batches overlapping [start, end), whole, until max_bytes (at least one)."""
        cache = self._streams.get(stream_id)
        if cache is None or not cache.batches:
            return []
        i = max(bisect.bisect_right(cache.starts, start_offset) - 1, 0)
        out: list[StreamRecordBatch] = []
        size = 0
        while i < len(cache.batches):
            batch = cache.batches[i]
            i += 1
            if batch.last_offset <= start_offset:
                continue
            if batch.base_offset >= end_offset:
                break
            if out and size + batch.size_bytes > max_bytes:
                break
            out.append(batch)
            size += batch.size_bytes
        return out
