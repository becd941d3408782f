"""A bounded HTTP/1.1 server (the controller API's): an idle connection costs no thread.

One thread (``api``) runs a selector: it accepts connections, does their TLS handshakes and
reads each request's head (request line and headers) without blocking, and hands a
connection whose head is complete to one of at most ``max_workers`` worker threads
(``api-worker-N``, started as needed). The worker runs the handler, which reads the body (if
any) under a deadline and writes the answer, then gives the connection back to the selector
(keep-alive) or closes it. A client that connects and sends nothing, or sends a request
slowly, holds a socket and a few KiB of memory, never a thread.

Limits, each answered with a status (never a 500) and a close:

* ``max_connections`` open at once: a new connection past it gets 503 (plain HTTP; a TLS
  listener just closes it);
* a head larger than ``MAX_HEAD_BYTES``: 431; a head (or TLS handshake) not complete within
  ``HEAD_TIMEOUT_S`` of its first byte: 408;
* a keep-alive connection idle for ``IDLE_TIMEOUT_S`` is closed;
* a response the client does not read within ``WRITE_TIMEOUT_S`` closes the connection.

The body's size and deadline are the handler's (`RequestInput.read_body`).

Thread-safety: the selector's state belongs to its thread; a worker owns a connection while
it serves it and gives it back through a queue and a wake-up socket.
"""

from __future__ import annotations

import logging
import math
import queue
import selectors
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler

__all__ = [
    "BoundedHTTPServer",
    "PooledRequestHandler",
    "RequestInput",
    "HEAD_TIMEOUT_S",
    "IDLE_TIMEOUT_S",
    "MAX_HEAD_BYTES",
]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # request line + headers
HEAD_TIMEOUT_S = 10.0  # from a head's first byte (or the connection's TLS start) to its end
IDLE_TIMEOUT_S = 120.0  # a keep-alive connection with no request in this long is closed
WRITE_TIMEOUT_S = 30.0  # to write one response
_SWEEP_INTERVAL_S = 0.5  # how often the selector looks for connections past their deadline
_RECV_BYTES = 64 * 1024
# a connection closed after its answer (401, 413, "Connection: close"...) is read from until
# the client closes or this passes (at most _LINGER_BYTES): closing with the client's unread
# bytes (a body not read) makes the kernel send a reset, which can destroy the answer before
# the client read it (seen: a 401 over TLS taken by the client as a dead controller)
_LINGER_S = 0.5
_LINGER_BYTES = 1024 * 1024
_ACCEPTS_PER_WAKEUP = 64
_ACCEPT_PAUSE_S = 0.1  # after accept() failed (e.g. out of file descriptors)
_REFUSAL_LOG_INTERVAL_S = 10.0

_RESPONSES = {
    code: (
        f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}"
    ).encode()
    for code, reason, body in (
        (503, "Service Unavailable", '{"error": {"code": "TIMEOUT", "message": "too many connections"}}'),
        (408, "Request Timeout", '{"error": {"code": "TIMEOUT", "message": "request not sent in time"}}'),
        (431, "Request Header Fields Too Large", '{"error": {"code": "REQUEST_TOO_LARGE", "message": "request head too large"}}'),
    )
}  # fmt: skip


class RequestInput:
    """The read side of a connection for its handler: what the selector read, then the
    socket (within the deadline of the call). Used by one thread at a time."""

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._deadline_s = math.inf

    def readline(self, limit: int = -1) -> bytes:
        """One line (with its newline) of at most `limit` bytes; b"" at EOF."""
        buf = self._conn.inbuf
        while True:
            end = buf.find(b"\n")
            if end >= 0 and (limit < 0 or end < limit):
                return self._take(end + 1)
            if 0 <= limit <= len(buf):
                return self._take(limit)
            if not self._fill():
                return self._take(len(buf))

    def read(self, size: int = -1) -> bytes:
        """`size` bytes, fewer at EOF (within the current deadline)."""
        buf = self._conn.inbuf
        while size < 0 or len(buf) < size:
            if not self._fill():
                break
        return self._take(len(buf) if size < 0 else min(size, len(buf)))

    def read_body(self, size: int, timeout_s: float) -> bytes:
        """A body of `size` bytes (fewer if the client closed first); TimeoutError if it
        has not all come within `timeout_s`."""
        self._deadline_s = time.monotonic() + timeout_s
        try:
            return self.read(size)
        finally:
            self._deadline_s = math.inf

    def _take(self, n: int) -> bytes:
        buf = self._conn.inbuf
        data = bytes(buf[:n])
        del buf[:n]
        return data

    def _fill(self) -> bool:
        """Read more from the socket (False at EOF); TimeoutError past the deadline."""
        left_s = self._deadline_s - time.monotonic()
        if left_s <= 0:
            raise TimeoutError("request body not complete in time")
        sock = self._conn.sock
        sock.settimeout(min(left_s, HEAD_TIMEOUT_S))
        data = sock.recv(_RECV_BYTES)
        if not data:
            return False
        self._conn.inbuf += data
        return True


