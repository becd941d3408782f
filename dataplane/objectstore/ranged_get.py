"""Ranged GETs without botocore: the catch-up read's GETs at a fraction of the CPU.

A catch-up read is ~200 ranged GETs per GB. Through botocore each cost ~2 ms of the broker's
CPU besides the bytes (its request pipeline: parameter validation, event hooks, signing
through `AWSRequest`, urllib3, `http.client`'s body reads in Python): ~0.3 s per GB, a third
of the broker's CPU of a catch-up. `RangedGetClient` sends the same SigV4-signed GET itself
over a kept-alive socket (SigV4 header signing is one HMAC-SHA256 per request; the signing
key is kept per day) and reads the body with `recv_into` straight into the buffer it returns:
~0.6 ms per 4 MiB GET, nearly all of it the kernel's copy. The buffers come from a bounded
`formats.buffer_pool.BufferPool`, which hands one out again once no view of its last body is
left (no zeroing and first-touch page faults of a fresh buffer per GET), in power-of-two size
classes from 1 MiB: a catch-up's GETs are 2-8 MiB (runs of blocks cut into about equal
pieces), so buffers of their exact sizes fitted the next body only by chance and a cold
broker's catch-up took a fresh buffer for ~70% of its bytes while others lay free.

It serves only what it can do exactly like botocore: plain `http://` endpoints (a local or
private store: SeaweedFS, MinIO) with static credentials in the bucket URI or its
environment variables; `usable` says so, and `ObjectStorage` sends everything else through
botocore. `ObjectStorage` sends its ranged reads here (`get_range_async`'s views, and
`get_range`'s bytes copied out of the view), not its PUTs, lists or whole-object GETs.
Failures are raised as the botocore exceptions `retry.classify` maps (ClientError with the
S3 error code from the XML body, ConnectTimeoutError, ReadTimeoutError,
EndpointConnectionError, IncompleteReadError), so retries, metrics and error types are the
same on both paths. A kept-alive connection the server closed meanwhile is reopened once at
once (nothing of the answer was read), as urllib3 does.

Thread-safety: `get` may be called from any number of threads; each takes a connection of
its own from a bounded idle pool (`max_idle_per_bucket`).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import socket
import threading
from collections.abc import Callable, Mapping
from urllib.parse import quote, urlsplit

from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    ReadTimeoutError,
)

from ..formats.buffer_pool import BufferPool
from .bucket_uri import BucketURI

__all__ = ["RangedGetClient"]

MAX_HEAD_BYTES = 64 * 1024  # status line and headers of one answer
MAX_ERROR_BODY_BYTES = 1024 * 1024  # an error answer's XML is read at most this far
RECV_HEAD_BYTES = 16 * 1024
# GET body buffers kept for use again, in use or not: above a catch-up's working set (the
# bodies a prefetching consumer's answers and every reader's readahead pin at once, ~250 MiB
# for 6 partitions), or the pool forgets buffers still in use and takes fresh ones again
DEFAULT_POOL_BYTES = 512 * 1024 * 1024
_UNSIGNED = "UNSIGNED-PAYLOAD"
_CODE_RE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_MESSAGE_RE = re.compile(rb"<Message>([^<]{0,512})</Message>")


class _StaleConnection(Exception):
    """A kept-alive connection was closed by the server before any answer byte came."""


class _Target:
    """Where and how one bucket's GETs go (derived from its BucketURI)."""

    def __init__(self, bucket: BucketURI, credentials: Mapping[str, str]) -> None:
        url = urlsplit(bucket.endpoint or "")
        self.endpoint = bucket.endpoint or ""
        self.address = (url.hostname or "", url.port or 80)
        netloc = url.netloc
        if bucket.path_style:
            self.host, self.path_prefix = netloc, f"/{quote(bucket.bucket, safe='')}/"
        else:
            self.host, self.path_prefix = f"{bucket.bucket}.{netloc}", "/"
        self.region = bucket.region
        self.access_key = credentials["aws_access_key_id"]
        self._secret = credentials["aws_secret_access_key"]
        self.token = credentials.get("aws_session_token")
        self._keys: dict[str, bytes] = {}  # date -> signing key (at most two kept)
        self.idle: list[socket.socket] = []

    def signing_key(self, date: str) -> bytes:
        key = self._keys.get(date)
        if key is None:
            key = hmac.new(("AWS4" + self._secret).encode(), date.encode(), hashlib.sha256).digest()
            for part in (self.region, "s3", "aws4_request"):
                key = hmac.new(key, part.encode(), hashlib.sha256).digest()
            if len(self._keys) >= 2:
                self._keys.clear()
            self._keys[date] = key
        return key


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
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle_per_bucket = max_idle_per_bucket
        self._now = now
        self._lock = threading.Lock()
        self._closed = False
        self._targets: dict[int, _Target] = {}
        self._buffers = buffers or BufferPool(DEFAULT_POOL_BYTES, lock=threading.Lock())
        for bucket_id, bucket in buckets.items():
            if not bucket.endpoint or not bucket.endpoint.lower().startswith("http://"):
                continue
            credentials = bucket.credentials()
            if "aws_access_key_id" in credentials and "aws_secret_access_key" in credentials:
                self._targets[bucket_id] = _Target(bucket, credentials)

    def usable(self, bucket_id: int) -> bool:
        """Whether this client serves the bucket (plain http endpoint, static credentials)."""
        return bucket_id in self._targets

    def get(self, bucket_id: int, key: str, start: int, end_exclusive: int) -> memoryview:
        """Bytes [start, end_exclusive) of the object (fewer if it ends earlier), as a
        read-only view of a buffer nobody else holds (it never changes). Raises the botocore
        exceptions `retry.classify` maps."""
        target = self._targets[bucket_id]
        request = self._request(target, key, start, end_exclusive)
        conn, reused = self._take(target)
        try:
            try:
                status, headers, body = self._exchange(conn, target, request, reused)
            except _StaleConnection:
                conn.close()
                conn, reused = self._connect(target), False
                status, headers, body = self._exchange(conn, target, request, reused)
        except BaseException:
            conn.close()
            raise
        if headers.get("connection", "").lower() == "close" or "content-length" not in headers:
            conn.close()  # (a chunked answer's trailers were left unread)
        else:
            self._give_back(target, conn)
        if status == 200 and "content-range" not in headers and len(body) > end_exclusive - start:
            body = body[start:end_exclusive]  # the server ignored Range: the whole object
        if status not in (200, 206):
            raise _client_error(status, body.tobytes())
        return body

    def close(self) -> None:
        """Close every idle connection; connections in use close when given back."""
        with self._lock:
            self._closed = True
            idle = [c for t in self._targets.values() for c in t.idle]
            for t in self._targets.values():
                t.idle.clear()
        for conn in idle:
            conn.close()

    # ------------------------------------------------------------------ internals

    def _request(self, target: _Target, key: str, start: int, end_exclusive: int) -> bytes:
        amz_date = self._now().strftime("%Y%m%dT%H%M%SZ")
        path = target.path_prefix + quote(key, safe="/~")
        headers = {
            "host": target.host,
            "range": f"bytes={start}-{end_exclusive - 1}",
            "x-amz-content-sha256": _UNSIGNED,
            "x-amz-date": amz_date,
        }
        if target.token:
            headers["x-amz-security-token"] = target.token
        names = sorted(headers)
        signed = ";".join(names)
        canonical = "\n".join(
            ["GET", path, "", "".join(f"{n}:{headers[n]}\n" for n in names), signed, _UNSIGNED]
        )
        scope = f"{amz_date[:8]}/{target.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signature = hmac.new(
            target.signing_key(amz_date[:8]), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={target.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        )
        lines = "".join(f"{n}: {v}\r\n" for n, v in headers.items())
        return f"GET {path} HTTP/1.1\r\n{lines}\r\n".encode()

    def _take(self, target: _Target) -> tuple[socket.socket, bool]:
        with self._lock:
            if target.idle:
                return target.idle.pop(), True
        return self._connect(target), False

    def _give_back(self, target: _Target, conn: socket.socket) -> None:
        with self._lock:
            if not self._closed and len(target.idle) < self.max_idle_per_bucket:
                target.idle.append(conn)
                return
        conn.close()

    def _connect(self, target: _Target) -> socket.socket:
        try:
            conn = socket.create_connection(target.address, timeout=self.connect_timeout_s)
        except TimeoutError as exc:
            raise ConnectTimeoutError(endpoint_url=target.endpoint, error=exc) from exc
        except OSError as exc:
            raise EndpointConnectionError(endpoint_url=target.endpoint, error=exc) from exc
        conn.settimeout(self.read_timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _exchange(
        self, conn: socket.socket, target: _Target, request: bytes, reused: bool
    ) -> tuple[int, dict[str, str], memoryview]:
        """Send `request` and read the whole answer: (status, headers, body)."""
        try:
            try:
                conn.sendall(request)
                head = conn.recv(RECV_HEAD_BYTES)
            except (ConnectionResetError, BrokenPipeError) as exc:
                if reused:
                    raise _StaleConnection() from exc
                raise
            if not head:
                if reused:
                    raise _StaleConnection()
                raise ConnectionResetError("the store closed the connection before answering")
            while b"\r\n\r\n" not in head:
                if len(head) > MAX_HEAD_BYTES:
                    raise ConnectionError("the store's answer has no end of headers")
                more = conn.recv(RECV_HEAD_BYTES)
                if not more:
                    raise ConnectionResetError("the store closed the connection in the headers")
                head += more
            status, headers, rest = _parse_head(head)
            return status, headers, self._read_body(conn, status, headers, rest)
        except TimeoutError as exc:
            raise ReadTimeoutError(endpoint_url=target.endpoint, error=exc) from exc

    def _read_body(
        self, conn: socket.socket, status: int, headers: dict[str, str], rest: bytes
    ) -> memoryview:
        length_text = headers.get("content-length")
        if length_text is None:
            if "chunked" in headers.get("transfer-encoding", "").lower():
                return memoryview(_read_chunked(conn, rest)).toreadonly()
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


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bytes]:
    raw, _, rest = head.partition(b"\r\n\r\n")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, rest


