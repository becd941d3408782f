"""Taking over a FileWAL (crash failover) and the file-level steps FileWAL shares with it.

:func:`take_over` makes the recoverer's reservation durable before it reads anything (see
``file_wal``'s module docstring) and returns a :class:`FileWALRecovery`: a recovery-only
handle that reads the previous owner's records and trims them once uploaded, never appends.
The helpers below create the preallocated file, write a reservation, check a trim point and
read a range of acknowledged records; `FileWAL.open` uses them too.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from dataplane.s3stream.wal import metrics
from dataplane.s3stream.wal.base import (
    RecoveredRecord,
    WALClosedError,
    WALCorruptError,
    WALFencedError,
    WALTakeoverRefusedError,
)
from dataplane.s3stream.wal.format import (
    HEADER_AREA_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    Reservation,
    WALState,
    decode_record_header,
)
from dataplane.s3stream.wal.loss import (
    WALLoss,
    find_loss,
    in_flight_window_bytes,
    report_loss,
)
from dataplane.s3stream.wal.ring import (
    RecordScanner,
    Ring,
    fsync_data,
    pwrite_all,
    read_meta,
    read_reservation,
    read_state,
)

__all__ = [
    "MAX_CAPACITY_BYTES",
    "MIN_CAPACITY_BYTES",
    "FileWALRecovery",
    "check_identity",
    "check_trim_point",
    "create_wal_file",
    "recover_range",
    "take_over",
    "write_reservation",
]

log = logging.getLogger(__name__)

MIN_CAPACITY_BYTES = 64 * 1024
MAX_CAPACITY_BYTES = 1 << 40
_I64_MAX = 2**63 - 1


class FileWALRecovery:
    """Recovery-only handle returned by :func:`take_over` (no appends).

    Holds the reservation of ``(node_id, node_epoch)``; reads the records the
    previous owner left and trims them once they are uploaded.
    """

    def __init__(
        self,
        path: Path,
        fd: int,
        node_id: int,
        node_epoch: int,
        capacity_bytes: int,
        in_flight_bytes: int = 0,
    ) -> None:
        self._path = path
        self._fd = fd
        self._node_id = node_id
        self._node_epoch = node_epoch
        self._capacity_bytes = capacity_bytes
        self._ring = Ring(fd, capacity_bytes)
        self._closed = False
        self._lock = threading.Lock()
        state = read_state(fd)  # read only after the reservation is durable
        if state is None:
            raise WALCorruptError("both state slots are invalid")
        self._state = state
        self._end: int | None = None
        self._in_flight_bytes = in_flight_bytes
        self._loss_checked = False
        # what `recover` found cut off by corruption (set when it finishes), None if nothing
        self.scan_loss: WALLoss | None = None

    @property
    def owner(self) -> tuple[int, int]:
        return (self._node_id, self._node_epoch)

    @property
    def capacity_bytes(self) -> int:
        return self._capacity_bytes

    @property
    def start_offset(self) -> int:
        return self._state.trim_offset

    @property
    def end_offset(self) -> int:
        """End of the valid record chain (scans the WAL once on first use)."""
        if self._end is None:
            scanner = RecordScanner(self._ring, self._state.trim_offset)
            for _ in scanner:
                pass
            self._end = scanner.end_offset
        return self._end

    def recover(self) -> Iterator[RecoveredRecord]:
        """Yield every valid record from the trim offset, in order, stopping at a torn tail."""
        self._check_open()
        scanner = RecordScanner(self._ring, self._state.trim_offset)
        for offset, body in scanner:
            yield RecoveredRecord(offset, RECORD_HEADER_SIZE_BYTES + len(body), body)
        self._end = scanner.end_offset
        if not self._loss_checked:  # report a loss once per handle, not per retry of recover()
            self._loss_checked = True
            loss = find_loss(
                self._ring,
                str(self._path),
                scanner.end_offset,
                self._state.trim_offset + self._capacity_bytes,
                self._in_flight_bytes,
                scanner.stop_reason,
            )
            if loss is not None:
                report_loss(loss, f"failover by node {self._node_id} epoch {self._node_epoch}")
                # reported: zero it, so the owner's restart neither reports it again nor
                # chains into these stale records from its new ones
                self._ring.write_zeros(loss.start_offset, loss.size_bytes)
                fsync_data(self._fd)
                metrics.FSYNCS.inc()
            self.scan_loss = loss

    def trim(self, up_to_offset: int) -> None:
        """Durably release records below ``up_to_offset`` (after they were uploaded)."""
        with self._lock:
            self._check_open()
            if up_to_offset <= self._state.trim_offset:
                return
            check_trim_point(self._ring, up_to_offset, self.end_offset)
            current = read_reservation(self._fd)
            if current is None or (current.node_id, current.node_epoch) != self.owner:
                raise WALFencedError(f"{self._path} was taken over again")
            state = WALState(
                self._state.seq + 1,
                self._capacity_bytes,
                up_to_offset,
                self._node_id,
                self._node_epoch,
            )
            pwrite_all(self._fd, state.encode(), state.slot_position)
            fsync_data(self._fd)
            metrics.FSYNCS.inc()
            self._state = state

    def close(self) -> None:
        """Close the file. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._fd)

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosedError(f"{self._path} recovery handle is closed")

    def __enter__(self) -> FileWALRecovery:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def take_over(
    path: str | os.PathLike[str], new_node_id: int, new_node_epoch: int
) -> FileWALRecovery:
    """Acquire the WAL at ``path`` for recovery (crash failover).

    Writes the reservation ``(new_node_id, new_node_epoch)`` and fdatasyncs it
    **before** reading any record, so the previous owner can no longer
    acknowledge appends (it re-checks the reservation after each fsync).

    Raises:
        WALTakeoverRefusedError: ``new_node_epoch`` is not greater than the
            current owner's epoch (unless the owner is ``(new_node_id, new_node_epoch)``
            itself: a recoverer retrying).
        WALCorruptError: the header is unreadable.
    """
    check_identity(new_node_id, new_node_epoch)
    path = Path(path)
    fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        meta = read_meta(fd)
        current = meta.reservation
        retry = (current.node_id, current.node_epoch) == (new_node_id, new_node_epoch)
        if new_node_epoch <= current.node_epoch and not retry:
            # the same (node, epoch) again is the recoverer retrying a failover that failed
            # half way (an upload or commit error): refusing it would wedge the failover
            raise WALTakeoverRefusedError(
                f"{path} is reserved by node {current.node_id} epoch {current.node_epoch}; "
                f"takeover needs an epoch > {current.node_epoch}, got {new_node_epoch}"
            )
        write_reservation(fd, current, new_node_id, new_node_epoch, current.max_batch_bytes)
        log.warning(
            "took over WAL %s: node %d epoch %d -> node %d epoch %d",
            path,
            current.node_id,
            current.node_epoch,
            new_node_id,
            new_node_epoch,
        )
        return FileWALRecovery(
            path,
            fd,
            new_node_id,
            new_node_epoch,
            meta.capacity_bytes,
            in_flight_window_bytes(current.max_batch_bytes),
        )
    except BaseException:
        os.close(fd)
        raise


