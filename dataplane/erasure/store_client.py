"""A client of one shard store's HTTP service (store_server.py).

Each calling thread keeps one keep-alive connection per store (a new TCP connection per
request cost about a millisecond of a produce's few); any error drops that connection, so a
paused or dead store costs its caller one timeout and leaves no half-used connection
behind. A request on a kept connection that the store had closed meanwhile (idle timeout,
restart) is sent once more on a new one: every request is safe to repeat (a hole rewrite
with identical bytes is accepted, a fill mark only rises, reads change nothing).
Thread-safe: connections are per thread.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import socket
import threading

from dataplane.erasure.holes import AcceptResult
from dataplane.erasure.store import RangeAnswer, WriteAnswer
from dataplane.erasure.store_server import (
    DROP_MARK_HEADER,
    FILL_MARK_HEADER,
    RESULT_HEADER,
    decode_range,
)

DEFAULT_TIMEOUT_MS = 2_000


class StoreUnavailableError(RuntimeError):
    """The store did not answer in time, refused the connection, or failed the request."""


class ShardStoreClient:
    """Talks to the shard store at host:port."""

    def __init__(
        self, address: str, timeout_ms: int = DEFAULT_TIMEOUT_MS, secret: str | None = None
    ):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"shard store address must be host:port, got {address!r}")
        self.address = address
        self.host = host
        self.port = int(port)
        self.timeout_ms = timeout_ms
        self._headers = {"Content-Type": "application/octet-stream"}
        if secret is not None:
            self._headers["Authorization"] = f"Bearer {secret}"
        self._local = threading.local()

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def _request(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        for attempt in range(2):
            conn = getattr(self._local, "conn", None)
            reused = conn is not None
            if conn is None:
                conn = http.client.HTTPConnection(
                    self.host, self.port, timeout=self.timeout_ms / 1000
                )
                self._local.conn = conn
            try:
                if conn.sock is None:  # small requests go out at once (no Nagle delay)
                    conn.connect()
                    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.request(method, path, body=body, headers=self._headers)
                response = conn.getresponse()
                data = response.read()
                headers = {k.lower(): v for k, v in response.getheaders()}
            except (OSError, http.client.HTTPException) as e:  # TimeoutError is an OSError
                self._drop()
                stale = isinstance(
                    e, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)
                )
                if reused and stale and attempt == 0:
                    continue  # the store closed the kept connection: once more, on a new one
                raise StoreUnavailableError(
                    f"shard store {self.address}: {type(e).__name__}: {e}"
                ) from None
            if response.will_close:
                self._drop()
            break
        if response.status == 401:
            raise StoreUnavailableError(
                f"shard store {self.address} refused the request: missing or wrong cluster secret"
            )
        if response.status >= 500:
            raise StoreUnavailableError(
                f"shard store {self.address}: HTTP {response.status}: {data[:200]!r}"
            )
        if response.status == 400:
            raise ValueError(f"shard store {self.address} refused the request: {data[:200]!r}")
        return response.status, headers, data

    def write(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        """Write a hole once; the answer says whether these bytes are in it."""
        return self._put("holes", stream_id, offset, data)

    def repair(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        """Put a decided write's shard into a hole holding no bytes (HoleStore.repair)."""
        return self._put("repair", stream_id, offset, data)

    def _put(self, kind: str, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        status, headers, body = self._request("PUT", f"/v1/{kind}/{stream_id}/{offset}", data)
        result = headers.get(RESULT_HEADER.lower())
        if status not in (200, 409) or result not in ("accepted", "taken"):
            raise StoreUnavailableError(
                f"shard store {self.address}: unexpected answer {status} {result}"
            )
        try:
            filled_below = int(headers.get(FILL_MARK_HEADER.lower(), ""))
        except ValueError:
            filled_below = None
        return WriteAnswer(AcceptResult(result), body, filled_below)

    def read(self, stream_id: int, offset: int) -> bytes | None:
        status, _, body = self._request("GET", f"/v1/holes/{stream_id}/{offset}")
        return None if status == 404 else body

    def read_range(
        self, stream_id: int, start: int, end: int, max_holes: int, max_bytes: int
    ) -> RangeAnswer:
        path = f"/v1/holes/{stream_id}?start={start}&end={end}&max_holes={max_holes}&max_bytes={max_bytes}"
        return self._range(path)

    def list_heads(self, stream_id: int, start: int, end: int, max_holes: int) -> RangeAnswer:
        """The range's holes cut to shard headers (HoleStore.list_heads)."""
        return self._range(f"/v1/heads/{stream_id}?start={start}&end={end}&max_holes={max_holes}")

    def _range(self, path: str) -> RangeAnswer:
        status, headers, body = self._request("GET", path)
        if status != 200:
            raise StoreUnavailableError(f"shard store {self.address}: range read answered {status}")
        try:
            answer = decode_range(body)
            dropped = headers.get(DROP_MARK_HEADER.lower())
            if dropped is not None:
                answer = dataclasses.replace(answer, dropped_below=int(dropped))
            return answer
        except ValueError as e:
            raise StoreUnavailableError(f"shard store {self.address}: {e}") from None

    def fill_below(self, stream_id: int, mark: int) -> int:
        status, _, body = self._request("POST", f"/v1/fill/{stream_id}?below={mark}", b"")
        if status != 200:
            raise StoreUnavailableError(f"shard store {self.address}: fill answered {status}")
        return int(json.loads(body)["filled_below"])

    def drop_below(self, stream_id: int, mark: int) -> int:
        status, _, body = self._request("POST", f"/v1/drop/{stream_id}?below={mark}", b"")
        if status != 200:
            raise StoreUnavailableError(f"shard store {self.address}: drop answered {status}")
        return int(json.loads(body)["dropped_below"])

    def find(self, stream_id: int, payload_crc: int) -> list[int]:
        status, _, body = self._request("GET", f"/v1/find/{stream_id}?crc={payload_crc}")
        if status != 200:
            raise StoreUnavailableError(f"shard store {self.address}: find answered {status}")
        return [int(o) for o in json.loads(body)["offsets"]]

    def set_injected_delay(self, active: bool) -> int:
        """Switch a benchmark store's injected write delay; returns the delay now in force."""
        query = f"/v1/inject-delay?active={int(active)}"
        status, _, body = self._request("POST", query, b"")
        if status != 200:
            raise StoreUnavailableError(
                f"shard store {self.address}: inject-delay answered {status}: {body[:200]!r}"
            )
        return int(json.loads(body)["write_delay_ms"])
