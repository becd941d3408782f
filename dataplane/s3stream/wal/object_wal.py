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
import re
import threading
import time
from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from dataplane.config import ObjectWALConfig
from dataplane.objectstore import ObjectNotFoundError, ObjectStorage, ObjectStoreError, Priority
from dataplane.s3stream.wal import metrics
from dataplane.s3stream.wal.base import (
    AppendResult,
    RecordPieces,
    RecoveredRecord,
    RoomSignal,
    WALClosedError,
    WALCorruptError,
    WALError,
    WALFencedError,
    WALFullError,
    WALQueueFullError,
    WALTakeoverRefusedError,
    WriteAheadLog,
)
from dataplane.s3stream.wal.object_format import (
    MAX_INCARNATION,
    OBJECT_RECORD_HEADER_BYTES,
    Chain,
    DataKey,
    Owner,
    SealKey,
    data_key,
    decode_object,
    encode_object,
    parse_data_key,
    parse_seal_key,
    parse_trim_key,
    record_ends,
    resolve_chain,
    seal_key,
    trim_key,
)

__all__ = [
    "ObjectWAL",
    "ObjectWALLocation",
    "ObjectWALReader",
    "ObjectWALRecovery",
    "WALTrimmedError",
    "check_config",
    "object_wal_exists",
    "take_over",
]

log = logging.getLogger(__name__)

_PREFIX_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")
MAX_PREFIX_CHARS = 512
MAX_LISTED_KEYS = 1_000_000  # a WAL holds at most capacity / batch objects; far below this
_I64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ObjectWALLocation:
    """Where a WAL lives: a configured bucket and a key prefix (no leading/trailing '/')."""

    bucket_id: int
    prefix: str

    def __post_init__(self) -> None:
        if len(self.prefix) > MAX_PREFIX_CHARS or not _PREFIX_RE.match(self.prefix):
            raise ValueError(
                f"invalid WAL prefix {self.prefix[:80]!r}: use path segments of letters, "
                "digits, '.', '-' and '_'"
            )
        if any(part in (".", "..") for part in self.prefix.split("/")):
            raise ValueError(f"invalid WAL prefix {self.prefix[:80]!r}: no '.' or '..' segments")


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
class _Pending:
    size_bytes: int  # record header + body
    body: bytes
    future: Future
    enqueued_at_s: float
    offset: int = -1


@dataclass(slots=True)
class _InFlight:
    batch: list[_Pending]
    key: DataKey
    ends: array
    object_key: str
    data: bytes
    puts: list[Future]  # the PUT and its hedged copies; the first success counts
    started_s: float

    def stored(self) -> bool:
        return any(f.done() and f.exception() is None for f in self.puts)


@dataclass(slots=True)
class _Live:
    """A data object holding untrimmed records; ``ends`` None until its records were read."""

    key: DataKey
    ends: array | None = None


@dataclass(slots=True)
class _Claimed:
    owner: Owner
    chain: Chain
    live: list[_Live] = field(default_factory=list)


_OPEN, _CLOSING, _FENCED, _FAILED = "open", "closing", "fenced", "failed"


# ---------------------------------------------------------------------- claiming
def _read_owner(objects: ObjectStorage, where: ObjectWALLocation) -> Owner | None:
    try:
        return Owner.decode(objects.get_object(where.bucket_id, f"{where.prefix}/owner"))
    except ObjectNotFoundError:
        return None


def _list(
    objects: ObjectStorage, where: ObjectWALLocation
) -> tuple[list[DataKey], list[tuple[SealKey, str]], list[int]]:
    datas: list[DataKey] = []
    seals: list[tuple[SealKey, str]] = []
    trims: list[int] = []
    for n, key in enumerate(objects.iter_keys(where.bucket_id, where.prefix + "/")):
        if n >= MAX_LISTED_KEYS:
            raise WALError(f"WAL prefix {where.prefix!r} holds over {MAX_LISTED_KEYS} objects")
        if (d := parse_data_key(where.prefix, key)) is not None:
            datas.append(d)
        elif (s := parse_seal_key(where.prefix, key)) is not None:
            seals.append((s, key))
        elif (t := parse_trim_key(where.prefix, key)) is not None:
            trims.append(t)
    return datas, seals, trims


