"""BlockCache: decoded data blocks of objects, with watch-based eviction (seed 002).

A block is cached under (object_id, block position). Each reader that will read a block
"watches" it (+1 when it schedules the read, -1 once it has read it). A block whose watch
count drops to 0 has been read by everyone who wanted it and is freed at once, so catch-up
readers do not evict each other's prefetched blocks; blocks nobody watches (a tail read that
another reader may repeat) live in an LRU until the byte budget needs the room. Pure policy:
no I/O, thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable

from dataplane.s3stream.records import StreamRecordBatch

BlockKey = tuple[int, int]  # (object_id, block position)


@dataclass
class _Entry:
    batches: list[StreamRecordBatch] | None  # None while the read is in flight
    size_bytes: int
    watchers: set[Hashable] = field(default_factory=set)


class BlockCache:
    """Byte-budgeted cache of decoded blocks; watched blocks are never evicted by LRU."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024):
        self.max_bytes = max_bytes
        self._entries: dict[BlockKey, _Entry] = {}
        self._lru: OrderedDict[BlockKey, None] = OrderedDict()  # unwatched, loaded blocks
        self._lock = threading.Lock()
        self.used_bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    # ------------------------------------------------------------ watching

    def watch(self, key: BlockKey, watcher: Hashable, size_bytes: int) -> bool:
        """Register `watcher`'s intent to read the block; True if the caller must load it
        (nobody has it cached or in flight)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = _Entry(None, size_bytes, {watcher})
                self.used_bytes += size_bytes
                self.misses += 1
                self._make_room()
                return True
            entry.watchers.add(watcher)
            self._lru.pop(key, None)
            self.hits += 1
            return False

    def unwatch(self, key: BlockKey, watcher: Hashable) -> None:
        """`watcher` has read the block (or gave up): free it once nobody watches it."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry.watchers.discard(watcher)
            if not entry.watchers:
                self._drop(key)

    def fill(self, key: BlockKey, batches: list[StreamRecordBatch], size_bytes: int) -> None:
        """The block's bytes arrived."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:  # every watcher gave up meanwhile: keep it as an LRU block
                entry = _Entry(None, 0)
                self._entries[key] = entry
                self._lru[key] = None
            self.used_bytes += size_bytes - entry.size_bytes
            entry.size_bytes = size_bytes
            entry.batches = batches
            self._make_room()

    def fail(self, key: BlockKey) -> None:
        """The load failed: forget the in-flight entry so the next reader retries."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.used_bytes -= entry.size_bytes
                self._lru.pop(key, None)

    # ------------------------------------------------------------ lookups

    def get(self, key: BlockKey) -> list[StreamRecordBatch] | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.batches is None:
                return None
            if key in self._lru:
                self._lru.move_to_end(key)
            return entry.batches

    def keep_unwatched(self, key: BlockKey, batches: list[StreamRecordBatch],
                       size_bytes: int) -> None:
        """Cache a block nobody watches (LRU only)."""
        with self._lock:
            if key in self._entries:
                return
            self._entries[key] = _Entry(batches, size_bytes)
            self._lru[key] = None
            self.used_bytes += size_bytes
            self._make_room()

    @property
    def free_bytes(self) -> int:
        return max(self.max_bytes - self.used_bytes, 0)

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------ internals

    def _drop(self, key: BlockKey) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.used_bytes -= entry.size_bytes
            self._lru.pop(key, None)

    def _make_room(self) -> None:
        while self.used_bytes > self.max_bytes and self._lru:
            key, _ = self._lru.popitem(last=False)
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.used_bytes -= entry.size_bytes
                self.evictions += 1
