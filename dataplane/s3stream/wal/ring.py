"""File I/O helpers of the file WAL: positional reads/writes, the data ring, the record scanner."""

from __future__ import annotations

import errno
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass

import crc32c as _crc32c

from dataplane.s3stream.wal.base import WALCorruptError
from dataplane.s3stream.wal.format import (
    DATA_START_BYTES,
    HEADER_AREA_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    RESERVATION_SLOT_POSITIONS,
    STATE_SLOT_POSITIONS,
    Reservation,
    WALState,
    decode_record_header,
    latest,
)

__all__ = [
    "FileMeta",
    "RecordScanner",
    "ReservationView",
    "Ring",
    "fsync_data",
    "pread_exact",
    "pwrite_all",
    "read_meta",
]

_SEEK_DATA = getattr(os, "SEEK_DATA", None)
_SEEK_HOLE = getattr(os, "SEEK_HOLE", None)
MAX_DATA_EXTENTS = 4096  # a search beyond this many ranges reads the rest whole
_MAX_IO_BYTES = 64 * 1024 * 1024  # one pread/pwrite call moves at most this much
_HAS_PWRITEV = hasattr(os, "pwritev")
try:
    # -1 means "indeterminate": fall back to POSIX's guaranteed minimum
    _IOV_MAX = min(1024, os.sysconf("SC_IOV_MAX"))
except (AttributeError, ValueError, OSError):  # pragma: no cover - non-POSIX
    _IOV_MAX = 16
if _IOV_MAX < 16:  # pragma: no cover - no such Linux
    _IOV_MAX = 16


