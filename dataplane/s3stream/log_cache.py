"""LogCache: the recent, acknowledged batches of every stream, in memory.

Appends land here once the WAL has made them durable. Batches not yet uploaded wait for
the uploader; uploaded ones stay for tail reads until the byte budget needs the room (oldest
uploaded first). Pure data structure, no I/O; the caller serializes access with its lock.

The uploader's calls (`take_pending`, `mark_uploaded`) run under the engine's lock that every
acknowledged append needs too (the WAL's committer puts each batch here before the produce is
answered), so they do no per-batch Python work: the pending batches are kept in parallel lists
with cumulative byte counts, and a chunk is cut by bisection and sliced; `mark_uploaded`
touches each stream once, and returns the batches it evicted so that the caller frees them
after releasing the lock (a per-batch loop over one upload's ~6,000 batches held the lock
for 5-10 ms, and every acknowledgement waited behind it).
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
    # bytes of this stream's batches ever added, up to and including each batch
    bytes_through: list[int] = field(default_factory=list)
    uploaded_end: int = -1  # offsets below it are in committed objects

    def append(self, batch: StreamRecordBatch, size_bytes: int) -> None:
        self.batches.append(batch)
        self.starts.append(batch.base_offset)
        self.bytes_through.append(
            (self.bytes_through[-1] if self.bytes_through else 0) + size_bytes
        )

    def uploaded_count(self) -> int:
        """How many batches from the head lie wholly below `uploaded_end` (batches are
        contiguous: each one's end is the next one's start)."""
        n = bisect.bisect_right(self.starts, self.uploaded_end)
        if n and self.batches[n - 1].last_offset > self.uploaded_end:
            n -= 1
        return n

    def drop_head(self, count: int) -> tuple[int, list[StreamRecordBatch]]:
        """Forget the first `count` batches: (their bytes, the batches themselves)."""
        if count <= 0:
            return 0, []
        before = self.bytes_through[0] - self.batches[0].size_bytes
        dropped = self.bytes_through[count - 1] - before
        gone = self.batches[:count]
        del self.batches[:count]
        del self.starts[:count]
        del self.bytes_through[:count]
        return dropped, gone


class LogCache:
    """Per-stream ordered batches with a byte budget for already-uploaded data."""

    def __init__(self, max_uploaded_bytes: int):
        self.max_uploaded_bytes = max_uploaded_bytes
        self._streams: dict[int, _StreamCache] = {}
        self.total_bytes = 0
        self.pending_upload_bytes = 0
        # the batches not uploaded yet, in WAL order, in parallel lists: each batch, the WAL
        # offset just past it, the bytes ever put up to and including it, and the monotonic
        # second it was acknowledged
        self._pending: list[StreamRecordBatch] = []
        self._pending_wal_next: list[int] = []
        self._pending_bytes_through: list[int] = []
        self._pending_acked_s: list[float] = []
        self._bytes_put = 0
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
        size = batch.size_bytes
        cache.append(batch, size)
        self.total_bytes += size
        self.pending_upload_bytes += size
        self._bytes_put += size
        self._pending.append(batch)
        self._pending_wal_next.append(wal_next_offset)
        self._pending_bytes_through.append(self._bytes_put)
        self._pending_acked_s.append(time.monotonic() if acked_s is None else acked_s)

    def pending_wal_end(self) -> int:
        """WAL offset just past the last batch not uploaded yet (-1 if none)."""
        return self._pending_wal_next[-1] if self._pending else -1

    def oldest_pending_acked_s(self) -> float | None:
        """When the oldest batch not uploaded yet was acknowledged (None if none)."""
        return self._pending_acked_s[0] if self._pending else None

    def take_pending(
        self, max_bytes: int, up_to_wal_offset: int | None = None
    ) -> tuple[list[StreamRecordBatch], int]:
        """Up to `max_bytes` of not-yet-uploaded batches in WAL order (at least one), none
        past `up_to_wal_offset`, and the WAL offset up to which the WAL may be trimmed once
        they are committed. O(log n): bisection and one slice."""
        if not self._pending:
            return [], -1
        before = self._pending_bytes_through[0] - self._pending[0].size_bytes
        count = max(1, bisect.bisect_right(self._pending_bytes_through, before + max_bytes))
        if up_to_wal_offset is not None:
            count = min(count, bisect.bisect_right(self._pending_wal_next, up_to_wal_offset))
        if count == 0:
            return [], -1
        return self._pending[:count], self._pending_wal_next[count - 1]

    def mark_uploaded(self, batches: list[StreamRecordBatch]) -> list[StreamRecordBatch]:
        """The first len(batches) pending batches are committed: they become evictable.
        Returns the batches evicted meanwhile (the caller drops them once its lock is
        released: freeing thousands of batches is work too)."""
        n = len(batches)
        if n == 0:
            return []
        assert self._pending[:n] == batches, "uploads must follow WAL order"
        before = self._pending_bytes_through[0] - self._pending[0].size_bytes
        self.pending_upload_bytes -= self._pending_bytes_through[n - 1] - before
        # each stream's last batch in the chunk, found from the end; latest first
        last_of: dict[int, StreamRecordBatch] = {}
        streams = len(self._streams)
        for batch in reversed(batches):
            if batch.stream_id not in last_of:
                last_of[batch.stream_id] = batch
                if len(last_of) == streams:
                    break
        for stream_id, batch in reversed(last_of.items()):
            cache = self._streams.get(stream_id)
            if cache is not None:
                cache.uploaded_end = max(cache.uploaded_end, batch.last_offset)
                self._evictable[stream_id] = None
                self._evictable.move_to_end(stream_id)
        del self._pending[:n]
        del self._pending_wal_next[:n]
        del self._pending_bytes_through[:n]
        del self._pending_acked_s[:n]
        return self._evict()

    def _evict(self) -> list[StreamRecordBatch]:
        evicted: list[StreamRecordBatch] = []
        uploaded = self.total_bytes - self.pending_upload_bytes
        while uploaded > self.max_uploaded_bytes and self._evictable:
            stream_id, _ = self._evictable.popitem(last=False)
            cache = self._streams.get(stream_id)
            if cache is None:
                continue
            dropped, gone = cache.drop_head(cache.uploaded_count())
            evicted += gone
            self.total_bytes -= dropped
            uploaded -= dropped
        return evicted

    def drop_stream(self, stream_id: int) -> None:
        """Forget a stream (closed after its data was uploaded)."""
        cache = self._streams.pop(stream_id, None)
        if cache is None:
            return
        if any(b.stream_id == stream_id for b in self._pending):
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
