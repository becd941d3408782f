"""Reading an object WAL without writing to it.

* :func:`take_over` claims a failed node's WAL for recovery (crash failover) and returns an
  :class:`ObjectWALRecovery`: it reads the previous owner's acknowledged records and trims
  them once uploaded, never appends.
* :class:`ObjectWALReader` reads single records of someone else's WAL by offset without
  claiming it (the zone router's RouterChannel).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterator
from concurrent.futures import Future

from dataplane.objectstore import ObjectNotFoundError, ObjectStorage, Priority
from dataplane.s3stream.wal.base import RecoveredRecord, WALClosedError, WALError, WALFencedError
from dataplane.s3stream.wal.object_chain import (
    ClaimedWAL,
    ObjectWALLocation,
    check_trim_point,
    claim,
    list_wal_objects,
    read_owner,
    read_records,
    trim_below,
)
from dataplane.s3stream.wal.object_format import (
    OBJECT_RECORD_HEADER_BYTES,
    Chain,
    DataKey,
    data_key,
    decode_object,
    resolve_chain,
)

__all__ = [
    "ObjectWALReader",
    "ObjectWALRecovery",
    "WALTrimmedError",
    "object_wal_exists",
    "take_over",
]


class ObjectWALRecovery:
    """Recovery-only handle returned by :func:`take_over` (no appends)."""

    scan_loss = None  # an object WAL's chain is checked object by object: no ring scan

    def __init__(
        self,
        objects: ObjectStorage,
        where: ObjectWALLocation,
        claimed: ClaimedWAL,
        parallelism: int,
    ) -> None:
        self._objects = objects
        self._where = where
        self._owner = claimed.owner
        self._live = claimed.live
        self._trim_offset = claimed.chain.trim_offset
        self._end = claimed.chain.end_offset
        self._parallelism = parallelism
        self._closed = False
        self._lock = threading.Lock()

    @property
    def owner(self) -> tuple[int, int]:
        return (self._owner.node_id, self._owner.epoch)

    @property
    def start_offset(self) -> int:
        return self._trim_offset

    @property
    def end_offset(self) -> int:
        return self._end

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield the previous owner's acknowledged, untrimmed records in order."""
        self._check_open()
        yield from read_records(
            self._objects, self._where, list(self._live), self._trim_offset, self._parallelism
        )

    def trim(self, up_to_offset: int) -> None:
        """Durably release records below ``up_to_offset`` (after they were uploaded)."""
        with self._lock:
            self._check_open()
            if up_to_offset <= self._trim_offset:
                return
            check_trim_point(self._live, up_to_offset, self._end)
            current = read_owner(self._objects, self._where)
            if current != self._owner:
                raise WALFencedError(f"WAL {self._where.prefix} was taken over again")
            self._live = trim_below(
                self._objects, self._where, self._live, self._trim_offset, up_to_offset
            )
            self._trim_offset = up_to_offset

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosedError(f"WAL {self._where.prefix} recovery handle is closed")

    def __enter__(self) -> ObjectWALRecovery:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def take_over(
    objects: ObjectStorage,
    where: ObjectWALLocation,
    new_node_id: int,
    new_node_epoch: int,
    *,
    read_parallelism: int = 16,
) -> ObjectWALRecovery:
    """Claim the WAL for recovery (crash failover): from the moment this returns, its
    previous owner can no longer acknowledge appends, and nothing it stores later is read.

    Raises:
        WALTakeoverRefusedError: ``new_node_epoch`` is not greater than the owner's epoch.
        WALError: the WAL does not exist.
    """
    objects.bucket(where.bucket_id)
    claimed = claim(objects, where, new_node_id, new_node_epoch, takeover=True)
    return ObjectWALRecovery(objects, where, claimed, read_parallelism)


def object_wal_exists(objects: ObjectStorage, where: ObjectWALLocation) -> bool:
    """Whether a writer ever opened the WAL (its owner object exists)."""
    return read_owner(objects, where) is not None


