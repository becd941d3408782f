"""QueuedWAL: the append queue and status machinery both WALs share.

`FileWAL` and `ObjectWAL` put appends through the same front: a pending queue bounded by
``max_queue_bytes`` that the WAL's writer thread drains into batches (group commit), the
`RoomSignal` that tells waiters room was freed, and the status open -> closing (close
drains what is queued) or fenced / failed (everything queued or in flight fails, and every
later call). Admission never blocks (the event loop calls `append`): a full queue raises
`WALQueueFullError`, a full WAL `WALFullError`, at once. What differs (how a batch is made
durable and how ownership is re-checked) stays in each WAL.

All ``_``-prefixed state is guarded by ``_lock``; methods documented "caller holds the lock"
must be called with it held.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from dataplane.light_future import LightFuture
from dataplane.runtime import writer_wakeup_deferred
from dataplane.s3stream.wal.base import (
    AppendResult,
    RecordPieces,
    RoomSignal,
    WALClosedError,
    WALError,
    WALFencedError,
    WALFullError,
    WALQueueFullError,
    WriteAheadLog,
)

__all__ = ["CLOSING", "FAILED", "FENCED", "OPEN", "PendingAppend", "QueuedWAL"]

OPEN, CLOSING, FENCED, FAILED = "open", "closing", "fenced", "failed"


@dataclass(slots=True)
class PendingAppend:
    """An admitted append, waiting in the queue or in a batch until it is durable."""

    size_bytes: int  # record header + body
    body: RecordPieces | bytes  # the FileWAL keeps the pieces; the ObjectWAL joins them
    future: Future
    enqueued_at_s: float
    body_crc32c: int = 0  # FileWAL only (its record header carries it)
    offset: int = -1  # assigned by the writer when the record joins a batch


class QueuedWAL(WriteAheadLog):
    """A `WriteAheadLog` whose appends go through a bounded queue (module docstring)."""

    def __init__(
        self,
        name: str,
        capacity_bytes: int,
        max_queue_bytes: int,
        trim_offset: int,
        end_offset: int,
    ) -> None:
        """`name` starts the WAL's error messages; `trim_offset` / `end_offset`: the record
        chain found when the WAL was opened (appends continue at its end)."""
        self._name = name
        self._capacity_bytes = capacity_bytes
        self._max_queue_bytes = max_queue_bytes
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)  # wakes the writer thread
        # writer threads waiting on `_not_empty` now: an append notifies only when one is
        # (a busy writer takes the queue when its commit ends; a notify is ~Python work)
        self._writers_waiting = 0
        self._room = RoomSignal()
        self._trim_lock = threading.Lock()  # one trim at a time
        self._queue: deque[PendingAppend] = deque()
        self._queued_bytes = 0
        self._trim_offset = trim_offset
        self._recovered_end = end_offset
        self._durable_end = end_offset
        self._next_offset = end_offset  # where the next batch starts (writer-assigned)
        self._status = OPEN
        self._closed = False
        self._failure = ""

    # ------------------------------------------------------------------ properties
    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used_bytes()

    @property
    def start_offset(self) -> int:
        with self._lock:
            return self._trim_offset

    @property
    def end_offset(self) -> int:
        with self._lock:
            return self._durable_end

    @property
    def recovered_end_offset(self) -> int:
        """End of the record chain found when the WAL was opened."""
        return self._recovered_end

    @property
    def fenced(self) -> bool:
        """Whether another owner took the WAL over (it acknowledges nothing more)."""
        with self._lock:
            return self._status == FENCED

    @property
    def failed(self) -> bool:
        """Whether a write failed for good (the WAL acknowledges nothing more)."""
        with self._lock:
            return self._status == FAILED

    @property
    def room(self) -> RoomSignal:
        return self._room

    @property
    def writer_idle(self) -> bool:
        """Whether a writer thread waits for appends (the next append wakes it)."""
        with self._lock:
            return self._writers_waiting > 0

    def has_room(self, size_bytes: int) -> bool:
        with self._lock:
            return (
                self._queued_bytes + size_bytes <= self._max_queue_bytes
                and self._used_bytes() + size_bytes <= self._capacity_bytes
            )

    # ------------------------------------------------------------------ admission
    def _admit(
        self, size_bytes: int, body: RecordPieces | bytes, body_crc32c: int = 0
    ) -> Future[AppendResult]:
        """Queue a record of `size_bytes` (header included) without blocking; the writer
        thread is woken.

        Raises:
            WALQueueFullError: the queue holds ``max_queue_bytes``; room comes as it drains.
            WALFullError: no room until the WAL is trimmed.
            WALClosedError / WALFencedError / WALError: the WAL no longer accepts appends.
        """
        now = time.monotonic()
        generation = self._room.generation
        with self._lock:
            self._raise_if_unusable()
            if self._queued_bytes + size_bytes > self._max_queue_bytes:
                raise WALQueueFullError(
                    f"WAL append queue full ({self._queued_bytes} B)", self._room, generation
                )
            used = self._used_bytes()
            if used + size_bytes > self._capacity_bytes:
                raise WALFullError(
                    f"WAL full: {used} B of {self._capacity_bytes} B used, record needs "
                    f"{size_bytes} B; trim after upload",
                    self._room,
                    generation,
                )
            future: Future[AppendResult] = LightFuture()
            future.set_running_or_notify_cancel()  # appends cannot be cancelled
            self._queue.append(PendingAppend(size_bytes, body, future, now, body_crc32c))
            self._queued_bytes += size_bytes
            if self._writers_waiting and not writer_wakeup_deferred(self, self._wake_writers):
                self._not_empty.notify_all()
        return future

    def _wake_writers(self) -> None:
        """A wakeup `_admit` deferred (`writer_wakeups_held`): the writer takes what was
        queued meanwhile."""
        with self._lock:
            if self._writers_waiting:
                self._not_empty.notify_all()

    def _used_bytes(self) -> int:
        """Caller holds the lock: bytes of untrimmed records, queued ones included."""
        return self._next_offset + self._queued_bytes - self._trim_offset

    def _raise_if_unusable(self) -> None:
        """Caller holds the lock."""
        if self._closed:
            raise WALClosedError(f"{self._name} is closed")
        if self._status == FENCED:
            raise WALFencedError(f"{self._name} was taken over: {self._failure}")
        if self._status == FAILED:
            raise WALError(f"{self._name} failed: {self._failure}")

    # ------------------------------------------------------------------ writer side
    def _wait_for_work(self, ready: Callable[[], bool]) -> bool:
        """Caller holds the lock; the writer thread waits until `ready()` (True), or until
        it must exit (False): the WAL was fenced or failed, or it is closing and the queue
        is drained."""
        while True:
            if self._status in (FENCED, FAILED):
                return False
            if ready():
                return True
            if self._status != OPEN and not self._queue:
                return False  # closing and drained
            self._wait_not_empty(None)

    def _linger(self, max_batch_bytes: int, linger_s: float) -> None:
        """Caller holds the lock; wait up to `linger_s` after the oldest queued append for
        a batch of `max_batch_bytes` (not while closing, nor once `_linger_interrupted`)."""
        if linger_s <= 0 or self._status != OPEN:
            return
        deadline = self._queue[0].enqueued_at_s + linger_s
        while self._queued_bytes < max_batch_bytes and self._status == OPEN:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self._linger_interrupted():
                return
            self._wait_not_empty(remaining)

    def _wait_not_empty(self, timeout_s: float | None) -> None:
        """Caller holds the lock: a writer thread waits for `_not_empty` (counted, so that
        appends notify only while a writer waits)."""
        self._writers_waiting += 1
        try:
            self._not_empty.wait(timeout_s)
        finally:
            self._writers_waiting -= 1

    def _linger_interrupted(self) -> bool:
        """Caller holds the lock; whether other work for the writer ends a linger."""
        return False

    def _pop_batch(self, limit_bytes: int) -> tuple[list[PendingAppend], int]:
        """Caller holds the lock; pop up to `limit_bytes` of appends (at least one) and
        assign their offsets from ``_next_offset``. Returns them and the offset past the
        last; the caller moves ``_next_offset`` and notifies `room`."""
        batch: list[PendingAppend] = []
        offset = self._next_offset
        queue = self._queue
        total = 0
        while queue:
            size = queue[0].size_bytes
            if batch and total + size > limit_bytes:
                break
            pending = queue.popleft()
            pending.offset = offset
            offset += size
            total += size
            batch.append(pending)
        self._queued_bytes -= total
        return batch, offset

    # ------------------------------------------------------------------ stopping
    def _begin_close(self) -> bool:
        """Stop accepting appends; the writer drains the queue. False if already closed."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            if self._status == OPEN:
                self._status = CLOSING
            self._not_empty.notify_all()
            self._room.notify()
        return True

    def _fail_queue(self, status: str, reason: str) -> list[PendingAppend]:
        """Caller holds the lock; enter `status` (FENCED or FAILED; the first failure
        stays), empty the queue and wake everyone. Returns the queued appends, for the
        caller to fail (`_fail_appends`) once it released the lock."""
        if self._status not in (FENCED, FAILED):
            self._status = status
            self._failure = reason
        pending = list(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        self._room.notify()
        self._not_empty.notify_all()
        return pending

    @staticmethod
    def _fail_appends(pending: list[PendingAppend], status: str, reason: str) -> None:
        """Fail the futures of `pending` (not yet resolved) with the error of `status`."""
        error = WALFencedError if status == FENCED else WALError
        for item in pending:
            if not item.future.done():
                item.future.set_exception(error(reason))
