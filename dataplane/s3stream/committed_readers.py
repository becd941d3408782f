"""CommittedReaders: the engine's cache of `StreamReader`s over committed objects.

A read of committed offsets continues the reader left where the previous read of the stream
ended (its readahead and located objects reused), or starts a new one. Readers idle longer
than `reader_idle_s`, or past `max_readers`, are released (oldest first). A read that finds
its located object deleted (compacted away) locates again, a bounded number of times.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict

from dataplane.config import StorageConfig
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.objectstore import ObjectNotFoundError
from dataplane.s3stream import metrics
from dataplane.s3stream.block_cache import BlockCache
from dataplane.s3stream.stream_reader import BlockFetcher, IndexCache, ObjectLocator, StreamReader

__all__ = [
    "MISSING_OBJECT_ATTEMPTS",
    "MISSING_OBJECT_BACKOFF_S",
    "CommittedReaders",
    "committed_reads_on_this_thread",
]

log = logging.getLogger(__name__)

# a read that finds its located object deleted (compacted away) re-locates this many times
MISSING_OBJECT_ATTEMPTS = 3
MISSING_OBJECT_BACKOFF_S = 0.2

_this_thread = threading.local()  # .reads: committed reads this thread made


def committed_reads_on_this_thread() -> int:
    """How many reads of committed objects the calling thread made so far: a caller that
    compares it before and after a read knows whether the read reached object storage (the
    Kafka egress limit ranks such a fetch a catch-up read). Thread-safe (per thread)."""
    return getattr(_this_thread, "reads", 0)


class CommittedReaders:
    """Reads committed offsets of any stream through cached `StreamReader`s (module
    docstring). Thread-safe: the cache is guarded by a lock; reads run outside it."""

    def __init__(
        self,
        locator: ObjectLocator,
        index_cache: IndexCache,
        fetcher: BlockFetcher,
        block_cache: BlockCache,
        config: StorageConfig,
    ) -> None:
        self._locator = locator
        self._index_cache = index_cache
        self._fetcher = fetcher
        self._block_cache = block_cache
        self._max_readers = config.max_readers
        self._reader_idle_s = config.reader_idle_s
        self._readers: OrderedDict[tuple[int, int], StreamReader] = OrderedDict()
        self._lock = threading.Lock()
        self._seen_hits = self._seen_misses = 0

    @property
    def readers(self) -> list[StreamReader]:
        """The readers cached now."""
        with self._lock:
            return list(self._readers.values())

    def read(self, stream_id: int, start: int, end: int, max_bytes: int) -> list[StreamRecordBatch]:
        """Batches of `stream_id` in [start, end) from its committed objects (blocks on I/O)."""
        _this_thread.reads = committed_reads_on_this_thread() + 1
        with self._lock:
            reader = self._readers.pop((stream_id, start), None)
        for attempt in range(1, MISSING_OBJECT_ATTEMPTS + 1):
            if reader is None:
                reader = StreamReader(
                    stream_id, start, self._locator, self._index_cache, self._fetcher
                )
            try:
                out = reader.read(start, end, max_bytes)
                break
            except ObjectNotFoundError:
                # a compaction replaced the object the reader had located and its retention
                # passed: locate again (a fresh reader) and retry, a bounded number of times
                reader.release()
                reader = None
                forget = getattr(self._locator, "forget", None)
                if forget is not None:
                    forget(stream_id)  # its cached locations name the deleted object
                if attempt == MISSING_OBJECT_ATTEMPTS:
                    raise
                log.info("stream %d: object gone at offset %d, re-locating", stream_id, start)
                time.sleep(MISSING_OBJECT_BACKOFF_S * attempt)
            except BaseException:
                reader.release()
                raise
        with self._lock:
            # two consumers at the same offset of a stream: keep the newer cursor, and let
            # the other give up its blocks and readahead (dropped unreleased, its watched
            # blocks would stay pinned in the BlockCache)
            displaced = self._readers.pop((stream_id, reader.next_offset), None)
            self._readers[(stream_id, reader.next_offset)] = reader
            self._expire_readers()
        if displaced is not None and displaced is not reader:
            displaced.release()
        cache = self._block_cache
        metrics.BLOCK_CACHE_BYTES.set(cache.used_bytes)
        hits, misses = cache.hits, cache.misses
        metrics.BLOCK_CACHE_HITS.inc(max(hits - self._seen_hits, 0))
        metrics.BLOCK_CACHE_MISSES.inc(max(misses - self._seen_misses, 0))
        self._seen_hits, self._seen_misses = hits, misses
        return out

    def release_all(self) -> None:
        """Release every cached reader (engine shutdown)."""
        with self._lock:
            for reader in self._readers.values():
                reader.release()
            self._readers.clear()

    def _expire_readers(self) -> None:
        """Caller holds the lock."""
        now = time.monotonic()
        while self._readers:
            key, oldest = next(iter(self._readers.items()))
            if (
                len(self._readers) <= self._max_readers
                and now - oldest.last_used < self._reader_idle_s
            ):
                break
            del self._readers[key]
            oldest.release()
