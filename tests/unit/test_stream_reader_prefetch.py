"""Catch-up prefetch in stream-set objects: layout, demand, segment-aligned GETs, backoff,
and StreamReaders that read every stream of an object through few GETs (no I/O)."""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from dataplane.formats.object_format import ObjectWriter, parse_object
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream import stream_reader as sr
from dataplane.s3stream.block_cache import BlockCache
from dataplane.s3stream.stream_reader import (
    BlockFetcher,
    ObjectDemand,
    ObjectLayout,
    ObjectLocation,
    StreamReader,
    contiguous,
)

STREAMS = 12
BATCHES = 3  # per stream
PAYLOAD = 600  # bytes per batch: one block per stream of ~1.9 KiB
SPAN = 8 * 1024  # prefetch segment of the tests


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeStorage:
    """In-memory objects; records every ranged GET."""

    def __init__(self, objects: dict[str, bytes]):
        self.objects = objects
        self.gets: list[tuple[str, int, int]] = []
        self.lock = threading.Lock()

    def get_range(self, bucket_id, key, start, end, priority=None) -> bytes:
        with self.lock:
            self.gets.append((key, start, end))
        return self.objects[key][start:end]

    def get_range_async(
        self, bucket_id, key, start, end, priority=None, max_gap_bytes=None, merge=True
    ) -> Future:
        assert max_gap_bytes == 0  # block reads never merge across other blocks
        fut: Future = Future()
        fut.set_result(self.get_range(bucket_id, key, start, end, priority))
        return fut


def build_sso(object_id: int = 7):
    w = ObjectWriter()
    for sid in range(STREAMS):
        for i in range(BATCHES):
            w.add(StreamRecordBatch(sid, 0, i, 1, bytes([sid]) * PAYLOAD))
    obj = w.finish()
    _, index = parse_object(obj.data)
    loc = ObjectLocation(object_id, 0, len(obj.data), 0, BATCHES)
    return obj.data, index, loc


class Locator:
    def __init__(self, loc: ObjectLocation):
        self.loc = loc

    def locate(self, stream_id, start_offset, end_offset, limit):
        return [self.loc]


def setup(clock=None, **cache_kw):
    data, index, loc = build_sso()
    storage = FakeStorage({sr.object_key(loc.object_id): data})
    cache = BlockCache(64 * 1024 * 1024, clock=clock or Clock(), **cache_kw)
    demand = ObjectDemand(min_streams=3, window_s=2.0, clock=clock or Clock())
    fetcher = BlockFetcher(
        storage, cache, prefetch_span_bytes=SPAN, demand=demand, clock=clock or Clock()
    )
    return storage, cache, fetcher, index, loc


def test_layout_and_contiguous_runs():
    _, index, _ = build_sso()
    layout = ObjectLayout.of(list(reversed(index)))
    assert layout.positions == sorted(e.position for e in index)
    assert layout.following(index[3].position)[0] == index[3]
    assert layout.following(index[3].position + 1) == []
    runs = contiguous([index[0], index[1], index[3]])
    assert [len(r) for r in runs] == [2, 1]


def test_demand_is_hot_only_with_enough_distinct_recent_streams():
    clock = Clock()
    demand = ObjectDemand(min_streams=3, window_s=2.0, max_objects=2, clock=clock)
    for _ in range(5):
        demand.note(1, 10)  # one stream, however often, is not demand
    assert not demand.hot(1)
    demand.note(1, 11)
    demand.note(1, 12)
    assert demand.hot(1)
    clock.now += 3
    assert not demand.hot(1)  # too old
    demand.note(2, 1)
    demand.note(3, 1)  # object 1 falls out of the bounded table
    assert demand._reads.keys() == {2, 3}


def test_cold_object_gets_only_the_missed_blocks():
    storage, cache, fetcher, index, loc = setup()
    layout = ObjectLayout.of(index)
    e = index[5]
    assert cache.watch((loc.object_id, e.position), "r", e.size)
    fetcher.load(loc, [e], layout)
    assert storage.gets == [(sr.object_key(loc.object_id), e.position, e.end_position)]
    assert cache.prefetched_bytes == 0


def hot(fetcher: BlockFetcher, loc: ObjectLocation, *read: int) -> None:
    """Make the object hot, and the blocks at positions `read` read by their readers."""
    for sid in (0, 1, 2):
        fetcher.note_read(loc.object_id, sid)
    for position in read:
        key = (loc.object_id, position)
        fetcher.cache.watch(key, "other", 1)
        fetcher.cache.fill(key, [], 1)
        fetcher.cache.unwatch(key, "other")  # read and freed: a ghost


