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
import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

__all__ = [
    "AppendResult",
    "RecoveredRecord",
    "RoomSignal",
    "WALBackpressureError",
    "WALClosedError",
    "WALCorruptError",
    "WALError",
    "WALFencedError",
    "WALFullError",
    "WALLoss",
    "WALQueueFullError",
    "WALQueueTimeoutError",
    "WALTakeoverRefusedError",
    "WriteAheadLog",
]


class WALError(Exception):
    """Base class of WAL errors."""


class RoomSignal:
    """Tells waiters that a WAL has freed room (its append queue drained, or it was trimmed).

    A generation counter closes the gap between a failed attempt and the wait: read
    `generation` before trying, then wait for a generation after it; room freed in between
    ends the wait at once. Thread-safe: `notify` is called from the WAL's threads; `wait`
    blocks the calling thread (never the event loop's), `wait_async` is the event loop's
    awaitable form (a callback, no thread held while waiting).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._generation = 0
        self._callbacks: list[Callable[[], None]] = []

    @property
    def generation(self) -> int:
        # read on every append: no lock (an int read is atomic; a stale value only ends
        # a later wait at once)
        return self._generation

    def notify(self) -> None:
        """Room was freed: wake every waiter (cheap when nobody waits)."""
        with self._cond:
            self._generation += 1
            callbacks, self._callbacks = self._callbacks, []
            self._cond.notify_all()
        for callback in callbacks:
            callback()

    def wait(self, after_generation: int, timeout_s: float) -> bool:
        """Block until a generation after `after_generation` (True) or `timeout_s` (False)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with self._cond:
            while self._generation <= after_generation:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    async def wait_async(self, after_generation: int, timeout_s: float) -> bool:
        """`wait` for the event loop: True once room was freed after `after_generation`,
        False after `timeout_s`."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(lambda: woken.done() or woken.set_result(None))

        with self._cond:
            if self._generation > after_generation:
                return True
            self._callbacks.append(wake)
        try:
            await asyncio.wait_for(woken, max(timeout_s, 0.0))
            return True
        except TimeoutError:
            with self._cond:
                if wake in self._callbacks:
                    self._callbacks.remove(wake)
                return self._generation > after_generation


class WALBackpressureError(WALError):
    """No room for the record now; nothing was appended. Room comes back by itself (the
    queue drains, or an upload lets the WAL be trimmed): wait on `room` for a generation
    after `generation`, then append again."""

    def __init__(self, message: str, room: RoomSignal, generation: int):
        super().__init__(message)
        self.room = room
        self.generation = generation


class WALFullError(WALBackpressureError):
    """No room for the record until the WAL is trimmed (upload, then trim)."""


class WALQueueFullError(WALBackpressureError):
    """The append queue holds ``max_queue_bytes``: room comes back as it drains."""


class WALQueueTimeoutError(WALError, TimeoutError):
    """`append_waiting`: the append queue stayed full for the whole wait."""


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


_MAX_STREAMS_NAMED = 20


@dataclass
class WALLoss:
    """Records cut off from a WAL by corruption: ``[start_offset, end_offset)`` of the ring's
    logical offsets, ``records`` valid records lost in it, and per stream the stream offsets
    ``(first, end)`` those records covered (some may have been uploaded already).
    ``within_in_flight_window``: every lost record lies within the bytes that may have been
    written but not yet synced at a crash; after a power loss they may never have been
    acknowledged (`wal.loss`)."""

    wal: str
    start_offset: int
    end_offset: int
    records: int
    stop_reason: str
    streams: dict[int, tuple[int, int]] = field(default_factory=dict)
    within_in_flight_window: bool = False

    @property
    def size_bytes(self) -> int:
        """Bytes of the ring the loss spans."""
        return self.end_offset - self.start_offset

    def describe(self) -> str:
        """One line: where, how much, which streams and offsets."""
        named = sorted(self.streams.items())[:_MAX_STREAMS_NAMED]
        streams = ", ".join(f"stream {sid} offsets [{a}, {b})" for sid, (a, b) in named)
        more = len(self.streams) - len(named)
        if more > 0:
            streams += f" and {more} more streams"
        caveat = (
            " (all within the last in-flight window: after a power loss they may not have "
            "been acknowledged)"
            if self.within_in_flight_window
            else ""
        )
        return (
            f"WAL {self.wal}: {self.records} records in bytes [{self.start_offset}, "
            f"{self.end_offset}) lost after corruption ({self.stop_reason}){caveat}; "
            f"{streams or 'no stream batches'}"
        )


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
    def append(
        self, record: bytes | RecordPieces, body_crc32c: int | None = None
    ) -> Future[AppendResult]:
        """Queue ``record`` for durable append; the future resolves after it is durable.
        Never blocks (callers may be on the event loop): no room now raises a
        `WALBackpressureError` (`WALFullError`, `WALQueueFullError`) at once.

        ``record`` may be given as a tuple of its pieces in order (e.g. a header and a
        payload): they are written one after another as one record, without being joined
        first. The caller must not change them afterwards (bytes or read-only views).
        ``body_crc32c``: the CRC32C of the record's bytes when the caller knows it
        (`formats.crc32c_combine` from a checked batch's CRC); a WAL may store it as the
        record's checksum instead of reading the bytes again, so it must be right."""

    @abc.abstractmethod
    def has_room(self, size_bytes: int) -> bool:
        """Whether an append of `size_bytes` (headers included) would find room now, both
        in the queue and in the WAL. Advisory: another thread may take the room first."""

    @property
    @abc.abstractmethod
    def room(self) -> RoomSignal:
        """Notified whenever the WAL frees room (queue drained, trimmed)."""

    def append_waiting(
        self, record: bytes | RecordPieces, queue_wait_s: float
    ) -> Future[AppendResult]:
        """`append` for a caller on a worker thread: while the append queue is full, wait
        for it to drain, up to `queue_wait_s` (then `WALQueueTimeoutError`). A full WAL
        still raises `WALFullError` at once (only an upload frees it). Never call this
        on the event loop."""
        deadline = time.monotonic() + queue_wait_s
        while True:
            try:
                return self.append(record)
            except WALQueueFullError as exc:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not exc.room.wait(exc.generation, remaining):
                    raise WALQueueTimeoutError(f"{exc} for {queue_wait_s} s") from None

    scan_loss: WALLoss | None = None
    """What the recovery scan found cut off by corruption (`wal.loss`), None if nothing;
    set before `recover` returns its last record. Read-only for callers."""

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
