"""Catch-up reads from object storage: StreamReader, index cache, block fetching (seed 002).

A `StreamReader` follows one read cursor of one stream. For each read it plans the data
blocks covering the requested offsets plus a readahead window, watches them in the shared
`BlockCache`, loads the missing ones with ranged GETs (adjacent blocks of one object in one
request, and the object store merges nearby requests of different readers), and releases
each block once it has consumed it. Readahead starts at 512 KiB and doubles only when a read
had to wait for a block (a miss) and the cache has room, up to 32 MiB.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from dataplane.objectstore import ObjectStorage, Priority, object_key
from dataplane.s3stream.block_cache import BlockCache, BlockKey
from dataplane.s3stream.object_format import (
    FOOTER_SIZE_BYTES,
    IndexEntry,
    decode_block,
    find_blocks,
    parse_footer,
    parse_index,
    slice_index_from_tail,
)
from dataplane.s3stream.records import StreamRecordBatch

MIN_READAHEAD_BYTES = 512 * 1024
MAX_READAHEAD_BYTES = 32 * 1024 * 1024
TAIL_READ_BYTES = 64 * 1024
MAX_LOCATIONS_PER_LOOKUP = 64
BLOCK_WAIT_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ObjectLocation:
    """A committed object holding offsets [start, end) of a stream, in bucket `bucket_id`."""

    object_id: int
    bucket_id: int
    size_bytes: int
    start_offset: int
    end_offset: int


class ObjectLocator(Protocol):
    def locate(self, stream_id: int, start_offset: int, end_offset: int,
               limit: int) -> list[ObjectLocation]:
        """Committed objects of the stream from `start_offset`, in offset order."""


class IndexCache:
    """Parsed index blocks of objects (LRU by count), grouped by stream so a lookup costs
    the stream's entries, not the whole index of a stream-set object of 1000s of streams."""

    def __init__(self, storage: ObjectStorage, max_objects: int = 20_000):
        self.storage = storage
        self.max_objects = max_objects
        self._cache: OrderedDict[int, dict[int, list[IndexEntry]]] = OrderedDict()
        self._loading: dict[int, Future] = {}
        self._lock = threading.Lock()

    def get(self, loc: ObjectLocation, stream_id: int) -> list[IndexEntry]:
        """The index entries of `stream_id` in the object, in offset order."""
        with self._lock:
            by_stream = self._cache.get(loc.object_id)
            if by_stream is not None:
                self._cache.move_to_end(loc.object_id)
                return by_stream.get(stream_id, [])
            loading = self._loading.get(loc.object_id)
            owner = loading is None
            if owner:  # single flight: concurrent readers of a new object share one load
                loading = self._loading[loc.object_id] = Future()
        if not owner:
            return loading.result(timeout=BLOCK_WAIT_TIMEOUT_S).get(stream_id, [])
        try:
            by_stream = {}
            for entry in self._load(loc):
                by_stream.setdefault(entry.stream_id, []).append(entry)
        except BaseException as exc:
            with self._lock:
                del self._loading[loc.object_id]
            loading.set_exception(exc)
            raise
        with self._lock:
            self._cache[loc.object_id] = by_stream
            del self._loading[loc.object_id]
            while len(self._cache) > self.max_objects:
                self._cache.popitem(last=False)
        loading.set_result(by_stream)
        return by_stream.get(stream_id, [])

    def _load(self, loc: ObjectLocation) -> list[IndexEntry]:
        key = object_key(loc.object_id)
        tail_len = min(loc.size_bytes, TAIL_READ_BYTES)
        tail = self.storage.get_range(loc.bucket_id, key, loc.size_bytes - tail_len,
                                      loc.size_bytes, Priority.CATCH_UP)
        footer = parse_footer(tail[-FOOTER_SIZE_BYTES:], loc.size_bytes)
        index_bytes = slice_index_from_tail(tail, loc.size_bytes, footer)
        if index_bytes is None:
            index_bytes = self.storage.get_range(
                loc.bucket_id, key, footer.index_position,
                footer.index_position + footer.index_length, Priority.CATCH_UP)
        return parse_index(index_bytes, footer)


class BlockFetcher:
    """Loads blocks into the BlockCache; one in-flight load per block, shared by readers."""

    def __init__(self, storage: ObjectStorage, cache: BlockCache):
        self.storage = storage
        self.cache = cache
        self._inflight: dict[BlockKey, Future] = {}
        self._lock = threading.Lock()
        self.bytes_fetched = 0

    def load(self, loc: ObjectLocation, entries: list[IndexEntry]) -> None:
        """Issue ranged GETs for `entries` (adjacent ones of the object in one request)."""
        runs: list[list[IndexEntry]] = []
        for e in entries:
            if runs and runs[-1][-1].end_position == e.position:
                runs[-1].append(e)
            else:
                runs.append([e])
        for run in runs:
            start, end = run[0].position, run[-1].end_position
            futures = {}
            with self._lock:
                for e in run:
                    fut: Future = Future()
                    self._inflight[(loc.object_id, e.position)] = fut
                    futures[(loc.object_id, e.position)] = (e, fut)
            get = self.storage.get_range_async(loc.bucket_id, object_key(loc.object_id),
                                               start, end, Priority.CATCH_UP)
            get.add_done_callback(lambda f, run=run, start=start, futures=futures:
                                  self._on_loaded(f, start, futures))

    def _on_loaded(self, get: Future, start: int, futures: dict) -> None:
        error = get.exception()
        data = None if error else get.result()
        if data is not None:
            with self._lock:
                self.bytes_fetched += len(data)
        for key, (entry, fut) in futures.items():
            try:
                if error is not None:
                    raise error
                block = memoryview(data)[entry.position - start: entry.end_position - start]
                batches = decode_block(block, entry)
                self.cache.fill(key, batches, entry.size)
                fut.set_result(batches)
            except BaseException as exc:
                self.cache.fail(key)
                fut.set_exception(exc)
            finally:
                with self._lock:
                    if self._inflight.get(key) is fut:
                        del self._inflight[key]

    def wait(self, key: BlockKey) -> list[StreamRecordBatch] | None:
        """The block's batches: from the cache, or once its in-flight load completes."""
        batches = self.cache.get(key)
        if batches is not None:
            return batches
        with self._lock:
            fut = self._inflight.get(key)
        if fut is None:
            return self.cache.get(key)
        return fut.result(timeout=BLOCK_WAIT_TIMEOUT_S)


