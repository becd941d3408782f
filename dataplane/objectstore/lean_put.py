"""PUTs without botocore: an upload's bytes handed to the kernel as they are.

Every produced byte is PUT once (in a stream-set or stream object). Through botocore a PUT
of an `ObjectBody` cost ~0.73 CPU s per GB of the sending thread (`http.client` reads the
body through its file interface and sends it block by block, each through urllib3's and
botocore's layers); `LeanPutClient` sends the SigV4-signed head (`s3_http.py`, unsigned
payload: the store config's default) and then the body's buffers with `sendmsg`, up to
IOV_MAX of them per call, with no copy: ~0.29 s per GB against a loopback send's own 0.27
(`benchmarks/objectstore_bench.py --objects 4 --object-mib 16 --runs 5`, 2026-12-01).

A paced body (`ObjectBody.paced`) is sent as its reader hands it out, so the pace holds as
it does through botocore. On a kept-alive connection the store may have closed while it
was idle, the PUT goes out only after a zero-timeout poll finds no end of file (as urllib3
checks): a PUT is never sent twice by this client, so a retry of a PUT with If-None-Match
is always the store's own retry (`ObjectStorage`), which handles the 412 of an attempt that
did land. `ObjectStorage` sends a PUT here when the bucket is served (`usable`: plain http,
static credentials) and payloads are not signed (`sign_payloads`); failures are raised as
the botocore exceptions `retry.classify` maps.

Thread-safety: `put` may be called from any number of threads; each takes a connection of
its own from a bounded idle pool (`max_idle_per_bucket`).
"""

from __future__ import annotations

import datetime
import os
import select
import socket
from collections.abc import Callable, Mapping
from contextlib import suppress

from botocore.exceptions import ConnectionClosedError, IncompleteReadError, ReadTimeoutError

from .body import ObjectBody
from .bucket_uri import BucketURI
from .s3_http import (
    MAX_ERROR_BODY_BYTES,
    RECV_HEAD_BYTES,
    S3Connections,
    S3Target,
    client_error,
    read_chunked,
    read_head,
    targets_of,
)

__all__ = ["LeanPutClient"]

MAX_BUFFERS_PER_SEND = max(16, min(os.sysconf("SC_IOV_MAX"), 1024))  # (sysconf: -1 if unknown)
MAX_INTERIM_ANSWERS = 8  # 1xx answers passed over before the final one
# a paced body is handed out (and its pace taken) this much at a time
PACED_READ_BYTES = 1024 * 1024


