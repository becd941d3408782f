"""Catch-up reads from object storage: StreamReader, index cache, block fetching (seed 002).

A `StreamReader` follows one read cursor of one stream. For each read it plans the data
blocks covering the requested offsets plus a readahead window, watches them in the shared
`BlockCache`, loads the missing ones with ranged GETs (adjacent blocks of one object in one
request, and the object store merges nearby requests of different readers), and releases
each block once it has consumed it. Readahead starts at 512 KiB and doubles when a read had to
wait for a block (a miss) and the cache has room, up to 32 MiB; a read that stopped at its
`max_bytes` (a consumer sweeping the stream: it will ask for the next range right away)
raises it at once to that read's size, so the next read's blocks are loaded while the
response travels. A GET covers at most `max_get_bytes` (8 MiB): a longer run of adjacent
blocks is read with several GETs in flight at once. Readahead beyond what a read itself
needs is bounded across all readers by the fetcher's `readahead_budget_bytes` (by default
half the BlockCache): a reader over the budget reads only what it is asked for.

Stream-set objects hold a little of many streams (~100s of KiB each), so per-stream reads
are small GETs, and object stores serve a limited number of GETs per second. When several
streams are being caught up through the same stream-set object at once (the object is
"hot") and the block right before or after the missed one (another stream's) is being read
or was read lately - readers sweep through neighbouring streams - the missed block's GET is
extended over the other blocks of its aligned segment of `prefetch_span_bytes` (4 MiB)
that nobody holds or has read (so consumers reading streams scattered over an object, even
every other one, prefetch nothing); those blocks enter the
BlockCache as speculative blocks that the streams' readers claim (see block_cache.py),
within the cache's bytes-per-reader budget. The fetcher stops prefetching for a while when
more than 5% of the prefetched bytes were dropped unread.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

from dataplane.formats.object_format import (
    FOOTER_SIZE_BYTES,
    IndexEntry,
    decode_block,
    find_blocks,
    parse_footer,
    parse_index,
    slice_index_from_tail,
)
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.objectstore import ObjectStorage, Priority, object_key
from dataplane.s3stream.block_cache import BlockCache, BlockKey

MIN_READAHEAD_BYTES = 512 * 1024
MAX_READAHEAD_BYTES = 32 * 1024 * 1024
MAX_GET_BYTES = 8 * 1024 * 1024  # larger runs of blocks: several GETs in flight
TAIL_READ_BYTES = 64 * 1024
MAX_LOCATIONS_PER_LOOKUP = 64
BLOCK_WAIT_TIMEOUT_S = 60.0
# prefetch of neighbouring blocks in stream-set objects (see the module docstring)
PREFETCH_SPAN_BYTES = 4 * 1024 * 1024  # segment size; AutoMQ merges reads <= 4 MiB
PREFETCH_MIN_STREAMS = 4  # distinct streams reading an object recently ...
PREFETCH_HOT_WINDOW_S = 2.0  # ... within this many seconds make it hot
PREFETCH_MAX_WASTE_RATIO = 0.05  # dropped-unread / prefetched before backing off
PREFETCH_WASTE_MIN_BYTES = 16 * 1024 * 1024  # judge the ratio only after this much prefetch
PREFETCH_BACKOFF_S = 60.0
MAX_DEMAND_OBJECTS = 1024  # objects whose recent readers are tracked


@dataclass(frozen=True)
class ObjectLocation:
    """A committed object holding offsets [start, end) of a stream, in bucket `bucket_id`."""

    object_id: int
    bucket_id: int
    size_bytes: int
    start_offset: int
    end_offset: int


class ObjectLocator(Protocol):
    def locate(
        self, stream_id: int, start_offset: int, end_offset: int, limit: int
    ) -> list[ObjectLocation]:
        """Committed objects of the stream from `start_offset`, in offset order."""


@dataclass(frozen=True)
class ObjectLayout:
    """Every data block of a multi-stream object in byte order (for prefetching
    neighbours); `positions[i]` is `entries[i].position`."""

    entries: list[IndexEntry]
    positions: list[int]

    @staticmethod
    def of(entries: list[IndexEntry]) -> ObjectLayout:
        ordered = sorted(entries, key=lambda e: e.position)
        return ObjectLayout(ordered, [e.position for e in ordered])

    def index_of(self, position: int) -> int | None:
        """Index of the block starting at `position` (None if none starts there)."""
        i = bisect.bisect_left(self.positions, position)
        if i == len(self.positions) or self.positions[i] != position:
            return None
        return i

    def following(self, position: int) -> list[IndexEntry]:
        """The blocks from the one starting at `position` on (empty if none starts there)."""
        i = self.index_of(position)
        return [] if i is None else self.entries[i:]


class IndexCache:
    """Parsed index blocks of objects (LRU by count), grouped by stream so a lookup costs
    the stream's entries, not the whole index of a stream-set object of 1000s of streams."""

    def __init__(self, storage: ObjectStorage, max_objects: int = 20_000):
        self.storage = storage
        self.max_objects = max_objects
        self._cache: OrderedDict[int, dict[int, list[IndexEntry]]] = OrderedDict()
        self._layouts: dict[int, ObjectLayout] = {}  # multi-stream objects of _cache only
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
            entries = self._load(loc)
            by_stream = {}
            for entry in entries:
                by_stream.setdefault(entry.stream_id, []).append(entry)
            layout = ObjectLayout.of(entries) if len(by_stream) > 1 else None
        except BaseException as exc:
            with self._lock:
                del self._loading[loc.object_id]
            loading.set_exception(exc)
            raise
        with self._lock:
            self._cache[loc.object_id] = by_stream
            if layout is not None:
                self._layouts[loc.object_id] = layout
            del self._loading[loc.object_id]
            while len(self._cache) > self.max_objects:
                evicted, _ = self._cache.popitem(last=False)
                self._layouts.pop(evicted, None)
        loading.set_result(by_stream)
        return by_stream.get(stream_id, [])

    def layout(self, object_id: int) -> ObjectLayout | None:
        """The byte-order layout of a cached multi-stream object (None otherwise)."""
        with self._lock:
            return self._layouts.get(object_id)

    def _load(self, loc: ObjectLocation) -> list[IndexEntry]:
        key = object_key(loc.object_id)
        tail_len = min(loc.size_bytes, TAIL_READ_BYTES)
        tail = self.storage.get_range(
            loc.bucket_id, key, loc.size_bytes - tail_len, loc.size_bytes, Priority.CATCH_UP
        )
        footer = parse_footer(tail[-FOOTER_SIZE_BYTES:], loc.size_bytes)
        index_bytes = slice_index_from_tail(tail, loc.size_bytes, footer)
        if index_bytes is None:
            index_bytes = self.storage.get_range(
                loc.bucket_id,
                key,
                footer.index_position,
                footer.index_position + footer.index_length,
                Priority.CATCH_UP,
            )
        return parse_index(index_bytes, footer)


