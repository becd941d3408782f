"""Object WALs across buckets: segments, and offsets that name their bucket (AKIP-1).

An object WAL that follows the active bucket (`segmented_wal.BucketFollowingWAL`: the
RouterChannel, `--wal s3`) is a sequence of *segments*, each an ordinary `ObjectWAL` in one
bucket. A segment is named by a `SegmentId` (counter, bucket id); the counter grows with
every new segment (a bucket switch, a failed segment replaced, a segment rolled before its
offsets run out), so segments are ordered by it. Segment 0 of a bucket lives at the WAL's
own prefix (the layout of a WAL that never switched); segment `n > 0` at `<prefix>-g<n>`.

A record's offset carries its segment, so any node reads it from the bucket it was written
to without listing anything::

    offset = counter << 48 | bucket id << 40 | offset inside the segment's ObjectWAL

Offsets grow across segments (the counter is the high part), which is all WAL users rely on
(trim below a point, order, floors). Limits: bucket ids 0..255 can hold a segment, a
segment at most 1 TiB of records (then a new one is started), 32767 segments over a WAL's
life. Pure layout plus the store-level steps on segments (list, delete) and the readers.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.wal.base import RecoveredRecord, WALError
from dataplane.s3stream.wal.object_chain import (
    ObjectWALLocation,
    WALOwnerUnfinishedError,
    read_owner,
)
from dataplane.s3stream.wal.object_readers import (
    ObjectWALReader,
    ObjectWALRecovery,
    WALTrimmedError,
    take_over,
)

__all__ = [
    "MAX_SEGMENT_BUCKET_ID",
    "MAX_SEGMENT_COUNTER",
    "SEGMENT_CAPACITY_BYTES",
    "SegmentId",
    "SegmentedReader",
    "SegmentedRecovery",
    "delete_segment",
    "global_offset",
    "list_segments",
    "split_offset",
    "take_over_segments",
]

log = logging.getLogger(__name__)

LOCAL_BITS = 40
BUCKET_BITS = 8
COUNTER_BITS = 63 - LOCAL_BITS - BUCKET_BITS  # 15
SEGMENT_CAPACITY_BYTES = 1 << LOCAL_BITS  # offsets inside one segment stay below this
MAX_SEGMENT_BUCKET_ID = (1 << BUCKET_BITS) - 1
MAX_SEGMENT_COUNTER = (1 << COUNTER_BITS) - 1
MAX_CACHED_SEGMENT_READERS = 8


@dataclass(frozen=True, order=True, slots=True)
class SegmentId:
    """One segment of a bucket-following WAL: ordered by counter (then bucket)."""

    counter: int
    bucket_id: int

    def __post_init__(self) -> None:
        if not 0 <= self.counter <= MAX_SEGMENT_COUNTER:
            raise ValueError(f"segment counter {self.counter} outside 0..{MAX_SEGMENT_COUNTER}")
        if not 0 <= self.bucket_id <= MAX_SEGMENT_BUCKET_ID:
            raise ValueError(
                f"bucket {self.bucket_id} cannot hold a WAL segment (ids 0..{MAX_SEGMENT_BUCKET_ID})"
            )

    def location(self, base_prefix: str) -> ObjectWALLocation:
        """Where the segment's ObjectWAL lives."""
        prefix = base_prefix if self.counter == 0 else f"{base_prefix}-g{self.counter}"
        return ObjectWALLocation(self.bucket_id, prefix)


def global_offset(segment: SegmentId, local_offset: int) -> int:
    """The WAL offset of `local_offset` inside `segment`'s ObjectWAL."""
    if not 0 <= local_offset <= SEGMENT_CAPACITY_BYTES:
        raise ValueError(
            f"offset {local_offset} is outside a segment (max {SEGMENT_CAPACITY_BYTES})"
        )
    high = (segment.counter << BUCKET_BITS) | segment.bucket_id
    return (high << LOCAL_BITS) | local_offset


def split_offset(offset: int) -> tuple[SegmentId, int]:
    """The segment and the offset inside it of a WAL offset; ValueError if negative."""
    if offset < 0:
        raise ValueError(f"negative WAL offset {offset}")
    local = offset & (SEGMENT_CAPACITY_BYTES - 1)
    bucket = (offset >> LOCAL_BITS) & MAX_SEGMENT_BUCKET_ID
    return SegmentId(offset >> (LOCAL_BITS + BUCKET_BITS), bucket), local


def _owned(objects: ObjectStorage, where: ObjectWALLocation) -> bool:
    """Whether a writer opened the WAL at `where` (an unfinished owner object counts: its
    claim is what settles it)."""
    try:
        return read_owner(objects, where) is not None
    except WALOwnerUnfinishedError:
        return True


