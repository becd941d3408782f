"""Asyncio Kafka wire-protocol server: frames in, handlers, frames out in request order.

`KafkaServer` binds the listeners and accepts connections. Per connection a
`dataplane.kafka.framing.FrameProtocol` (an asyncio ``BufferedProtocol``) cuts the byte
stream into frames (4-byte signed size + payload), and a `dataplane.kafka.connection.Connection`
runs a reader task (decode, route, start the handler as a task) and a writer task (responses
written in request order, even when handlers finish out of order) around it.

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
broker process. Binds 127.0.0.1 by default.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from dataplane.config import MAX_REQUEST_BYTES

from .connection import Admit, Connection
from .framing import FrameProtocol, ReadBufferPool, new_frame_buffer_pool, peer_of
from .registry import ApiRegistry, CloseConnection

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

# Kafka's connection-count: every listener of every server of the process
CONNECTIONS = Gauge("automq_kafka_connections", "Kafka client connections open now")


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

    def connection_extras(self, transport: asyncio.BaseTransport) -> dict[str, Any]:
        """The initial per-connection state of a connection that came in on this listener."""
        extras: dict[str, Any] = dict(self.extras)
        if self.name is not None:
            extras["listener"] = self.name
        if self.principal_of_peer is not None:
            principal = self.principal_of_peer(transport.get_extra_info("peercert"))
            if principal is not None:
                extras["principal"] = principal
        return extras


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
        accepting: Callable[[], bool] | None = None,
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
        self._connections: dict[Connection, asyncio.Task[Any]] = {}
        self._handlers: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count(1)
        self._stopping = False
        # False while new connections are refused (a self-fenced broker: broker/lease.py)
        self._accepting = accepting or (lambda: True)
        # read buffers are lent to connections with bytes to parse, not one per connection
        self.read_buffers = ReadBufferPool()
        # large frames' buffers, used again once their request is done with them
        self.frame_buffers = new_frame_buffer_pool()

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
                        lambda listener=listener: FrameProtocol(
                            functools.partial(self._accept, listener=listener),
                            self.max_request_bytes,
                            self.read_buffers,
                            self.frame_buffers,
                        ),
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

    def close_connections(self, reason: str) -> int:
        """Close every client connection now (on the event loop); returns how many. Clients
        reconnect, to this broker or, after a metadata refresh, to another."""
        conns = list(self._connections)
        for conn in conns:
            conn.abort()
        if conns:
            log.warning("closed %d client connections: %s", len(conns), reason)
        return len(conns)

    async def __aenter__(self) -> KafkaServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # ----------------------------------------------------------------- internals

    def _accept(self, protocol: FrameProtocol, listener: ServerListener) -> None:
        """A new connection (from its protocol's ``connection_made``): serve it or refuse."""
        transport = protocol.transport
        assert transport is not None
        if self._stopping or len(self._connections) >= self.max_connections:
            log.warning(
                "refusing connection from %s:%d: %s",
                *peer_of(transport),
                "server stopping"
                if self._stopping
                else f"max_connections={self.max_connections} reached",
            )
            transport.close()
            return
        if not self._accepting():
            log.debug("refusing connection from %s:%d: not serving", *peer_of(transport))
            transport.close()
            return
        conn = Connection(
            next(self._ids),
            protocol,
            self.registry,
            extras=listener.connection_extras(transport),
            admit=listener.admit,
            max_inflight=self.max_inflight_per_connection,
            idle_timeout_s=self.idle_timeout_s,
            track_handler=self._track_handler,
        )
        self._connections[conn] = asyncio.get_running_loop().create_task(
            self._serve(conn), name=f"kafka-conn-{conn.conn_id}"
        )
        log.debug("%s: accepted", conn.name)

    async def _serve(self, conn: Connection) -> None:
        CONNECTIONS.inc()
        try:
            await conn.run()
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - a bug in one connection must not take the server down
            log.exception("%s: connection failed", conn.name)
        finally:
            CONNECTIONS.dec()
            self._connections.pop(conn, None)

    def _track_handler(self, task: asyncio.Task[Any], conn: Connection) -> None:
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

    def close_connections(self, reason: str) -> None:
        """Close every client connection (from any thread: done on the server's loop; a
        no-op when the server is not running)."""
        loop = self._loop
        if loop is None or self._thread is None:
            return
        try:
            loop.call_soon_threadsafe(self.server.close_connections, reason)
        except RuntimeError:  # loop already closed
            pass

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
