"""One Kafka client connection: a reader and a writer task around an ordered slot queue.

* the reader takes a slot of the in-flight budget (``max_inflight_per_connection``), takes
  the next frame from the connection's `FrameProtocol`, decodes and routes it, starts its
  handler as a task and queues that task; when the budget is used up it stops taking frames;
* the writer takes queued tasks in request order, waits for each and writes its response,
  so responses leave in request order even when handlers finish out of order. A handler
  that returns None (Produce acks=0) sends nothing and the order of later responses holds.

How and when a connection closes is described in `dataplane.kafka.server`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Histogram

from dataplane.formats.kafka_errors import (
    MalformedRequestError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)
from dataplane.runtime import until_done

from .codec import DecodedRequest, decode_request
from .framing import FrameProtocol, peer_of
from .registry import ApiRegistry, CloseConnection, Registration, RequestContext
from .request_checks import forbidden_null

__all__ = ["Admit", "Connection"]

log = logging.getLogger(__name__)

# admit(api key, connection extras) -> None to serve the request, or why the connection closes
Admit = Callable[[int, dict[str, Any]], str | None]

# Kafka's RequestMetrics TotalTimeMs: from the frame read to the response ready (a Fetch's
# includes its long-poll wait), by api name (`automqctl cluster top`, Grafana)
REQUEST_LATENCY_SECONDS = Histogram(
    "automq_request_latency_seconds",
    "Time from a request's frame read to its response ready to write, by Kafka api",
    ["api"],
    buckets=(
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ),
)  # fmt: skip
# api key -> its labelled histogram, looked up once per api (the event loop's alone)
_LATENCY_BY_API: dict[int, Any] = {}

_CLOSE = object()  # queue slot: close the connection once the earlier responses are written


class _FinalFrame:
    """A handler's response after which the connection closes."""

    __slots__ = ("frame",)

    def __init__(self, frame: bytes | list | None):
        self.frame = frame


_READ_ABORT = "abort"  # close now, drop pending responses
_READ_DRAIN = "drain"  # a close slot was queued: write what precedes it, then close