def _claim(
    objects: ObjectStorage, where: ObjectWALLocation, node_id: int, epoch: int, takeover: bool
) -> _Claimed:
    """Make (node_id, epoch) the WAL's writer; see the module docstring."""
    if not 0 <= node_id <= _I64_MAX or not 0 <= epoch <= _I64_MAX:
        raise ValueError(f"node_id={node_id} and node_epoch={epoch} must be within 0..2^63-1")
    current = _read_owner(objects, where)
    name = f"WAL s3 bucket {where.bucket_id} prefix {where.prefix!r}"
    if current is None:
        if takeover:
            raise WALError(f"{name} does not exist")
        incarnation = 0
    elif (current.node_id, current.epoch) == (node_id, epoch):
        # the same node again: a recoverer retrying its failover, or the owner re-opening;
        # either way a new writer that fences the previous incarnation
        incarnation = current.incarnation + 1
    elif takeover:
        if epoch <= current.epoch:
            raise WALTakeoverRefusedError(
                f"{name} is owned by node {current.node_id} epoch {current.epoch}; "
                f"takeover needs an epoch > {current.epoch}, got {epoch}"
            )
        incarnation = 0
    elif epoch > current.epoch:
        incarnation = 0
    else:
        raise WALFencedError(
            f"{name} is owned by node {current.node_id} epoch {current.epoch}; "
            f"node {node_id} epoch {epoch} may not open it"
        )
    if incarnation > MAX_INCARNATION:
        raise WALError(f"{name} was re-opened {MAX_INCARNATION} times with epoch {epoch}")
    owner = Owner(node_id, epoch, incarnation)
    objects.put_object(where.bucket_id, f"{where.prefix}/owner", owner.encode())
    # listed only after our ownership is stored: see the module docstring
    datas, seals, trims = _list(objects, where)
    chain = resolve_chain(datas, [s for s, _ in seals], trims)
    objects.put_object(where.bucket_id, seal_key(where.prefix, owner.writer, chain.end_offset), b"")
    if _read_owner(objects, where) != owner:
        raise WALFencedError(f"{name} was claimed by another writer while node {node_id} opened it")
    # cleanup (best effort): objects no reader will use. Seals stay: each one bounds the
    # writer just before it, should that writer's late PUT (a zombie's hedged copy) land.
    garbage = [data_key(where.prefix, d.writer, d.start_offset, d.end_offset) for d in chain.stale]
    garbage += [
        data_key(where.prefix, d.writer, d.start_offset, d.end_offset) for d in chain.trimmed
    ]
    garbage += [trim_key(where.prefix, t) for t in trims if t < chain.trim_offset]
    if garbage:
        try:
            objects.delete_objects(where.bucket_id, garbage)
        except ObjectStoreError as exc:
            log.warning("%s: cleanup of %d objects failed: %s", name, len(garbage), exc)
    log.info(
        "%s claimed by node %d epoch %d (writer %d): %d objects in [%d, %d), %d stale",
        name,
        node_id,
        epoch,
        incarnation,
        len(chain.objects),
        chain.trim_offset,
        chain.end_offset,
        len(chain.stale),
    )
    return _Claimed(owner, chain, [_Live(d) for d in chain.objects])


def _read_records(
    objects: ObjectStorage,
    where: ObjectWALLocation,
    live: list[_Live],
    trim_offset: int,
    parallelism: int,
) -> Iterator[RecoveredRecord]:
    """Yield the records of ``live`` objects at or past ``trim_offset``, fetching ahead."""
    if not live:
        return
    pool = ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="object-wal-read")
    try:
        keys = [
            data_key(where.prefix, o.key.writer, o.key.start_offset, o.key.end_offset) for o in live
        ]
        ahead: deque[Future] = deque()
        next_i = 0
        for item in live:
            while next_i < len(keys) and len(ahead) < parallelism:
                ahead.append(pool.submit(objects.get_object, where.bucket_id, keys[next_i]))
                next_i += 1
            try:
                data = ahead.popleft().result()
            except ObjectNotFoundError:
                # deleted under us: fine only if a trim (by a fenced owner that had uploaded
                # it, racing with this recovery) covers it; otherwise acknowledged data is gone
                trims = [
                    t
                    for k in objects.iter_keys(where.bucket_id, where.prefix + "/trim/")
                    if (t := parse_trim_key(where.prefix, k)) is not None
                ]
                if max(trims, default=0) >= item.key.end_offset:
                    item.ends = array("q")
                    continue
                raise WALCorruptError(f"WAL object {item.key} is missing") from None
            ends = array("q")
            for offset, body in decode_object(item.key, data):
                size = OBJECT_RECORD_HEADER_BYTES + len(body)
                ends.append(offset + size)
                if offset >= trim_offset:
                    yield RecoveredRecord(offset, size, body)
            item.ends = ends
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _check_trim_point(live: list[_Live], up_to: int, end: int) -> None:
    if up_to > end:
        raise ValueError(f"cannot trim to {up_to}: beyond the durable end {end}")
    if up_to == end:
        return
    for item in live:
        if item.key.start_offset == up_to:
            return
        if item.key.start_offset < up_to < item.key.end_offset:
            ends = item.ends
            if ends is not None:
                i = bisect_left(ends, up_to)
                if i < len(ends) and ends[i] == up_to:
                    return
            break
    raise ValueError(f"cannot trim to {up_to}: not a record boundary")


