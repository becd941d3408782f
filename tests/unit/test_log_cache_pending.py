"""LogCache pending-upload selection: an upload takes only what was pending when it began,
so a flush or a stream close under steady produce load finishes."""

from __future__ import annotations

from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream.log_cache import LogCache


def test_take_pending_stops_at_the_wal_offset_snapshot():
    cache = LogCache(256 << 20)
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
    assert LogCache(256 << 20).pending_wal_end() == -1


def test_a_cancelled_produce_future_does_not_break_the_append(tmp_path, monkeypatch, caplog):
    """The Kafka layer cancels the future of a produce whose client timed out; when the WAL
    later makes the batch durable the stream still advances, and the engine's callback does
    not fail (it used to raise InvalidStateError, logged as a traceback per batch)."""
    import logging
    from concurrent.futures import Future

    from tests.unit.inprocess_broker import inprocess_broker

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with inprocess_broker(tmp_path) as (apis, controller, sync):
        storage = apis.partitions.storage
        stream = storage.open_stream(storage.create_stream(), 0)
        wal_future: Future = Future()  # the WAL's answer, held back until after the cancel
        written: list[Future] = []
        real_append = storage.wal.append

        def held_append(data, body_crc32c=None):
            written.append(real_append(data, body_crc32c))
            return wal_future

        monkeypatch.setattr(storage.wal, "append", held_append)
        produced = stream.append(b"x")
        assert produced.cancel()  # the client gave up while the WAL write was in flight
        with caplog.at_level(logging.ERROR, logger="concurrent.futures"):
            wal_future.set_result(written[0].result(10))
        assert not [r for r in caplog.records if r.name == "concurrent.futures"]
        assert stream.next_offset == 1  # the batch is durable and readable all the same


def test_uploads_in_chunks_keep_the_byte_counts_and_evict_only_uploaded_batches():
    """Chunks cut by bytes and by the WAL snapshot; after each chunk is marked uploaded the
    pending and total bytes match the batches still held, eviction keeps the budget, drops
    only uploaded batches (oldest stream first) and hands them back to the caller."""
    payload = b"p" * 1000
    size = StreamRecordBatch(0, 0, 0, 1, payload).size_bytes
    cache = LogCache(max_uploaded_bytes=10 * size)
    wal = 0
    for i in range(60):  # three streams, interleaved, two records per batch
        wal += size
        cache.put(StreamRecordBatch(i % 3, 0, (i // 3) * 2, 2, payload), wal)
    assert cache.pending_upload_bytes == cache.total_bytes == 60 * size
    evicted_total = 0
    chunks = []
    while True:
        batches, wal_end = cache.take_pending(7 * size + 1, 45 * size)
        if not batches:
            break
        assert wal_end == (sum(len(c) for c in chunks) + len(batches)) * size
        chunks.append(batches)
        evicted = cache.mark_uploaded(batches)
        evicted_total += len(evicted)
        assert all(b.last_offset <= 2 * (sum(len(c) for c in chunks) // 3 + 1) for b in evicted)
        assert cache.total_bytes - cache.pending_upload_bytes <= 10 * size
    assert [len(c) for c in chunks] == [7, 7, 7, 7, 7, 7, 3]  # 45 batches up to the snapshot
    assert cache.pending_upload_bytes == 15 * size
    assert cache.total_bytes == 25 * size and evicted_total == 35
    # what is left of each stream starts at an uploaded batch or a pending one, contiguous
    for sid in range(3):
        start = cache.start_offset(sid)
        held = cache.read(sid, start, 10**6, 10**9)
        assert [b.base_offset for b in held] == list(range(start, 40, 2))
    assert cache.take_pending(1)[0][0].base_offset == 30  # at least one, in WAL order
    assert cache.oldest_pending_acked_s() is not None


def test_a_chunk_smaller_than_one_batch_still_takes_one():
    cache = LogCache(1 << 20)
    cache.put(StreamRecordBatch(1, 0, 0, 1, b"x" * 100), wal_next_offset=200)
    batches, wal_end = cache.take_pending(1)
    assert len(batches) == 1 and wal_end == 200
    assert cache.take_pending(1, up_to_wal_offset=199) == ([], -1)