def check_identity(node_id: int, node_epoch: int) -> None:
    """Raise ValueError unless `node_id` and `node_epoch` fit the reservation's fields."""
    if not 0 <= node_id <= _I64_MAX or not 0 <= node_epoch <= _I64_MAX:
        raise ValueError(f"node_id={node_id} and node_epoch={node_epoch} must be within 0..2^63-1")


def write_reservation(
    fd: int, current: Reservation, node_id: int, node_epoch: int, max_batch_bytes: int
) -> Reservation:
    """Durably write the reservation ``(node_id, node_epoch)`` over `current` (next slot)."""
    new = Reservation(current.seq + 1, current.capacity_bytes, node_id, node_epoch, max_batch_bytes)
    pwrite_all(fd, new.encode(), new.slot_position)
    fsync_data(fd)
    metrics.FSYNCS.inc()
    return new


def create_wal_file(
    path: Path, capacity_bytes: int, node_id: int, node_epoch: int, max_batch_bytes: int
) -> None:
    """Create a preallocated WAL file atomically (temp file, fsync, link into place)."""
    if not MIN_CAPACITY_BYTES <= capacity_bytes <= MAX_CAPACITY_BYTES or capacity_bytes % 4096:
        raise ValueError(
            f"capacity_bytes={capacity_bytes} must be a multiple of 4096 within "
            f"{MIN_CAPACITY_BYTES}..{MAX_CAPACITY_BYTES}"
        )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        total = HEADER_AREA_BYTES + capacity_bytes
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, total)
        else:  # pragma: no cover - non-Linux
            os.ftruncate(fd, total)
        for seq in (0, 1):
            reservation = Reservation(seq, capacity_bytes, node_id, node_epoch, max_batch_bytes)
            state = WALState(seq, capacity_bytes, 0, node_id, node_epoch)
            pwrite_all(fd, reservation.encode(), reservation.slot_position)
            pwrite_all(fd, state.encode(), state.slot_position)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        os.link(tmp, path)  # fails if another creator won the race
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def check_trim_point(ring: Ring, up_to_offset: int, end_offset: int) -> None:
    """A trim point must be the durable end or the offset of a valid record header."""
    if up_to_offset > end_offset:
        raise ValueError(f"cannot trim to {up_to_offset}: beyond the durable end {end_offset}")
    if up_to_offset == end_offset:
        return
    header = decode_record_header(ring.read(up_to_offset, RECORD_HEADER_SIZE_BYTES))
    if header is None or header.record_offset != up_to_offset:
        raise ValueError(f"cannot trim to {up_to_offset}: not a record boundary")


def recover_range(ring: Ring, start: int, end: int, chunk_bytes: int) -> Iterator[RecoveredRecord]:
    """Yield the acknowledged records in ``[start, end)``; WALCorruptError if one no longer
    validates."""
    scanner = RecordScanner(ring, start, stop_at=end, chunk_bytes=chunk_bytes)
    for offset, body in scanner:
        yield RecoveredRecord(offset, RECORD_HEADER_SIZE_BYTES + len(body), body)
    if scanner.end_offset != end:
        raise WALCorruptError(
            f"acknowledged records no longer validate at {scanner.end_offset} "
            f"(expected records up to {end}): {scanner.stop_reason}"
        )