def test_hot_object_but_a_lone_miss_in_its_segment_prefetches_nothing():
    storage, cache, fetcher, index, loc = setup()
    layout = ObjectLayout.of(index)
    hot(fetcher, loc)  # hot object, no neighbour read
    for e in (index[0], index[2], index[4]):  # sparse readers: every other one
        cache.watch((loc.object_id, e.position), "r", e.size)
        fetcher.load(loc, [e], layout)
    assert [g[1] for g in storage.gets] == [index[0].position, index[2].position, index[4].position]
    assert cache.prefetched_bytes == 0


def test_hot_object_gets_the_whole_aligned_segment_once():
    storage, cache, fetcher, index, loc = setup()
    layout = ObjectLayout.of(index)
    hot(fetcher, loc, index[1].position)
    e = index[2]
    assert e.position < SPAN <= index[-1].position  # segment 0 of several
    cache.watch((loc.object_id, e.position), "r", e.size)
    fetcher.load(loc, [e], layout)
    in_segment = [b for b in index if b.position < SPAN]
    key = sr.object_key(loc.object_id)
    # everything of the segment but the block its reader already consumed
    assert storage.gets == [
        (key, 0, index[0].end_position),
        (key, index[2].position, in_segment[-1].end_position),
    ]
    assert cache.prefetched_bytes == sum(b.size for b in in_segment) - e.size - index[1].size
    # another reader of a block of that segment waits for the same GET: no new request
    other = in_segment[0]
    assert cache.watch((loc.object_id, other.position), "r2", other.size) is False
    assert fetcher.wait((loc.object_id, other.position))[0].payload == bytes([0]) * PAYLOAD
    assert len(storage.gets) == 2


def test_segment_skips_blocks_already_held_and_splits_the_get():
    storage, cache, fetcher, index, loc = setup()
    layout = ObjectLayout.of(index)
    hot(fetcher, loc, index[1].position)
    held = index[2]
    cache.watch((loc.object_id, held.position), "x", held.size)  # in flight elsewhere
    e = index[0]
    cache.watch((loc.object_id, e.position), "r", e.size)
    fetcher.load(loc, [e], layout)
    starts = [g[1] for g in storage.gets]
    assert starts == [index[0].position, index[3].position]
    assert all(not (g[1] <= held.position < g[2]) for g in storage.gets)


def test_prefetch_backs_off_when_prefetched_blocks_go_unread(monkeypatch):
    clock = Clock()
    storage, cache, fetcher, index, loc = setup(clock=clock, speculative_ttl_s=5)
    monkeypatch.setattr(sr, "PREFETCH_WASTE_MIN_BYTES", 1)
    layout = ObjectLayout.of(index)
    hot(fetcher, loc, index[1].position, index[-2].position)
    e = index[0]
    cache.watch((loc.object_id, e.position), "r", e.size)
    fetcher.load(loc, [e], layout)
    assert cache.prefetched_bytes > 0
    clock.now += 6  # nobody claimed them
    cache.speculative_room()
    assert cache.prefetch_wasted_bytes == cache.prefetched_bytes
    for sid in (3, 4, 5):
        fetcher.note_read(loc.object_id, sid)
    last = index[-1]
    cache.watch((loc.object_id, last.position), "r", last.size)
    fetcher.load(loc, [last], layout)
    assert storage.gets[-1][1:] == (last.position, last.end_position)  # no prefetch
    clock.now += sr.PREFETCH_BACKOFF_S + 1
    assert fetcher._prefetch_allowed()


@pytest.mark.parametrize("span", [0, SPAN])
def test_readers_of_every_stream_read_all_data_with_few_gets(span):
    data, index, loc = build_sso()
    storage = FakeStorage({sr.object_key(loc.object_id): data})
    cache = BlockCache(64 * 1024 * 1024)
    fetcher = BlockFetcher(
        storage, cache, prefetch_span_bytes=span, demand=ObjectDemand(min_streams=3)
    )
    index_cache = sr.IndexCache(storage)
    readers = [StreamReader(sid, 0, Locator(loc), index_cache, fetcher) for sid in range(STREAMS)]
    delivered = 0
    for r in readers:  # one read each, in stream order
        out = r.read(0, BATCHES, 1 << 20)
        assert [b.base_offset for b in out] == list(range(BATCHES))
        assert all(b.payload == bytes([r.stream_id]) * PAYLOAD for b in out)
        delivered += sum(b.size_bytes for b in out)
        r.release()
    block_gets = [g for g in storage.gets if g[2] <= index[-1].end_position]
    fetched = sum(g[2] - g[1] for g in block_gets)
    assert fetched == sum(e.size for e in index)  # every block exactly once
    if span:  # per segment: a lone miss, then one GET for the rest of it
        assert len(block_gets) <= 2 * -(-index[-1].end_position // SPAN) + 1
        assert cache.prefetch_claimed_bytes == cache.prefetched_bytes
    else:
        assert len(block_gets) == STREAMS
    assert cache.used_bytes == 0 and cache.watcher_count == 0