class ObjectWALReader:
    """Reads single records of someone else's object WAL by offset, without claiming it: the
    RouterChannel's `get(channel offset)` (seed 000), where a main reads what a proxy appended.

    Only offsets the writer acknowledged should be asked for (they were handed over after the
    ack). The listing is cached and read on when an offset lies past it: only the keys after
    the chain's last data object (S3 StartAfter; data keys sort by writer, then offset),
    which are the data objects written since (and any past a gap, again) plus the few
    seals, trim points and the owner; data objects below the trim point are forgotten.
    Decoded objects are kept in a small LRU.

    Many threads read at once (a failover resolves its Link Records in parallel), so each
    store request is made once: one listing at a time, after which a waiting reader looks
    at the new chain before listing again, and one GET per object, which every reader that
    needs the object waits on. Thread-safe (a lock around the caches, another held while
    listing; GETs run outside both).
    """

    def __init__(
        self, objects: ObjectStorage, where: ObjectWALLocation, *, cached_objects: int = 16
    ) -> None:
        if cached_objects < 1:
            raise ValueError("cached_objects must be >= 1")
        self._objects = objects
        self._where = where
        self._max_cached = cached_objects
        self._lock = threading.Lock()
        self._list_lock = threading.Lock()  # held while listing: one listing at a time
        self._listings = 0  # how many listings finished (a waiter's sign that one ran)
        self._chain: Chain | None = None
        self._datas: dict[DataKey, None] = {}  # every data object listed, not yet trimmed
        self._listed_after = ""  # the chain's last data key: the next listing starts after it
        self._decoded: dict[DataKey, dict[int, bytes]] = {}  # insertion order = LRU order
        # objects being fetched: the readers that need one wait on its one GET
        self._fetching: dict[DataKey, Future[dict[int, bytes]]] = {}

    def read(self, offset: int) -> RecoveredRecord:
        """The record that starts at ``offset``.

        Raises:
            WALTrimmedError: the offset was trimmed (its data was released).
            ValueError: no record starts there (beyond the WAL's end, or inside a record).
        """
        key = self._object_at(offset) if self._chain is not None else None
        if key is None:
            listings = self._listings
            with self._list_lock:
                if self._listings != listings:  # listed while this one waited
                    key = self._object_at(offset)
                if key is None:
                    self._list_on()
                    key = self._object_at(offset)
        if key is None:
            chain = self._chain
            assert chain is not None
            if offset < chain.trim_offset:
                raise WALTrimmedError(
                    f"offset {offset} is below the trim point {chain.trim_offset}"
                )
            raise ValueError(f"no record at {offset}: the WAL ends at {chain.end_offset}")
        records = self._records(key)
        body = records.get(offset)
        if body is None:
            raise ValueError(f"no record starts at {offset} (object {key})")
        return RecoveredRecord(offset, OBJECT_RECORD_HEADER_BYTES + len(body), body)

    def _object_at(self, offset: int) -> DataKey | None:
        """The data object of the chain known now that holds `offset`."""
        chain = self._chain
        assert chain is not None
        if offset < chain.trim_offset:
            return None
        starts = [d.start_offset for d in chain.objects]
        i = bisect_left(starts, offset + 1) - 1
        if i >= 0 and chain.objects[i].start_offset <= offset < chain.objects[i].end_offset:
            return chain.objects[i]
        return None

    def _list_on(self) -> None:
        """List the keys after the newest data key known and resolve the chain again.
        The caller holds `_list_lock`."""
        with self._lock:
            after = self._listed_after
        new, seals, trims = list_wal_objects(self._objects, self._where, start_after=after)
        trim = max(trims, default=0)
        with self._lock:
            for d in new:
                self._datas[d] = None
            for d in [d for d in self._datas if d.end_offset <= trim]:
                del self._datas[d]  # wholly trimmed (deleted, or about to be)
            chain = self._chain = resolve_chain(list(self._datas), [s for s, _ in seals], trims)
            # on from the chain's last object, not the newest key seen: PUTs run in parallel,
            # so an object past a gap (a later one visible first) is listed again until the
            # gap fills (the missing one sorts after the chain's end)
            last = chain.objects[-1] if chain.objects else None
            self._listed_after = (
                data_key(self._where.prefix, last.writer, last.start_offset, last.end_offset)
                if last is not None
                else ""
            )
            self._listings += 1

    def _records(self, key: DataKey) -> dict[int, bytes]:
        with self._lock:
            records = self._decoded.pop(key, None)
            if records is not None:
                self._decoded[key] = records  # most recently used
                return records
            fetching = self._fetching.get(key)
            if fetching is None:
                fetching = self._fetching[key] = Future()
                fetch = True
            else:
                fetch = False
        if not fetch:
            return fetching.result()  # the other reader's GET (or its error)
        try:
            records = self._fetch(key)
        except BaseException as exc:
            fetching.set_exception(exc)
            raise
        else:
            fetching.set_result(records)
        finally:
            with self._lock:
                del self._fetching[key]
        return records

    def _fetch(self, key: DataKey) -> dict[int, bytes]:
        """GET and decode one data object; keep it in the LRU."""
        name = data_key(self._where.prefix, key.writer, key.start_offset, key.end_offset)
        try:
            data = self._objects.get_object(self._where.bucket_id, name, Priority.PRODUCE)
        except ObjectNotFoundError:
            raise WALTrimmedError(f"object {key} was trimmed") from None
        records = dict(decode_object(key, data))
        with self._lock:
            self._decoded[key] = records
            while len(self._decoded) > self._max_cached:
                self._decoded.pop(next(iter(self._decoded)))
        return records


class WALTrimmedError(WALError):
    """The requested offset was trimmed: its data is gone from the WAL."""
