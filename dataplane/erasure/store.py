"""A shard store: durable write-once holes on local disk.

One append-only log file; each record is
    length u32 | crc32c u32 | kind u8 | stream_id u64 | offset i64 | data
(length counts everything after the crc). Kinds: HOLE (data: the hole's bytes) and FILL
(offset: every empty hole of the stream below it now holds junk). Every answer follows an
fsync covering everything the answer depends on, so an accepted hole survives a crash and no
caller ever sees a hole that a crash could take back. Concurrent writes share fsyncs (group
commit): each appends under the lock, then one thread fsyncs for all that are waiting. On open the log is replayed into a bounded
in-memory index (offset -> file position); a torn tail from a crash is cut off.

Filling below a mark is the range form of writing the junk marker into each empty hole: it
is write-once too (the mark only rises), and a shard for an empty hole below the mark is
refused, the store answering with the junk marker as that hole's content.

Thread-safe: one lock covers the check and the append of a write, so two writers racing for
one hole are ordered and exactly one is accepted; both answers wait until the winner's record
is durable.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from dataplane.erasure.holes import AcceptResult, accept
from dataplane.erasure.shard_format import JUNK_MARKER

LOG_FILE = "holes.log"
_PREFIX = struct.Struct(">II")
_BODY = struct.Struct(">BQq")
_KIND_HOLE = 1
_KIND_FILL = 2
DEFAULT_MAX_HOLES = 1_000_000
MAX_HOLE_BYTES = 16 * 1024 * 1024 + 64


class StoreFullError(RuntimeError):
    """The in-memory index is at its bound: the store refuses new holes until sealed ranges
    are dropped."""


@dataclass
class _Stream:
    offsets: list[int] = field(default_factory=list)  # sorted
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)  # offset -> (pos, len)
    filled_below: int = -(2**63)


@dataclass(frozen=True)
class WriteAnswer:
    result: AcceptResult
    content: bytes  # what the hole holds after the write
    # the stream's fill mark on this store: a writer whose clock is behind it moves past it
    filled_below: int | None = None


@dataclass(frozen=True)
class RangeAnswer:
    holes: list[tuple[int, bytes]]  # (offset, bytes) of the filled holes in the range, ascending
    complete_below: int  # every hole below it in the range is in `holes` (the limit cut the rest)
    filled_below: int


class HoleStore:
    """Durable write-once holes of many streams in one directory."""

    def __init__(
        self,
        directory: Path,
        max_holes: int = DEFAULT_MAX_HOLES,
        fsync: Callable[[int], None] = os.fsync,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_holes = max_holes
        self._lock = threading.Lock()
        self._fsync = fsync
        self._sync = threading.Condition()  # guards _durable, _syncing, _sync_error
        self._durable = 0
        self._syncing = False
        self._sync_error: OSError | None = None
        self.fsync_count = 0
        self._streams: dict[int, _Stream] = {}
        self._holes = 0
        path = self.directory / LOG_FILE
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._end = self._replay()
        os.ftruncate(self._fd, self._end)  # cut a torn tail
        os.fsync(self._fd)
        self._durable = self._end

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _replay(self) -> int:
        size = os.fstat(self._fd).st_size
        pos = 0
        while pos + _PREFIX.size <= size:
            length, crc = _PREFIX.unpack(os.pread(self._fd, _PREFIX.size, pos))
            if length < _BODY.size or pos + _PREFIX.size + length > size:
                break
            body = os.pread(self._fd, length, pos + _PREFIX.size)
            if crc32c.crc32c(body) != crc:
                break
            kind, stream_id, offset = _BODY.unpack_from(body)
            stream = self._streams.setdefault(stream_id, _Stream())
            if kind == _KIND_HOLE:
                data_pos = pos + _PREFIX.size + _BODY.size
                self._index(stream, offset, data_pos, length - _BODY.size)
            elif kind == _KIND_FILL:
                stream.filled_below = max(stream.filled_below, offset)
            pos += _PREFIX.size + length
        return pos

    def _index(self, stream: _Stream, offset: int, pos: int, length: int) -> None:
        if offset not in stream.positions:
            bisect.insort(stream.offsets, offset)
            self._holes += 1
        stream.positions[offset] = (pos, length)

    def _append(self, kind: int, stream_id: int, offset: int, data: bytes) -> int:
        body = _BODY.pack(kind, stream_id, offset) + data
        record = _PREFIX.pack(len(body), crc32c.crc32c(body)) + body
        pos = self._end
        os.pwrite(self._fd, record, pos)
        self._end = pos + len(record)
        return pos + _PREFIX.size + _BODY.size

    def _wait_durable(self, target: int) -> None:
        """Return once the log is durable up to `target`; the first waiter fsyncs for all."""
        while True:
            with self._sync:
                while True:
                    if self._sync_error is not None:
                        raise OSError(f"shard store log cannot be synced: {self._sync_error}")
                    if self._durable >= target:
                        return
                    if not self._syncing:
                        self._syncing = True
                        break
                    self._sync.wait()
            with self._lock:
                end = self._end
                fd = self._fd
            error: OSError | None = None
            try:
                if fd < 0:
                    raise OSError("shard store is closed")
                self._fsync(fd)
            except OSError as e:
                error = e
            with self._sync:
                self.fsync_count += 1
                if error is None:
                    self._durable = max(self._durable, end)
                else:  # what was written may be lost: answer nothing any more
                    self._sync_error = error
                self._syncing = False
                self._sync.notify_all()

    def _read(self, stream: _Stream, offset: int) -> bytes | None:
        where = stream.positions.get(offset)
        if where is not None:
            return os.pread(self._fd, where[1], where[0])
        if offset < stream.filled_below:
            return JUNK_MARKER
        return None

    def write(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        """Write a hole once; answers with what the hole holds afterwards (durable)."""
        if not data or len(data) > MAX_HOLE_BYTES:
            raise ValueError(f"hole bytes must be 1..{MAX_HOLE_BYTES} long, got {len(data)}")
        with self._lock:
            self._check_open()
            stream = self._streams.setdefault(stream_id, _Stream())
            existing = self._read(stream, offset)
            result = accept(existing, data)
            if result is AcceptResult.TAKEN or existing is not None:
                content = existing if existing is not None else data
                answer = WriteAnswer(result, content, stream.filled_below)
            else:
                if self._holes >= self.max_holes:
                    raise StoreFullError(f"shard store holds {self._holes} holes, its limit")
                pos = self._append(_KIND_HOLE, stream_id, offset, data)
                self._index(stream, offset, pos, len(data))
                answer = WriteAnswer(AcceptResult.ACCEPTED, data, stream.filled_below)
            target = self._end
        # what the answer reports (ours or another writer's bytes, a fill) must be durable
        self._wait_durable(target)
        return answer

    def fill_below(self, stream_id: int, mark: int) -> int:
        """Fill every empty hole of the stream below `mark` with junk (durable); returns the
        stream's fill mark (never lowered)."""
        with self._lock:
            self._check_open()
            stream = self._streams.setdefault(stream_id, _Stream())
            if mark > stream.filled_below:
                self._append(_KIND_FILL, stream_id, mark, b"")
                stream.filled_below = mark
            answer, target = stream.filled_below, self._end
        self._wait_durable(target)
        return answer

    def read(self, stream_id: int, offset: int) -> bytes | None:
        """A hole's bytes (the junk marker for an empty hole below the fill mark), None if empty."""
        with self._lock:
            self._check_open()
            stream = self._streams.get(stream_id)
            answer = None if stream is None else self._read(stream, offset)
            target = self._end
        self._wait_durable(target)
        return answer

    def read_range(
        self, stream_id: int, start: int, end: int, max_holes: int, max_bytes: int
    ) -> RangeAnswer:
        """The filled holes with start <= offset < end, at most max_holes / about max_bytes."""
        with self._lock:
            self._check_open()
            answer = self._read_range(stream_id, start, end, max_holes, max_bytes)
            target = self._end
        self._wait_durable(target)
        return answer

    def _read_range(
        self, stream_id: int, start: int, end: int, max_holes: int, max_bytes: int
    ) -> RangeAnswer:
        stream = self._streams.get(stream_id)
        if stream is None:
            return RangeAnswer([], end, -(2**63))
        found: list[tuple[int, bytes]] = []
        size = 0
        i = bisect.bisect_left(stream.offsets, start)
        complete_below = end
        while i < len(stream.offsets) and stream.offsets[i] < end:
            offset = stream.offsets[i]
            if len(found) >= max_holes or (found and size >= max_bytes):
                complete_below = offset
                break
            data = self._read(stream, offset)
            assert data is not None
            found.append((offset, data))
            size += len(data)
            i += 1
        return RangeAnswer(found, complete_below, stream.filled_below)

    @property
    def hole_count(self) -> int:
        return self._holes

    def _check_open(self) -> None:
        if self._fd < 0:
            raise RuntimeError("shard store is closed")
