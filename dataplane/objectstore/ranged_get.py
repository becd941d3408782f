"""Ranged GETs without botocore: the catch-up read's GETs at a fraction of the CPU.

A catch-up read is ~200 ranged GETs per GB. Through botocore each cost ~2 ms of the broker's
CPU besides the bytes (its request pipeline: parameter validation, event hooks, signing
through `AWSRequest`, urllib3, `http.client`'s body reads in Python): ~0.3 s per GB, a third
of the broker's CPU of a catch-up. `RangedGetClient` sends the same SigV4-signed GET itself
over a kept-alive socket (`s3_http.py`) and reads the body with `recv_into` straight into
the buffer it returns: ~0.6 ms per 4 MiB GET, nearly all of it the kernel's copy. The buffers come from a bounded
`formats.buffer_pool.BufferPool`, which hands one out again once no view of its last body is
left (no zeroing and first-touch page faults of a fresh buffer per GET), in power-of-two size
classes from 1 MiB: a catch-up's GETs are 2-8 MiB (runs of blocks cut into about equal
pieces), so buffers of their exact sizes fitted the next body only by chance and a cold
broker's catch-up took a fresh buffer for ~70% of its bytes while others lay free.

It serves only what it can do exactly like botocore (`s3_http.targets_of`); `usable` says
so, and `ObjectStorage` sends everything else through botocore. `ObjectStorage` sends its
ranged reads here (`get_range_async`'s views, and `get_range`'s bytes copied out of the
view); its PUTs go to `lean_put.py`, its lists and whole-object GETs to botocore. Failures
are raised as the botocore exceptions `retry.classify` maps. A kept-alive connection the
server closed meanwhile is reopened once at once (nothing of the answer was read), as
urllib3 does.

Thread-safety: `get` may be called from any number of threads; each takes a connection of
its own from a bounded idle pool (`max_idle_per_bucket`).
"""

from __future__ import annotations

import datetime
import socket
import threading
from collections.abc import Callable, Mapping

from botocore.exceptions import IncompleteReadError, ReadTimeoutError

from ..formats.buffer_pool import BufferPool
from .bucket_uri import BucketURI
from .s3_http import (
    MAX_ERROR_BODY_BYTES,
    S3Connections,
    S3Target,
    StaleConnection,
    client_error,
    read_chunked,
    read_head,
    targets_of,
)

__all__ = ["RangedGetClient"]

# GET body buffers kept for use again, in use or not: above a catch-up's working set (the
# bodies a prefetching consumer's answers and every reader's readahead pin at once, ~250 MiB
# for 6 partitions), or the pool forgets buffers still in use and takes fresh ones again
DEFAULT_POOL_BYTES = 512 * 1024 * 1024


class RangedGetClient:
    """SigV4-signed ranged GETs over kept-alive sockets, bodies read into their buffer."""

    def __init__(
        self,
        buckets: Mapping[int, BucketURI],
        connect_timeout_s: float,
        read_timeout_s: float,
        max_idle_per_bucket: int,
        buffers: BufferPool | None = None,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._now = now
        self._connections = S3Connections(connect_timeout_s, read_timeout_s, max_idle_per_bucket)
        self._targets: dict[int, S3Target] = targets_of(buckets)
        self._buffers = buffers or BufferPool(DEFAULT_POOL_BYTES, lock=threading.Lock())

    def usable(self, bucket_id: int) -> bool:
        """Whether this client serves the bucket (plain http endpoint, static credentials)."""
        return bucket_id in self._targets

    def get(self, bucket_id: int, key: str, start: int, end_exclusive: int) -> memoryview:
        """Bytes [start, end_exclusive) of the object (fewer if it ends earlier), as a
        read-only view of a buffer nobody else holds (it never changes). Raises the botocore
        exceptions `retry.classify` maps."""
        target = self._targets[bucket_id]
        request = self._request(target, key, start, end_exclusive)
        conn, reused = self._connections.take(target)
        try:
            try:
                status, headers, body = self._exchange(conn, target, request, reused)
            except StaleConnection:
                conn.close()
                conn, reused = self._connections.connect(target), False
                status, headers, body = self._exchange(conn, target, request, reused)
        except BaseException:
            conn.close()
            raise
        if headers.get("connection", "").lower() == "close" or "content-length" not in headers:
            conn.close()  # (a chunked answer's trailers were left unread)
        else:
            self._connections.give_back(target, conn)
        if status == 200 and "content-range" not in headers and len(body) > end_exclusive - start:
            body = body[start:end_exclusive]  # the server ignored Range: the whole object
        if status not in (200, 206):
            raise client_error(status, body.tobytes(), "GetObject")
        return body

    def close(self) -> None:
        """Close every idle connection; connections in use close when given back."""
        self._connections.close(self._targets)

    # ------------------------------------------------------------------ internals

    def _request(self, target: S3Target, key: str, start: int, end_exclusive: int) -> bytes:
        return target.request_head(
            "GET", key, {"range": f"bytes={start}-{end_exclusive - 1}"}, self._now()
        )

    def _exchange(
        self, conn: socket.socket, target: S3Target, request: bytes, reused: bool
    ) -> tuple[int, dict[str, str], memoryview]:
        """Send `request` and read the whole answer: (status, headers, body)."""
        try:
            try:
                conn.sendall(request)
            except (ConnectionResetError, BrokenPipeError) as exc:
                if reused:
                    raise StaleConnection() from exc
                raise
            status, headers, rest = read_head(conn, reused)
            return status, headers, self._read_body(conn, status, headers, rest)
        except TimeoutError as exc:
            raise ReadTimeoutError(endpoint_url=target.endpoint, error=exc) from exc

    def _read_body(
        self, conn: socket.socket, status: int, headers: dict[str, str], rest: bytes
    ) -> memoryview:
        length_text = headers.get("content-length")
        if length_text is None:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                return memoryview(read_chunked(conn, rest)).toreadonly()
            raise ConnectionError("the store's answer has no Content-Length")
        length = int(length_text)
        if status not in (200, 206) and length > MAX_ERROR_BODY_BYTES:
            raise ConnectionError(f"error answer of {length} bytes")
        buf = self._buffers.take(length)
        view = memoryview(buf)[:length]
        got = min(len(rest), length)
        view[:got] = rest[:got]
        while got < length:
            n = conn.recv_into(view[got:])
            if n == 0:
                raise IncompleteReadError(actual_bytes=got, expected_bytes=length)
            got += n
        body = view.toreadonly()
        view.release()
        return body
