"""The write-ahead-log interface of the S3Stream engine.

Two implementations: :class:`~dataplane.s3stream.wal.file_wal.FileWAL` (a preallocated
local file / cloud disk, seed 001) and :class:`~dataplane.s3stream.wal.object_wal.ObjectWAL`
(objects in the object store; AutoMQ's default, and the zone router's RouterChannel storage,
seed 000). Both give records a monotonically
increasing *logical offset*; a record is identified by it, trimming is
expressed with it, and recovery returns records in offset order.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass

__all__ = [
    "AppendResult",
    "RecoveredRecord",
    "WALClosedError",
    "WALCorruptError",
    "WALError",
    "WALFencedError",
    "WALFullError",
    "WALTakeoverRefusedError",
    "WriteAheadLog",
]


class WALError(Exception):
    """Base class of WAL errors."""


class WALFullError(WALError):
    """No room for the record until the WAL is trimmed (upload, then trim)."""


class WALClosedError(WALError):
    """The WAL was closed."""


class WALFencedError(WALError):
    """Another owner holds the WAL's reservation; this instance may no longer acknowledge appends."""


class WALTakeoverRefusedError(WALError):
    """A reservation request did not carry an epoch greater than the current owner's."""


class WALCorruptError(WALError):
    """The WAL's metadata is unreadable, or acknowledged data no longer validates."""


# a record as its pieces, written back to back (see WriteAheadLog.append)
RecordPieces = tuple[bytes | memoryview, ...]


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an acknowledged record lives in the WAL.

    Attributes:
        offset: logical offset of the record (its first byte, header included).
        size_bytes: bytes the record occupies in the WAL (header + body).
    """

    offset: int
    size_bytes: int

    @property
    def next_offset(self) -> int:
        """Logical offset just past the record; pass it to ``trim`` once the record is uploaded."""
        return self.offset + self.size_bytes


@dataclass(frozen=True, slots=True)
class RecoveredRecord:
    """A record read back from the WAL during recovery."""

    offset: int
    size_bytes: int
    data: bytes

    @property
    def next_offset(self) -> int:
        """Logical offset just past the record."""
        return self.offset + self.size_bytes


class WriteAheadLog(abc.ABC):
    """A durable, ordered log of opaque records with group commit.

    Contract:
      * ``append`` assigns offsets in call order; its future resolves with the
        record's :class:`AppendResult` only once the record is durable (and, for
        shared media, only while this instance still owns the WAL). Failures
        that are known at call time (closed, fenced, full, too large) raise
        immediately; failures of the write itself fail the future.
      * ``recover`` yields every acknowledged, untrimmed record in offset order
        and never yields corrupt data.
      * ``trim(up_to_offset)`` releases records below ``up_to_offset`` (a record
        boundary, i.e. some ``next_offset``) for reuse; it blocks until the new
        trim point is durable.
    """

    @abc.abstractmethod
    def append(self, record: bytes | RecordPieces) -> Future[AppendResult]:
        """Queue ``record`` for durable append; the future resolves after it is durable.

        ``record`` may be given as a tuple of its pieces in order (e.g. a header and a
        payload): they are written one after another as one record, without being joined
        first. The caller must not change them afterwards (bytes or read-only views)."""

    @abc.abstractmethod
    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield the acknowledged, untrimmed records in offset order."""

    @abc.abstractmethod
    def trim(self, up_to_offset: int) -> None:
        """Release the records below ``up_to_offset`` (durably, before returning)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Finish queued appends, stop accepting new ones, release resources. Idempotent."""

    @property
    @abc.abstractmethod
    def capacity_bytes(self) -> int:
        """Bytes of records the WAL can hold (headers included)."""

    @property
    @abc.abstractmethod
    def used_bytes(self) -> int:
        """Bytes held by untrimmed records, including appends queued but not yet durable."""

    @property
    @abc.abstractmethod
    def start_offset(self) -> int:
        """The trim point: logical offset of the oldest retained record."""

    @property
    @abc.abstractmethod
    def end_offset(self) -> int:
        """Logical offset just past the last durable (acknowledged) record."""

    @property
    def free_bytes(self) -> int:
        """Bytes still available for appends."""
        return self.capacity_bytes - self.used_bytes

    def __enter__(self) -> WriteAheadLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
