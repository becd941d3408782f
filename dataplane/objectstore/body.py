"""An object's bytes as a list of buffers, sent to the store without joining them.

The uploader builds a stream-set object as many buffers (block headers, block bodies, the
index, the footer). Joining them into one `bytes` copies the whole object (tens of MB) while
holding the GIL, and doubles the memory of an upload; `ObjectBody` hands the buffers to the
HTTP client one read at a time instead. Each attempt of a PUT reads the body through a fresh
`reader()`, so a retried PUT sends exactly the same bytes from the start.

A body may be sent at a bounded rate (`paced` with a `SendPace`, which several bodies sent
in parallel may share): its readers hand out bytes no faster than the pace's
`send_bytes_per_s` (after a first `PACE_BURST_BYTES`), waiting in the thread that sends.
The uploader paces the stream-set objects of its regular uploads so that the object store's
work on them (SeaweedFS hashes every byte; a cloud NIC's egress) is spread over seconds
instead of taking every core for a fraction of one while produce requests wait.

Pure: no I/O. Thread-safety: an `ObjectBody` is immutable (its buffers must not be changed
while a put of it runs); each `BodyReader` belongs to one attempt, on one thread; a
`SendPace` is thread-safe.
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Callable, Iterable, Iterator

Buffer = bytes | bytearray | memoryview
# a paced reader hands out this much at once before the rate applies
PACE_BURST_BYTES = 1024 * 1024
# a paced reader waits only once it is this far ahead of its pace, then until it is on
# pace: a wait per HTTP send block (16 KiB) doubled a paced PUT's CPU (~8,000 thread
# wake-ups per GB); this makes it ~20 a second, each within 50 ms of the rate
PACE_SLACK_S = 0.05


class SendPace:
    """A rate shared by the readers of one or more bodies: `take(n)` returns once handing
    out `n` more bytes keeps everything taken within `send_bytes_per_s` since the first
    take (after PACE_BURST_BYTES), give or take `PACE_SLACK_S` of bytes (a take that is
    less than that ahead returns at once; one further ahead waits until it is on pace);
    after `unpace()` it returns at once (a waiting one too). Thread-safe; the wait happens
    outside its lock."""

    def __init__(
        self,
        send_bytes_per_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        unpaced: threading.Event | None = None,
    ) -> None:
        """`clock` and `unpaced` (what a wait waits on) are injectable for tests."""
        if send_bytes_per_s <= 0:
            raise ValueError(f"send_bytes_per_s must be > 0, not {send_bytes_per_s}")
        self.send_bytes_per_s = float(send_bytes_per_s)
        self._lock = threading.Lock()
        self._started_s: float | None = None
        self._taken_bytes = 0
        self._clock = clock
        self._unpaced = unpaced or threading.Event()

    def unpace(self) -> None:
        """From now on hand out bytes at once (any thread)."""
        self._unpaced.set()

    def take(self, n_bytes: int) -> None:
        """Wait (in the calling thread: an upload's, never the event loop) until `n_bytes`
        more may be handed out."""
        with self._lock:
            now = self._clock()
            if self._started_s is None:
                self._started_s = now
            self._taken_bytes += n_bytes
            excess_bytes = self._taken_bytes - PACE_BURST_BYTES
            due = self._started_s + excess_bytes / self.send_bytes_per_s
        if due - now > PACE_SLACK_S:
            self._unpaced.wait(due - now)


class ObjectBody:
    """The concatenation of `parts`, without copying them."""

    __slots__ = ("_pace", "_parts", "_size")

    def __init__(self, parts: Iterable[Buffer], pace: SendPace | None = None) -> None:
        """`pace`: the rate its readers hand out bytes at (None: at once)."""
        self._pace = pace
        views = []
        for part in parts:
            view = memoryview(part)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            if len(view):
                views.append(view)
        self._parts: tuple[memoryview, ...] = tuple(views)
        self._size = sum(len(v) for v in views)

    def __len__(self) -> int:
        return self._size

    @property
    def pace(self) -> SendPace | None:
        """The rate its readers hand out bytes at (None: as fast as they are read)."""
        return self._pace

    def paced(self, pace: SendPace | None) -> ObjectBody:
        """The same bytes (not copied), read at `pace` (None: at once)."""
        return ObjectBody(self._parts, pace)

    def chunks(self) -> Iterator[memoryview]:
        """The buffers in order (views, not copies)."""
        return iter(self._parts)

    def tobytes(self) -> bytes:
        """The whole body as one `bytes` (a copy: for small bodies and checks only)."""
        return b"".join(self._parts)

    __bytes__ = tobytes  # bytes(body)

    def md5_hex(self) -> str:
        """The MD5 of the body (an S3 ETag of a single-part upload)."""
        digest = hashlib.md5()
        for part in self._parts:
            digest.update(part)
        return digest.hexdigest()

    def equals(self, data: Buffer) -> bool:
        """Whether `data` holds exactly this body's bytes."""
        view = memoryview(data)
        if len(view) != self._size:
            return False
        pos = 0
        for part in self._parts:
            if view[pos : pos + len(part)] != part:
                return False
            pos += len(part)
        return True

    def reader(self) -> BodyReader:
        """A new read-only file positioned at the start of the body."""
        return BodyReader(self)


class BodyReader(io.RawIOBase):
    """A seekable, read-only file over an `ObjectBody`: `read(n)` returns views of the
    body's buffers (no copy), at most `n` bytes and never crossing a buffer's end."""

    def __init__(self, body: ObjectBody) -> None:
        super().__init__()
        self._parts = body._parts
        self._size = len(body)
        self._pos = 0  # absolute position
        self._part = 0  # index of the buffer holding _pos (== len(parts) at the end)
        self._offset = 0  # position inside that buffer
        self._pace = body.pace

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self._pos + offset
        elif whence == io.SEEK_END:
            target = self._size + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if target < 0:
            raise ValueError(f"negative seek position {target}")
        target = min(target, self._size)
        part, before = 0, 0
        while part < len(self._parts) and before + len(self._parts[part]) <= target:
            before += len(self._parts[part])
            part += 1
        self._pos, self._part, self._offset = target, part, target - before
        return target

    def read(self, size: int | None = -1) -> memoryview | bytes:  # type: ignore[override]
        if self.closed:
            raise ValueError("read of a closed body")
        if size is None or size < 0:
            rest = b"".join(
                [self._parts[self._part][self._offset :], *self._parts[self._part + 1 :]]
                if self._part < len(self._parts)
                else []
            )
            self.seek(0, io.SEEK_END)
            return rest
        if size == 0 or self._part >= len(self._parts):
            return b""
        part = self._parts[self._part]
        chunk = part[self._offset : self._offset + size]
        if self._pace is not None:
            self._pace.take(len(chunk))
        self._offset += len(chunk)
        self._pos += len(chunk)
        if self._offset == len(part):
            self._part += 1
            self._offset = 0
        return chunk

    def readinto(self, buffer: Buffer) -> int:  # type: ignore[override]
        chunk = self.read(len(memoryview(buffer)))
        n = len(chunk)
        memoryview(buffer).cast("B")[:n] = chunk
        return n