class ObjectDemand:
    """Which streams read which objects (or segments of objects) lately: a key read by at
    least `min_streams` distinct streams within `window_s` is "hot" (several readers
    catching up through it). Bounded: the last `max_objects` keys, the last `min_streams`
    reads of each."""

    def __init__(
        self,
        min_streams: int = PREFETCH_MIN_STREAMS,
        window_s: float = PREFETCH_HOT_WINDOW_S,
        max_objects: int = MAX_DEMAND_OBJECTS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.min_streams = min_streams
        self.window_s = window_s
        self.max_objects = max_objects
        self._clock = clock
        # key -> (stream id -> last read time), at most min_streams streams each
        self._reads: OrderedDict[Hashable, OrderedDict[int, float]] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, object_id: Hashable, stream_id: int) -> None:
        """`stream_id` is reading blocks of `object_id` (an object, or a segment) now."""
        now = self._clock()
        with self._lock:
            streams = self._reads.get(object_id)
            if streams is None:
                streams = self._reads[object_id] = OrderedDict()
                while len(self._reads) > self.max_objects:
                    self._reads.popitem(last=False)
            else:
                self._reads.move_to_end(object_id)
            streams[stream_id] = now
            streams.move_to_end(stream_id)
            while len(streams) > self.min_streams:
                streams.popitem(last=False)

    def hot(self, object_id: Hashable) -> bool:
        """Whether `min_streams` distinct streams read the object within the window."""
        now = self._clock()
        with self._lock:
            streams = self._reads.get(object_id)
            if streams is None or len(streams) < self.min_streams:
                return False
            oldest = next(iter(streams.values()))
            return now - oldest <= self.window_s