@dataclass
class _Planned:
    key: BlockKey
    entry: IndexEntry
    loc: ObjectLocation


class StreamReader:
    """One read cursor of one stream over committed objects."""

    def __init__(self, stream_id: int, next_offset: int, locator: ObjectLocator,
                 index_cache: IndexCache, fetcher: BlockFetcher):
        self.stream_id = stream_id
        self.next_offset = next_offset
        self.locator = locator
        self.index_cache = index_cache
        self.fetcher = fetcher
        self.cache = fetcher.cache
        self.readahead_bytes = MIN_READAHEAD_BYTES
        self._window: list[_Planned] = []  # watched blocks, in offset order
        self._locations: list[ObjectLocation] = []
        self.last_used = time.monotonic()
        self.misses = 0

    # ------------------------------------------------------------ planning

    def _locate(self, offset: int, end_offset: int) -> list[ObjectLocation]:
        if not self._locations or self._locations[-1].end_offset <= offset \
                or self._locations[0].start_offset > offset:
            self._locations = self.locator.locate(self.stream_id, offset, end_offset,
                                                  MAX_LOCATIONS_PER_LOOKUP)
        return [loc for loc in self._locations if loc.end_offset > offset]

    def _extend_window(self, end_offset: int, want_bytes: int) -> None:
        """Watch blocks past the window until it holds `want_bytes` or reaches `end_offset`."""
        held = sum(p.entry.size for p in self._window)
        cursor = self._window[-1].entry.end_offset if self._window else self.next_offset
        to_load: dict[int, tuple[ObjectLocation, list[IndexEntry]]] = {}
        while held < want_bytes and cursor < end_offset:
            locs = self._locate(cursor, end_offset)
            if not locs:
                break
            progressed = False
            for loc in locs:
                if loc.end_offset <= cursor:
                    continue
                if loc.start_offset > cursor:
                    break
                index = self.index_cache.get(loc, self.stream_id)
                for entry in find_blocks(index, self.stream_id, cursor, end_offset,
                                         max(want_bytes - held, 1)):
                    key = (loc.object_id, entry.position)
                    if self.cache.watch(key, self, entry.size):
                        to_load.setdefault(loc.object_id, (loc, []))[1].append(entry)
                    self._window.append(_Planned(key, entry, loc))
                    held += entry.size
                    cursor = entry.end_offset
                    progressed = True
                if held >= want_bytes or cursor >= end_offset:
                    break
            if not progressed:
                break
        for loc, entries in to_load.values():
            self.fetcher.load(loc, entries)

    # ------------------------------------------------------------ reading

    def read(self, start_offset: int, end_offset: int, max_bytes: int) -> list[StreamRecordBatch]:
        """Whole batches overlapping [start, end) until max_bytes (at least one if any)."""
        self.last_used = time.monotonic()
        if start_offset != self.next_offset:
            self.release()
            self.next_offset = start_offset
        self._extend_window(end_offset, max_bytes + self.readahead_bytes)
        out: list[StreamRecordBatch] = []
        size = 0
        waited = False
        while self._window:
            planned = self._window[0]
            if planned.entry.start_offset >= end_offset:
                break
            if self.cache.get(planned.key) is None:
                waited = True
            batches = self.fetcher.wait(planned.key)
            if batches is None:  # dropped meanwhile (should not happen while watched): reload
                self.cache.watch(planned.key, self, planned.entry.size)
                self.fetcher.load(planned.loc, [planned.entry])
                batches = self.fetcher.wait(planned.key) or []
            full = True
            for batch in batches:
                if batch.last_offset <= self.next_offset:
                    continue
                if batch.base_offset >= end_offset:
                    break
                if out and size + batch.size_bytes > max_bytes:
                    full = False
                    break
                out.append(batch)
                size += batch.size_bytes
                self.next_offset = batch.last_offset
            if not full:
                break
            self._window.pop(0)
            self.cache.unwatch(planned.key, self)
            if size >= max_bytes:
                break
        if waited:
            self.misses += 1
            grown = min(self.readahead_bytes * 2, MAX_READAHEAD_BYTES)
            if grown > self.readahead_bytes and self.cache.free_bytes > 2 * grown:
                self.readahead_bytes = grown
        if out:
            # keep the window topped up so the next read finds its blocks loaded
            self._extend_window(end_offset, self.readahead_bytes)
        return out

    def release(self) -> None:
        """Give up every watched block (the cursor moved elsewhere, or the reader is idle)."""
        for planned in self._window:
            self.cache.unwatch(planned.key, self)
        self._window.clear()

    @property
    def held_bytes(self) -> int:
        return sum(p.entry.size for p in self._window)