def list_segments(objects: ObjectStorage, base_prefix: str) -> list[SegmentId]:
    """The segments of the WAL at `base_prefix` in every configured bucket (by their owner
    objects), in order. Raises the store's error when a bucket does not answer."""
    owner_re = re.compile(rf"^{re.escape(base_prefix)}-g(\d+)/owner$")
    found: list[SegmentId] = []
    for bucket_id in objects.bucket_ids:
        if bucket_id > MAX_SEGMENT_BUCKET_ID:
            continue
        if _owned(objects, ObjectWALLocation(bucket_id, base_prefix)):
            found.append(SegmentId(0, bucket_id))
        for key in objects.iter_keys(bucket_id, f"{base_prefix}-g"):
            match = owner_re.match(key)
            if match and 0 < int(match.group(1)) <= MAX_SEGMENT_COUNTER:
                found.append(SegmentId(int(match.group(1)), bucket_id))
    return sorted(found)


def delete_segment(objects: ObjectStorage, base_prefix: str, segment: SegmentId) -> int:
    """Delete every object of a segment nobody needs any more (wholly trimmed), its owner
    last; the count. Raises the store's error (the caller retries later)."""
    where = segment.location(base_prefix)
    keys = list(objects.iter_keys(where.bucket_id, where.prefix + "/"))
    owner = f"{where.prefix}/owner"
    rest = [k for k in keys if k != owner]
    deleted = objects.delete_objects(where.bucket_id, rest) if rest else 0
    if owner in keys:
        deleted += objects.delete_objects(where.bucket_id, [owner])
    return deleted


class SegmentedReader:
    """Reads single records of another node's bucket-following WAL by offset (the
    RouterChannel's get): the offset names the segment, so the record is read from the
    bucket it was written to. Thread-safe (a lock around the reader cache)."""

    def __init__(self, objects: ObjectStorage, base_prefix: str):
        self._objects = objects
        self._base_prefix = base_prefix
        self._readers: OrderedDict[SegmentId, ObjectWALReader] = OrderedDict()
        self._lock = threading.Lock()

    def _reader(self, segment: SegmentId) -> ObjectWALReader:
        with self._lock:
            reader = self._readers.pop(segment, None)
            if reader is None:
                reader = ObjectWALReader(self._objects, segment.location(self._base_prefix))
            self._readers[segment] = reader
            while len(self._readers) > MAX_CACHED_SEGMENT_READERS:
                self._readers.popitem(last=False)
            return reader

    def read(self, offset: int) -> RecoveredRecord:
        """The record that starts at `offset`.

        Raises:
            WALTrimmedError: the offset was trimmed (or its whole segment deleted).
            ValueError: no record starts there.
        """
        segment, local = split_offset(offset)
        try:
            record = self._reader(segment).read(local)
        except ValueError:
            where = segment.location(self._base_prefix)
            if not _owned(self._objects, where):
                raise WALTrimmedError(f"segment {segment} of {self._base_prefix} is gone") from None
            raise
        return RecoveredRecord(offset, record.size_bytes, record.data)


class SegmentedRecovery:
    """A failed node's bucket-following WAL claimed for recovery (every segment): read in
    offset order, trim what was uploaded. Not thread-safe (one recovering thread)."""

    scan_loss = None  # object WALs have no torn tail to scan

    def __init__(self, segments: list[tuple[SegmentId, ObjectWALRecovery]]):
        self._segments = segments

    def recover(self) -> Iterator[RecoveredRecord]:
        for segment, handle in self._segments:
            for record in handle.recover():
                yield RecoveredRecord(
                    global_offset(segment, record.offset), record.size_bytes, record.data
                )

    def trim(self, up_to_offset: int) -> None:
        """Release the records below `up_to_offset` in every segment it covers."""
        up_to_segment, local = split_offset(up_to_offset)
        for segment, handle in self._segments:
            if segment < up_to_segment:
                handle.trim(handle.end_offset)
            elif segment == up_to_segment:
                handle.trim(local)

    def close(self) -> None:
        for _, handle in self._segments:
            handle.close()


def take_over_segments(
    objects: ObjectStorage, base_prefix: str, node_id: int, node_epoch: int
) -> SegmentedRecovery:
    """Claim every segment of the WAL at `base_prefix` for recovery by `node_id` at
    `node_epoch` (see `object_readers.take_over`). Raises WALError when none exists."""
    segments = list_segments(objects, base_prefix)
    if not segments:
        raise WALError(f"WAL {base_prefix!r} does not exist in any bucket")
    claimed: list[tuple[SegmentId, ObjectWALRecovery]] = []
    try:
        for segment in segments:
            where = segment.location(base_prefix)
            claimed.append((segment, take_over(objects, where, node_id, node_epoch)))
    except BaseException:
        for _, handle in claimed:
            handle.close()
        raise
    return SegmentedRecovery(claimed)