def fsync_data(fd: int) -> None:
    """fdatasync where available (Linux), fsync elsewhere."""
    sync = getattr(os, "fdatasync", os.fsync)
    sync(fd)


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """Read exactly ``size`` bytes at ``position``; a short file raises WALCorruptError."""
    chunks: list[bytes] = []
    done = 0
    while done < size:
        chunk = os.pread(fd, min(size - done, _MAX_IO_BYTES), position + done)
        if not chunk:
            raise WALCorruptError(f"file too short: wanted {size} B at {position}, got {done} B")
        chunks.append(chunk)
        done += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    """Write all of ``data`` at ``position`` (retrying short writes)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        written = os.pwrite(fd, view[done : done + _MAX_IO_BYTES], position + done)
        if written <= 0:
            raise OSError(f"pwrite wrote {written} B at {position + done}")
        done += written


class Ring:
    """The data area of the WAL file as a ring addressed by logical offsets."""

    def __init__(self, fd: int, capacity_bytes: int) -> None:
        self.fd = fd
        self.capacity_bytes = capacity_bytes

    def write(self, logical: int, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` (at most the capacity) at logical offset ``logical``, wrapping if needed."""
        view = memoryview(data)
        if len(view) > self.capacity_bytes:
            raise ValueError(f"write of {len(view)} B exceeds the ring capacity")
        pos = logical % self.capacity_bytes
        first = min(len(view), self.capacity_bytes - pos)
        pwrite_all(self.fd, view[:first], DATA_START_BYTES + pos)
        if first < len(view):
            pwrite_all(self.fd, view[first:], DATA_START_BYTES)

    def write_batch(self, logical: int, parts: list[bytes | memoryview], total: int) -> None:
        """Write the concatenation of ``parts`` (``total`` bytes) at ``logical``.

        Uses ``pwritev`` (no copy) when the batch does not wrap the ring end, one call per
        ``_IOV_MAX`` parts; otherwise joins and writes.
        """
        pos = logical % self.capacity_bytes
        if sum(len(part) for part in parts) != total:
            raise ValueError(f"batch parts hold {sum(map(len, parts))} B, not {total} B")
        if _HAS_PWRITEV and pos + total <= self.capacity_bytes:
            at = DATA_START_BYTES + pos
            for first in range(0, len(parts), _IOV_MAX):
                chunk = parts[first : first + _IOV_MAX]
                size = sum(len(part) for part in chunk)
                written = os.pwritev(self.fd, chunk, at)
                if written != size:
                    # short write (rare): write the rest of this chunk from its join
                    pwrite_all(self.fd, memoryview(b"".join(chunk))[written:], at + written)
                at += size
            return
        self.write(logical, b"".join(parts))

    def read(self, logical: int, size: int) -> bytes:
        """Read ``size`` bytes (at most the capacity) from logical offset ``logical``."""
        if size > self.capacity_bytes:
            raise ValueError(f"read of {size} B exceeds the ring capacity")
        pos = logical % self.capacity_bytes
        first = min(size, self.capacity_bytes - pos)
        head = pread_exact(self.fd, first, DATA_START_BYTES + pos)
        if first == size:
            return head
        return head + pread_exact(self.fd, size - first, DATA_START_BYTES)

    def data_extents(self, start: int, limit: int) -> list[tuple[int, int]]:
        """The logical ranges within ``[start, limit)`` (at most one capacity) whose bytes
        may be other than zeros, in order: holes and unwritten (fallocated) extents read as
        zeros and the filesystem names them (``SEEK_DATA`` / ``SEEK_HOLE``), so a search
        for record headers skips them instead of reading them (a fresh 512 MiB ring is
        nearly all unwritten). Taken before reading: pages the page cache holds count as
        data, so reads that fill it cannot grow the answer while it is used. The whole
        range where the filesystem cannot tell; at most MAX_DATA_EXTENTS ranges (the last
        one runs to ``limit``)."""
        if limit - start > self.capacity_bytes:
            raise ValueError(f"[{start}, {limit}) is more than the ring's capacity")
        extents: list[tuple[int, int]] = []
        at = start
        while at < limit:
            lap_start = at - at % self.capacity_bytes
            segment_end = min(limit, lap_start + self.capacity_bytes)
            found = self._file_extents(at - lap_start, segment_end - lap_start)
            if found is None:
                return [(start, limit)]
            for a, b in found:
                if extents and extents[-1][1] == lap_start + a:  # across the wrap: one range
                    extents[-1] = (extents[-1][0], lap_start + b)
                else:
                    extents.append((lap_start + a, lap_start + b))
            at = segment_end
        if len(extents) > MAX_DATA_EXTENTS:
            extents[MAX_DATA_EXTENTS - 1 :] = [(extents[MAX_DATA_EXTENTS - 1][0], limit)]
        return extents

    def _file_extents(self, pos: int, end: int) -> list[tuple[int, int]] | None:
        """Data ranges of ring positions ``[pos, end)`` (no wrap); None: cannot tell."""
        if _SEEK_DATA is None or _SEEK_HOLE is None:  # pragma: no cover - no such Linux
            return None
        found: list[tuple[int, int]] = []
        while pos < end and len(found) <= MAX_DATA_EXTENTS:
            try:
                data = os.lseek(self.fd, DATA_START_BYTES + pos, _SEEK_DATA) - DATA_START_BYTES
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no data up to the end of the file
                    return found
                return None
            if data >= end:
                break
            hole = os.lseek(self.fd, DATA_START_BYTES + data, _SEEK_HOLE) - DATA_START_BYTES
            found.append((data, min(hole, end)))
            pos = hole
        if pos < end and len(found) > MAX_DATA_EXTENTS:
            found[-1] = (found[-1][0], end)
        return found

    def write_zeros(self, logical: int, size: int, chunk_bytes: int = 1024 * 1024) -> None:
        """Overwrite ``size`` bytes from ``logical`` with zeros."""
        zeros = bytes(min(size, chunk_bytes))
        done = 0
        while done < size:
            n = min(len(zeros), size - done)
            self.write(logical + done, memoryview(zeros)[:n])
            done += n


class RecordScanner:
    """Iterates the valid record chain from ``start``; stops at the first invalid record.

    Padding records are skipped (their bodies carry no data and are not read).
    A record is valid when its header has the magic and a matching header CRC,
    its body offset equals the expected logical offset (continuity; this also
    rejects stale records of an earlier lap around the ring), it fits in the
    window ``[start, start + capacity)``, and its body CRC matches.

    After iteration ``end_offset`` is the offset just past the last valid record
    and ``stop_reason`` says why the scan stopped.
    """

    def __init__(
        self,
        ring: Ring,
        start: int,
        stop_at: int | None = None,
        chunk_bytes: int = 1024 * 1024,
    ) -> None:
        self._ring = ring
        self._start = start
        self._limit = start + ring.capacity_bytes if stop_at is None else stop_at
        self._chunk_bytes = max(RECORD_HEADER_SIZE_BYTES, min(chunk_bytes, ring.capacity_bytes))
        self._buf = b""
        self._buf_start = start
        self.end_offset = start
        self.stop_reason = "not scanned"

    def _read(self, logical: int, size: int) -> bytes:
        buf_end = self._buf_start + len(self._buf)
        if self._buf_start <= logical and logical + size <= buf_end:
            off = logical - self._buf_start
            return self._buf[off : off + size]
        if size >= self._chunk_bytes:
            return self._ring.read(logical, size)
        self._buf = self._ring.read(logical, min(self._chunk_bytes, self._limit - logical))
        self._buf_start = logical
        return self._buf[:size]

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        pos = self._start
        limit = self._limit
        self.stop_reason = "end of window"
        while pos + RECORD_HEADER_SIZE_BYTES <= limit:
            header = decode_record_header(self._read(pos, RECORD_HEADER_SIZE_BYTES))
            if header is None:
                self.stop_reason = f"no valid record header at {pos}"
                break
            if header.body_offset != pos + RECORD_HEADER_SIZE_BYTES:
                self.stop_reason = (
                    f"record at {pos} belongs to offset {header.record_offset} (stale or torn)"
                )
                break
            end = header.body_offset + header.body_length
            if end > limit:
                self.stop_reason = f"record at {pos} of {header.body_length} B overruns the window"
                break
            if header.is_padding:
                self.end_offset = end
                pos = end
                continue
            body = self._read(header.body_offset, header.body_length) if header.body_length else b""
            if _crc32c.crc32c(body) != header.body_crc32c:
                self.stop_reason = f"body CRC mismatch in record at {pos}"
                break
            self.end_offset = end
            yield pos, body
            pos = end
        self.end_offset = pos