class BlockFetcher:
    """Loads blocks into the BlockCache with ranged GETs; the cache entry of a block is its
    single in-flight load, shared by every reader. Extends GETs of hot stream-set objects
    over neighbouring blocks (speculative prefetch, see the module docstring)."""

    def __init__(
        self,
        storage: ObjectStorage,
        cache: BlockCache,
        *,
        prefetch_span_bytes: int = PREFETCH_SPAN_BYTES,
        demand: ObjectDemand | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_get_bytes: int = MAX_GET_BYTES,
        readahead_budget_bytes: int | None = None,
    ):
        if max_get_bytes <= 0 or (
            readahead_budget_bytes is not None and readahead_budget_bytes < 0
        ):
            raise ValueError("invalid BlockFetcher limits")
        self.storage = storage
        self.cache = cache
        self.prefetch_span_bytes = prefetch_span_bytes
        self.max_get_bytes = max_get_bytes
        self.readahead_budget_bytes = (
            cache.max_bytes // 2 if readahead_budget_bytes is None else readahead_budget_bytes
        )
        # bytes of blocks in every reader's window past what its current read asked for
        self.readahead_held_bytes = 0
        self.demand = demand or ObjectDemand(clock=clock)
        self._clock = clock
        self._lock = threading.Lock()
        self.bytes_fetched = 0
        self.gets = 0
        self._backoff_until = 0.0
        self._waste_base = (0, 0)  # (prefetched, wasted) bytes when last judged

    def try_hold_readahead(self, size_bytes: int) -> bool:
        """Take `size_bytes` of the readahead budget; False (nothing taken) if over it."""
        with self._lock:
            if self.readahead_held_bytes + size_bytes > self.readahead_budget_bytes:
                return False
            self.readahead_held_bytes += size_bytes
            return True

    def release_readahead(self, size_bytes: int) -> None:
        """Give back readahead budget (the block was read, or its reader gave it up)."""
        with self._lock:
            self.readahead_held_bytes -= size_bytes

    def note_read(self, object_id: int, stream_id: int) -> None:
        """A reader plans blocks of `stream_id` in the object (evidence of demand)."""
        self.demand.note(object_id, stream_id)

    def load(
        self, loc: ObjectLocation, entries: list[IndexEntry], layout: ObjectLayout | None = None
    ) -> None:
        """Issue ranged GETs for `entries` (which the caller watched; adjacent ones of the
        object in one request). With the object's `layout`, a GET of a hot stream-set
        object also covers the other blocks of its prefetch segment that nobody holds."""
        runs = contiguous(entries)
        extend = (
            layout is not None
            and self.prefetch_span_bytes > 0
            and self._prefetch_allowed()
            and self.demand.hot(loc.object_id)
        )
        for run in runs:
            if extend and self._sweeping(loc, layout, run):
                for group in contiguous(
                    sorted(run + self._neighbours(loc, layout, run), key=lambda e: e.position)
                ):
                    self._get(loc, group)
                continue
            pieces = split_run(run, self.max_get_bytes)
            for piece in pieces:
                # the pieces of one run are this reader's own adjacent bytes: no merge window
                self._get(loc, piece, merge=len(pieces) == 1)

    def _sweeping(self, loc: ObjectLocation, layout: ObjectLayout, run: list[IndexEntry]) -> bool:
        """Whether the block before or after `run` belongs to another stream whose reader
        is reading it or read it lately (readers sweep through neighbouring streams)."""
        i = layout.index_of(run[0].position)
        if i is None:
            return False
        for j in (i - 1, i + len(run)):
            if (
                0 <= j < len(layout.entries)
                and layout.entries[j].stream_id != run[0].stream_id
                and self.cache.read_lately((loc.object_id, layout.entries[j].position))
            ):
                return True
        return False

    def _neighbours(
        self, loc: ObjectLocation, layout: ObjectLayout, run: list[IndexEntry]
    ) -> list[IndexEntry]:
        """The other blocks of the run's segment nobody holds, registered as speculative.

        Segments are fixed, aligned byte ranges of `prefetch_span_bytes`, so readers
        missing on different streams of one segment agree on which GET covers them (a
        span that starts at each miss would leave a small hole before every other
        reader's span). A block cached, in flight, already read, or over the budget is
        skipped; the object store merges the resulting nearby GETs again."""
        span = self.prefetch_span_bytes
        seg_start = run[0].position // span * span
        seg_end = seg_start + span
        mine = {e.position for e in run}
        out: list[IndexEntry] = []
        i = bisect.bisect_left(layout.positions, seg_start)
        for e in layout.entries[i:]:
            if e.position >= seg_end:  # a block belongs to the segment it starts in
                break
            if e.position in mine:
                continue
            if self.cache.prefetch((loc.object_id, e.position), e.size):
                out.append(e)
        return out

    def _prefetch_allowed(self) -> bool:
        """False while backing off because too many prefetched bytes went unread."""
        now = self._clock()
        with self._lock:
            if now < self._backoff_until:
                return False
            prefetched = self.cache.prefetched_bytes - self._waste_base[0]
            wasted = self.cache.prefetch_wasted_bytes - self._waste_base[1]
            if prefetched >= PREFETCH_WASTE_MIN_BYTES:
                if wasted > PREFETCH_MAX_WASTE_RATIO * prefetched:
                    self._backoff_until = now + PREFETCH_BACKOFF_S
                    self._waste_base = (
                        self.cache.prefetched_bytes,
                        self.cache.prefetch_wasted_bytes,
                    )
                    return False
            return True

    def _get(self, loc: ObjectLocation, run: list[IndexEntry], merge: bool = True) -> None:
        start, end = run[0].position, run[-1].end_position
        with self._lock:
            self.gets += 1
        # merged only with touching ranges: bytes between blocks are other streams'
        # blocks, cached already or read by nobody (max_gap_bytes=0)
        get = self.storage.get_range_async(
            loc.bucket_id,
            object_key(loc.object_id),
            start,
            end,
            Priority.CATCH_UP,
            max_gap_bytes=0,
            merge=merge,
        )
        get.add_done_callback(lambda f: self._on_loaded(f, loc.object_id, start, run))

    def _on_loaded(self, get: Future, object_id: int, start: int, run: list[IndexEntry]) -> None:
        error = get.exception()
        data = None if error else get.result()
        if data is not None:
            with self._lock:
                self.bytes_fetched += len(data)
        for entry in run:
            key = (object_id, entry.position)
            try:
                if error is not None:
                    raise error
                block = memoryview(data)[entry.position - start : entry.end_position - start]
                # the payloads stay views of the GET's body: a Fetch answer sends them as
                # they are (no copy of the bytes read)
                self.cache.fill(key, decode_block(block, entry, share_payloads=True), entry.size)
            except BaseException as exc:
                self.cache.fail(key, exc)

    def wait(self, key: BlockKey) -> list[StreamRecordBatch] | None:
        """The block's batches: from the cache, or once its in-flight load completes;
        None if nobody has it cached or in flight."""
        batches = self.cache.get(key)
        if batches is not None:
            return batches
        ready = self.cache.pending(key)
        if ready is None:
            return self.cache.get(key)
        return ready.result(timeout=BLOCK_WAIT_TIMEOUT_S)


