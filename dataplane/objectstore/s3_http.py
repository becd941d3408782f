"""S3 requests without botocore: SigV4 signing, kept-alive sockets and answer parsing.

Shared by the lean clients of the two requests the broker makes by the GB: the catch-up
read's ranged GETs (`ranged_get.py`) and the uploads' PUTs (`lean_put.py`). Through botocore
each costs its request pipeline (parameter validation, event hooks, signing through
`AWSRequest`, urllib3 and `http.client` moving the bytes in Python); here a request is its
head, signed with SigV4 over an unsigned payload (one HMAC-SHA256; the signing key is kept
per day), and its bytes go straight between the socket and the caller's buffers.

Only what can be done exactly like botocore is served: plain ``http://`` endpoints (a local
or private store: SeaweedFS, MinIO) with static credentials in the bucket URI or its
environment variables (`targets_of`); everything else stays on botocore. Failures are
raised as the botocore exceptions `retry.classify` maps (ClientError with the S3 error code
from the XML body, ConnectTimeoutError, ReadTimeoutError, EndpointConnectionError,
IncompleteReadError), so retries, metrics and error types are the same on both paths.

Thread-safety: `S3Connections` may be used from any number of threads; each request takes
a connection of its own from a bounded idle pool.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import re
import socket
import threading
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
)

from .bucket_uri import BucketURI

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "RECV_HEAD_BYTES",
    "S3Connections",
    "S3Target",
    "StaleConnection",
    "client_error",
    "read_chunked",
    "read_head",
    "targets_of",
]

MAX_HEAD_BYTES = 64 * 1024  # status line and headers of one answer
MAX_ERROR_BODY_BYTES = 1024 * 1024  # an error answer's XML is read at most this far
RECV_HEAD_BYTES = 16 * 1024
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_CODE_RE = re.compile(rb"<Code>([^<]{1,128})</Code>")
_MESSAGE_RE = re.compile(rb"<Message>([^<]{0,512})</Message>")


class StaleConnection(Exception):
    """A kept-alive connection was closed by the server before any answer byte came."""


class S3Target:
    """Where and how one bucket's requests go (derived from its BucketURI), and its idle
    connections (guarded by the `S3Connections` lock)."""

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

    def request_head(
        self, method: str, key: str, headers: Mapping[str, str], now: datetime.datetime
    ) -> bytes:
        """The head of a `method` request of `key` with `headers` (lower-case names), signed
        with SigV4 over an unsigned payload, every header signed (as botocore signs them)."""
        amz_date = now.strftime("%Y%m%dT%H%M%SZ")
        path = self.path_prefix + quote(key, safe="/~")
        signed_headers = {
            **headers,
            "host": self.host,
            "x-amz-content-sha256": UNSIGNED_PAYLOAD,
            "x-amz-date": amz_date,
        }
        if self.token:
            signed_headers["x-amz-security-token"] = self.token
        names = sorted(signed_headers)
        signed = ";".join(names)
        canonical = "\n".join(
            [
                method,
                path,
                "",
                "".join(f"{n}:{signed_headers[n]}\n" for n in names),
                signed,
                UNSIGNED_PAYLOAD,
            ]
        )
        scope = f"{amz_date[:8]}/{self.region}/s3/aws4_request"
        to_sign = "\n".join(
            ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
        )
        signature = hmac.new(
            self.signing_key(amz_date[:8]), to_sign.encode(), hashlib.sha256
        ).hexdigest()
        signed_headers["authorization"] = (
            f"AWS4-HMAC-SHA256 Credential={self.access_key}/{scope}, "
            f"SignedHeaders={signed}, Signature={signature}"
        )
        lines = "".join(f"{n}: {v}\r\n" for n, v in signed_headers.items())
        return f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode()


def targets_of(buckets: Mapping[int, BucketURI]) -> dict[int, S3Target]:
    """The buckets a lean client serves exactly like botocore: plain http endpoints with
    static credentials (in the URI or the environment)."""
    targets: dict[int, S3Target] = {}
    for bucket_id, bucket in buckets.items():
        if not bucket.endpoint or not bucket.endpoint.lower().startswith("http://"):
            continue
        credentials = bucket.credentials()
        if "aws_access_key_id" in credentials and "aws_secret_access_key" in credentials:
            targets[bucket_id] = S3Target(bucket, credentials)
    return targets


class S3Connections:
    """Kept-alive sockets to the targets: at most `max_idle_per_bucket` idle per target."""

    def __init__(
        self, connect_timeout_s: float, read_timeout_s: float, max_idle_per_bucket: int
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle_per_bucket = max_idle_per_bucket
        self._lock = threading.Lock()
        self._closed = False

    def take(self, target: S3Target) -> tuple[socket.socket, bool]:
        """An idle connection (True: reused) or a new one (False)."""
        with self._lock:
            if target.idle:
                return target.idle.pop(), True
        return self.connect(target), False

    def give_back(self, target: S3Target, conn: socket.socket) -> None:
        """Keep `conn` for the next request (closed instead when the pool is full or
        closed)."""
        with self._lock:
            if not self._closed and len(target.idle) < self.max_idle_per_bucket:
                target.idle.append(conn)
                return
        conn.close()

    def connect(self, target: S3Target) -> socket.socket:
        try:
            conn = socket.create_connection(target.address, timeout=self.connect_timeout_s)
        except TimeoutError as exc:
            raise ConnectTimeoutError(endpoint_url=target.endpoint, error=exc) from exc
        except OSError as exc:
            raise EndpointConnectionError(endpoint_url=target.endpoint, error=exc) from exc
        conn.settimeout(self.read_timeout_s)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def close(self, targets: Mapping[int, S3Target]) -> None:
        """Close every idle connection; connections in use close when given back."""
        with self._lock:
            self._closed = True
            idle = [c for t in targets.values() for c in t.idle]
            for t in targets.values():
                t.idle.clear()
        for conn in idle:
            conn.close()


def read_head(
    conn: socket.socket, reused: bool, pending: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """Read an answer's status line and headers, starting with the bytes `pending` already
    read: (status, headers with lower-case names, the bytes read past them). On a `reused`
    connection that ends before any answer byte, StaleConnection."""
    head = pending
    if not head:
        try:
            head = conn.recv(RECV_HEAD_BYTES)
        except ConnectionResetError as exc:
            if reused:
                raise StaleConnection() from exc
            raise
        if not head:
            if reused:
                raise StaleConnection()
            raise ConnectionResetError("the store closed the connection before answering")
    while b"\r\n\r\n" not in head:
        if len(head) > MAX_HEAD_BYTES:
            raise ConnectionError("the store's answer has no end of headers")
        more = conn.recv(RECV_HEAD_BYTES)
        if not more:
            raise ConnectionResetError("the store closed the connection in the headers")
        head += more
    return parse_head(head)


def parse_head(head: bytes) -> tuple[int, dict[str, str], bytes]:
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


def read_chunked(conn: socket.socket, data: bytes) -> bytes:
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


def client_error(status: int, body: bytes, operation: str) -> ClientError:
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
        operation,
    )