class Connection:
    """One client connection: reader and writer tasks around an ordered slot queue."""

    def __init__(
        self,
        conn_id: int,
        protocol: FrameProtocol,
        registry: ApiRegistry,
        *,
        extras: dict[str, Any],
        admit: Admit | None,
        max_inflight: int,
        idle_timeout_s: float,
        track_handler: Callable[[asyncio.Task[Any], Connection], None],
    ) -> None:
        """`extras` is the connection's initial state for the layers above (its listener's),
        `admit` gates its requests, `track_handler` is told of every handler task started."""
        self.registry = registry
        self.admit = admit
        self.idle_timeout_s = idle_timeout_s
        self._track_handler = track_handler
        self.conn_id = conn_id
        self.protocol = protocol
        assert protocol.transport is not None
        self.transport = protocol.transport
        self.peer = peer_of(self.transport)
        self.name = f"conn {conn_id} {self.peer[0]}:{self.peer[1]}"
        self.closing = False
        self.inflight = 0  # slots queued and not yet fully written
        self.extras = extras  # per-connection state of the layers above
        self._discard_output = False
        self._queue: asyncio.Queue[object] = asyncio.Queue()  # bounded by _budget
        self._budget = asyncio.Semaphore(max_inflight)
        # the turn of the connection's last in-order request (`Registration.in_order`)
        self._last_turn: asyncio.Future[None] | None = None
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

    async def _read_frame(self) -> bytes | memoryview | None:
        """The next frame's payload, or None if the connection must be aborted."""
        protocol = self.protocol
        idle = self.idle_timeout_s
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
                await protocol.wait_for_bytes(idle)
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
                frame = None  # an idle connection must not hold its last request
                self.inflight += 1
                self._queue.put_nowait(slot)
                queued = True
                if not keep_reading:
                    return _READ_DRAIN
            finally:
                if not queued:
                    self._budget.release()

    def _dispatch(self, frame: bytes | memoryview) -> tuple[object, bool]:
        """Decode and route one frame: (queue slot, keep reading?)."""
        received_at = time.monotonic()
        try:
            request = decode_request(frame)
            registration = self.registry.route(request)
        except UnsupportedVersionError as exc:
            answer = self.registry.unsupported_version_response(exc)
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
        if self.admit is not None:
            refused = self.admit(request.api_key, self.extras)
            if refused is not None:
                log.warning(
                    "%s: %s (%s, client id %r), closing",
                    self.name,
                    refused,
                    request.api_name,
                    request.client_id,
                )
                return _CLOSE, False
        loop = asyncio.get_running_loop()
        previous = turn = None
        if registration.in_order:
            previous, turn = self._last_turn, loop.create_future()
            self._last_turn = turn
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
            turn=turn,
        )
        task = loop.create_task(
            self._run_handler(request, ctx, registration, previous),
            name=f"kafka-{self.conn_id}-{request.api_name}-{request.correlation_id}",
        )
        self._track_handler(task, self)
        return task, True

    async def _run_handler(
        self,
        request: DecodedRequest,
        ctx: RequestContext,
        registration: Registration,
        previous: asyncio.Future[None] | None,
    ) -> bytes | list | None:
        """Run the handler once `previous` (the turn of the connection's in-order request
        before this one) is passed; this request's own turn is passed when it ends, if
        the handler did not pass it earlier."""
        try:
            if previous is not None and not previous.done():
                await until_done(previous)  # never cancels the previous request's turn
            if self.closing:
                # The connection failed or went away before this handler started: skip it.
                raise CloseConnection("connection closed before the handler started")
            return await self._handle(request, ctx, registration)
        finally:
            if previous is not None and not previous.done():
                # cancelled while waiting: the next request's turn comes with this one's
                previous.add_done_callback(lambda _f: ctx.pass_turn())
            else:
                ctx.pass_turn()

    async def _handle(
        self, request: DecodedRequest, ctx: RequestContext, registration: Registration
    ) -> bytes | list | None:
        try:
            frame = await self.registry.handle(request, ctx, registration)
        except Exception as exc:
            # a handler that fails on a null Kafka's schema forbids met a malformed request:
            # close as Kafka's parser would (a warning), not as a bug (an error traceback)
            null_field = forbidden_null(request.body, request.api_version)
            if null_field is None or isinstance(exc, CloseConnection):
                raise
            log.warning(
                "%s: malformed request (%s v%d, correlation id %d): %s is null (%s); closing",
                self.name,
                request.api_name,
                request.api_version,
                request.correlation_id,
                null_field,
                type(exc).__name__,
            )
            raise CloseConnection(f"{null_field} is null in {request.api_name}") from None
        latency = _LATENCY_BY_API.get(request.api_key)
        if latency is None:
            latency = _LATENCY_BY_API[request.api_key] = REQUEST_LATENCY_SECONDS.labels(
                request.api_name.removesuffix("Request")
            )
        latency.observe(time.monotonic() - ctx.received_at)
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
                    await until_done(slot)
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
                        # (Most writes leave the buffer below its mark: no timer for them.)
                        if self.protocol.writing_paused or self.protocol.lost.done():
                            async with asyncio.timeout(self.idle_timeout_s):
                                await self.protocol.drain()
                    except TimeoutError:
                        log.info(
                            "%s: client not reading responses for %.1f s, closing",
                            self.name,
                            self.idle_timeout_s,
                        )
                        self.closing = True
                        self._discard_output = True
                        return
                if final:
                    self.closing = True
                    log.info("%s: closing after the handler's final response", self.name)
                    return
            finally:
                slot = frame = None  # an idle connection must not hold its last response
                self.inflight -= 1
                self._budget.release()