def _trim(
    objects: ObjectStorage, where: ObjectWALLocation, live: list[_Live], old: int, up_to: int
) -> list[_Live]:
    """Store the trim point, delete the objects wholly below it; returns the live rest."""
    objects.put_object(where.bucket_id, trim_key(where.prefix, up_to), b"")
    dead = [o for o in live if o.key.end_offset <= up_to]
    keys = [
        data_key(where.prefix, o.key.writer, o.key.start_offset, o.key.end_offset) for o in dead
    ]
    if old > 0:
        keys.append(trim_key(where.prefix, old))
    if keys:
        objects.delete_objects(where.bucket_id, keys)
    return [o for o in live if o.key.end_offset > up_to]


# ---------------------------------------------------------------------- the WAL
class ObjectWAL(WriteAheadLog):
    """A WAL of objects under ``s3://bucket/prefix`` (see the module docstring).

    Create with :meth:`open`. ``append`` is thread-safe; ``recover`` is meant for startup.
    """

    def __init__(
        self,
        objects: ObjectStorage,
        where: ObjectWALLocation,
        claimed: _Claimed,
        capacity_bytes: int,
        config: ObjectWALConfig,
    ) -> None:
        self._objects = objects
        self._where = where
        self._owner = claimed.owner
        self._owner_bytes = claimed.owner.encode()
        self._config = config
        self._capacity_bytes = capacity_bytes
        self._name = f"s3 WAL {where.prefix}"
        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._room = RoomSignal()
        self._acks_cv = threading.Condition(self._lock)
        self._trim_lock = threading.Lock()
        self._queue: deque[_Pending] = deque()
        self._queued_bytes = 0
        self._in_flight: deque[_InFlight] = deque()
        self._live: list[_Live] = claimed.live
        self._trim_offset = claimed.chain.trim_offset
        self._recovered_end = claimed.chain.end_offset
        self._durable_end = claimed.chain.end_offset
        self._next_offset = claimed.chain.end_offset
        self._status = _OPEN
        self._closed = False
        self._failure = ""
        self._writer_exited = False
        self._puts = 0
        self._owner_checks = 0
        self._hedges = 0
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
        claimed = _claim(objects, where, node_id, node_epoch, takeover=False)
        return cls(objects, where, claimed, capacity_bytes, config)

    # ------------------------------------------------------------------ properties
    @property
    def location(self) -> ObjectWALLocation:
        return self._where

    @property
    def owner(self) -> tuple[int, int]:
        return (self._owner.node_id, self._owner.epoch)

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._next_offset + self._queued_bytes - self._trim_offset

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
        return self._recovered_end

    @property
    def put_count(self) -> int:
        """Data objects this instance stored (one per group commit)."""
        with self._lock:
            return self._puts

    @property
    def owner_checks(self) -> int:
        with self._lock:
            return self._owner_checks

    @property
    def hedged_puts(self) -> int:
        """Extra copies of slow PUTs sent by this instance."""
        with self._lock:
            return self._hedges

    @property
    def fenced(self) -> bool:
        with self._lock:
            return self._status == _FENCED

    @property
    def room(self) -> RoomSignal:
        return self._room

    def has_room(self, size_bytes: int) -> bool:
        with self._lock:
            used = self._next_offset + self._queued_bytes - self._trim_offset
            return (
                self._queued_bytes + size_bytes <= self._config.max_queue_bytes
                and used + size_bytes <= self._capacity_bytes
            )

    # ------------------------------------------------------------------ API
    def append(self, record: bytes | RecordPieces) -> Future[AppendResult]:
        """Queue ``record`` (or its pieces, joined here); the future resolves once its object
        is stored and ownership re-checked. Never blocks (see `WriteAheadLog.append`;
        `append_waiting` waits for queue room on a worker thread).

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
        size = OBJECT_RECORD_HEADER_BYTES + len(body)
        now = time.monotonic()
        generation = self._room.generation
        with self._lock:
            self._raise_if_unusable()
            if self._queued_bytes + size > self._config.max_queue_bytes:
                raise WALQueueFullError(
                    f"WAL append queue full ({self._queued_bytes} B)", self._room, generation
                )
            used = self._next_offset + self._queued_bytes - self._trim_offset
            if used + size > self._capacity_bytes:
                raise WALFullError(
                    f"WAL full: {used} B of {self._capacity_bytes} B used, record needs {size} B; "
                    "trim after upload",
                    self._room,
                    generation,
                )
            future: Future[AppendResult] = Future()
            future.set_running_or_notify_cancel()
            self._queue.append(_Pending(size, body, future, now))
            self._queued_bytes += size
            self._not_empty.notify_all()
        return future

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield the records in ``[start_offset, end_offset)`` as of this call, in order."""
        with self._lock:
            if self._closed:
                raise WALClosedError(f"{self._name} is closed")
            live, trim = list(self._live), self._trim_offset
        yield from _read_records(
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
            _check_trim_point(live, up_to_offset, end)
            self._check_owner()
            try:
                rest = _trim(self._objects, self._where, live, old, up_to_offset)
            except ObjectStoreError as exc:
                raise WALError(f"trim of {self._name} failed: {exc}") from exc
            with self._lock:
                dropped = len(live) - len(rest)
                self._live = self._live[dropped:]
                self._trim_offset = up_to_offset
                self._room.notify()

    def close(self) -> None:
        """Store what is queued, stop the threads. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._status == _OPEN:
                self._status = _CLOSING
            self._not_empty.notify_all()
            self._room.notify()
        deadline = time.monotonic() + self._config.close_timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
            self._stop(_FAILED, "close timed out", [])
            raise WALError(f"{self._name} did not stop within {self._config.close_timeout_s} s")

    def _raise_if_unusable(self) -> None:
        """Caller holds the lock."""
        if self._closed:
            raise WALClosedError(f"{self._name} is closed")
        if self._status == _FENCED:
            raise WALFencedError(f"{self._name} was taken over: {self._failure}")
        if self._status == _FAILED:
            raise WALError(f"{self._name} failed: {self._failure}")

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
            self._stop(_FAILED, f"{role} crashed: {exc!r}", [])
        finally:
            if role == "writer":
                with self._lock:
                    self._writer_exited = True
                    self._acks_cv.notify_all()

    def _write_loop(self) -> None:
        """Writer thread: batch queued appends, PUT each batch as one object."""
        while True:
            with self._lock:
                while True:
                    if self._status in (_FENCED, _FAILED):
                        return
                    if self._queue and len(self._in_flight) < self._config.max_in_flight:
                        break
                    if self._status != _OPEN and not self._queue:
                        return  # closing and drained
                    self._not_empty.wait()
                self._linger()
                batch = self._take_batch()
            start = batch[0].offset
            bodies = [p.body for p in batch]
            end = batch[-1].offset + batch[-1].size_bytes
            key = DataKey(self._owner.writer, start, end)
            object_key = data_key(self._where.prefix, key.writer, start, end)
            try:
                data = encode_object(self._owner.node_id, self._owner.writer, start, bodies)
                put = self._objects.put_object_async(self._where.bucket_id, object_key, data)
            except Exception as exc:  # the store is closed, or a bug: the WAL cannot go on
                self._stop(_FAILED, f"{type(exc).__name__}: {exc}", batch)
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

    def _linger(self) -> None:
        """Caller holds the lock; wait up to linger_s for a fuller batch."""
        linger = self._config.linger_s
        if linger <= 0 or self._status != _OPEN:
            return
        deadline = self._queue[0].enqueued_at_s + linger
        while self._queued_bytes < self._config.max_batch_bytes and self._status == _OPEN:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._not_empty.wait(remaining)

    def _take_batch(self) -> list[_Pending]:
        """Caller holds the lock; pop up to max_batch_bytes of appends (at least one)."""
        batch: list[_Pending] = []
        offset = self._next_offset
        total = 0
        while self._queue:
            size = self._queue[0].size_bytes
            if batch and total + size > self._config.max_batch_bytes:
                break
            pending = self._queue.popleft()
            pending.offset = offset
            offset += size
            total += size
            batch.append(pending)
        self._queued_bytes -= total
        self._next_offset = offset
        self._room.notify()
        return batch

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
                self._stop(_FAILED, f"PUT of {head.key} failed: {type(exc).__name__}: {exc}", [])
                continue
            with self._lock:
                ready: list[_InFlight] = []
                for item in self._in_flight:
                    if not item.stored():
                        break
                    ready.append(item)
            # every object in `ready` was stored before this check started
            try:
                self._check_owner()
            except WALFencedError as exc:
                self._stop(_FENCED, str(exc), [])
                continue
            except Exception as exc:
                self._stop(_FAILED, f"owner check failed: {type(exc).__name__}: {exc}", [])
                continue
            with self._lock:
                if self._status in (_FENCED, _FAILED):
                    continue  # _stop failed them meanwhile
                for item in ready:
                    self._in_flight.popleft()
                    item.data = b""
                    self._live.append(_Live(item.key, item.ends))
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
        ``put_timeout_s``."""
        config = self._config
        while True:
            pending = [f for f in item.puts if not f.done()]
            if item.stored():
                return
            if not pending:
                item.puts[-1].result()  # every copy failed: raise the last error
            left = item.started_s + config.put_timeout_s - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no PUT answered within {config.put_timeout_s} s")
            done, _ = wait(
                pending, timeout=min(left, config.hedge_after_s), return_when=FIRST_COMPLETED
            )
            if done:
                continue  # stored, or a copy failed (the others may still succeed)
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

    def _stop(self, status: str, reason: str, batch: list[_Pending]) -> None:
        """Fail ``batch``, everything in flight or queued, and all later calls."""
        with self._lock:
            if self._status not in (_FENCED, _FAILED):
                self._status = status
                self._failure = reason
            pending = list(batch)
            for item in self._in_flight:
                pending.extend(item.batch)
            pending.extend(self._queue)
            self._in_flight.clear()
            self._queue.clear()
            self._queued_bytes = 0
            self._room.notify()
            self._not_empty.notify_all()
            self._acks_cv.notify_all()
        level = logging.WARNING if status == _FENCED else logging.ERROR
        log.log(level, "%s %s: %s; failing %d appends", self._name, status, reason, len(pending))
        error = WALFencedError if status == _FENCED else WALError
        for appended in pending:
            if not appended.future.done():
                appended.future.set_exception(error(reason))


# ---------------------------------------------------------------------- takeover
class ObjectWALRecovery:
    """Recovery-only handle returned by :func:`take_over` (no appends)."""

    def __init__(
        self, objects: ObjectStorage, where: ObjectWALLocation, claimed: _Claimed, parallelism: int
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
        yield from _read_records(
            self._objects, self._where, list(self._live), self._trim_offset, self._parallelism
        )

    def trim(self, up_to_offset: int) -> None:
        """Durably release records below ``up_to_offset`` (after they were uploaded)."""
        with self._lock:
            self._check_open()
            if up_to_offset <= self._trim_offset:
                return
            _check_trim_point(self._live, up_to_offset, self._end)
            current = _read_owner(self._objects, self._where)
            if current != self._owner:
                raise WALFencedError(f"WAL {self._where.prefix} was taken over again")
            self._live = _trim(
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
    claimed = _claim(objects, where, new_node_id, new_node_epoch, takeover=True)
    return ObjectWALRecovery(objects, where, claimed, read_parallelism)


def object_wal_exists(objects: ObjectStorage, where: ObjectWALLocation) -> bool:
    """Whether a writer ever opened the WAL (its owner object exists)."""
    return _read_owner(objects, where) is not None


class ObjectWALReader:
    """Reads single records of someone else's object WAL by offset, without claiming it: the
    RouterChannel's `get(channel offset)` (seed 000), where a main reads what a proxy appended.

    Only offsets the writer acknowledged should be asked for (they were handed over after the
    ack). The listing is cached and re-read when an offset lies past it; decoded objects are
    kept in a small LRU. Thread-safe (one lock around the caches; reads of the store run
    outside it).
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
        self._chain: Chain | None = None
        self._decoded: dict[DataKey, dict[int, bytes]] = {}  # insertion order = LRU order

    def read(self, offset: int) -> RecoveredRecord:
        """The record that starts at ``offset``.

        Raises:
            WALTrimmedError: the offset was trimmed (its data was released).
            ValueError: no record starts there (beyond the WAL's end, or inside a record).
        """
        key = self._object_at(offset, refresh=False) or self._object_at(offset, refresh=True)
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

    def _object_at(self, offset: int, refresh: bool) -> DataKey | None:
        if refresh or self._chain is None:
            datas, seals, trims = _list(self._objects, self._where)
            chain = resolve_chain(datas, [s for s, _ in seals], trims)
            with self._lock:
                self._chain = chain
        chain = self._chain
        if offset < chain.trim_offset:
            return None
        starts = [d.start_offset for d in chain.objects]
        i = bisect_left(starts, offset + 1) - 1
        if i >= 0 and chain.objects[i].start_offset <= offset < chain.objects[i].end_offset:
            return chain.objects[i]
        return None

    def _records(self, key: DataKey) -> dict[int, bytes]:
        with self._lock:
            records = self._decoded.pop(key, None)
            if records is not None:
                self._decoded[key] = records  # most recently used
                return records
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
