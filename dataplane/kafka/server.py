"""Asyncio Kafka wire-protocol server: frames in, handlers, frames out in request order.

Per connection a `_FrameProtocol` (an asyncio ``BufferedProtocol``) cuts the byte stream
into frames (4-byte signed size + payload): the event loop reads from the socket straight
into its buffers, a frame larger than ``_DIRECT_FRAME_BYTES`` gets a buffer of its own that
the rest of it is read into and that is handed on without a copy, smaller frames are copied
once out of a reused read buffer. Around it there are two tasks:

* the reader takes a slot of the in-flight budget (``max_inflight_per_connection``), takes
  the next frame, decodes and routes it, starts its handler as a task and queues that
  task; when the budget is used up it stops taking frames, and the protocol stops reading
  the socket once ``_QUEUED_FRAME_BYTES`` of frames wait (TCP backpressure);
* the writer takes queued tasks in request order, waits for each and writes its response,
  so responses leave in request order even when handlers finish out of order. A handler
  that returns None (Produce acks=0) sends nothing and the order of later responses holds.

What closes a connection (other connections are never affected):

* immediately: EOF or socket error, a negative size, a size above ``max_request_bytes``,
  no complete frame for ``idle_timeout_s`` while nothing is in flight, a response the
  client does not read for ``idle_timeout_s``;
* after the responses of the earlier requests are written (Kafka closes in order too):
  an undecodable frame, an unknown or unserved api key, an unsupported version (except
  ApiVersions, which gets Kafka's UNSUPPORTED_VERSION answer), a request the ``admit`` gate
  refuses (e.g. before SASL authentication), a handler exception (logged with its
  traceback) or `CloseConnection` raised by a handler;
* after its own response: a request whose handler set ``ctx.close_after_response``.

Handlers of requests that were queued behind the failure and have not started yet are not
run; handlers already running finish and their responses are dropped (they are not
cancelled: half-done work such as an append should complete). ``stop()`` cancels all.

A server may listen on several sockets (Kafka's listeners), each a ``ServerListener`` with
its own name, TLS context, admission gate and initial per-connection state; a connection's
``extras["listener"]`` names the listener it came in on (so Metadata can answer with that
listener's endpoints).

``KafkaServerThread`` runs a ``KafkaServer`` in its own event loop thread for the threaded
broker process. Binds 127.0.0.1 by default. Imports nothing from the rest of the project.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import ssl
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dataplane.config import MAX_REQUEST_BYTES
from dataplane.formats.kafka_errors import (
    MalformedRequestError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)

from .codec import DecodedRequest, decode_request
from .registry import ApiRegistry, CloseConnection, Registration, RequestContext

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_INFLIGHT_PER_CONNECTION",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_IDLE_TIMEOUT_S",
    "KafkaServer",
    "KafkaServerThread",
    "ServerListener",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = MAX_REQUEST_BYTES  # Kafka's socket.request.max.bytes
DEFAULT_MAX_INFLIGHT_PER_CONNECTION = 64
DEFAULT_MAX_CONNECTIONS = 10_000
DEFAULT_IDLE_TIMEOUT_S = 600.0  # Kafka's connections.max.idle.ms
STOP_GRACE_S = 5.0
SSL_HANDSHAKE_TIMEOUT_S = 10.0  # a client that never finishes the TLS handshake is dropped


@dataclass
class ServerListener:
    """One listening socket of the server. `name` (None: unnamed) is put in each of its
    connections' extras as "listener", with a copy of `extras`; `admit` gates its requests
    (None: every request is served); `ssl_context` None is plaintext."""

    host: str = "127.0.0.1"
    port: int = 0
    name: str | None = None
    ssl_context: ssl.SSLContext | None = None
    admit: Admit | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    # a TLS listener with client certificates: the principal of a connection's verified
    # certificate (`getpeercert()`), or None to keep the one in `extras`
    principal_of_peer: Callable[[Any], str | None] | None = None


_CLOSE = object()  # queue slot: close the connection once the earlier responses are written

# admit(api key, connection extras) -> None to serve the request, or why the connection closes
Admit = Callable[[int, dict[str, Any]], str | None]


class _FinalFrame:
    """A handler's response after which the connection closes."""

    __slots__ = ("frame",)

    def __init__(self, frame: bytes | list | None):
        self.frame = frame