def _read_chunked(conn: socket.socket, data: bytes) -> bytes:
    """A chunked body (error answers of some stores), bounded by MAX_ERROR_BODY_BYTES."""
    out = bytearray()
    buf = bytearray(data)
    while True:
        while b"\r\n" not in buf:
            more = conn.recv(RECV_HEAD_BYTES)
            if not more:
                raise IncompleteReadError(actual_bytes=len(out), expected_bytes=len(out) + 1)
            buf += more
        size_line, _, tail = bytes(buf).partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        buf = bytearray(tail)
        while len(buf) < size + 2:
            more = conn.recv(RECV_HEAD_BYTES)
            if not more:
                raise IncompleteReadError(actual_bytes=len(out), expected_bytes=len(out) + size)
            buf += more
        if size == 0:
            return bytes(out)  # trailers, if any, are left unread: the caller closes
        out += buf[:size]
        del buf[: size + 2]
        if len(out) > MAX_ERROR_BODY_BYTES:
            raise ConnectionError("chunked answer too long")


def _client_error(status: int, body: bytes) -> ClientError:
    """The ClientError botocore raises for an S3 error answer (code from its XML)."""
    code = _CODE_RE.search(body)
    message = _MESSAGE_RE.search(body)
    return ClientError(
        {
            "Error": {
                "Code": code.group(1).decode("latin-1") if code else str(status),
                "Message": message.group(1).decode("latin-1") if message else "",
            },
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "GetObject",
    )
