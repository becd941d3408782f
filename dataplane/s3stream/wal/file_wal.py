"""FileWAL: the write-ahead log on a local file / single-replica cloud disk (seed 001).

* A preallocated file of fixed capacity used as a ring (format: ``wal/format.py``).
* Group commit on one *committer* thread: it takes the queued appends (up to
  ``max_batch_bytes``), assigns their offsets, adds a padding record up to the next
  4 KiB boundary, writes the batch (with O_DIRECT from one reused aligned buffer,
  ``direct_write.py``, or buffered with one ``pwritev``), calls ``fdatasync``, re-checks the reservation, marks the batch
  durable and resolves its futures in order; then the next batch. Appends that arrive
  while an fdatasync runs wait in the queue and are all taken by the next group commit.
  An append is acknowledged only after its fdatasync. One thread instead of a
  writer -> syncer -> completer pipeline: on a busy machine every thread handoff waits
  for the scheduler, and the pipeline saved only the write's microseconds per commit.
* Software reservation (DESIGN.md "Crash failover"): the file names its owner
  ``(node_id, node_epoch)``. **After** every batch's fdatasync (and before the
  first write after opening or after a trim) the owner re-reads the reservation
  from disk; if it no longer names it, the batch fails with
  :class:`WALFencedError` and the WAL stops. A recoverer calls :func:`take_over`,
  which makes the new reservation durable before it reads anything, so every
  append the old owner acknowledged was durable before the takeover and is
  seen by the recovery.
* Recovery on open scans from the trim offset and stops at the first torn or
  corrupt record; appends continue from there. Before accepting appends, the
  range that in-flight batches could have reached is zeroed, so a stale but
  intact record of a torn batch can never reappear behind newer records.

Limits of the reservation (documented in docs/formats.md): it fences
acknowledgements, not writes. A fenced owner can still land the batch it was
committing (at most ``max_batch_bytes`` and its padding record) after its last
acknowledged record, and never acknowledges it. Recovery zeroes a window of
``PIPELINE_DEPTH`` such batches after the chain (two: the bound of the pipelined writer
before 2026-11-29, whose files may still be opened). :func:`take_over` therefore
returns a recovery-only handle that does not append.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from dataplane.config import FileWALConfig
from dataplane.formats.record_batch import crc32c_keeping_gil
from dataplane.runtime import loop_wakeups_held
from dataplane.s3stream.wal import metrics
from dataplane.s3stream.wal.append_queue import FAILED, FENCED, PendingAppend, QueuedWAL
from dataplane.s3stream.wal.base import (
    AppendResult,
    RecordPieces,
    RecoveredRecord,
    WALClosedError,
    WALCorruptError,
    WALError,
    WALFencedError,
)
from dataplane.s3stream.wal.direct_write import DIRECT_ALIGN_BYTES, DirectBatchWriter
from dataplane.s3stream.wal.file_takeover import (
    check_identity,
    check_trim_point,
    create_wal_file,
    recover_range,
    write_reservation,
)
from dataplane.s3stream.wal.format import (
    MAX_ALIGN_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    WALState,
    encode_padding_record,
    encode_record_header,
    padding_bytes,
)
from dataplane.s3stream.wal.loss import (
    WALLoss,
    find_loss,
    in_flight_window_bytes,
    report_loss,
)
from dataplane.s3stream.wal.prefill import RingPrefiller
from dataplane.s3stream.wal.ring import (
    RecordScanner,
    ReservationView,
    Ring,
    decode_reservation,
    fsync_data,
    pwrite_all,
    read_meta,
    read_state,
)

__all__ = ["FileWAL", "check_config"]

log = logging.getLogger(__name__)

_U32_MAX = 2**32 - 1
_PREFILL_CHUNK_BYTES = 1024 * 1024


def check_config(config: FileWALConfig, capacity_bytes: int) -> None:
    """Raise ValueError when a limit of `config` is out of range for ``capacity_bytes`` or
    this file format (the model itself bounds each field alone)."""
    if config.max_record_bytes + RECORD_HEADER_SIZE_BYTES > config.max_batch_bytes:
        raise ValueError("max_batch_bytes must hold one max_record_bytes record and its header")
    if config.max_batch_bytes > min(capacity_bytes, _U32_MAX):
        raise ValueError(
            f"max_batch_bytes={config.max_batch_bytes} exceeds the capacity ({capacity_bytes} B)"
        )
    if config.max_queue_bytes < config.max_batch_bytes:
        raise ValueError("max_queue_bytes must be >= max_batch_bytes")
    if config.align_bytes > 1 and (
        config.align_bytes > MAX_ALIGN_BYTES or config.align_bytes & (config.align_bytes - 1)
    ):
        raise ValueError(f"align_bytes must be 0, 1 or a power of two <= {MAX_ALIGN_BYTES}")


def _pieces_of(record: bytes | RecordPieces) -> RecordPieces:
    """A record as the tuple of its pieces. Kept as they are: bytes, and byte views of
    bytes; anything else (a mutable buffer, which could change before the committer writes
    it, or a view of items wider than a byte, whose len() is not its size) is copied."""
    if isinstance(record, tuple):
        for piece in record:
            if type(piece) is not bytes:
                return tuple(piece if _immutable_bytes(piece) else bytes(piece) for piece in record)
        return record  # (the common case: a header and a patched batch, both bytes)
    return (record if isinstance(record, bytes) else bytes(record),)


def _immutable_bytes(piece: bytes | memoryview) -> bool:
    if isinstance(piece, bytes):
        return True
    view = memoryview(piece)
    return isinstance(view.obj, bytes) and view.itemsize == 1 and view.ndim == 1


@dataclass(slots=True)
class _TrimRequest:
    up_to_offset: int
    future: Future


class FileWAL(QueuedWAL):
    """Local-file WAL with group commit and an on-disk owner reservation.

    Create or open with :meth:`open`; do not call the constructor directly.
    """

    def __init__(
        self,
        path: Path,
        fd: int,
        node_id: int,
        node_epoch: int,
        capacity_bytes: int,
        trim_offset: int,
        end_offset: int,
        state_seq: int,
        config: FileWALConfig,
        initial_fsyncs: int,
        created: bool = False,
        scan_loss: WALLoss | None = None,
    ) -> None:
        super().__init__(
            f"WAL {path}", capacity_bytes, config.max_queue_bytes, trim_offset, end_offset
        )
        self.scan_loss = scan_loss
        self._path = path
        self._fd = fd
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._config = config
        self._ring = Ring(fd, capacity_bytes)
        # aligned batches are written with O_DIRECT (direct_write.py); None: all buffered
        self._direct: DirectBatchWriter | None = None
        if config.direct_io and config.align_bytes >= DIRECT_ALIGN_BYTES:
            self._direct = DirectBatchWriter.open(
                path,
                capacity_bytes,
                config.max_batch_bytes + MAX_ALIGN_BYTES + RECORD_HEADER_SIZE_BYTES,
            )
        self._reservation_view = ReservationView(fd)
        self._trims: deque[_TrimRequest] = deque()
        self._state_seq = state_seq
        self._owned_raw: tuple[bytes, bytes] | None = None
        self._precheck_needed = True  # until the first successful check after open / a trim
        self._fsyncs = initial_fsyncs
        self._batches = 0
        self._acked_records = 0
        self._acked_bytes = 0
        # one thread writes, fdatasyncs, checks and acknowledges each group commit in turn
        self._committer = threading.Thread(
            target=self._run_committer, name=f"file-wal-committer-{path.name}", daemon=True
        )
        self._prefiller: RingPrefiller | None = None
        if created and end_offset == 0 and config.prefill_ahead_bytes > 0:
            self._prefiller = RingPrefiller(
                path,
                capacity_bytes,
                ahead_bytes=max(config.prefill_ahead_bytes, _PREFILL_CHUNK_BYTES),
                chunk_bytes=_PREFILL_CHUNK_BYTES,
                still_owner=self._still_owner,
            )
            self._prefiller.start()
        self._committer.start()

    # ------------------------------------------------------------------ opening
    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        node_id: int,
        node_epoch: int,
        *,
        capacity_bytes: int | None = None,
        config: FileWALConfig | None = None,
    ) -> FileWAL:
        """Open (or create) the WAL at ``path`` as owner ``(node_id, node_epoch)``.

        If the file does not exist it is created (``capacity_bytes`` required:
        the ring size; the file is ``16 KiB + capacity_bytes``). If it exists,
        its reservation must name ``(node_id, node_epoch)`` or an older epoch; an
        older one is replaced (durably) before anything is read. Then the valid
        record chain is recovered (see :meth:`recover`) and appends continue
        after it.

        Raises:
            WALFencedError: the file is reserved by a newer epoch, or by another
                node at the same epoch.
            WALCorruptError: both slots of the reservation or the state are invalid.
            FileNotFoundError: no file and no ``capacity_bytes``.
        """
        config = config or FileWALConfig()
        check_identity(node_id, node_epoch)
        path = Path(path)
        created = False
        if not path.exists():
            if capacity_bytes is None:
                raise FileNotFoundError(f"{path} does not exist and no capacity_bytes was given")
            check_config(config, capacity_bytes)
            try:
                create_wal_file(path, capacity_bytes, node_id, node_epoch, config.max_batch_bytes)
                created = True
            except FileExistsError:
                pass  # another opener created it first; open it like an existing file
        fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            return cls._open_fd(path, fd, node_id, node_epoch, capacity_bytes, config, created)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def _open_fd(
        cls,
        path: Path,
        fd: int,
        node_id: int,
        node_epoch: int,
        capacity_bytes: int | None,
        config: FileWALConfig,
        created: bool,
    ) -> FileWAL:
        meta = read_meta(fd)
        capacity = meta.capacity_bytes
        if capacity_bytes is not None and capacity_bytes != capacity:
            raise ValueError(f"{path} has capacity {capacity} B, not {capacity_bytes} B")
        check_config(config, capacity)
        current = meta.reservation
        same_owner = (current.node_id, current.node_epoch) == (node_id, node_epoch)
        if not same_owner and node_epoch <= current.node_epoch:
            raise WALFencedError(
                f"{path} is reserved by node {current.node_id} epoch {current.node_epoch}; "
                f"node {node_id} epoch {node_epoch} may not open it"
            )
        fsyncs = 0
        if not same_owner or current.max_batch_bytes < config.max_batch_bytes:
            max_batch = max(config.max_batch_bytes, current.max_batch_bytes)
            write_reservation(fd, current, node_id, node_epoch, max_batch)
            fsyncs += 1
        # The state is read only after our reservation is durable.
        state = read_state(fd)
        if state is None:
            raise WALCorruptError("both state slots are invalid")
        scanner = RecordScanner(
            Ring(fd, capacity), state.trim_offset, chunk_bytes=config.scan_chunk_bytes
        )
        records = 0
        for _ in scanner:
            records += 1
        end = scanner.end_offset
        log.info(
            "opened WAL %s as node %d epoch %d: %d records in [%d, %d), scan stopped: %s",
            path,
            node_id,
            node_epoch,
            records,
            state.trim_offset,
            end,
            scanner.stop_reason,
        )
        # batches that may have been in flight, each with its padding record
        in_flight_bytes = in_flight_window_bytes(
            max(current.max_batch_bytes, config.max_batch_bytes)
        )
        scan_loss = None
        if not created:
            scan_loss = find_loss(
                Ring(fd, capacity),
                str(path),
                end,
                state.trim_offset + capacity,
                in_flight_window_bytes(current.max_batch_bytes),
                scanner.stop_reason,
                config.scan_chunk_bytes,
            )
            if scan_loss is not None:
                report_loss(scan_loss, f"restart of node {node_id}")
        # Invalidate what a torn in-flight batch may have left after the chain.
        # ... and the records a loss cut off: reported now, never to be read again
        lost_bytes = 0 if scan_loss is None else scan_loss.end_offset - end
        zero_bytes = min(max(in_flight_bytes, lost_bytes), capacity - (end - state.trim_offset))
        if zero_bytes > 0 and not created:  # a new file is all zeros already
            Ring(fd, capacity).write_zeros(end, zero_bytes)
            fsync_data(fd)
            fsyncs += 1
        return cls(
            path,
            fd,
            node_id,
            node_epoch,
            capacity,
            state.trim_offset,
            end,
            state.seq,
            config,
            fsyncs,
            created,
            scan_loss,
        )

    # ------------------------------------------------------------------ properties
    @property
    def path(self) -> Path:
        return self._path

    @property
    def owner(self) -> tuple[int, int]:
        """``(node_id, node_epoch)`` this instance writes as."""
        return (self._node_id, self._node_epoch)

    @property
    def direct_io(self) -> bool:
        """Whether aligned group commits are written with O_DIRECT (`FileWALConfig.direct_io`
        and a filesystem that takes it)."""
        return self._direct is not None

    @property
    def fsync_count(self) -> int:
        """fdatasync calls made by this instance (group commits, trims, open)."""
        with self._lock:
            return self._fsyncs

    @property
    def batch_count(self) -> int:
        """Group commits completed by this instance."""
        with self._lock:
            return self._batches

    @property
    def acked_records(self) -> int:
        """Records acknowledged by this instance."""
        with self._lock:
            return self._acked_records

    @property
    def acked_bytes(self) -> int:
        """Bytes (headers and padding included) of batches acknowledged by this instance."""
        with self._lock:
            return self._acked_bytes

    # ------------------------------------------------------------------ API
    def append(
        self, record: bytes | RecordPieces, body_crc32c: int | None = None
    ) -> Future[AppendResult]:
        """Queue ``record`` (or its pieces, see `WriteAheadLog.append`); the future resolves
        once it is durable and ownership re-checked. ``body_crc32c`` (when given) is the
        record's checksum, not computed again.

        Never blocks (see `WriteAheadLog.append`; `append_waiting` waits for queue room
        on a worker thread).

        Raises:
            ValueError: record larger than ``max_record_bytes``.
            WALQueueFullError: the queue holds ``max_queue_bytes``; room comes as it drains.
            WALFullError: no room until the WAL is trimmed.
            WALClosedError / WALFencedError / WALError: the WAL no longer accepts appends.
        """
        body = _pieces_of(record)
        body_len = sum(map(len, body))
        if body_len > self._config.max_record_bytes:
            raise ValueError(
                f"record of {body_len} B exceeds max_record_bytes={self._config.max_record_bytes}"
            )
        if body_crc32c is None:
            body_crc32c = 0
            for piece in body:
                # on the caller's thread (the event loop, for a produce): the GIL is kept
                body_crc32c = crc32c_keeping_gil(piece, body_crc32c)
        return self._admit(RECORD_HEADER_SIZE_BYTES + body_len, body, body_crc32c)

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield the records in ``[start_offset, end_offset)`` as of this call, in order.

        Meant for startup, before appends and trims. Raises WALCorruptError if an
        acknowledged record no longer validates (e.g. trimmed and overwritten
        concurrently, or damaged on disk).
        """
        with self._lock:
            if self._closed:
                raise WALClosedError("WAL is closed")
            start, end = self._trim_offset, self._durable_end
        yield from recover_range(self._ring, start, end, self._config.scan_chunk_bytes)

    def trim(self, up_to_offset: int) -> None:
        """Release records below ``up_to_offset`` (a record boundary) durably.

        No-op when ``up_to_offset`` is not above the current trim point.

        Raises:
            ValueError: beyond the durable end, or not a record boundary.
            WALFencedError / WALClosedError / WALError: the WAL is unusable.
        """
        with self._trim_lock:
            with self._lock:
                self._raise_if_unusable()
                trim, end = self._trim_offset, self._durable_end
            if up_to_offset <= trim:
                return
            check_trim_point(self._ring, up_to_offset, end)
            request = _TrimRequest(up_to_offset, Future())
            with self._lock:
                self._raise_if_unusable()
                self._trims.append(request)
                self._not_empty.notify()
            request.future.result(timeout=self._config.close_timeout_s)

    def close(self) -> None:
        """Write what is queued, stop the committer and close the file. Idempotent."""
        if not self._begin_close():
            return
        deadline = time.monotonic() + self._config.close_timeout_s
        if self._prefiller is not None:
            self._prefiller.stop(self._config.close_timeout_s)
        self._committer.join(max(0.0, deadline - time.monotonic()))
        if self._committer.is_alive():
            raise WALError(
                f"committer of {self._path} did not stop within {self._config.close_timeout_s} s"
            )
        self._reservation_view.close()
        if self._direct is not None:
            self._direct.close()
        os.close(self._fd)

    # ------------------------------------------------------------------ committer thread
    def _run_committer(self) -> None:
        try:
            self._commit_loop()
        except BaseException as exc:  # a bug: fail everything queued rather than hang callers
            log.exception("WAL %s committer crashed", self._path)
            self._stop(FAILED, f"committer crashed: {exc!r}", [])
            raise

    def _commit_loop(self) -> None:
        """Committer thread: one group commit (or trim) after another, until the WAL is
        fenced, failed, or closed and drained."""
        limit = self._config.max_batch_bytes
        while True:
            trim: _TrimRequest | None = None
            batch: list[PendingAppend] = []
            padding = 0
            with self._lock:
                if not self._wait_for_work(lambda: bool(self._trims) or bool(self._queue)):
                    return
                if self._trims:
                    trim = self._trims.popleft()
                else:
                    self._linger(limit, self._config.linger_s)
                    if not self._queue:  # failed while lingering: the queue was failed
                        continue
                    batch, padding = self._take_batch(limit)
            if trim is not None:
                self._do_trim(trim)
            else:
                self._commit(batch, padding)

    def _linger_interrupted(self) -> bool:
        """Caller holds the lock; a queued trim ends the committer's linger."""
        return bool(self._trims)

    def _take_batch(self, limit: int) -> tuple[list[PendingAppend], int]:
        """Caller holds the lock; pop up to ``limit`` bytes of appends (at least one).

        Assigns the records' offsets and decides the batch's padding record
        (returned size, 0 for none): padding is added only when the space it takes
        is not needed by appends already admitted to the queue.
        """
        batch, offset = self._pop_batch(limit)
        padding = padding_bytes(offset, self._config.align_bytes)
        if offset + padding + self._queued_bytes - self._trim_offset > self._capacity_bytes:
            padding = 0
        self._next_offset = offset + padding
        self._room.notify()
        return batch, padding

    def _still_owner(self) -> bool:
        """Whether the reservation on disk still names this instance (any thread)."""
        current = decode_reservation(self._reservation_view.raw())
        return current is not None and (current.node_id, current.node_epoch) == (
            self._node_id,
            self._node_epoch,
        )

    def _check_reservation(self) -> None:
        raw = self._reservation_view.raw()
        if raw == self._owned_raw:
            return  # byte-identical to slots already verified to name us
        current = decode_reservation(raw)
        if current is None:
            raise WALFencedError("no valid reservation slot: ownership cannot be confirmed")
        if (current.node_id, current.node_epoch) != (self._node_id, self._node_epoch):
            raise WALFencedError(
                f"reservation now names node {current.node_id} epoch {current.node_epoch}"
            )
        self._owned_raw = raw

    def _commit(self, batch: list[PendingAppend], padding: int) -> None:
        """Committer thread: one group commit. Write the batch (one pwritev), fdatasync,
        re-check the reservation, then resolve the appends' futures in order.

        Nothing else is written and unchecked while this runs, so when the write starts,
        everything written before it has passed a post-fsync ownership check and the
        write goes to space that was free at that check. After a trim that argument does
        not hold (the trim freed space), so the first batch after a trim (or after
        opening) checks ownership before writing: a fenced owner must not write into
        space the recoverer may still read.
        """
        start = batch[0].offset
        last = batch[-1]
        records_end = last.offset + last.size_bytes  # offsets are contiguous
        size = records_end - start + padding
        try:
            if self._precheck_needed:
                self._check_reservation()
                self._precheck_needed = False
            prefiller = self._prefiller
            if prefiller is not None and prefiller.active:
                prefiller.claim(start + size)  # no zeros may land on this batch
            self._write_batch(start, _batch_parts(batch, records_end, padding), size)
            fsync_data(self._fd)
            with self._lock:
                self._fsyncs += 1
            metrics.FSYNCS.inc()
            self._check_reservation()  # ack only if we still own the WAL after the fsync
        except WALFencedError as exc:
            self._stop(FENCED, str(exc), batch)
            return
        except Exception as exc:  # OSError, or anything unexpected: state unknown, stop
            self._stop(FAILED, f"{type(exc).__name__}: {exc}", batch)
            return
        with self._lock:
            self._durable_end = start + size
            self._batches += 1
            self._acked_records += len(batch)
            self._acked_bytes += size
        metrics.APPEND_BYTES.inc(size)
        metrics.BATCH_BYTES.observe(size)
        now = time.monotonic()
        with loop_wakeups_held():  # the futures' callbacks wake the event loop once
            for pending in batch:
                metrics.APPEND_LATENCY.observe(now - pending.enqueued_at_s)
                pending.future.set_result(AppendResult(pending.offset, pending.size_bytes))

    def _write_batch(self, start: int, parts: list[bytes], size: int) -> None:
        """Committer thread: write a group commit, with O_DIRECT when it is aligned."""
        direct = self._direct
        if direct is not None and direct.fits(start, size):
            if direct.write_batch(start, parts, size):
                return
            log.warning("WAL %s: O_DIRECT write refused; writing buffered from now on", self._path)
            self._direct = None
            direct.close()
        self._ring.write_batch(start, parts, size)

    def _do_trim(self, request: _TrimRequest) -> None:
        try:
            self._check_reservation()
            state = WALState(
                seq=self._state_seq + 1,
                capacity_bytes=self._capacity_bytes,
                trim_offset=request.up_to_offset,
                writer_node_id=self._node_id,
                writer_node_epoch=self._node_epoch,
            )
            self._precheck_needed = True  # the next batch may write into the freed space
            pwrite_all(self._fd, state.encode(), state.slot_position)
            fsync_data(self._fd)
            metrics.FSYNCS.inc()
        except WALFencedError as exc:
            request.future.set_exception(WALFencedError(str(exc)))
            self._stop(FENCED, str(exc), [])
            return
        except Exception as exc:  # OSError, or anything unexpected
            request.future.set_exception(WALError(f"trim failed: {exc}"))
            self._stop(FAILED, f"{type(exc).__name__}: {exc}", [])
            return
        with self._lock:
            self._fsyncs += 1
            self._state_seq = state.seq
            self._trim_offset = request.up_to_offset
            self._room.notify()
        request.future.set_result(None)

    # ------------------------------------------------------------------ failure
    def _stop(self, status: str, reason: str, batch: list[PendingAppend]) -> None:
        """Fail ``batch``, everything queued, and all later calls."""
        if self._prefiller is not None:
            self._prefiller.stop(timeout_s=0)  # no join: this may run on any WAL thread
        with self._lock:
            pending = list(batch)
            pending.extend(self._fail_queue(status, reason))
            trims = list(self._trims)
            self._trims.clear()
        if status == FENCED:
            log.warning("WAL %s fenced: %s; failing %d appends", self._path, reason, len(pending))
        else:
            log.error("WAL %s failed: %s; failing %d appends", self._path, reason, len(pending))
        self._fail_appends(pending, status, reason)
        error = WALFencedError if status == FENCED else WALError
        for request in trims:
            request.future.set_exception(error(reason))


def _batch_parts(batch: list[PendingAppend], records_end: int, padding: int) -> list[bytes]:
    """The pieces ``pwritev`` writes for `batch`: each record's header and body pieces,
    then the padding record of `padding` bytes (none if 0) at `records_end`."""
    parts: list[bytes] = []
    for pending in batch:
        parts.append(
            encode_record_header(
                pending.size_bytes - RECORD_HEADER_SIZE_BYTES,
                pending.offset + RECORD_HEADER_SIZE_BYTES,
                pending.body_crc32c,
            )
        )
        parts.extend(pending.body)
    if padding:
        parts.append(encode_padding_record(records_end, padding))
    return parts
