"""A shard store: durable write-once holes on local disk.

One append-only log file; each record is
    length u32 | crc32c u32 | kind u8 | stream_id u64 | offset i64 | data
(length counts everything after the crc). The file is longer than its records: past the
last record it holds zeros written ahead of the appends (preallocated room, extended by a
background thread in chunks, each fsync'd), so a group commit writes into blocks the
filesystem already allocated and sized and can use fdatasync, which then needs no journal
commit (on ext4 an fsync of a file that grew waits for one, and journal commits are
serialised filesystem-wide: stores sharing a disk queue behind each other's). fdatasync also
flushes the file size when an append outran the room, so it is enough in every case. Replay
stops at the first record that is zero, short or fails its CRC: the log's end; on open
everything after it is cut and zeroed anew before any write is accepted, so bytes of a torn
append can never be read as a record later. Kinds: HOLE (data: the hole's bytes) and FILL
(offset: every empty hole of the stream below it now holds junk) and DROP (offset: the
stream's holes below it are sealed into object storage and forgotten here; the mark only
rises and implies a fill). Every answer follows an
fsync covering everything the answer depends on, so an accepted hole survives a crash and no
caller ever sees a hole that a crash could take back. Concurrent writes share fsyncs (group
commit): each appends under the lock, then one thread fsyncs for all that are waiting. On open the log is replayed into a bounded
in-memory index (offset -> file position); a torn tail from a crash is cut off.

Filling below a mark is the range form of writing the junk marker into each empty hole: it
is write-once too (the mark only rises), and a shard for an empty hole below the mark is
refused, the store answering with the junk marker as that hole's content. The one exception
is `repair`: a shard of a write already decided (k consistent shards elsewhere, checked by
the repairer) may fill such a hole, as no decision can change by it (see `repair`).

Thread-safe: one lock covers the check and the append of a write, so two writers racing for
one hole are ordered and exactly one is accepted; both answers wait until the winner's record
is durable.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c

from dataplane.erasure.holes import AcceptResult, accept
from dataplane.erasure.shard_format import (
    HEADER_BYTES,
    JUNK_MARKER,
    ShardFormatError,
    decode_shard,
    peek_payload_crc,
)

log = logging.getLogger(__name__)

LOG_FILE = "holes.log"
_PREFIX = struct.Struct(">II")
_BODY = struct.Struct(">BQq")
_KIND_HOLE = 1
_KIND_FILL = 2
_KIND_DROP = 3
# the log is rewritten without dropped holes once they are at least this many bytes and
# half the file
COMPACT_MIN_DEAD_BYTES = 64 * 1024 * 1024
MAX_RECENT_WRITES_PER_STREAM = 100_000  # payload CRCs remembered per stream
DEFAULT_MAX_HOLES = 1_000_000
MAX_HOLE_BYTES = 16 * 1024 * 1024 + 64
# zero-filled room past the log's end: each extension is half the log, within these bounds,
# and starts when less than half an extension is left
PREALLOCATE_MIN_BYTES = 256 * 1024
DEFAULT_PREALLOCATE_MAX_BYTES = 8 * 1024 * 1024
_ZERO_PIECE_BYTES = 1024 * 1024  # zeros written per lock hold
_ZEROS = bytes(_ZERO_PIECE_BYTES)


class StoreFullError(RuntimeError):
    """The in-memory index is at its bound: the store refuses new holes until sealed ranges
    are dropped."""


@dataclass
class _Stream:
    offsets: list[int] = field(default_factory=list)  # sorted
    positions: dict[int, tuple[int, int]] = field(default_factory=dict)  # offset -> (pos, len)
    filled_below: int = -(2**63)
    dropped_below: int = -(2**63)
    # the last writes' payload CRCs (offset -> crc, insertion order) and the reverse map:
    # a retried batch finds where its first attempt went (kept after a drop: the offset
    # is then sealed and still readable); bounded
    recent_crcs: OrderedDict[int, int] = field(default_factory=OrderedDict)
    offsets_by_crc: dict[int, set[int]] = field(default_factory=dict)


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
    # holes below it were sealed and dropped: a range starting below it is not complete here
    dropped_below: int = -(2**63)


class HoleStore:
    """Durable write-once holes of many streams in one directory."""

    def __init__(
        self,
        directory: Path,
        max_holes: int = DEFAULT_MAX_HOLES,
        fsync: Callable[[int], None] = os.fdatasync,
        compact_min_dead_bytes: int = COMPACT_MIN_DEAD_BYTES,
        preallocate_max_bytes: int = DEFAULT_PREALLOCATE_MAX_BYTES,
    ):
        """`fsync` makes the log durable (group commits and the room's extensions; tests
        inject theirs); `preallocate_max_bytes` bounds one extension of the zeroed room."""
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
        # durability is tracked in logical log positions (file position + shift): a rewrite
        # shortens the file but never moves a logical position back
        self._shift = 0
        self._dead_bytes = 0  # log bytes of dropped holes (reclaimed by a rewrite)
        self.compact_min_dead_bytes = compact_min_dead_bytes
        self.rewrites = 0
        self.preallocate_max_bytes = max(PREALLOCATE_MIN_BYTES, preallocate_max_bytes)
        self.extensions = 0  # background extensions of the zeroed room
        path = self.directory / LOG_FILE
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self._end = self._replay()
        # cut a torn tail (and the old room: it may hold a torn append's bytes past the
        # end), then zero new room; durable before any write can land in it
        os.ftruncate(self._fd, self._end)
        self._alloc_end = self._end
        try:
            _write_zeros(self._fd, self._end, self._end + self._extension_bytes(self._end))
            self._alloc_end = self._end + self._extension_bytes(self._end)
        except OSError as e:  # a full disk: no room, appends grow the file (still durable)
            log.warning("shard store %s: no zeroed room written: %s", self.directory, e)
        os.fsync(self._fd)
        self._durable = self._end
        self._room = threading.Condition(self._lock)  # wakes the extender
        self._extender = threading.Thread(
            target=self._extend_room, name=f"hole-store-room-{self.directory.name}", daemon=True
        )
        self._extender.start()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._room.notify_all()
        if self._extender is not threading.current_thread():
            self._extender.join(timeout=10)

    def _extension_bytes(self, log_end: int) -> int:
        return min(self.preallocate_max_bytes, max(PREALLOCATE_MIN_BYTES, log_end // 2))

    def _needs_room(self) -> bool:
        return self._alloc_end - self._end < self._extension_bytes(self._end) // 2

    def _extend_room(self) -> None:
        """The extender thread: keeps zeroed room ahead of the appends. Zeros are written a
        piece per lock hold, always past the last append (so they never overwrite a record),
        then synced outside the lock. A failed sync stops all answers, as a group commit's
        does (the error may be reported to one caller only)."""
        while True:
            with self._lock:
                while self._fd >= 0 and not self._needs_room():
                    self._room.wait()
                if self._fd < 0:
                    return
                remaining = self._extension_bytes(self._end)
            while True:
                with self._lock:
                    if self._fd < 0:
                        return
                    if remaining <= 0:
                        fd = os.dup(self._fd)  # the current file (a rewrite may replace it)
                        break
                    start = max(self._alloc_end, self._end)
                    piece = min(_ZERO_PIECE_BYTES, remaining)
                    try:
                        _write_zeros(self._fd, start, start + piece)
                    except OSError as e:
                        # a full disk: extend no more, appends grow the file themselves
                        log.warning("shard store %s: room not extended: %s", self.directory, e)
                        return
                    self._alloc_end = start + piece
                    remaining -= piece
            try:
                self._fsync(fd)
            except OSError as e:
                with self._sync:
                    self._sync_error = e
                    self._sync.notify_all()
                return
            finally:
                os.close(fd)
            self.extensions += 1

    def _replay(self) -> int:
        end = 0
        for pos, body in _records(self._fd):
            length = len(body)
            kind, stream_id, offset = _BODY.unpack_from(body)
            stream = self._streams.setdefault(stream_id, _Stream())
            if kind == _KIND_HOLE:
                data_pos = pos + _PREFIX.size + _BODY.size
                self._index(stream, offset, data_pos, length - _BODY.size)
                self._remember(stream, offset, body[_BODY.size :])
            elif kind == _KIND_FILL:
                stream.filled_below = max(stream.filled_below, offset)
            elif kind == _KIND_DROP:
                self._drop(stream, offset)
            end = pos + _PREFIX.size + length
        return end

    def _index(self, stream: _Stream, offset: int, pos: int, length: int) -> None:
        if offset not in stream.positions:
            bisect.insort(stream.offsets, offset)
            self._holes += 1
        stream.positions[offset] = (pos, length)

    @staticmethod
    def _remember(stream: _Stream, offset: int, data: bytes) -> None:
        crc = peek_payload_crc(data)
        if crc is None or offset in stream.recent_crcs:
            return
        stream.recent_crcs[offset] = crc
        stream.offsets_by_crc.setdefault(crc, set()).add(offset)
        while len(stream.recent_crcs) > MAX_RECENT_WRITES_PER_STREAM:
            old_offset, old_crc = stream.recent_crcs.popitem(last=False)
            offsets = stream.offsets_by_crc[old_crc]
            offsets.discard(old_offset)
            if not offsets:
                del stream.offsets_by_crc[old_crc]

    def find(self, stream_id: int, payload_crc: int) -> list[int]:
        """Offsets of the stream's recent holes holding a shard whose header names this
        payload CRC (candidates only: shards are not checked), ascending."""
        with self._lock:
            self._check_open()
            stream = self._streams.get(stream_id)
            found = sorted(stream.offsets_by_crc.get(payload_crc, ())) if stream else []
            target = self._end + self._shift
        self._wait_durable(target)
        return found

    def _drop(self, stream: _Stream, mark: int) -> None:
        """Forget the stream's holes below `mark` (the index; their log bytes are dead)."""
        stream.dropped_below = max(stream.dropped_below, mark)
        stream.filled_below = max(stream.filled_below, mark)
        cut = bisect.bisect_left(stream.offsets, mark)
        for offset in stream.offsets[:cut]:
            _, length = stream.positions.pop(offset)
            self._dead_bytes += _PREFIX.size + _BODY.size + length
        del stream.offsets[:cut]
        self._holes -= cut

    def _append(self, kind: int, stream_id: int, offset: int, data: bytes) -> int:
        body = _BODY.pack(kind, stream_id, offset) + data
        record = _PREFIX.pack(len(body), crc32c.crc32c(body)) + body
        pos = self._end
        os.pwrite(self._fd, record, pos)
        self._end = pos + len(record)
        if self._needs_room():
            self._room.notify()
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
                end = self._end + self._shift
                # a duplicate: a close() meanwhile must not let this sync hit another file
                # that reused the descriptor's number (and report it durable)
                fd = os.dup(self._fd) if self._fd >= 0 else -1
            error: OSError | None = None
            try:
                if fd < 0:
                    raise OSError("shard store is closed")
                self._fsync(fd)
            except OSError as e:
                error = e
            finally:
                if fd >= 0:
                    os.close(fd)
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
                answer = self._put_new(stream, stream_id, offset, data)
            target = self._end + self._shift
        # what the answer reports (ours or another writer's bytes, a fill) must be durable
        self._wait_durable(target)
        return answer

    def _put_new(self, stream: _Stream, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        """Caller holds the lock: store `data` in an empty hole (not yet durable)."""
        if self._holes >= self.max_holes:
            raise StoreFullError(f"shard store holds {self._holes} holes, its limit")
        pos = self._append(_KIND_HOLE, stream_id, offset, data)
        self._index(stream, offset, pos, len(data))
        self._remember(stream, offset, data)
        return WriteAnswer(AcceptResult.ACCEPTED, data, stream.filled_below)

    def repair(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        """Put a shard of a *decided* write into a hole that holds no bytes (the repairer's
        write, `erasure/repair.py`): accepted into an empty hole and also into one that is
        junk only because it lies below the fill mark (never written); a hole that holds
        bytes (any shard, explicit junk) is never changed (TAKEN, answered with them), nor
        one below the drop mark (sealed). Safe only because the caller saw k consistent
        shards of that write: an offset that already has k holes of one write is decided
        for every reader, and adding that write's shards cannot change it (a fill exists to
        stop a write from *reaching* k). `data` must be a valid shard frame of this stream
        and offset (ValueError otherwise). Durable before it answers."""
        try:
            shard = decode_shard(data)
        except ShardFormatError as e:
            raise ValueError(f"a repair must be a valid shard frame: {e}") from None
        if (shard.stream_id, shard.offset) != (stream_id, offset):
            raise ValueError(
                f"repair shard names stream {shard.stream_id} offset {shard.offset}, "
                f"not {stream_id} {offset}"
            )
        with self._lock:
            self._check_open()
            stream = self._streams.setdefault(stream_id, _Stream())
            where = stream.positions.get(offset)
            held = os.pread(self._fd, where[1], where[0]) if where is not None else None
            if held is not None or offset < stream.dropped_below:
                content = held if held is not None else JUNK_MARKER
                result = AcceptResult.ACCEPTED if content == data else AcceptResult.TAKEN
                answer = WriteAnswer(result, content, stream.filled_below)
            else:
                answer = self._put_new(stream, stream_id, offset, data)
            target = self._end + self._shift
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
            answer, target = stream.filled_below, self._end + self._shift
        self._wait_durable(target)
        return answer

    def drop_below(self, stream_id: int, mark: int) -> int:
        """Forget the stream's holes below `mark`: they are sealed into object storage (the
        caller saw the seal committed). Durable, idempotent, the mark only rises; it also
        fills below the mark. Returns the stream's drop mark. The log is rewritten without
        the dropped holes once enough of it is dead."""
        with self._lock:
            self._check_open()
            stream = self._streams.setdefault(stream_id, _Stream())
            if mark > stream.dropped_below:
                self._append(_KIND_DROP, stream_id, mark, b"")
                self._drop(stream, mark)
            answer, target = stream.dropped_below, self._end + self._shift
        self._wait_durable(target)
        self._maybe_rewrite()
        return answer

    def _worth_rewriting(self) -> bool:
        return (
            self._fd >= 0
            and self._dead_bytes >= self.compact_min_dead_bytes
            and self._dead_bytes * 2 >= self._end
        )

    def _maybe_rewrite(self) -> None:
        with self._lock:
            if not self._worth_rewriting():
                return
        # no fsync may run on the old file while it is replaced: take the syncer's turn
        # first (the lock order of _wait_durable: the turn, then the lock)
        with self._sync:
            while self._syncing:
                self._sync.wait()
            self._syncing = True
        try:
            with self._lock:
                if self._worth_rewriting():
                    self._rewrite()
                end = self._end + self._shift
        finally:
            with self._sync:
                self._syncing = False
                self._sync.notify_all()
        self._wait_durable(end)

    def _rewrite(self) -> None:
        """Copy the live log (marks and held holes) to a new file, fsync, rename it over the
        old one. Called with the lock held and everything durable; a crash leaves either
        file whole (the rename is atomic, the temporary file is ignored on open)."""
        tmp = self.directory / (LOG_FILE + ".rewrite")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            out = bytearray()
            positions: dict[tuple[int, int], tuple[int, int]] = {}
            for stream_id, stream in self._streams.items():
                for kind, mark in (
                    (_KIND_FILL, stream.filled_below),
                    (_KIND_DROP, stream.dropped_below),
                ):
                    if mark > -(2**63):
                        body = _BODY.pack(kind, stream_id, mark)
                        out += _PREFIX.pack(len(body), crc32c.crc32c(body)) + body
                for offset in stream.offsets:
                    pos, length = stream.positions[offset]
                    body = _BODY.pack(_KIND_HOLE, stream_id, offset) + os.pread(
                        self._fd, length, pos
                    )
                    out += _PREFIX.pack(len(body), crc32c.crc32c(body))
                    positions[(stream_id, offset)] = (len(out) + _BODY.size, length)
                    out += body
            os.pwrite(fd, bytes(out), 0)
            alloc_end = len(out)
            try:
                _write_zeros(fd, len(out), len(out) + self._extension_bytes(len(out)))
                alloc_end += self._extension_bytes(len(out))
            except OSError as e:  # a full disk: the new log starts without room
                log.warning("shard store %s: no zeroed room written: %s", self.directory, e)
            self._fsync(fd)
            os.replace(tmp, self.directory / LOG_FILE)
            dir_fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            os.close(fd)
            raise
        # the old file's appends may not all be fsync'd, but every live one is in the new
        # file, which is: everything up to the logical end is durable
        logical_end = self._end + self._shift
        os.close(self._fd)
        self._fd = fd
        for (stream_id, offset), where in positions.items():
            self._streams[stream_id].positions[offset] = where
        self._end = len(out)
        self._alloc_end = alloc_end
        self._shift = logical_end - self._end
        self._dead_bytes = 0
        self.rewrites += 1
        with self._sync:
            self._durable = max(self._durable, logical_end)

    def read(self, stream_id: int, offset: int) -> bytes | None:
        """A hole's bytes (the junk marker for an empty hole below the fill mark), None if empty."""
        with self._lock:
            self._check_open()
            stream = self._streams.get(stream_id)
            answer = None if stream is None else self._read(stream, offset)
            target = self._end + self._shift
        self._wait_durable(target)
        return answer

    def read_range(
        self, stream_id: int, start: int, end: int, max_holes: int, max_bytes: int
    ) -> RangeAnswer:
        """The filled holes with start <= offset < end, at most max_holes / about max_bytes."""
        with self._lock:
            self._check_open()
            answer = self._read_range(stream_id, start, end, max_holes, max_bytes)
            target = self._end + self._shift
        self._wait_durable(target)
        return answer

    def list_heads(self, stream_id: int, start: int, end: int, max_holes: int) -> RangeAnswer:
        """As read_range, but each hole's bytes cut to a shard header's length (what a
        repairer needs to find decided writes lacking shards, at a fraction of the bytes)."""
        with self._lock:
            self._check_open()
            answer = self._read_range(
                stream_id, start, end, max_holes, max_holes * HEADER_BYTES, HEADER_BYTES
            )
            target = self._end + self._shift
        self._wait_durable(target)
        return answer

    def _read_range(
        self,
        stream_id: int,
        start: int,
        end: int,
        max_holes: int,
        max_bytes: int,
        head_bytes: int | None = None,
    ) -> RangeAnswer:
        stream = self._streams.get(stream_id)
        if stream is None:
            return RangeAnswer([], end, -(2**63))
        if start < stream.dropped_below:  # sealed: the holes are in object storage now
            return RangeAnswer([], end, stream.filled_below, stream.dropped_below)
        found: list[tuple[int, bytes]] = []
        size = 0
        i = bisect.bisect_left(stream.offsets, start)
        complete_below = end
        while i < len(stream.offsets) and stream.offsets[i] < end:
            offset = stream.offsets[i]
            if len(found) >= max_holes or (found and size >= max_bytes):
                complete_below = offset
                break
            if head_bytes is None:
                data = self._read(stream, offset)
            else:
                pos, length = stream.positions[offset]
                data = os.pread(self._fd, min(length, head_bytes), pos)
            assert data is not None
            found.append((offset, data))
            size += len(data)
            i += 1
        return RangeAnswer(found, complete_below, stream.filled_below, stream.dropped_below)

    def streams(self) -> dict[int, int]:
        """Stream id -> drop mark of every stream this store has seen."""
        with self._lock:
            return {sid: st.dropped_below for sid, st in self._streams.items()}

    @property
    def hole_count(self) -> int:
        return self._holes

    def _check_open(self) -> None:
        if self._fd < 0:
            raise RuntimeError("shard store is closed")


def _write_zeros(fd: int, start: int, end: int) -> None:
    """Write zeros at [start, end) of the file (not synced)."""
    pos = start
    while pos < end:
        pos += os.pwrite(fd, _ZEROS[: min(_ZERO_PIECE_BYTES, end - pos)], pos)


def used_log_bytes(directory: Path) -> int:
    """The bytes of a store's log that hold records (its end; the zeroed room after it is
    not counted). Reads the log as replay does; safe while the store runs (it may miss the
    appends of the moment)."""
    fd = os.open(Path(directory) / LOG_FILE, os.O_RDONLY)
    try:
        end = 0
        for pos, body in _records(fd):
            end = pos + _PREFIX.size + len(body)
        return end
    finally:
        os.close(fd)


def _records(fd: int) -> Iterator[tuple[int, bytes]]:
    """(position, body) of the log's records in order, up to its end: the first record that
    is zero (the room), short (past the file) or fails its CRC (a torn append)."""
    size = os.fstat(fd).st_size
    pos = 0
    while pos + _PREFIX.size <= size:
        length, crc = _PREFIX.unpack(os.pread(fd, _PREFIX.size, pos))
        if not _BODY.size <= length <= _BODY.size + MAX_HOLE_BYTES:
            return
        if pos + _PREFIX.size + length > size:
            return
        body = os.pread(fd, length, pos + _PREFIX.size)
        if crc32c.crc32c(body) != crc:
            return
        yield pos, body
        pos += _PREFIX.size + length