@dataclass(frozen=True, slots=True)
class FileMeta:
    """Reservation and state read from the header area."""

    reservation: Reservation
    state: WALState
    capacity_bytes: int


def read_reservation_raw(fd: int) -> tuple[bytes, bytes]:
    """The raw bytes of both reservation slots (64 B each), read with one pread."""
    raw = pread_exact(fd, RESERVATION_SLOT_POSITIONS[1] + 64, 0)
    return tuple(raw[p : p + 64] for p in RESERVATION_SLOT_POSITIONS)  # type: ignore[return-value]


class ReservationView:
    """Reads the reservation slots through a shared read-only mmap of the header.

    Same page cache as ``pread`` (so it sees another process's ``pwrite`` at once)
    but no system call, so the writer thread keeps the GIL: it is used for the
    per-batch ownership check on the hot path.
    """

    def __init__(self, fd: int) -> None:
        self._map = mmap.mmap(fd, RESERVATION_SLOT_POSITIONS[1] + 4096, access=mmap.ACCESS_READ)

    def raw(self) -> tuple[bytes, bytes]:
        """The raw bytes of both reservation slots (64 B each)."""
        m = self._map
        return tuple(m[p : p + 64] for p in RESERVATION_SLOT_POSITIONS)  # type: ignore[return-value]

    def close(self) -> None:
        self._map.close()


def decode_reservation(raw_slots: tuple[bytes, bytes]) -> Reservation | None:
    """The valid slot with the highest seq among raw slots, None if both are invalid."""
    return latest([Reservation.decode(raw) for raw in raw_slots])


def read_reservation(fd: int) -> Reservation | None:
    """The current reservation (valid slot with the highest seq), None if both slots are invalid."""
    return decode_reservation(read_reservation_raw(fd))


def read_state(fd: int) -> WALState | None:
    """The current state (valid slot with the highest seq), None if both slots are invalid."""
    base = STATE_SLOT_POSITIONS[0]
    raw = pread_exact(fd, STATE_SLOT_POSITIONS[1] - base + 64, base)
    return latest([WALState.decode(raw[p - base : p - base + 64]) for p in STATE_SLOT_POSITIONS])


def read_meta(fd: int) -> FileMeta:
    """Read and cross-check both slot pairs.

    Raises:
        WALCorruptError: no valid reservation or state slot, inconsistent
            capacities, or a file shorter than header + capacity.
    """
    size = os.fstat(fd).st_size
    if size < HEADER_AREA_BYTES:
        raise WALCorruptError(
            f"WAL file of {size} B is shorter than its {HEADER_AREA_BYTES} B header"
        )
    reservation = read_reservation(fd)
    if reservation is None:
        raise WALCorruptError("both reservation slots are invalid")
    state = read_state(fd)
    if state is None:
        raise WALCorruptError("both state slots are invalid")
    if reservation.capacity_bytes != state.capacity_bytes:
        raise WALCorruptError(
            f"capacity mismatch: reservation {reservation.capacity_bytes} B, "
            f"state {state.capacity_bytes} B"
        )
    if size < HEADER_AREA_BYTES + reservation.capacity_bytes:
        raise WALCorruptError(
            f"WAL file of {size} B is shorter than header + capacity "
            f"({HEADER_AREA_BYTES + reservation.capacity_bytes} B)"
        )
    return FileMeta(reservation, state, reservation.capacity_bytes)
