"""A scripted keep-alive HTTP/1.1 server on 127.0.0.1 standing in for an S3 store, for the
lean S3 clients' unit tests (`objectstore/ranged_get.py`, `objectstore/lean_put.py`)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from dataplane.objectstore import ObjectStorage, ObjectStoreMetrics

# (request number from 0, path, headers) -> (raw answer bytes, close the connection after it),
# or None to close it without answering
Script = Callable[[int, str, dict[str, str]], tuple[bytes, bool] | None]


def store_of(uri: str, registry: CollectorRegistry, **overrides) -> ObjectStorage:
    """An ObjectStorage of `uri` with its metrics in `registry`, 3 attempts, ~no backoff."""
    overrides = {"max_attempts": 3, "backoff_base_ms": 1, "backoff_max_ms": 2, **overrides}
    return ObjectStorage(uri, metrics=ObjectStoreMetrics(registry), **overrides)


def requests_counted(registry: CollectorRegistry, op: str, status: str) -> float:
    """How many `op` attempts on bucket 0 ended with `status` (the store's metrics)."""
    value = registry.get_sample_value(
        "automq_object_store_requests_total",
        {"op": op, "bucket_id": "0", "status": status},
    )
    return value or 0.0


def answer(status: int, body: bytes, extra: str = "", length: int | None = None) -> bytes:
    """A raw HTTP/1.1 answer with a Content-Length (`length` if given, else the body's)."""
    size = len(body) if length is None else length
    return f"HTTP/1.1 {status} X\r\nContent-Length: {size}\r\n{extra}\r\n".encode() + body


class FakeStore:
    """A keep-alive HTTP/1.1 server on 127.0.0.1 answering by `script`; records each
    request (path, headers), the body each request with a Content-Length carried (read
    before the script runs, unless `answer_before_body`), and how many connections it
    accepted. Every thread it starts ends when `close` is called or its client leaves."""

    def __init__(self, script: Script, answer_before_body: bool = False) -> None:
        self.script = script  # runs on the server's threads
        self.answer_before_body = answer_before_body
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.methods: list[str] = []
        self.bodies: list[bytes] = []
        self.connections = 0
        self.closed_connections = 0
        self._closed = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def uri(self, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"0@s3://bkt?region=eu-west-1&endpoint=http://127.0.0.1:{self.port}&{query}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def wait_closed(self, count: int, timeout_s: float = 10.0) -> None:
        """Wait until the server has closed `count` connections (AssertionError after
        `timeout_s`)."""
        with self._closed:
            if not self._closed.wait_for(lambda: self.closed_connections >= count, timeout_s):
                raise AssertionError(f"{self.closed_connections} of {count} connections closed")

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        finally:
            conn.close()
            with self._closed:
                self.closed_connections += 1
                self._closed.notify_all()

    def _answer(self, conn: socket.socket) -> None:
        data = b""
        while True:
            while b"\r\n\r\n" not in data:
                more = conn.recv(65536)
                if not more:
                    return
                data += more
            head, _, data = data.partition(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:])
            }
            method, path = lines[0].split(" ")[:2]
            length = int(headers.get("content-length", "0"))
            if not self.answer_before_body:
                while len(data) < length:
                    more = conn.recv(1 << 20)
                    if not more:
                        return
                    data += more
                self.bodies.append(data[:length])
                data = data[length:]
            number = len(self.requests)
            self.requests.append((path, headers))
            self.methods.append(method)
            out = self.script(number, path, headers)
            if out is None:
                return
            conn.sendall(out[0])
            if out[1]:
                return

    def close(self) -> None:
        self._listener.close()
