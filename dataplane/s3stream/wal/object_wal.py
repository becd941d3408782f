"""ObjectWAL: the write-ahead log as objects in an object store (seed 000; AutoMQ's default).

* Group commit: the *writer* thread takes queued appends (waiting up to ``linger_s`` for a
  fuller batch, at most ``max_batch_bytes``), assigns their offsets and PUTs them as one
  object (``object_format``); up to ``max_in_flight`` PUTs run at once. The *acker* thread
  takes finished PUTs in offset order, re-reads the ``owner`` object once for all of them,
  and only then resolves their futures: an append is acknowledged after its object is
  stored and while this instance still owns the WAL (the file WAL's reservation check after
  fdatasync, with a GET in place of a pread).
* Opening (:meth:`ObjectWAL.open`) and taking over (:func:`take_over`) both *claim* the
  WAL: write the owner object, list the prefix, resolve the record chain, and write a seal
  naming the chain's end before anything else. Every append the previous owner acknowledged
  was stored before the claim (its owner check came after its PUT), so the listing sees
  it; anything it stores later lies beyond the seal and is ignored (and deleted) by every
  later reader. The fencing rule is in ``object_format.resolve_chain`` and docs/formats.md.
* ``trim`` writes a trim marker, then deletes the data objects wholly below it.

Every request goes through :class:`~dataplane.objectstore.ObjectStorage`, with its retry
policy and timeouts; a PUT that still fails stops the WAL (like a failed fdatasync).
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from dataplane.config import ObjectWALConfig
from dataplane.objectstore import ObjectNotFoundError, ObjectStorage, ObjectStoreError, Priority
from dataplane.s3stream.wal import metrics
from dataplane.s3stream.wal.append_queue import FAILED, FENCED, PendingAppend, QueuedWAL
from dataplane.s3stream.wal.base import (
    AppendResult,
    RecordPieces,
    RecoveredRecord,
    WALClosedError,
    WALError,
    WALFencedError,
)
from dataplane.s3stream.wal.object_chain import (
    ClaimedWAL,
    LiveObject,
    ObjectWALLocation,
    check_trim_point,
    claim,
    read_records,
    trim_below,
)
from dataplane.s3stream.wal.object_format import (
    OBJECT_RECORD_HEADER_BYTES,
    DataKey,
    data_key,
    encode_object,
    record_ends,
)

__all__ = ["ObjectWAL", "check_config"]

log = logging.getLogger(__name__)

STOP_CHECK_S = 0.2  # a PUT's waiter looks this often whether the WAL was stopped meanwhile


def check_config(config: ObjectWALConfig, capacity_bytes: int) -> None:
    """Raise ValueError when a limit of `config` is out of range for ``capacity_bytes`` or
    this object format (the model itself bounds each field alone)."""
    if config.max_record_bytes + OBJECT_RECORD_HEADER_BYTES > config.max_batch_bytes:
        raise ValueError("max_batch_bytes must hold one max_record_bytes record and its header")
    if config.max_batch_bytes > capacity_bytes:
        raise ValueError(
            f"max_batch_bytes={config.max_batch_bytes} exceeds the capacity ({capacity_bytes} B)"
        )
    if config.max_queue_bytes < config.max_batch_bytes:
        raise ValueError("max_queue_bytes must be >= max_batch_bytes")


@dataclass(slots=True)
class _InFlight:
    batch: list[PendingAppend]
    key: DataKey
    ends: array
    object_key: str
    data: bytes
    puts: list[Future]  # the PUT and its hedged copies; the first success counts
    started_s: float

    def stored(self) -> bool:
        return any(f.done() and f.exception() is None for f in self.puts)


class ObjectWAL(QueuedWAL):
    """A WAL of objects under ``s3://bucket/prefix`` (see the module docstring).

    Create with :meth:`open`. ``append`` is thread-safe; ``recover`` is meant for startup.
    """

    def __init__(
        self,
        objects: ObjectStorage,
        where: ObjectWALLocation,
        claimed: ClaimedWAL,
        capacity_bytes: int,
        config: ObjectWALConfig,
    ) -> None:
        super().__init__(
            f"s3 WAL {where.prefix}",
            capacity_bytes,
            config.max_queue_bytes,
            claimed.chain.trim_offset,
            claimed.chain.end_offset,
        )
        self._objects = objects
        self._where = where
        self._owner = claimed.owner
        self._owner_bytes = claimed.owner.encode()
        self._config = config
        self._acks_cv = threading.Condition(self._lock)
        self._in_flight: deque[_InFlight] = deque()
        self._live: list[LiveObject] = claimed.live
        self._writer_exited = False
        self._puts = 0
        self._owner_checks = 0
        self._hedges = 0
        # when the acker's ownership check started (None: none running): see stalled_s
        self._owner_check_since: float | None = None
        self._threads = [
            threading.Thread(
                target=self._run, args=(role, fn), name=f"object-wal-{role}", daemon=True
            )
            for role, fn in (("writer", self._write_loop), ("acks", self._ack_loop))
        ]
        for thread in self._threads:
            thread.start()

    @classmethod
    def open(
        cls,
        objects: ObjectStorage,
        where: ObjectWALLocation,
        node_id: int,
        node_epoch: int,
        *,
        capacity_bytes: int,
        config: ObjectWALConfig | None = None,
    ) -> ObjectWAL:
        """Open (or create) the WAL as writer ``(node_id, node_epoch)``.

        Raises:
            WALFencedError: the WAL is owned by a newer epoch, or another node at this epoch.
            WALCorruptError: the objects break the chain rule (acknowledged data missing).
            ObjectStoreError: the store is unreachable (after its retries).
        """
        config = config or ObjectWALConfig()
        check_config(config, capacity_bytes)
        objects.bucket(where.bucket_id)  # an unknown bucket id fails here, before any write
        claimed = claim(objects, where, node_id, node_epoch, takeover=False)
        return cls(objects, where, claimed, capacity_bytes, config)

    # ------------------------------------------------------------------ properties
    @property
    def location(self) -> ObjectWALLocation:
        return self._where

    @property
    def owner(self) -> tuple[int, int]:
        return (self._owner.node_id, self._owner.epoch)

    @property
    def put_count(self) -> int:
        """Data objects this instance stored (one per group commit)."""
        with self._lock:
            return self._puts

    @property
    def stalled_s(self) -> float:
        """How long the oldest PUT in flight, or the ownership check that acknowledges
        stored ones, has gone unanswered (0: nothing waits on the store)."""
        with self._lock:
            now = time.monotonic()
            checking_s = 0.0 if self._owner_check_since is None else now - self._owner_check_since
            if not self._in_flight or self._in_flight[0].stored():
                # stored objects wait for the owner check: a hung store stalls them there
                return checking_s
            return max(now - self._in_flight[0].started_s, checking_s)

    @property
    def owner_checks(self) -> int:
        with self._lock:
            return self._owner_checks

    @property
    def hedged_puts(self) -> int:
        """Extra copies of slow PUTs sent by this instance."""
        with self._lock:
            return self._hedges

    # ------------------------------------------------------------------ API
    def append(
        self, record: bytes | RecordPieces, body_crc32c: int | None = None
    ) -> Future[AppendResult]:
        """Queue ``record`` (or its pieces, joined here); the future resolves once its object
        is stored and ownership re-checked. Never blocks (see `WriteAheadLog.append`;
        `append_waiting` waits for queue room on a worker thread). ``body_crc32c`` is not
        used: the object's checksums are computed when it is built, off the caller's
        thread.

        Raises:
            ValueError: record larger than ``max_record_bytes``.
            WALQueueFullError: the queue holds ``max_queue_bytes``; room comes as it drains.
            WALFullError: no room until the WAL is trimmed.
            WALClosedError / WALFencedError / WALError: the WAL no longer accepts appends.
        """
        if isinstance(record, tuple):
            body = b"".join(record)
        else:
            body = record if isinstance(record, bytes) else bytes(record)
        if len(body) > self._config.max_record_bytes:
            raise ValueError(
                f"record of {len(body)} B exceeds max_record_bytes={self._config.max_record_bytes}"
            )
        return self._admit(OBJECT_RECORD_HEADER_BYTES + len(body), body)

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield the records in ``[start_offset, end_offset)`` as of this call, in order."""
        with self._lock:
            if self._closed:
                raise WALClosedError(f"{self._name} is closed")
            live, trim = list(self._live), self._trim_offset
        yield from read_records(
            self._objects, self._where, live, trim, self._config.read_parallelism
        )

    def trim(self, up_to_offset: int) -> None:
        """Durably release the records below ``up_to_offset`` (a record boundary).

        Raises:
            ValueError: beyond the durable end, or not a record boundary.
            WALFencedError / WALClosedError / WALError: the WAL is unusable.
        """
        with self._trim_lock:
            with self._lock:
                self._raise_if_unusable()
                old, end, live = self._trim_offset, self._durable_end, list(self._live)
            if up_to_offset <= old:
                return
            check_trim_point(live, up_to_offset, end)
            self._check_owner()
            try:
                rest = trim_below(self._objects, self._where, live, old, up_to_offset)
            except ObjectStoreError as exc:
                raise WALError(f"trim of {self._name} failed: {exc}") from exc
            with self._lock:
                dropped = len(live) - len(rest)
                self._live = self._live[dropped:]
                self._trim_offset = up_to_offset
                self._room.notify()

    def close(self) -> None:
        """Store what is queued, stop the threads. Idempotent."""
        if not self._begin_close():
            return
        deadline = time.monotonic() + self._config.close_timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
            self._stop(FAILED, "close timed out", [])
            raise WALError(f"{self._name} did not stop within {self._config.close_timeout_s} s")

    def abandon(self, reason: str) -> None:
        """Fail every append queued or in flight, and all later ones (`WALError`), without
        waiting for their PUTs: a writer that moved to another WAL (`BucketFollowingWAL`,
        a stalled bucket). A PUT still running may store its object later; nothing
        acknowledged refers to it."""
        self._stop(FAILED, f"abandoned: {reason}", [])

    def _check_owner(self) -> None:
        """Raise WALFencedError unless the owner object still names this writer."""
        try:
            current = self._objects.get_object(
                self._where.bucket_id, f"{self._where.prefix}/owner", Priority.PRODUCE
            )
        except ObjectNotFoundError:
            raise WALFencedError("the owner object is gone") from None
        with self._lock:
            self._owner_checks += 1
        if current != self._owner_bytes:
            raise WALFencedError(f"owner is now {current[:120]!r}")

    # ------------------------------------------------------------------ threads
    def _run(self, role: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # a bug: fail everything rather than hang callers
            log.exception("%s %s crashed", self._name, role)
            self._stop(FAILED, f"{role} crashed: {exc!r}", [])
        finally:
            if role == "writer":
                with self._lock:
                    self._writer_exited = True
                    self._acks_cv.notify_all()

    def _write_loop(self) -> None:
        """Writer thread: batch queued appends, PUT each batch as one object."""
        while True:
            with self._lock:
                if not self._wait_for_work(
                    lambda: bool(self._queue) and len(self._in_flight) < self._config.max_in_flight
                ):
                    return
                self._linger(self._config.max_batch_bytes, self._config.linger_s)
                if not self._queue:  # fenced or failed while lingering: the queue was failed
                    continue
                batch, self._next_offset = self._pop_batch(self._config.max_batch_bytes)
                self._room.notify()
            start = batch[0].offset
            bodies = [p.body for p in batch]
            end = batch[-1].offset + batch[-1].size_bytes
            key = DataKey(self._owner.writer, start, end)
            object_key = data_key(self._where.prefix, key.writer, start, end)
            try:
                data = encode_object(self._owner.node_id, self._owner.writer, start, bodies)
                put = self._objects.put_object_async(self._where.bucket_id, object_key, data)
            except Exception as exc:  # the store is closed, or a bug: the WAL cannot go on
                self._stop(FAILED, f"{type(exc).__name__}: {exc}", batch)
                return
            with self._lock:
                self._in_flight.append(
                    _InFlight(
                        batch,
                        key,
                        record_ends(start, bodies),
                        object_key,
                        data,
                        [put],
                        time.monotonic(),
                    )
                )
                self._acks_cv.notify_all()

    def _ack_loop(self) -> None:
        """Acker thread: in offset order, wait for PUTs, check ownership once, acknowledge."""
        while True:
            with self._lock:
                while not self._in_flight and not self._writer_exited:
                    self._acks_cv.wait()
                if not self._in_flight:
                    return
                head = self._in_flight[0]
            try:
                self._await_put(head)
            except Exception as exc:  # timeout, or the store failed after its retries
                self._stop(FAILED, f"PUT of {head.key} failed: {type(exc).__name__}: {exc}", [])
                continue
            with self._lock:
                ready: list[_InFlight] = []
                for item in self._in_flight:
                    if not item.stored():
                        break
                    ready.append(item)
            # every object in `ready` was stored before this check started
            with self._lock:
                self._owner_check_since = time.monotonic()
            try:
                self._check_owner()
            except WALFencedError as exc:
                self._stop(FENCED, str(exc), [])
                continue
            except Exception as exc:
                self._stop(FAILED, f"owner check failed: {type(exc).__name__}: {exc}", [])
                continue
            finally:
                with self._lock:
                    self._owner_check_since = None
            with self._lock:
                if self._status in (FENCED, FAILED):
                    continue  # _stop failed them meanwhile
                for item in ready:
                    self._in_flight.popleft()
                    item.data = b""
                    self._live.append(LiveObject(item.key, item.ends))
                    self._puts += 1
                self._durable_end = ready[-1].key.end_offset
                self._not_empty.notify_all()
            now = time.monotonic()
            for item in ready:
                size = item.key.end_offset - item.key.start_offset
                metrics.APPEND_BYTES.inc(size)
                metrics.BATCH_BYTES.observe(size)
                for pending in item.batch:
                    metrics.APPEND_LATENCY.observe(now - pending.enqueued_at_s)
                    pending.future.set_result(AppendResult(pending.offset, pending.size_bytes))

    def _await_put(self, item: _InFlight) -> None:
        """Wait until one copy of ``item``'s PUT succeeded; hedge a slow one (same key and
        bytes). Raises the PUT's error when every copy failed, TimeoutError after
        ``put_timeout_s``, WALError once the WAL was stopped meanwhile (abandoned)."""
        config = self._config
        hedge_at_s = item.started_s + config.hedge_after_s
        while True:
            pending = [f for f in item.puts if not f.done()]
            if item.stored():
                return
            if not pending:
                item.puts[-1].result()  # every copy failed: raise the last error
            with self._lock:
                if self._status in (FENCED, FAILED):
                    raise WALError(f"{self._name} stopped: {self._failure}")
            now = time.monotonic()
            left = item.started_s + config.put_timeout_s - now
            if left <= 0:
                raise TimeoutError(f"no PUT answered within {config.put_timeout_s} s")
            wait_s = min(left, max(hedge_at_s - now, 0.0), STOP_CHECK_S)
            done, _ = wait(pending, timeout=wait_s, return_when=FIRST_COMPLETED)
            if done or time.monotonic() < hedge_at_s:
                continue  # stored, a copy failed (the others may still succeed), or not yet
            hedge_at_s = time.monotonic() + config.hedge_after_s
            if len(item.puts) <= config.max_hedges:
                with self._lock:
                    self._hedges += 1
                log.warning(
                    "%s: PUT of %s unanswered after %.1f s; sending a copy",
                    self._name,
                    item.object_key,
                    time.monotonic() - item.started_s,
                )
                item.puts.append(
                    self._objects.put_object_async(
                        self._where.bucket_id, item.object_key, item.data
                    )
                )

    def _stop(self, status: str, reason: str, batch: list[PendingAppend]) -> None:
        """Fail ``batch``, everything in flight or queued, and all later calls."""
        with self._lock:
            stopped_before = self._status in (FENCED, FAILED)
            pending = list(batch)
            for item in self._in_flight:
                pending.extend(item.batch)
            pending.extend(self._fail_queue(status, reason))
            self._in_flight.clear()
            self._acks_cv.notify_all()
        if stopped_before and not pending:
            return  # a thread noticing the stop: said and done already
        level = logging.WARNING if status == FENCED else logging.ERROR
        log.log(level, "%s %s: %s; failing %d appends", self._name, status, reason, len(pending))
        self._fail_appends(pending, status, reason)
