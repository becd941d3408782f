"""BlockCache: decoded data blocks of objects, with watch-based eviction (seed 002).

A block is cached under (object_id, block position). Each reader that will read a block
"watches" it (+1 when it schedules the read, -1 once it has read it). A block whose watch
count drops to 0 has been read by everyone who wanted it and is freed at once, so catch-up
readers do not evict each other's prefetched blocks; blocks nobody watches (a tail read that
another reader may repeat) live in an LRU until the byte budget needs the room.

Speculative blocks: when many readers catch up through one stream-set object at once, the
fetcher also loads the neighbouring blocks of other streams in the same GET (`prefetch`),
before any reader watches them. Such a block is held unwatched and is *claimed* by the
first reader that watches it. Their bytes are bounded twice: by `max_speculative_bytes`
(1/8 of the cache by default), and so that the whole cache stays within
`max_bytes_per_watcher` (2 MiB) per reader watching anything - the cache lends the unused
part of the readers' window share to prefetching, never more. An unclaimed block is dropped
after `speculative_ttl_s` or first when the byte budget needs room, and its bytes count as
wasted, which the fetcher uses to back off. Blocks that were read and freed are remembered
(bounded "ghost" keys) so a prefetch never loads a block its readers already consumed.

Batches decoded from a GET share its buffer (their payloads are views of it, see
formats/stream_records.py), so a block pins the whole GET while it is cached; that is what it costs while
its readers read it, but a block parked in the LRU (nobody watches it) may stay long, so it
is given payloads of its own first: the LRU's bytes are then what it counts.

Every entry carries a future that resolves when its bytes arrive (or fail), so a reader
that finds a block in flight waits for exactly that load. Pure policy: no I/O, thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass, field

from dataplane.formats.stream_records import StreamRecordBatch

BlockKey = tuple[int, int]  # (object_id, block position)

DEFAULT_SPECULATIVE_FRACTION = 8  # at most 1/8 of the cache unless told otherwise
DEFAULT_MAX_BYTES_PER_WATCHER = 2 * 1024 * 1024  # the catch-up goal per read window
DEFAULT_SPECULATIVE_TTL_S = 30.0
DEFAULT_MAX_GHOSTS = 65_536


@dataclass
class _Entry:
    batches: list[StreamRecordBatch] | None  # None while the read is in flight
    size_bytes: int
    watchers: set[Hashable] = field(default_factory=set)
    ready: Future | None = None  # resolves with the batches when the load completes
    speculative: bool = False  # prefetched, not claimed by any reader yet


class BlockCache:
    """Byte-budgeted cache of decoded blocks; watched blocks are never evicted by LRU."""

    def __init__(
        self,
        max_bytes: int,
        *,
        max_speculative_bytes: int | None = None,
        max_bytes_per_watcher: int = DEFAULT_MAX_BYTES_PER_WATCHER,
        speculative_ttl_s: float = DEFAULT_SPECULATIVE_TTL_S,
        max_ghosts: int = DEFAULT_MAX_GHOSTS,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_speculative_bytes is None:
            max_speculative_bytes = max_bytes // DEFAULT_SPECULATIVE_FRACTION
        if (
            max_bytes <= 0
            or max_speculative_bytes < 0
            or max_bytes_per_watcher < 0
            or speculative_ttl_s <= 0
            or max_ghosts < 0
        ):
            raise ValueError("invalid BlockCache limits")
        self.max_bytes = max_bytes
        self.max_speculative_bytes = max_speculative_bytes
        self.max_bytes_per_watcher = max_bytes_per_watcher
        self.speculative_ttl_s = speculative_ttl_s
        self.max_ghosts = max_ghosts
        self._clock = clock
        self._entries: dict[BlockKey, _Entry] = {}
        self._lru: OrderedDict[BlockKey, None] = OrderedDict()  # unwatched, loaded blocks
        self._speculative: OrderedDict[BlockKey, float] = OrderedDict()  # key -> since
        self._ghosts: OrderedDict[BlockKey, None] = OrderedDict()  # read and freed
        self._watch_counts: dict[Hashable, int] = {}  # watcher -> blocks it watches
        self._lock = threading.Lock()
        self.used_bytes = 0
        self.speculative_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.prefetched_bytes = 0  # bytes registered by prefetch()
        self.prefetch_claimed_bytes = 0  # ... later watched by a reader
        self.prefetch_wasted_bytes = 0  # ... dropped unclaimed after they were loaded

    # ------------------------------------------------------------ watching

    def watch(self, key: BlockKey, watcher: Hashable, size_bytes: int) -> bool:
        """Register `watcher`'s intent to read the block; True if the caller must load it
        (nobody has it cached or in flight)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = _Entry(None, size_bytes, {watcher}, Future())
                self._count_watch(watcher, +1)
                self.used_bytes += size_bytes
                self.misses += 1
                self._ghosts.pop(key, None)
                self._make_room()
                return True
            if watcher not in entry.watchers:
                entry.watchers.add(watcher)
                self._count_watch(watcher, +1)
            if entry.speculative:  # a prefetched block found its reader
                entry.speculative = False
                self._speculative.pop(key, None)
                self.speculative_bytes -= entry.size_bytes
                self.prefetch_claimed_bytes += entry.size_bytes
            self._lru.pop(key, None)
            self.hits += 1
            return False

    def unwatch(self, key: BlockKey, watcher: Hashable) -> None:
        """`watcher` has read the block (or gave up): free it once nobody watches it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or watcher not in entry.watchers:
                return
            entry.watchers.discard(watcher)
            self._count_watch(watcher, -1)
            if not entry.watchers:
                self._drop(key)
                if entry.batches is not None:
                    self._remember(key)

    def prefetch(self, key: BlockKey, size_bytes: int) -> bool:
        """Register a speculative load of a block nobody watches yet; True if the caller
        must load it (not cached, not in flight, not already read, and within the
        speculative budget)."""
        with self._lock:
            self._expire_speculative()
            if key in self._entries or key in self._ghosts:
                return False
            if size_bytes > self._speculative_room():
                return False
            self._entries[key] = _Entry(None, size_bytes, set(), Future(), speculative=True)
            self._speculative[key] = self._clock()
            self.used_bytes += size_bytes
            self.speculative_bytes += size_bytes
            self.prefetched_bytes += size_bytes
            self._make_room()
            return True

    def fill(self, key: BlockKey, batches: list[StreamRecordBatch], size_bytes: int) -> None:
        """The block's bytes arrived."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:  # every watcher gave up meanwhile: keep it as an LRU block
                batches = _owned(batches)
                entry = _Entry(None, 0)
                self._entries[key] = entry
                self._lru[key] = None
            delta = size_bytes - entry.size_bytes
            self.used_bytes += delta
            if entry.speculative:
                self.speculative_bytes += delta
            entry.size_bytes = size_bytes
            entry.batches = batches
            ready = entry.ready
            self._make_room()
        if ready is not None and not ready.done():
            ready.set_result(batches)

    def fail(self, key: BlockKey, error: BaseException | None = None) -> None:
        """The load failed: forget the in-flight entry so the next reader retries."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            for watcher in entry.watchers:
                self._count_watch(watcher, -1)
            self._drop(key)
        if entry.ready is not None and not entry.ready.done():
            entry.ready.set_exception(error or RuntimeError(f"load of block {key} failed"))

    # ------------------------------------------------------------ lookups

    def get(self, key: BlockKey) -> list[StreamRecordBatch] | None:
        """The block's batches if loaded (refreshes its LRU position)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.batches is None:
                return None
            if key in self._lru:
                self._lru.move_to_end(key)
            return entry.batches

    def pending(self, key: BlockKey) -> Future | None:
        """The future of the block's load if it is cached or in flight, else None."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry.ready

    def read_lately(self, key: BlockKey) -> bool:
        """Whether a reader wants the block or read it lately (watched, cached after a
        read, or a remembered ghost) - not merely prefetched."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                return not entry.speculative
            return key in self._ghosts

    def keep_unwatched(
        self, key: BlockKey, batches: list[StreamRecordBatch], size_bytes: int
    ) -> None:
        """Cache a block nobody watches (LRU only)."""
        with self._lock:
            if key in self._entries:
                return
            batches = _owned(batches)
            ready: Future = Future()
            ready.set_result(batches)
            self._entries[key] = _Entry(batches, size_bytes, ready=ready)
            self._lru[key] = None
            self.used_bytes += size_bytes
            self._make_room()

    def speculative_room(self) -> int:
        """Bytes that may still be prefetched now."""
        with self._lock:
            self._expire_speculative()
            return self._speculative_room()

    @property
    def free_bytes(self) -> int:
        return max(self.max_bytes - self.used_bytes, 0)

    @property
    def watcher_count(self) -> int:
        """Readers currently watching at least one block (active read windows)."""
        with self._lock:
            return len(self._watch_counts)

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------ internals

    def _count_watch(self, watcher: Hashable, delta: int) -> None:
        n = self._watch_counts.get(watcher, 0) + delta
        if n > 0:
            self._watch_counts[watcher] = n
        else:
            self._watch_counts.pop(watcher, None)

    def _speculative_room(self) -> int:
        # prefetch is for the readers reading now: the cache as a whole stays within
        # max_bytes_per_watcher per active read window, and within its byte budget
        return max(
            min(
                self.max_speculative_bytes - self.speculative_bytes,
                self.max_bytes_per_watcher * len(self._watch_counts) - self.used_bytes,
                self.max_bytes - self.used_bytes,
            ),
            0,
        )

    def _remember(self, key: BlockKey) -> None:
        if self.max_ghosts == 0:
            return
        self._ghosts[key] = None
        self._ghosts.move_to_end(key)
        while len(self._ghosts) > self.max_ghosts:
            self._ghosts.popitem(last=False)

    def _drop(self, key: BlockKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.used_bytes -= entry.size_bytes
            self._lru.pop(key, None)
            if entry.speculative:
                self._speculative.pop(key, None)
                self.speculative_bytes -= entry.size_bytes

    def _waste(self, key: BlockKey) -> None:
        """Drop a loaded, unclaimed speculative block."""
        entry = self._entries[key]
        self.prefetch_wasted_bytes += entry.size_bytes
        self._drop(key)
        self.evictions += 1

    def _expire_speculative(self) -> None:
        now = self._clock()
        expired = []
        for key, since in self._speculative.items():
            if now - since < self.speculative_ttl_s:
                break
            expired.append(key)
        for key in expired:
            if self._entries[key].batches is not None:  # in flight ones expire once loaded
                self._waste(key)

    def _make_room(self) -> None:
        if self.used_bytes <= self.max_bytes:
            return
        # unclaimed speculative blocks go first, oldest first; in-flight ones cannot
        for key in [k for k in self._speculative if self._entries[k].batches is not None]:
            if self.used_bytes <= self.max_bytes:
                return
            self._waste(key)
        while self.used_bytes > self.max_bytes and self._lru:
            key, _ = self._lru.popitem(last=False)
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.used_bytes -= entry.size_bytes
                self.evictions += 1
                self._remember(key)


def _owned(batches: list[StreamRecordBatch]) -> list[StreamRecordBatch]:
    """`batches` with payloads of their own (copies of shared ones)."""
    return [b.owned() for b in batches]