class LeanPutClient:
    """SigV4-signed PUTs over kept-alive sockets, bodies sent from their own buffers."""

    def __init__(
        self,
        buckets: Mapping[int, BucketURI],
        connect_timeout_s: float,
        read_timeout_s: float,
        max_idle_per_bucket: int,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._now = now
        self._connections = S3Connections(connect_timeout_s, read_timeout_s, max_idle_per_bucket)
        self._targets: dict[int, S3Target] = targets_of(buckets)

    def usable(self, bucket_id: int) -> bool:
        """Whether this client serves the bucket (plain http endpoint, static credentials)."""
        return bucket_id in self._targets

    def put(self, bucket_id: int, key: str, data: bytes | ObjectBody, if_none_match: bool) -> None:
        """Write `data` under `key` (with `if_none_match`: only if no object is there yet).
        Raises the botocore exceptions `retry.classify` maps (a 412 as a ClientError)."""
        target = self._targets[bucket_id]
        headers = {"content-length": str(len(data))}
        if if_none_match:
            headers["if-none-match"] = "*"
        head = target.request_head("PUT", key, headers, self._now())
        conn, reused = self._connections.take(target)
        try:
            if reused and _closed_by_peer(conn):
                conn.close()
                conn = self._connections.connect(target)
            status, answer, keep = self._exchange(conn, target, head, data)
        except BaseException:
            conn.close()
            raise
        if keep:
            self._connections.give_back(target, conn)
        else:
            conn.close()
        if status != 200:
            raise client_error(status, answer, "PutObject")

    def close(self) -> None:
        """Close every idle connection; connections in use close when given back."""
        self._connections.close(self._targets)

    # ------------------------------------------------------------------ internals

    def _exchange(
        self, conn: socket.socket, target: S3Target, head: bytes, data: bytes | ObjectBody
    ) -> tuple[int, bytes, bool]:
        """Send the request and read the answer: (status, body, whether the connection may
        serve another request). Socket and framing failures are raised as the retryable
        botocore errors they are there."""
        try:
            try:
                _send_request(conn, head, data)
            except (BrokenPipeError, ConnectionResetError) as exc:
                # a store refusing the request may answer and close before the body is in:
                # its answer (e.g. 403) says more than the broken pipe; the connection is
                # done either way
                with suppress(OSError, ValueError, IncompleteReadError):
                    status, body, _ = _read_answer(conn)
                    return status, body, False
                raise exc
            return _read_answer(conn)
        except TimeoutError as exc:
            raise ReadTimeoutError(endpoint_url=target.endpoint, error=exc) from exc
        except (OSError, ValueError) as exc:  # unreachable, reset, a garbled answer
            raise ConnectionClosedError(endpoint_url=target.endpoint, error=exc) from exc


def _send_request(conn: socket.socket, head: bytes, data: bytes | ObjectBody) -> None:
    """The head, then the body: a paced one as its reader hands it out, any other from its
    own buffers."""
    if isinstance(data, ObjectBody) and data.pace is not None:
        conn.sendall(head)
        reader = data.reader()
        while chunk := reader.read(PACED_READ_BYTES):
            conn.sendall(chunk)
        return
    _send_all(conn, [head, *data.chunks()] if isinstance(data, ObjectBody) else [head, data])


def _send_all(conn: socket.socket, pieces: list[bytes | memoryview]) -> None:
    """Send every piece, in order, with as few `sendmsg` calls as the kernel allows."""
    views = [memoryview(p) for p in pieces if len(p)]
    first = 0
    while first < len(views):
        sent = conn.sendmsg(views[first : first + MAX_BUFFERS_PER_SEND])
        while sent and first < len(views):
            size = len(views[first])
            if sent >= size:
                sent -= size
                first += 1
            else:
                views[first] = views[first][sent:]
                sent = 0


def _read_answer(conn: socket.socket) -> tuple[int, bytes, bool]:
    """A PUT's answer: (status, body: empty or an error's XML, whether the connection may
    serve another request). Interim 1xx answers a store sends unasked are passed over; a
    body without a length ends with the connection (HTTP/1.0, `Connection: close`)."""
    status, headers, rest = read_head(conn, reused=False)
    for _ in range(MAX_INTERIM_ANSWERS):
        if not 100 <= status < 200:
            break
        status, headers, rest = read_head(conn, reused=False, pending=rest)
    else:
        raise ConnectionError("the store sent only interim answers")
    keep = headers.get("connection", "").lower() != "close"
    length_text = headers.get("content-length")
    if length_text is not None:
        length = int(length_text)
        if length > MAX_ERROR_BODY_BYTES:
            raise ConnectionError(f"answer of {length} bytes to a PUT")
        body = bytearray(rest[:length])
        while len(body) < length:
            more = conn.recv(min(RECV_HEAD_BYTES, length - len(body)))
            if not more:
                raise IncompleteReadError(actual_bytes=len(body), expected_bytes=length)
            body += more
        return status, bytes(body), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return status, read_chunked(conn, rest), False  # (its trailers are left unread)
    body = bytearray(rest)  # delimited by the end of the connection
    while len(body) <= MAX_ERROR_BODY_BYTES:
        more = conn.recv(RECV_HEAD_BYTES)
        if not more:
            return status, bytes(body), False
        body += more
    raise ConnectionError("answer to a PUT too long")


def _closed_by_peer(conn: socket.socket) -> bool:
    """Whether an idle kept-alive connection was closed (or reset) by the store: readable
    at once, which an idle HTTP connection is only at its end (or with stray bytes, which
    make it unusable as well)."""
    poller = select.poll()  # (select.select cannot take descriptors above 1023)
    poller.register(conn, select.POLLIN | select.POLLERR | select.POLLHUP)
    try:
        return bool(poller.poll(0))
    except OSError:
        return True