class _Output:
    """The write side of a connection (each write within WRITE_TIMEOUT_S)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def write(self, data: bytes) -> int:
        self._sock.settimeout(WRITE_TIMEOUT_S)
        self._sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass


class PooledRequestHandler(BaseHTTPRequestHandler):
    """A `BaseHTTPRequestHandler` that serves one request per `serve_one` call (the server
    calls it on a worker thread when a request's head is there). One per connection.

    ``waited_s``: how long the request waited for a worker (handlers may answer "busy").
    """

    protocol_version = "HTTP/1.1"

    def __init__(self, conn: _Connection, server: BoundedHTTPServer) -> None:
        # not BaseRequestHandler.__init__: that one serves the whole connection at once
        self.request = self.connection = conn.sock
        self.client_address = conn.address
        self.server = server  # type: ignore[assignment]
        self.rfile = RequestInput(conn)  # type: ignore[assignment]
        self.wfile = _Output(conn.sock)  # type: ignore[assignment]
        self.close_connection = True
        self.waited_s = 0.0

    def serve_one(self) -> bool:
        """Serve the request whose head has been read; True to keep the connection."""
        self.handle_one_request()
        return not self.close_connection


class _Connection:
    """One client connection (the selector's while idle, a worker's while served)."""

    __slots__ = ("sock", "address", "inbuf", "handler", "since_s", "head_since_s", "tls_ready")

    def __init__(self, sock: socket.socket, address: tuple, tls: bool) -> None:
        self.sock = sock
        self.address = address
        self.inbuf = bytearray()
        self.handler: PooledRequestHandler | None = None
        self.since_s = time.monotonic()  # idle since, or queued since
        self.head_since_s = self.since_s if tls else math.inf  # handshake counts as head
        self.tls_ready = not tls

    def head_complete(self) -> bool:
        return self.inbuf.find(b"\r\n\r\n") >= 0 or self.inbuf.find(b"\n\n") >= 0


class BoundedHTTPServer:
    """HTTP/1.1 on a selector thread and at most `max_workers` handler threads.

    `handler_class(conn, server)` makes a connection's `PooledRequestHandler`. Run
    `serve_forever()` on a thread of its own (``api``); `shutdown()` stops it,
    `server_close()` closes the socket and every connection.
    """

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[PooledRequestHandler],
        *,
        max_workers: int,
        max_connections: int,
        ssl_context: ssl.SSLContext | None = None,
        backlog: int = 256,
    ) -> None:
        self.handler_class = handler_class
        self.max_workers = max_workers
        self.max_connections = max_connections
        self.ssl_context = ssl_context  # None: plain HTTP
        self._listener = socket.create_server(address, backlog=backlog, reuse_port=False)
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._conns: set[_Connection] = set()  # every open connection
        self._returned: queue.SimpleQueue[tuple[_Connection, bool]] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[_Connection | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._workers_lock = threading.Lock()
        self._idle_workers = 0
        self._queued = 0
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._accept_resume_s = 0.0
        self._refused = 0
        self._refusal_logged_s = 0.0

    @property
    def connection_count(self) -> int:
        """Connections open now (idle or served)."""
        return len(self._conns)

    @property
    def worker_count(self) -> int:
        """Handler threads started so far (at most `max_workers`)."""
        return len(self._workers)

    # ------------------------------------------------------------ lifecycle

    def serve_forever(self) -> None:
        """Accept and serve until `shutdown()`."""
        self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        next_sweep_s = time.monotonic() + _SWEEP_INTERVAL_S
        try:
            while not self._stop.is_set():
                for key, _ in self._selector.select(_SWEEP_INTERVAL_S):
                    if key.data == "listener":
                        self._accept()
                    elif key.data == "wake":
                        self._take_back()
                    else:
                        self._on_ready(key.data)
                now = time.monotonic()
                if now >= next_sweep_s:
                    self._sweep(now)
                    next_sweep_s = now + _SWEEP_INTERVAL_S
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has returned (if it runs)."""
        self._stop.set()
        self._wake()
        for _ in range(self.max_workers + 1):
            self._work.put(None)
        if self._selector.get_map():
            self._stopped.wait(10)

    def server_close(self) -> None:
        """Close the listening socket and every connection."""
        self._listener.close()
        for conn in list(self._conns):
            self._close(conn)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # ------------------------------------------------------------ selector thread

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: pause instead of spinning
                log.warning("controller API cannot accept connections: %s", exc)
                self._selector.unregister(self._listener)
                self._accept_resume_s = time.monotonic() + _ACCEPT_PAUSE_S
                return
            if len(self._conns) >= self.max_connections:
                self._refuse(sock, address)
                continue
            sock.setblocking(False)
            if self.ssl_context is not None:
                try:
                    sock = self.ssl_context.wrap_socket(
                        sock, server_side=True, do_handshake_on_connect=False
                    )
                except (OSError, ValueError):
                    sock.close()
                    continue
            conn = _Connection(sock, address, self.ssl_context is not None)
            conn.handler = self.handler_class(conn, self)
            self._conns.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)

    def _refuse(self, sock: socket.socket, address: tuple) -> None:
        self._refused += 1
        now = time.monotonic()
        if now - self._refusal_logged_s >= _REFUSAL_LOG_INTERVAL_S:
            log.warning(
                "controller API at max_connections=%d: refused %d connection(s), last from %s",
                self.max_connections,
                self._refused,
                address[0],
            )
            self._refusal_logged_s, self._refused = now, 0
        if self.ssl_context is None:
            _send_now(sock, _RESPONSES[503])
        sock.close()

    def _on_ready(self, conn: _Connection) -> None:
        """The connection has bytes (or room to write, in a TLS handshake)."""
        if not conn.tls_ready:
            if not self._handshake(conn):
                return
        if not self._read_head(conn):
            return
        if conn.head_complete():
            self._selector.unregister(conn.sock)
            self._dispatch(conn)
        elif len(conn.inbuf) > MAX_HEAD_BYTES:
            self._selector.unregister(conn.sock)
            _send_now(conn.sock, _RESPONSES[431])
            self._close(conn)

    def _handshake(self, conn: _Connection) -> bool:
        """Advance a TLS handshake; True once it is done."""
        sock = conn.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(sock, selectors.EVENT_READ, conn)
            return False
        except ssl.SSLWantWriteError:
            self._selector.modify(sock, selectors.EVENT_WRITE, conn)
            return False
        except (OSError, ValueError) as exc:  # a failed handshake closes this connection
            log.debug("TLS handshake with %s failed: %s", conn.address[0], exc)
            self._selector.unregister(sock)
            self._close(conn)
            return False
        conn.tls_ready = True
        conn.head_since_s = math.inf
        self._selector.modify(sock, selectors.EVENT_READ, conn)
        return True

    def _read_head(self, conn: _Connection) -> bool:
        """Read what the socket has (up to a head's limit); False if it was closed."""
        try:
            while len(conn.inbuf) <= MAX_HEAD_BYTES and not conn.head_complete():
                data = conn.sock.recv(_RECV_BYTES)
                if not data:
                    raise ConnectionResetError("closed by the client")
                if not conn.inbuf:
                    conn.head_since_s = time.monotonic()
                conn.inbuf += data
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except (OSError, ValueError):  # reset, TLS error, EOF
            self._unregister(conn)
            self._close(conn)
            return False
        return True

    def _dispatch(self, conn: _Connection) -> None:
        """Hand a connection with a complete head to a worker (one is started if none is
        free and fewer than max_workers run)."""
        conn.since_s = time.monotonic()
        with self._workers_lock:
            self._queued += 1
            start = self._queued > self._idle_workers and len(self._workers) < self.max_workers
            if start:
                worker = threading.Thread(
                    target=self._work_loop, name=f"api-worker-{len(self._workers)}", daemon=True
                )
                self._workers.append(worker)
        self._work.put(conn)
        if start:
            worker.start()

    def _take_back(self) -> None:
        """Connections the workers are done with: closed ones are forgotten, kept ones
        served again if a next request is there, else watched."""
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                conn, keep = self._returned.get_nowait()
            except queue.Empty:
                return
            if not keep:
                self._close(conn)
                continue
            conn.sock.setblocking(False)
            conn.since_s = time.monotonic()
            conn.head_since_s = conn.since_s if conn.inbuf else math.inf
            self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            self._on_ready(conn)  # a pipelined request, or TLS bytes already decrypted

    def _sweep(self, now: float) -> None:
        """Close connections past their head or idle deadline; resume accepting."""
        if self._accept_resume_s and now >= self._accept_resume_s:
            self._accept_resume_s = 0.0
            self._selector.register(self._listener, selectors.EVENT_READ, "listener")
        for key in list(self._selector.get_map().values()):
            conn = key.data
            if not isinstance(conn, _Connection):
                continue
            if now - conn.head_since_s > HEAD_TIMEOUT_S:
                self._selector.unregister(conn.sock)
                if conn.tls_ready:
                    _send_now(conn.sock, _RESPONSES[408])
                self._close(conn)
            elif not conn.inbuf and now - conn.since_s > IDLE_TIMEOUT_S:
                self._selector.unregister(conn.sock)
                self._close(conn)

    def _unregister(self, conn: _Connection) -> None:
        try:
            self._selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass

    def _close(self, conn: _Connection) -> None:
        self._conns.discard(conn)
        try:
            conn.sock.close()
        except OSError:
            pass

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, OSError):
            pass  # already woken (its buffer is full) or closed

    # ------------------------------------------------------------ worker threads

    def _work_loop(self) -> None:
        while True:
            with self._workers_lock:
                self._idle_workers += 1
            conn = self._work.get()
            with self._workers_lock:
                self._idle_workers -= 1
                self._queued -= 1
            if conn is None:
                return
            self._returned.put((conn, self._serve(conn)))
            self._wake()

    def _serve(self, conn: _Connection) -> bool:
        """Serve the requests whose heads are there; True to keep the connection open."""
        handler = conn.handler
        assert handler is not None
        try:
            conn.sock.setblocking(True)
            while True:
                handler.waited_s = time.monotonic() - conn.since_s
                if not handler.serve_one() or self._stop.is_set():
                    _linger(conn.sock)
                    return False
                if not conn.head_complete():
                    return True
                conn.since_s = time.monotonic()
        except (OSError, ValueError) as exc:  # the client went away or stopped reading
            log.debug("connection from %s ended: %s", conn.address[0], exc)
            return False
        except Exception:  # a bug: close this connection, keep serving the others
            log.exception("controller API failed serving %s", conn.address[0])
            return False


def _linger(sock: socket.socket) -> None:
    """End our side (the answer is sent), then read and drop what the client still sends
    until it closes, `_LINGER_S` passes or `_LINGER_BYTES` came: no reset on close."""
    deadline = time.monotonic() + _LINGER_S
    drained = 0
    try:
        sock.shutdown(socket.SHUT_WR)  # on a TLS socket: the raw socket's, no close_notify
        while drained < _LINGER_BYTES:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            sock.settimeout(left)
            chunk = sock.recv(_RECV_BYTES)
            if not chunk:
                return
            drained += len(chunk)
    except (OSError, ValueError):
        pass  # the client went away: nothing to protect


def _send_now(sock: socket.socket, data: bytes) -> None:
    """Best effort, without blocking: a short canned answer before a close."""
    try:
        sock.setblocking(False)
        sock.send(data)
    except (OSError, ValueError):
        pass
