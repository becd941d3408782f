"""The socket side of a Kafka connection: `FrameProtocol` cuts the byte stream into frames.

A frame is a 4-byte signed size and its payload. The event loop reads from the socket
straight into the protocol's buffers. Frames that arrive whole within one read are copied
once out of a read buffer; a frame still incomplete at the end of a read (every frame larger
than ``DIRECT_FRAME_BYTES``) is read into a buffer of its own from the server's frame
`BufferPool` and handed on, as a read-only view of its exact size, without a copy. Those
buffers are used again once no view of their frame is left (a Produce request's record sets
are views of it until they are appended): a fresh buffer per large frame cost its zeroing
and a page fault per 4 KiB, more than half of the loop's page faults at saturation. A fresh
one is an anonymous mapping whose pages are committed as the bytes arrive, so a size prefix
alone commits little memory. The read buffer is borrowed from the server's `ReadBufferPool`
for one read and given back after it: an idle connection holds no buffer, a connection in
the middle of a frame holds that frame's buffer only. The protocol stops reading the socket
once ``QUEUED_FRAME_BYTES`` of frames wait for the connection to take them (TCP
backpressure), and tells the connection's writer when the transport can take more bytes.
"""

from __future__ import annotations

import asyncio
import collections
import mmap
import struct
from collections.abc import Callable

from ..formats.buffer_pool import BufferPool

__all__ = [
    "DIRECT_FRAME_BYTES",
    "FRAME_POOL_BYTES",
    "MAX_POOLED_FRAME_BYTES",
    "QUEUED_FRAME_BYTES",
    "FrameProtocol",
    "ReadBufferPool",
    "new_frame_buffer_pool",
    "peer_of",
]

_READ_BYTES = 64 * 1024  # at most this per read into a read buffer: a large frame's start
# that lands there is copied to the frame's own buffer, so keep that copy short
_READ_BUFFER_BYTES = _READ_BYTES + 4  # (+ a size prefix's first bytes kept from a read)
_FREE_READ_BUFFERS = 16  # a pool keeps at most this many buffers for the next reads (1 MiB)
DIRECT_FRAME_BYTES = _READ_BYTES  # a frame above this is read into a buffer of its own
# Large frames' buffers kept for use again per server, in use or free: above the frames a
# saturated listener holds at once (requests in flight on every connection, ~1 MiB each)
FRAME_POOL_BYTES = 64 * 1024 * 1024
MAX_POOLED_FRAME_BYTES = 16 * 1024 * 1024  # a larger frame's buffer is not kept for reuse
QUEUED_FRAME_BYTES = 1024 * 1024  # frames waiting for an in-flight slot: stop reading above
_QUEUED_FRAMES = 256  # (or above this many small ones)
_SIZE = struct.Struct(">i")


class ReadBufferPool:
    """The read buffers of one event loop's connections: a connection borrows one while it
    has unparsed bytes and gives it back when it has none, so memory follows the reads in
    progress, not the connections open. At most `max_free` buffers are kept for reuse.

    Thread-safety: one event loop's protocols only (not locked).
    """

    def __init__(
        self, buffer_bytes: int = _READ_BUFFER_BYTES, max_free: int = _FREE_READ_BUFFERS
    ) -> None:
        self.buffer_bytes = buffer_bytes
        self.max_free = max_free
        self._free: list[bytearray] = []

    @property
    def free_count(self) -> int:
        """Buffers kept for reuse now."""
        return len(self._free)

    def take(self) -> bytearray:
        """A buffer of `buffer_bytes` (reused when one is free)."""
        return self._free.pop() if self._free else bytearray(self.buffer_bytes)

    def give(self, buf: bytearray) -> None:
        """Return a buffer taken with `take` (dropped when `max_free` are kept already)."""
        if len(self._free) < self.max_free:
            self._free.append(buf)


def new_frame_buffer_pool(max_bytes: int = FRAME_POOL_BYTES) -> BufferPool:
    """The buffers of large frames (power-of-two mappings from ``DIRECT_FRAME_BYTES``) of one
    event loop's connections (not locked: only that loop takes from it)."""
    return BufferPool(
        max_bytes, min_classed_bytes=DIRECT_FRAME_BYTES, max_buffer_bytes=MAX_POOLED_FRAME_BYTES
    )


