"""LogCache pending-upload selection: an upload takes only what was pending when it began,
so a flush or a stream close under steady produce load finishes."""

from __future__ import annotations

from dataplane.s3stream.log_cache import LogCache
from dataplane.s3stream.records import StreamRecordBatch


def test_take_pending_stops_at_the_wal_offset_snapshot():
    cache = LogCache()
    for i in range(3):
        cache.put(StreamRecordBatch(1, 0, i, 1, b"x" * 10), wal_next_offset=(i + 1) * 100)
    target = cache.pending_wal_end()
    assert target == 300
    cache.put(StreamRecordBatch(1, 0, 3, 1, b"x" * 10), wal_next_offset=400)  # arrives later
    batches, wal_end = cache.take_pending(1 << 20, target)
    assert [b.base_offset for b in batches] == [0, 1, 2] and wal_end == 300
    cache.mark_uploaded(batches)
    assert cache.take_pending(1 << 20, target) == ([], -1)
    batches, wal_end = cache.take_pending(1 << 20)
    assert [b.base_offset for b in batches] == [3] and wal_end == 400


def test_nothing_pending_has_no_wal_end():
    assert LogCache().pending_wal_end() == -1
