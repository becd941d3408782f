"""A TCP fault proxy in front of an S3 endpoint (tests only): pass, connection reset, HTTP
503, blackhole (accept, never answer) or added latency, switchable at any time.

Thread-safety: `mode` and `latency_s` may be changed from any thread; each connection reads
them as it goes. Bounded: at most MAX_CONNECTIONS concurrent connections, every socket has a
timeout, `close()` ends everything.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

MAX_CONNECTIONS = 256
MODES = ("pass", "reset", "503", "blackhole", "latency")
_503 = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class FaultProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "pass"
        self.latency_s = 0.3
        self._server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._server.bind(("127.0.0.1", 0))
        self._server.listen(64)
        self._server.settimeout(0.2)
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._server.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except (TimeoutError, OSError):
                continue
            if not self._slots.acquire(blocking=False):
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            conn.settimeout(0.2)
            mode = self.mode
            if mode == "reset":
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return  # close with RST
            if mode == "503":
                _read_some(conn, self._stop, once=True)
                conn.sendall(_503)
                return
            if mode == "blackhole":
                while not self._stop.is_set() and self.mode == "blackhole":
                    _read_some(conn, self._stop, once=True)
                return
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(0.2)
            self._pump(conn, upstream)
        except OSError:
            pass
        finally:
            for s in (conn, upstream):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
            self._slots.release()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both directions on one thread, until either side closes or the mode changes to a
        fault (existing connections then fail too, as on a real outage)."""
        while not self._stop.is_set() and self.mode in ("pass", "latency"):
            moved = False
            for src, dst, delay in ((client, upstream, True), (upstream, client, False)):
                try:
                    data = src.recv(65536)
                except TimeoutError:
                    continue
                if not data:
                    return
                if self.mode not in ("pass", "latency"):
                    # the fault began while this read waited: a request already in flight
                    # fails too (it passed before, e.g. a whole PUT sent at once)
                    return
                if delay and self.mode == "latency":
                    time.sleep(self.latency_s)
                dst.sendall(data)
                moved = True
            if not moved:
                time.sleep(0.001)


def _read_some(conn: socket.socket, stop: threading.Event, once: bool = False) -> None:
    deadline = time.monotonic() + 2
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            if not conn.recv(65536) or once:
                return
        except TimeoutError:
            if once:
                return