class FrameProtocol(asyncio.BufferedProtocol):
    """The socket side of one connection: frames in (zero-copy for large ones), flow
    control out. Lives on the event loop thread only.

    Framing errors (a negative size, a size above ``max_request_bytes``) stop reading and
    are reported through ``error`` once the frames before them are taken.
    """

    def __init__(
        self,
        on_connection_made: Callable[[FrameProtocol], None],
        max_frame_bytes: int,
        buffers: ReadBufferPool | None = None,
        frame_buffers: BufferPool | None = None,
    ) -> None:
        """`on_connection_made(protocol)` is called once the transport is there (the server
        accepts or refuses the connection); a frame above `max_frame_bytes` is an error.
        `buffers`: the pool read buffers are borrowed from; `frame_buffers`: the pool large
        frames' buffers come from (None: pools of its own)."""
        self._on_connection_made = on_connection_made
        self.max_frame_bytes = max_frame_bytes
        self.transport: asyncio.Transport | None = None
        self._buffers = buffers if buffers is not None else ReadBufferPool(max_free=0)
        self._frame_buffers = frame_buffers or new_frame_buffer_pool(0)
        # borrowed while unparsed bytes are in it (or a read into it is under way)
        self._buf: bytearray | None = None
        self._view = memoryview(b"")
        self._start = 0  # unparsed bytes are self._buf[_start:_end]
        self._end = 0
        self._carry = b""  # the first bytes (< 4) of a size prefix, between reads
        # the frame being read into a buffer of its own: its size, its buffer, bytes in it
        self._direct_size = 0
        self._direct: bytearray | mmap.mmap | None = None
        self._direct_filled = 0
        self.frames: collections.deque[bytes | memoryview] = collections.deque()
        self._queued_bytes = 0
        self.error: str | None = None  # why reading stopped on bad input
        self.eof = False  # no more bytes will come (EOF, connection lost)
        self._frame_waiter: asyncio.Future[None] | None = None
        # `wait_for_bytes`'s timeout: one timer per connection, armed by a wait and moved
        # on only when it fires (a wait's deadline is a float, not a timer of its own)
        self._wait_deadline = 0.0
        self._wait_timer: asyncio.TimerHandle | None = None
        self._wait_timer_at = 0.0
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's is not a subclass
        self._on_connection_made(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is not None:  # (a pool's buffer may be longer than the frame)
            return memoryview(direct)[self._direct_filled : self._direct_size]
        if self._buf is None:
            self._buf = self._buffers.take()
            self._view = memoryview(self._buf)
            carry = self._carry  # a size prefix's first bytes, from the previous read
            self._buf[: len(carry)] = carry
            self._start, self._end = 0, len(carry)
            self._carry = b""
        return self._view[self._end : self._end + _READ_BYTES]

    def buffer_updated(self, nbytes: int) -> None:
        if self.error is not None:
            return
        direct = self._direct
        if direct is not None:
            self._direct_filled += nbytes
            if self._direct_filled == self._direct_size:
                self._direct = None
                # read-only: the buffer is the pool's, nobody downstream writes into it
                self._push(memoryview(direct)[: self._direct_size].toreadonly())
            return
        self._end += nbytes
        self._parse()

    def eof_received(self) -> bool | None:
        self._give_back_buffer()  # the read that saw EOF borrowed one; nothing is in it
        self.eof = True
        self._wake_reader()
        # Keep a plain transport open (as asyncio's streams do): the connection closes it
        # once the reader has aborted; a TLS transport closes itself.
        assert self.transport is not None
        return self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self._give_back_buffer()
        if self._wait_timer is not None:
            self._wait_timer.cancel()  # the loop must not keep a closed connection
            self._wait_timer = None
        self.eof = True
        self._wake_reader()
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("connection lost"))
        self._drain_waiters.clear()
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for waiter in self._drain_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._drain_waiters.clear()

    # -- framing -----------------------------------------------------------------------------
    def _parse(self) -> None:
        view = self._view
        start, end = self._start, self._end
        while end - start >= 4:
            size = _SIZE.unpack_from(view, start)[0]
            if size < 0:
                self._fail(f"negative frame size {size}")
                return
            if size > self.max_frame_bytes:
                self._fail(
                    f"frame of {size} bytes exceeds max_request_bytes={self.max_frame_bytes}"
                )
                return
            available = end - start - 4
            if available >= size:
                self._push(bytes(view[start + 4 : start + 4 + size]))
                start += 4 + size
                continue
            # Read the rest of this frame straight into its own buffer (a large frame's is
            # handed on without a copy), so the read buffer goes back to the pool now.
            chunk = self._frame_buffers.take(size)
            chunk[:available] = view[start + 4 : end]
            self._direct, self._direct_size = chunk, size
            self._direct_filled = available
            start = end
            break
        # only a size prefix's first bytes (< 4) can be left: kept aside
        self._start, self._end = start, end
        self._give_back_buffer()

    def _give_back_buffer(self) -> None:
        """Return the read buffer to the pool (unparsed bytes, at most a size prefix's
        first three, are kept aside)."""
        if self._buf is not None:
            if self._end > self._start:
                self._carry = bytes(self._view[self._start : self._end])
            self._start = self._end = 0
            self._view.release()
            self._view = memoryview(b"")
            self._buffers.give(self._buf)
            self._buf = None

    @property
    def partial_frame_bytes(self) -> int:
        """Bytes of a frame that is not complete yet (0: between frames)."""
        if self._direct is not None:
            return self._direct_filled + 4
        return self._end - self._start + len(self._carry)

    def _push(self, frame: bytes | memoryview) -> None:
        self.frames.append(frame)
        self._queued_bytes += len(frame)
        if not self._reading_paused and (
            self._queued_bytes > QUEUED_FRAME_BYTES or len(self.frames) > _QUEUED_FRAMES
        ):
            self._reading_paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake_reader()

    def _fail(self, why: str) -> None:
        self.error = why
        self._start = self._end = 0
        self._give_back_buffer()
        assert self.transport is not None
        self.transport.pause_reading()
        self._wake_reader()

    def _wake_reader(self) -> None:
        waiter = self._frame_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by the connection's tasks ------------------------------------------------------
    def take_frame(self) -> bytes | memoryview | None:
        """The oldest complete frame, or None."""
        if not self.frames:
            return None
        frame = self.frames.popleft()
        self._queued_bytes -= len(frame)
        if (
            self._reading_paused
            and self.error is None
            and self._queued_bytes <= QUEUED_FRAME_BYTES // 2
            and len(self.frames) <= _QUEUED_FRAMES // 2
        ):
            self._reading_paused = False
            assert self.transport is not None
            if not self.transport.is_closing():
                self.transport.resume_reading()
        return frame

    async def wait_for_bytes(self, timeout_s: float) -> None:
        """Until a frame, an error or EOF arrives (returns at once if one is there).

        Raises:
            TimeoutError: none came within `timeout_s`.
        """
        if self.frames or self.error is not None or self.eof:
            return
        loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._frame_waiter = waiter
        deadline = self._wait_deadline = loop.time() + timeout_s
        if self._wait_timer is None or deadline < self._wait_timer_at:
            self._arm_wait_timer(loop, deadline)
        try:
            await waiter
        finally:
            self._frame_waiter = None

    def _arm_wait_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        if self._wait_timer is not None:
            self._wait_timer.cancel()
        self._wait_timer = loop.call_at(at, self._on_wait_timer, loop)
        self._wait_timer_at = at

    def _on_wait_timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """The timer of a wait that may since have ended: the wait under way (if any) times
        out when its own deadline is passed, else the timer moves on to that deadline."""
        self._wait_timer = None
        waiter = self._frame_waiter
        if waiter is None or waiter.done():
            return  # no wait: the next one arms the timer
        # (within a millisecond: the loop's timers may fire that early, uvloop's rounded)
        if loop.time() >= self._wait_deadline - 0.001:
            waiter.set_exception(TimeoutError())
        else:
            self._arm_wait_timer(loop, self._wait_deadline)

    @property
    def writing_paused(self) -> bool:
        """The transport's write buffer is above its high-water mark (`drain` would wait)."""
        return self._writing_paused

    async def drain(self) -> None:
        """Until the transport's write buffer is below its high-water mark."""
        assert self.transport is not None
        if self.lost.done():
            raise ConnectionResetError("connection lost")
        if not self._writing_paused:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(waiter)
        await waiter


def peer_of(transport: asyncio.BaseTransport) -> tuple[str, int]:
    """The (host, port) of a transport's peer; ("?", 0) when it has none."""
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return str(peer[0]), int(peer[1])
    return ("?", 0)