def split_run(run: list[IndexEntry], max_bytes: int) -> list[list[IndexEntry]]:
    """A run of adjacent blocks cut into about equal pieces of at most `max_bytes` each
    (a block larger than that is a piece of its own)."""
    total = run[-1].end_position - run[0].position
    if total <= max_bytes:
        return [run]
    target = total / -(-total // max_bytes)  # n equal pieces, n = ceil(total / max_bytes)
    start = run[0].position
    pieces: list[list[IndexEntry]] = [[]]
    for e in run:
        piece = pieces[-1]
        # piece k takes the blocks whose middle lies below (k + 1) * target
        if piece and (
            e.end_position - piece[0].position > max_bytes
            or e.position + e.size / 2 - start > len(pieces) * target
        ):
            pieces.append([e])
        else:
            piece.append(e)
    return pieces


def contiguous(entries: list[IndexEntry]) -> list[list[IndexEntry]]:
    """Blocks (in byte order) grouped into runs of adjacent ones."""
    runs: list[list[IndexEntry]] = []
    for e in entries:
        if runs and runs[-1][-1].end_position == e.position:
            runs[-1].append(e)
        else:
            runs.append([e])
    return runs


@dataclass
class _Planned:
    key: BlockKey
    entry: IndexEntry
    loc: ObjectLocation
    readahead: bool = False  # holds readahead budget (planned past what a read asked for)


class StreamReader:
    """One read cursor of one stream over committed objects."""

    def __init__(
        self,
        stream_id: int,
        next_offset: int,
        locator: ObjectLocator,
        index_cache: IndexCache,
        fetcher: BlockFetcher,
    ):
        self.stream_id = stream_id
        self.next_offset = next_offset
        self.locator = locator
        self.index_cache = index_cache
        self.fetcher = fetcher
        self.cache = fetcher.cache
        self.readahead_bytes = MIN_READAHEAD_BYTES
        self._window: list[_Planned] = []  # watched blocks, in offset order
        self._held = 0  # bytes of the blocks in the window
        self._locations: list[ObjectLocation] = []
        self.last_used = time.monotonic()
        self.misses = 0

    # ------------------------------------------------------------ planning

    def _locate(self, offset: int, end_offset: int) -> list[ObjectLocation]:
        if (
            not self._locations
            or self._locations[-1].end_offset <= offset
            or self._locations[0].start_offset > offset
        ):
            self._locations = self.locator.locate(
                self.stream_id, offset, end_offset, MAX_LOCATIONS_PER_LOOKUP
            )
        return [loc for loc in self._locations if loc.end_offset > offset]

    def _extend_window(self, end_offset: int, want_bytes: int, need_bytes: int = 0) -> None:
        """Watch blocks past the window until it holds `want_bytes` or reaches `end_offset`;
        past the first `need_bytes` (what the read asks for) only within the fetcher's
        readahead budget."""
        held = self._held
        cursor = self._window[-1].entry.end_offset if self._window else self.next_offset
        to_load: dict[int, tuple[ObjectLocation, list[IndexEntry]]] = {}
        noted: set[int] = set()
        over_budget = False
        try:
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
                    if loc.object_id not in noted:
                        noted.add(loc.object_id)
                        self.fetcher.note_read(loc.object_id, self.stream_id)
                    for entry in find_blocks(
                        index, self.stream_id, cursor, end_offset, max(want_bytes - held, 1)
                    ):
                        ahead = held >= need_bytes
                        if ahead and not self.fetcher.try_hold_readahead(entry.size):
                            over_budget = True
                            break
                        key = (loc.object_id, entry.position)
                        if self.cache.watch(key, self, entry.size):
                            to_load.setdefault(loc.object_id, (loc, []))[1].append(entry)
                        self._window.append(_Planned(key, entry, loc, ahead))
                        held += entry.size
                        cursor = entry.end_offset
                        progressed = True
                    if over_budget or held >= want_bytes or cursor >= end_offset:
                        break
                if over_budget or not progressed:
                    break
        finally:
            # what was watched is loaded even if a lookup failed half way (readers waiting
            # for those blocks must not wait for a load nobody started)
            self._held = held
            for loc, entries in to_load.values():
                self.fetcher.load(loc, entries, self.index_cache.layout(loc.object_id))

    # ------------------------------------------------------------ reading

    def read(self, start_offset: int, end_offset: int, max_bytes: int) -> list[StreamRecordBatch]:
        """Whole batches overlapping [start, end) until max_bytes (at least one if any)."""
        self.last_used = time.monotonic()
        if start_offset != self.next_offset:
            self.release()
            self.next_offset = start_offset
        # what the read asks for is planned whatever the budget; blocks it already holds
        # stop counting as readahead
        for planned in self._window:
            if planned.readahead:
                planned.readahead = False
                self.fetcher.release_readahead(planned.entry.size)
        self._extend_window(end_offset, max_bytes + self.readahead_bytes, max_bytes)
        out: list[StreamRecordBatch] = []
        size = 0
        waited = False
        limited = False  # stopped by max_bytes, not by the end of the data
        while self._window:
            planned = self._window[0]
            if planned.entry.start_offset >= end_offset:
                break
            if self.cache.get(planned.key) is None:
                waited = True
            batches = self.fetcher.wait(planned.key)
            if batches is None:  # dropped meanwhile (should not happen while watched): reload
                if self.cache.watch(planned.key, self, planned.entry.size):
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
                limited = True
                break
            self._pop()
            if size >= max_bytes:
                limited = True
                break
        if waited:
            self.misses += 1
            grown = min(self.readahead_bytes * 2, MAX_READAHEAD_BYTES)
            if grown > self.readahead_bytes and self.cache.free_bytes > 2 * grown:
                self.readahead_bytes = grown
        if limited:
            # a sweeping consumer asks for the next range as soon as it has this one:
            # have at least that much loaded (or in flight) by then
            self.readahead_bytes = max(self.readahead_bytes, min(max_bytes, MAX_READAHEAD_BYTES))
        if out:
            # keep the window topped up so the next read finds its blocks loaded
            self._extend_window(end_offset, self.readahead_bytes)
        return out

    def _pop(self) -> None:
        """The window's first block is read: give it up."""
        planned = self._window.pop(0)
        self._held -= planned.entry.size
        if planned.readahead:
            self.fetcher.release_readahead(planned.entry.size)
        self.cache.unwatch(planned.key, self)

    def release(self) -> None:
        """Give up every watched block (the cursor moved elsewhere, or the reader is idle)."""
        while self._window:
            self._pop()

    @property
    def held_bytes(self) -> int:
        return self._held
