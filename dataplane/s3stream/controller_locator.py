"""ControllerLocator: where a stream's committed offsets live, asked of the controller."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from controlplane.calls import ControllerCalls
from controlplane.errors import ControllerError
from dataplane.s3stream.stream_reader import ObjectLocation

__all__ = ["ControllerLocator"]

log = logging.getLogger(__name__)


class ControllerLocator:
    """Finds a stream's objects through the controller API.

    Committed offsets never move to other objects except by compaction, so answers are
    cached per stream (bounded) and reused for any read that starts inside them; a read past
    the cached span asks again. `forget(stream_id)` drops a stream's entry (after a read hit
    an object that compaction deleted). An answer that falls short of the asked end is asked
    again of the leader (a follower's image may lag the last commits).

    Thread-safety: any thread; the cache is guarded by a lock, lookups run outside it.
    """

    LOOKUP_LIMIT = 1000

    def __init__(self, client: ControllerCalls, max_streams: int = 100_000):
        self.client = client
        self.max_streams = max_streams
        self._cache: OrderedDict[int, list[ObjectLocation]] = OrderedDict()
        self._lock = threading.Lock()

    def locate(
        self, stream_id: int, start_offset: int, end_offset: int, limit: int
    ) -> list[ObjectLocation]:
        with self._lock:
            cached = self._cache.get(stream_id)
            if cached and cached[0].start_offset <= start_offset < cached[-1].end_offset:
                self._cache.move_to_end(stream_id)
                return [loc for loc in cached if loc.end_offset > start_offset][:limit]
        lookup = max(limit, self.LOOKUP_LIMIT)
        found = self._lookup(stream_id, start_offset, end_offset, lookup, from_leader=False)
        if len(found) < lookup and (not found or found[-1].end_offset < end_offset):
            # Short of what was asked: callers ask only for offsets they know are committed,
            # and the controller that answered may be a follower whose image lags the last
            # commits (e.g. a failover's uploads, just before this node opened the stream).
            # The leader has every commit it acknowledged. If it cannot be asked, the first
            # answer stands (a tail read that needs the rest refuses to go on by itself).
            try:
                found = self._lookup(stream_id, start_offset, end_offset, lookup, from_leader=True)
            except ControllerError as exc:
                log.info("stream %d: the leader's object lookup failed: %s", stream_id, exc)
        if found:
            with self._lock:
                self._cache[stream_id] = found
                while len(self._cache) > self.max_streams:
                    self._cache.popitem(last=False)
        return found[:limit]

    def forget(self, stream_id: int) -> None:
        with self._lock:
            self._cache.pop(stream_id, None)

    def _lookup(
        self, stream_id: int, start_offset: int, end_offset: int, limit: int, *, from_leader: bool
    ) -> list[ObjectLocation]:
        return [
            ObjectLocation(
                object_id=o["object_id"],
                bucket_id=o["bucket_id"],
                size_bytes=o["size_bytes"],
                start_offset=o["start_offset"],
                end_offset=o["end_offset"],
            )
            for o in self.client.stream_objects(
                stream_id, start_offset, end_offset, limit, from_leader=from_leader
            )
        ]
