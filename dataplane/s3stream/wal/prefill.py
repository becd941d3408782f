"""Zero-filling a new WAL file's ring ahead of its writer (first lap only).

A new WAL file is preallocated with ``posix_fallocate``, which on ext4 and XFS leaves
*unwritten* extents. The first write into such an extent converts it, a metadata change,
so the fdatasync that follows must also commit the filesystem journal, which is shared
by every file on the filesystem: measured on this project's disk, fdatasync p99 of
8.5 ms into zero-filled space against 17.5 ms into fallocated space in the broker's
half-load benchmark (docs/benchmarks.md). Once the ring has wrapped, every extent is
written and the cost is gone; this module removes it from the first lap too.

The :class:`RingPrefiller` writes zeros (``O_DIRECT | O_DSYNC`` where the filesystem
allows it, so the zeros and their extent conversion are durable on their own and never
become dirty pages for the writer's fdatasync to flush) in chunks, at most
``ahead_bytes`` beyond the writer, never into space the writer has claimed. Zeros are
what an unwritten extent reads as, so recovery and fencing see the same bytes either way.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dataplane.s3stream.wal.format import DATA_START_BYTES
from dataplane.s3stream.wal.ring import fsync_data, pwrite_all

__all__ = ["RingPrefiller"]

log = logging.getLogger(__name__)

_ALIGN_BYTES = 4096  # O_DIRECT offset/length alignment on the filesystems we run on
_IDLE_CHECK_S = 1.0  # an idle prefiller checks the reservation this often


class RingPrefiller:
    """Writes zeros into a fresh WAL ring ahead of its writer, on a thread of its own.

    Thread-safety: :meth:`claim` is called by the WAL's writer thread before each write,
    :meth:`stop` by any thread. The prefiller's thread takes a chunk beyond every claim
    under a lock, writes it outside the lock, and a claim that reaches into the chunk
    being written waits for that write: a zero never lands on bytes the writer wrote,
    and a writer that stays behind the zeros never waits.

    Args:
        path: the WAL file (opened again here, so the writer's descriptor is untouched).
        capacity_bytes: size of the ring (logical offsets of the first lap are positions).
        still_owner: checked before every chunk; False stops the filling (a process whose
            WAL was taken over must not write, not even zeros, where the new owner may).
        ahead_bytes: how far beyond the writer's claim zeros are written (a bound on the
            background I/O a lightly used WAL causes).
        chunk_bytes: size of one zero write (a multiple of 4 KiB).
        max_bytes_per_s: pace of the zero writes, so they leave the disk to the writer.
    """

    def __init__(
        self,
        path: Path,
        capacity_bytes: int,
        *,
        ahead_bytes: int,
        chunk_bytes: int = 1024 * 1024,
        max_bytes_per_s: int = 256 * 1024 * 1024,
        still_owner: Callable[[], bool] = lambda: True,
    ) -> None:
        if chunk_bytes <= 0 or chunk_bytes % _ALIGN_BYTES:
            raise ValueError("chunk_bytes must be a positive multiple of 4096")
        if ahead_bytes < chunk_bytes or max_bytes_per_s <= 0:
            raise ValueError("ahead_bytes must be >= chunk_bytes and max_bytes_per_s positive")
        self._path = path
        self._still_owner = still_owner
        self._capacity_bytes = capacity_bytes
        self._ahead_bytes = ahead_bytes
        self._chunk_bytes = chunk_bytes
        self._chunk_interval_s = chunk_bytes / max_bytes_per_s
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._claimed_end = 0  # ring positions below this belong to the writer
        self._filled_end = 0  # zeros were written up to here (beyond the claims)
        self._writing: tuple[int, int] | None = None  # the chunk being written, if any
        self._written = threading.Condition(self._lock)
        self._stop_event = threading.Event()
        self._stopped = False
        self._finished = False  # the thread has ended: no zero write is or will be under way
        self._done = False  # the first lap is claimed or filled: nothing left to do
        self.filled_bytes = 0  # zeros written (for tests and metrics)
        self._thread = threading.Thread(
            target=self._run, name=f"file-wal-prefill-{path.name}", daemon=True
        )

    @property
    def active(self) -> bool:
        """False once nothing is left to fill, or once the filling thread has ended, so no
        zero write can still be under way (a plain read: the writer only uses it to skip
        :meth:`claim`; while it is True the writer must claim, even after :meth:`stop`,
        because a chunk may still be in flight)."""
        return not (self._done or self._finished)

    def start(self) -> None:
        self._thread.start()

    def claim(self, end: int) -> None:
        """Writer thread: the writer is about to write ring positions below ``end``
        (a logical offset; one past the capacity means the ring wrapped)."""
        with self._lock:
            if end <= self._claimed_end:
                return
            self._claimed_end = min(end, self._capacity_bytes)
            if self._claimed_end >= self._capacity_bytes:
                self._done = True
            self._wake.notify()
            # bounded: the chunk's write ends (or fails) and clears _writing
            while self._writing is not None and self._writing[0] < end:
                self._written.wait()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop filling and wait for the thread (at most ``timeout_s``). Idempotent."""
        with self._lock:
            self._stopped = True
            self._stop_event.set()
            self._wake.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def _next_chunk(self) -> tuple[int, int] | None:
        """Caller holds the lock; the next range to fill, None to wait, (-1, -1) to end."""
        if self._stopped or self._done:
            return (-1, -1)
        start = max(self._filled_end, self._claimed_end)
        start = -(-start // _ALIGN_BYTES) * _ALIGN_BYTES  # round up: O_DIRECT alignment
        if start >= self._capacity_bytes:
            self._done = True
            return (-1, -1)
        if start >= self._claimed_end + self._ahead_bytes:
            return None  # far enough ahead: wait for the writer
        end = min(start + self._chunk_bytes, self._capacity_bytes)
        return (start, end)

    def _open(self) -> tuple[int, bool]:
        flags = os.O_WRONLY | getattr(os, "O_CLOEXEC", 0)
        direct = getattr(os, "O_DIRECT", 0) | getattr(os, "O_DSYNC", 0)
        if direct:
            try:
                return os.open(self._path, flags | direct), True
            except OSError:  # e.g. a filesystem without O_DIRECT: buffered + fdatasync
                pass
        return os.open(self._path, flags), False

    def _run(self) -> None:
        try:
            try:
                fd, direct = self._open()
            except OSError as exc:
                log.warning("WAL %s: not prefilling (%s)", self._path, exc)
                return
            zeros = mmap.mmap(-1, self._chunk_bytes)  # page-aligned and zeroed, for O_DIRECT
            try:
                self._fill(fd, direct, zeros)
            except Exception as exc:
                # only a cost: the writer then converts extents itself, as without prefilling
                log.warning("WAL %s: prefilling stopped: %s", self._path, exc)
            finally:
                zeros.close()
                os.close(fd)
        finally:
            with self._lock:
                self._finished = True
                self._writing = None
                self._written.notify_all()

    def _fill(self, fd: int, direct: bool, zeros: mmap.mmap) -> None:
        started = time.monotonic()
        while True:
            with self._lock:
                chunk = self._next_chunk()
                while chunk is None:
                    # idle (far enough ahead): wake now and then to end once taken over
                    self._wake.wait(_IDLE_CHECK_S)
                    chunk = self._next_chunk()
                    if chunk is None and not self._still_owner():
                        log.warning("WAL %s: taken over; prefilling stopped", self._path)
                        return
                start, end = chunk
                if start < 0:
                    return
                self._writing = chunk  # claims reaching into it wait for this write
            if not self._still_owner():
                log.warning("WAL %s: taken over; prefilling stopped", self._path)
                return  # the finally of _run clears _writing
            try:
                pwrite_all(fd, memoryview(zeros)[: end - start], DATA_START_BYTES + start)
                if not direct:
                    fsync_data(fd)  # convert the extents now, not in the writer's fdatasync
            finally:
                with self._lock:
                    self._writing = None
                    self._filled_end = max(self._filled_end, end)
                    self.filled_bytes += end - start
                    self._written.notify_all()
            # pace: at most max_bytes_per_s on average since the start
            started += self._chunk_interval_s
            delay = started - time.monotonic()
            if delay > 0:
                self._stop_event.wait(delay)
            else:
                started = time.monotonic()
