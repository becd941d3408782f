"""Catch-up readahead of a sweeping StreamReader: the next read's blocks are loaded while the
previous answer travels, long runs go out as several GETs in flight, and the readahead of
all readers stays within the fetcher's budget (an in-memory store with latency)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from dataplane.formats.object_format import ObjectWriter, parse_object
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream import stream_reader as sr
from dataplane.s3stream.block_cache import BlockCache
from dataplane.s3stream.stream_reader import BlockFetcher, ObjectLocation, StreamReader, split_run

KIB = 1024
PAYLOAD = 2 * KIB
BATCHES = 64  # per stream: 128 KiB of payload
BLOCK = 8 * KIB  # ~4 batches per block


class SlowStorage:
    """In-memory objects served after `delay_s`, on a pool; records every GET and how many
    were in flight at once. A GET waits (up to `delay_s`) for `together` GETs to be in
    flight, so GETs issued together are seen together even on a loaded machine."""

    def __init__(self, objects: dict[str, bytes], delay_s: float = 0.05, together: int = 1):
        self.objects = objects
        self.delay_s = delay_s
        self.together = together
        self.gets: list[tuple[str, int, int]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.cond = threading.Condition()
        self.pool = ThreadPoolExecutor(16)

    def get_range(self, bucket_id, key, start, end, priority=None) -> bytes:
        return self.objects[key][start:end]

    def _serve(self, key: str, start: int, end: int) -> bytes:
        with self.cond:
            self.cond.wait_for(lambda: self.in_flight >= self.together, timeout=self.delay_s)
        time.sleep(self.delay_s)
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()
        return self.objects[key][start:end]

    def get_range_async(
        self, bucket_id, key, start, end, priority=None, max_gap_bytes=None, merge=True
    ) -> Future:
        with self.cond:
            self.gets.append((key, start, end))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.cond.notify_all()
        return self.pool.submit(self._serve, key, start, end)

    def idle(self, timeout_s: float = 10.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.in_flight == 0, timeout=timeout_s)


def build(streams: int = 1, object_id: int = 9):
    w = ObjectWriter(block_size_bytes=BLOCK)
    for sid in range(streams):
        for i in range(BATCHES):
            w.add(StreamRecordBatch(sid, 0, i, 1, bytes([sid, i % 251]) * (PAYLOAD // 2)))
    obj = w.finish()
    _, index = parse_object(obj.data)
    return obj.data, index, ObjectLocation(object_id, 0, len(obj.data), 0, BATCHES)


class Locator:
    def __init__(self, loc: ObjectLocation):
        self.loc = loc

    def locate(self, stream_id, start_offset, end_offset, limit):
        return [self.loc]


def reader_setup(streams=1, delay_s=0.05, together=1, **fetcher_kw):
    data, index, loc = build(streams)
    storage = SlowStorage({sr.object_key(loc.object_id): data}, delay_s, together)
    cache = BlockCache(64 * 1024 * 1024)
    fetcher = BlockFetcher(storage, cache, prefetch_span_bytes=0, **fetcher_kw)
    index_cache = sr.IndexCache(storage)
    return storage, cache, fetcher, index, loc, index_cache


def test_split_run_cuts_long_runs_into_bounded_adjacent_pieces():
    _, index, _ = build()
    run = list(index)
    for limit in (BLOCK, 3 * BLOCK, 40 * KIB, 10**9):
        pieces = split_run(run, limit)
        assert [e for p in pieces for e in p] == run  # every block once, in order
        for p in pieces:
            assert p[-1].end_position - p[0].position <= max(limit, p[0].size)
            assert all(a.end_position == b.position for a, b in zip(p, p[1:]))
    assert split_run(run, 10**9) == [run]
    sizes = [p[-1].end_position - p[0].position for p in split_run(run, 40 * KIB)]
    assert max(sizes) - min(sizes) <= 2 * BLOCK  # about equal pieces


def test_a_sweeping_reader_has_the_next_read_in_flight_before_it_asks(monkeypatch):
    monkeypatch.setattr(sr, "MIN_READAHEAD_BYTES", 1)
    storage, cache, fetcher, index, loc, index_cache = reader_setup()
    reader = StreamReader(0, 0, Locator(loc), index_cache, fetcher)
    ask = 32 * KIB
    first = reader.read(0, BATCHES, ask)
    assert first and sum(b.size_bytes for b in first) <= ask
    # the read stopped at max_bytes: the next `ask` bytes are already planned and loading
    assert reader.readahead_bytes >= ask
    assert reader.held_bytes >= ask
    storage.idle()
    misses = reader.misses
    second = reader.read(reader.next_offset, BATCHES, ask)
    assert second[0].base_offset == first[-1].last_offset
    assert reader.misses == misses  # found loaded: no wait
    offset = reader.next_offset
    while offset < BATCHES:  # the rest, in order, every payload intact
        out = reader.read(offset, BATCHES, ask)
        assert out and out[0].base_offset == offset
        assert all(b.payload == bytes([0, b.base_offset % 251]) * (PAYLOAD // 2) for b in out)
        # ... and a read-only view of the GET's body, not a copy of it
        assert all(isinstance(b.payload, memoryview) and b.payload.readonly for b in out)
        offset = reader.next_offset
    reader.release()
    storage.idle()
    assert cache.used_bytes == 0 and cache.watcher_count == 0
    assert fetcher.readahead_held_bytes == 0


def test_a_long_run_of_blocks_is_read_with_several_gets_in_flight(monkeypatch):
    monkeypatch.setattr(sr, "MIN_READAHEAD_BYTES", 1)
    storage, cache, fetcher, index, loc, index_cache = reader_setup(
        delay_s=0.2, together=3, max_get_bytes=3 * BLOCK
    )
    reader = StreamReader(0, 0, Locator(loc), index_cache, fetcher)
    out = reader.read(0, BATCHES, 96 * KIB)
    assert [b.base_offset for b in out] == list(range(len(out)))
    block_gets = [g for g in storage.gets if g[2] <= index[-1].end_position]
    assert len(block_gets) >= 4
    assert all(end - start <= 3 * BLOCK + BLOCK for _, start, end in block_gets)
    assert storage.max_in_flight >= 3  # issued together, not one after the other
    reader.release()
    storage.idle()
    # blocks given up while in flight stay only as evictable (LRU) blocks
    assert cache.watcher_count == 0 and fetcher.readahead_held_bytes == 0
    cache.max_bytes = 1
    cache.keep_unwatched((0, 0), [], 1)
    assert cache.used_bytes <= 1


@pytest.mark.parametrize("budget", [0, 20 * KIB])
def test_readahead_of_all_readers_stays_within_the_budget(monkeypatch, budget):
    monkeypatch.setattr(sr, "MIN_READAHEAD_BYTES", 1)
    streams = 4
    storage, cache, fetcher, index, loc, index_cache = reader_setup(
        streams=streams, delay_s=0.0, readahead_budget_bytes=budget
    )
    readers = [StreamReader(s, 0, Locator(loc), index_cache, fetcher) for s in range(streams)]
    got = {s: 0 for s in range(streams)}
    for _ in range(BATCHES):
        for r in readers:
            if r.next_offset >= BATCHES:
                continue
            out = r.read(r.next_offset, BATCHES, 16 * KIB)
            assert out[0].base_offset == got[r.stream_id]
            got[r.stream_id] = out[-1].last_offset
            assert fetcher.readahead_held_bytes <= budget
    assert got == {s: BATCHES for s in range(streams)}  # every reader progressed to the end
    for r in readers:
        r.release()
    storage.idle()
    assert fetcher.readahead_held_bytes == 0
    assert cache.used_bytes == 0 and cache.watcher_count == 0