_READ_ABORT = "abort"  # close now, drop pending responses
_READ_DRAIN = "drain"  # a close slot was queued: write what precedes it, then close


_READ_BUFFER_BYTES = 256 * 1024  # the reused read buffer of a connection
_READ_BYTES = 64 * 1024  # at most this per read into it: a large frame's start that lands
# there is copied to the frame's own buffer, so keep that copy short
_MIN_READ_BYTES = 16 * 1024  # less free room than this at its end: move the partial frame front
_DIRECT_FRAME_BYTES = 64 * 1024  # a frame above this is read into a buffer of its own (no copy)
# A frame's own buffer is allocated as its bytes arrive, at most this much ahead: a size
# prefix alone must not make the server commit max_request_bytes of memory. A frame larger
# than one such chunk is joined from its chunks once complete (one copy, rare requests).
_DIRECT_CHUNK_BYTES = 2 * 1024 * 1024
_QUEUED_FRAME_BYTES = 1024 * 1024  # frames waiting for an in-flight slot: stop reading above
_QUEUED_FRAMES = 256  # (or above this many small ones)
_SIZE = struct.Struct(">i")


class _FrameProtocol(asyncio.BufferedProtocol):
    """The socket side of one connection: frames in (zero-copy for large ones), flow
    control out. Lives on the event loop thread only.

    Framing errors (a negative size, a size above ``max_request_bytes``) stop reading and
    are reported through ``error`` once the frames before them are taken.
    """

    def __init__(self, server: KafkaServer, listener: ServerListener) -> None:
        self.server = server
        self.listener = listener
        self.max_frame_bytes = server.max_request_bytes
        self.transport: asyncio.Transport | None = None
        self.conn: _Connection | None = None
        self._buf = bytearray(_READ_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = 0  # unparsed bytes are self._buf[_start:_end]
        self._end = 0
        # the large frame being read: its size, its chunks so far, bytes in them
        self._direct_size = 0
        self._direct: list[bytearray] | None = None
        self._direct_filled = 0
        self._chunk_filled = 0  # bytes in the last chunk
        self.frames: collections.deque[bytes | bytearray] = collections.deque()
        self._queued_bytes = 0
        self.error: str | None = None  # why reading stopped on bad input
        self.eof = False  # no more bytes will come (EOF, connection lost)
        self._frame_waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # -- asyncio callbacks -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's is not a subclass
        self.server._accept(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is not None:
            chunk = direct[-1]
            if self._chunk_filled == len(chunk):
                chunk = bytearray(min(_DIRECT_CHUNK_BYTES, self._direct_size - self._direct_filled))
                direct.append(chunk)
                self._chunk_filled = 0
            return memoryview(chunk)[self._chunk_filled :]
        if len(self._buf) - self._end < _MIN_READ_BYTES:
            # Only a partial frame of at most _DIRECT_FRAME_BYTES + 4 is left: move it to
            # the front (same-length slice assignment: allowed while views are exported).
            start, end = self._start, self._end
            self._buf[: end - start] = self._view[start:end]
            self._start, self._end = 0, end - start
        return self._view[self._end : self._end + _READ_BYTES]

    def buffer_updated(self, nbytes: int) -> None:
        if self.error is not None:
            return
        direct = self._direct
        if direct is not None:
            self._direct_filled += nbytes
            self._chunk_filled += nbytes
            if self._direct_filled == self._direct_size:
                self._direct = None
                self._push(direct[0] if len(direct) == 1 else b"".join(direct))
            return
        self._end += nbytes
        self._parse()

    def eof_received(self) -> bool | None:
        self.eof = True
        self._wake_reader()
        # Keep a plain transport open (as asyncio's streams do): the connection closes it
        # once the reader has aborted; a TLS transport closes itself.
        assert self.transport is not None
        return self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
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
            if size > _DIRECT_FRAME_BYTES:
                # Read the rest of this frame straight into its own buffer.
                chunk = bytearray(min(size, _DIRECT_CHUNK_BYTES))
                chunk[:available] = view[start + 4 : end]
                self._direct, self._direct_size = [chunk], size
                self._direct_filled = self._chunk_filled = available
                start = end
            break
        if start == end:
            start = end = 0
        self._start, self._end = start, end

    @property
    def partial_frame_bytes(self) -> int:
        """Bytes of a frame that is not complete yet (0: between frames)."""
        if self._direct is not None:
            return self._direct_filled + 4
        return self._end - self._start

    def _push(self, frame: bytes | bytearray) -> None:
        self.frames.append(frame)
        self._queued_bytes += len(frame)
        if not self._reading_paused and (
            self._queued_bytes > _QUEUED_FRAME_BYTES or len(self.frames) > _QUEUED_FRAMES
        ):
            self._reading_paused = True
            assert self.transport is not None
            self.transport.pause_reading()
        self._wake_reader()

    def _fail(self, why: str) -> None:
        self.error = why
        self._start = self._end = 0
        assert self.transport is not None
        self.transport.pause_reading()
        self._wake_reader()

    def _wake_reader(self) -> None:
        waiter = self._frame_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- used by the connection's tasks ------------------------------------------------------
    def take_frame(self) -> bytes | bytearray | None:
        """The oldest complete frame, or None."""
        if not self.frames:
            return None
        frame = self.frames.popleft()
        self._queued_bytes -= len(frame)
        if (
            self._reading_paused
            and self.error is None
            and self._queued_bytes <= _QUEUED_FRAME_BYTES // 2
            and len(self.frames) <= _QUEUED_FRAMES // 2
        ):
            self._reading_paused = False
            assert self.transport is not None
            if not self.transport.is_closing():
                self.transport.resume_reading()
        return frame

    async def wait_for_bytes(self) -> None:
        """Until a frame, an error or EOF arrives (returns at once if one is there)."""
        if self.frames or self.error is not None or self.eof:
            return
        waiter = asyncio.get_running_loop().create_future()
        self._frame_waiter = waiter
        try:
            await waiter
        finally:
            self._frame_waiter = None

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


def _peer_of(transport: asyncio.BaseTransport) -> tuple[str, int]:
    peer = transport.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return str(peer[0]), int(peer[1])
    return ("?", 0)


class _Connection:
    """One client connection: reader and writer tasks around an ordered slot queue."""

    def __init__(
        self,
        server: KafkaServer,
        conn_id: int,
        protocol: _FrameProtocol,
        listener: ServerListener,
    ) -> None:
        self.server = server
        self.listener = listener
        self.conn_id = conn_id
        self.protocol = protocol
        assert protocol.transport is not None
        self.transport = protocol.transport
        self.peer = _peer_of(self.transport)
        self.name = f"conn {conn_id} {self.peer[0]}:{self.peer[1]}"
        self.closing = False
        self.inflight = 0  # slots queued and not yet fully written
        # per-connection state of the layers above
        self.extras: dict[str, Any] = dict(listener.extras)
        if listener.name is not None:
            self.extras["listener"] = listener.name
        if listener.principal_of_peer is not None:
            principal = listener.principal_of_peer(self.transport.get_extra_info("peercert"))
            if principal is not None:
                self.extras["principal"] = principal
        self._discard_output = False
        self._queue: asyncio.Queue[object] = asyncio.Queue()  # bounded by _budget
        self._budget = asyncio.Semaphore(server.max_inflight_per_connection)
        self._last_sequential: asyncio.Task[bytes | None] | None = None
        self._reader_task: asyncio.Task[str] | None = None
        self._writer_task: asyncio.Task[None] | None = None

    # ----------------------------------------------------------------- lifecycle

    async def run(self) -> None:
        self._reader_task = asyncio.create_task(
            self._read_loop(), name=f"kafka-read-{self.conn_id}"
        )
        self._writer_task = asyncio.create_task(
            self._write_loop(), name=f"kafka-write-{self.conn_id}"
        )
        try:
            done, _ = await asyncio.wait(
                {self._reader_task, self._writer_task}, return_when=asyncio.FIRST_COMPLETED
            )
            if self._reader_task in done and not self._reader_task.cancelled():
                error = self._reader_task.exception()
                if error is not None:
                    log.error("%s: reader failed", self.name, exc_info=error)
                elif self._reader_task.result() == _READ_DRAIN:
                    # A close slot is queued: write the responses before it, then close.
                    await asyncio.wait({self._writer_task})
                # else abort: close now; running handlers finish, their responses are dropped.
        finally:
            self.closing = True
            for task in (self._reader_task, self._writer_task):
                if not task.done():
                    task.cancel()
            await asyncio.gather(self._reader_task, self._writer_task, return_exceptions=True)
            if self._writer_task.done() and not self._writer_task.cancelled():
                exc = self._writer_task.exception()
                if exc is not None and not isinstance(exc, (ConnectionError, OSError)):
                    log.error("%s: writer failed", self.name, exc_info=exc)
            if self._discard_output:
                self.transport.abort()  # do not wait to flush to a client that is not reading
            else:
                self.transport.close()
            try:
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self.protocol.lost)
            except Exception:  # noqa: BLE001 - closing anyway (reset by peer, timeout)
                pass
            log.debug("%s: closed", self.name)

    def abort(self) -> None:
        """Stop serving now (server stop): no more reads, no more writes."""
        self.closing = True
        for task in (self._reader_task, self._writer_task):
            if task is not None and not task.done():
                task.cancel()

    # ----------------------------------------------------------------- reading

    async def _read_frame(self) -> bytes | bytearray | None:
        """The next frame's payload, or None if the connection must be aborted."""
        protocol = self.protocol
        idle = self.server.idle_timeout_s
        while True:
            frame = protocol.take_frame()
            if frame is not None:
                return frame
            if protocol.error is not None:
                log.warning("%s: %s, closing", self.name, protocol.error)
                return None
            if protocol.eof:
                partial = protocol.partial_frame_bytes
                if partial:
                    log.info(
                        "%s: connection closed inside a frame (%d bytes read)", self.name, partial
                    )
                return None
            try:
                async with asyncio.timeout(idle):
                    await protocol.wait_for_bytes()
            except TimeoutError:
                # Waiting for the next frame while responses are pending is not idleness.
                if self.inflight > 0 and protocol.partial_frame_bytes == 0:
                    continue
                log.info("%s: idle for %.0f s, closing", self.name, idle)
                return None

    async def _read_loop(self) -> str:
        while True:
            await self._budget.acquire()
            queued = False
            try:
                if self.closing:
                    return _READ_ABORT
                frame = await self._read_frame()
                if frame is None or self.closing:
                    return _READ_ABORT
                slot, keep_reading = self._dispatch(frame)
                self.inflight += 1
                self._queue.put_nowait(slot)
                queued = True
                if not keep_reading:
                    return _READ_DRAIN
            finally:
                if not queued:
                    self._budget.release()

    def _dispatch(self, frame: bytes | bytearray) -> tuple[object, bool]:
        """Decode and route one frame: (queue slot, keep reading?)."""
        received_at = time.monotonic()
        try:
            request = decode_request(frame)
            registration = self.server.registry.route(request)
        except UnsupportedVersionError as exc:
            answer = self.server.registry.unsupported_version_response(exc)
            if answer is not None:
                log.info(
                    "%s: %s; answering UNSUPPORTED_VERSION with our api versions", self.name, exc
                )
                ready: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
                ready.set_result(answer)
                return ready, True
            log.warning("%s: %s (client id %r), closing", self.name, exc, exc.client_id)
            return _CLOSE, False
        except UnknownApiKeyError as exc:
            log.warning("%s: %s, closing", self.name, exc)
            return _CLOSE, False
        except MalformedRequestError as exc:
            log.warning(
                "%s: malformed request (api key %s, version %s, correlation id %s): %s; closing",
                self.name,
                exc.api_key,
                exc.api_version,
                exc.correlation_id,
                exc.message,
            )
            return _CLOSE, False
        if self.listener.admit is not None:
            refused = self.listener.admit(request.api_key, self.extras)
            if refused is not None:
                log.warning(
                    "%s: %s (%s, client id %r), closing",
                    self.name,
                    refused,
                    request.api_name,
                    request.client_id,
                )
                return _CLOSE, False
        ctx = RequestContext(
            api_key=request.api_key,
            api_version=request.api_version,
            correlation_id=request.correlation_id,
            client_id=request.client_id,
            peer=self.peer,
            connection_id=self.conn_id,
            received_at=received_at,
            request_size=request.size,
            extras=self.extras,
        )
        previous = self._last_sequential if registration.sequential else None
        task = asyncio.get_running_loop().create_task(
            self._run_handler(request, ctx, registration, previous),
            name=f"kafka-{self.conn_id}-{request.api_name}-{request.correlation_id}",
        )
        if registration.sequential:
            self._last_sequential = task
        self.server._track_handler(task, self)
        return task, True

    async def _run_handler(
        self,
        request: DecodedRequest,
        ctx: RequestContext,
        registration: Registration,
        previous: asyncio.Task[bytes | None] | None,
    ) -> bytes | list | None:
        if previous is not None and not previous.done():
            await asyncio.wait({previous})
        if self.closing:
            # The connection failed or went away before this handler started: skip it.
            raise CloseConnection("connection closed before the handler started")
        frame = await self.server.registry.handle(request, ctx, registration)
        return _FinalFrame(frame) if ctx.close_after_response else frame

    # ----------------------------------------------------------------- writing

    async def _write_loop(self) -> None:
        while True:
            slot = await self._queue.get()
            try:
                if slot is _CLOSE:
                    self.closing = True
                    return
                assert isinstance(slot, asyncio.Future)
                if not slot.done():
                    await asyncio.wait({slot})
                if slot.cancelled():
                    self.closing = True
                    return
                exc = slot.exception()
                if exc is not None:
                    self.closing = True
                    if isinstance(exc, CloseConnection):
                        log.info("%s: closing on handler request: %s", self.name, exc)
                    else:
                        log.error(
                            "%s: handler failed, closing the connection", self.name, exc_info=exc
                        )
                    return
                frame = slot.result()
                final = isinstance(frame, _FinalFrame)
                if final:
                    frame = frame.frame
                if frame is not None:
                    if self.transport.is_closing():
                        # The peer went away (EOF, reset: the reader is aborting) or we are
                        # closing: nothing more can be written.
                        self.closing = True
                        return
                    if isinstance(frame, list):  # a response with its record sets not copied
                        self.transport.writelines(frame)
                    else:
                        self.transport.write(frame)
                    try:
                        # A client that stops reading must not pin the connection forever.
                        async with asyncio.timeout(self.server.idle_timeout_s):
                            await self.protocol.drain()
                    except TimeoutError:
                        log.info(
                            "%s: client not reading responses for %.1f s, closing",
                            self.name,
                            self.server.idle_timeout_s,
                        )
                        self.closing = True
                        self._discard_output = True
                        return
                if final:
                    self.closing = True
                    log.info("%s: closing after the handler's final response", self.name)
                    return
            finally:
                self.inflight -= 1
                self._budget.release()


class KafkaServer:
    """Kafka protocol server on asyncio protocols; one event loop, many connections.

    ``port=0`` binds an ephemeral port: read the actual one from ``port`` after ``start()``.
    """

    def __init__(
        self,
        registry: ApiRegistry,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_inflight_per_connection: int = DEFAULT_MAX_INFLIGHT_PER_CONNECTION,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        admit: Admit | None = None,
        ssl_context: ssl.SSLContext | None = None,
        listeners: list[ServerListener] | None = None,
    ) -> None:
        if not isinstance(registry, ApiRegistry):
            raise TypeError("registry must be an ApiRegistry")
        if listeners is None:
            listeners = [ServerListener(host, port, None, ssl_context, admit)]
        if not listeners:
            raise ValueError("at least one listener is needed")
        for listener in listeners:
            if not 0 <= listener.port <= 65535:
                raise ValueError(f"bad port {listener.port}")
        for name, value in (
            ("max_request_bytes", max_request_bytes),
            ("max_inflight_per_connection", max_inflight_per_connection),
            ("max_connections", max_connections),
        ):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if max_request_bytes > 2**31 - 1:
            raise ValueError(
                "max_request_bytes cannot exceed 2**31 - 1 (the size prefix is an int32)"
            )
        if not idle_timeout_s > 0:
            raise ValueError("idle_timeout_s must be > 0")
        self.registry = registry
        self.listeners = list(listeners)
        self.host = self.listeners[0].host
        self.max_request_bytes = max_request_bytes
        self.max_inflight_per_connection = max_inflight_per_connection
        self.max_connections = max_connections
        self.idle_timeout_s = float(idle_timeout_s)
        self._servers: list[asyncio.Server] = []
        self._ports: list[int] | None = None
        self._connections: dict[_Connection, asyncio.Task[Any]] = {}
        self._handlers: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count(1)
        self._stopping = False

    @property
    def port(self) -> int:
        """The first listener's bound port (after ``start()``)."""
        return self.ports[0]

    @property
    def ports(self) -> list[int]:
        """Every listener's bound port, in listener order (after ``start()``)."""
        if self._ports is None:
            raise RuntimeError("server not started")
        return list(self._ports)

    @property
    def connection_count(self) -> int:
        """Connections currently served."""
        return len(self._connections)

    @property
    def serving(self) -> bool:
        return bool(self._servers)

    async def start(self) -> None:
        """Bind every listener and start accepting connections (none if one cannot bind)."""
        if self._servers:
            raise RuntimeError("server already started")
        self._stopping = False
        loop = asyncio.get_running_loop()
        servers: list[asyncio.Server] = []
        try:
            for listener in self.listeners:
                servers.append(
                    await loop.create_server(
                        lambda listener=listener: _FrameProtocol(self, listener),
                        listener.host,
                        listener.port,
                        reuse_address=True,
                        ssl=listener.ssl_context,
                        ssl_handshake_timeout=(
                            SSL_HANDSHAKE_TIMEOUT_S if listener.ssl_context else None
                        ),
                    )
                )
        except BaseException:
            for server in servers:
                server.close()
            raise
        self._servers = servers
        self._ports = [int(s.sockets[0].getsockname()[1]) for s in servers]
        for listener, port in zip(self.listeners, self._ports, strict=True):
            log.info(
                "Kafka protocol server listening on %s:%d%s",
                listener.host,
                port,
                f" (listener {listener.name})" if listener.name else "",
            )

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop accepting, close every connection and cancel running handlers."""
        servers = self._servers
        if not servers:
            return
        self._stopping = True
        for server in servers:
            server.close()
        conns = list(self._connections.items())
        for conn, _ in conns:
            conn.abort()
        handlers = list(self._handlers)
        for task in handlers:
            task.cancel()
        pending = [t for _, t in conns] + handlers
        if pending:
            _, still = await asyncio.wait(pending, timeout=grace_s)
            if still:
                log.warning(
                    "%d connection/handler tasks did not finish within %.1f s", len(still), grace_s
                )
        try:
            async with asyncio.timeout(grace_s):
                for server in servers:
                    await server.wait_closed()
        except TimeoutError:
            log.warning("listener did not close within %.1f s", grace_s)
        self._servers = []
        log.info("Kafka protocol server on %s:%s stopped", self.host, self._ports)

    async def __aenter__(self) -> KafkaServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------------------- internals

    def _accept(self, protocol: _FrameProtocol) -> None:
        """A new connection (from its protocol's ``connection_made``): serve it or refuse."""
        transport = protocol.transport
        assert transport is not None
        if self._stopping or len(self._connections) >= self.max_connections:
            log.warning(
                "refusing connection from %s:%d: %s",
                *_peer_of(transport),
                "server stopping"
                if self._stopping
                else f"max_connections={self.max_connections} reached",
            )
            transport.close()
            return
        conn = _Connection(self, next(self._ids), protocol, protocol.listener)
        protocol.conn = conn
        self._connections[conn] = asyncio.get_running_loop().create_task(
            self._serve(conn), name=f"kafka-conn-{conn.conn_id}"
        )
        log.debug("%s: accepted", conn.name)

    async def _serve(self, conn: _Connection) -> None:
        try:
            await conn.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug in one connection must not take the server down
            log.exception("%s: connection failed", conn.name)
        finally:
            self._connections.pop(conn, None)

    def _track_handler(self, task: asyncio.Task[Any], conn: _Connection) -> None:
        self._handlers.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._handlers.discard(t)
            if t.cancelled():
                return
            exc = t.exception()  # marks it retrieved; the writer logs the ones it sees
            if exc is not None and conn.closing and not isinstance(exc, CloseConnection):
                log.debug("%s: handler %s ended with %r", conn.name, t.get_name(), exc)

        task.add_done_callback(done)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop when it is installed (a dependency on Linux): its socket reads and
    callbacks run in C, which leaves the GIL to request handling; asyncio's own otherwise."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - platforms without uvloop
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class KafkaServerThread:
    """A `KafkaServer` running in its own event-loop thread (the broker process is threaded).

    ``start()`` returns once the port is bound (``port`` is then valid); ``stop()`` stops the
    server and joins the thread. Usable as a context manager.
    """

    def __init__(
        self, registry: ApiRegistry, host: str = "127.0.0.1", port: int = 0, **server_kwargs: Any
    ) -> None:
        self.server = KafkaServer(registry, host, port, **server_kwargs)  # validates arguments now
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def ports(self) -> list[int]:
        return self.server.ports

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("server thread not started")
        return self._loop

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread and wait until the server listens (or raise its startup error)."""
        if self._thread is not None:
            raise RuntimeError("server thread already started")
        self._started = threading.Event()
        self._error = None
        self._thread = threading.Thread(
            target=self._run, name=f"kafka-server-{self.server.host}", daemon=True
        )
        self._thread.start()
        if not self._started.wait(timeout):
            self.stop(timeout)
            raise TimeoutError(f"Kafka server did not start within {timeout} s")
        if self._error is not None:
            self._thread.join(timeout)
            self._thread = None
            raise RuntimeError(f"Kafka server failed to start: {self._error}") from self._error

    def _run(self) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            try:
                loop.run_until_complete(self.server.start())
            except BaseException as exc:  # noqa: BLE001 - reported to start()
                self._error = exc
                return
            finally:
                self._started.set()
            loop.run_forever()
            loop.run_until_complete(self.server.stop())
        except Exception:  # noqa: BLE001
            log.exception("Kafka server thread failed")
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server and join the thread (no-op if not running)."""
        thread = self._thread
        if thread is None:
            return
        loop = self._loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # loop already closed
                pass
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"Kafka server thread did not stop within {timeout} s")
        self._thread = None

    def __enter__(self) -> KafkaServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
