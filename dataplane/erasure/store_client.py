"""A client of one shard store's HTTP service (store_server.py).

One short-lived connection per request: a paused or dead store costs its caller one timeout
and leaves no half-used connection behind. Thread-safe (no shared state).
"""

from __future__ import annotations

import http.client
import json

from dataplane.erasure.holes import AcceptResult
from dataplane.erasure.store import RangeAnswer, WriteAnswer
from dataplane.erasure.store_server import FILL_MARK_HEADER, RESULT_HEADER, decode_range

DEFAULT_TIMEOUT_MS = 2_000


class StoreUnavailableError(RuntimeError):
    """The store did not answer in time, refused the connection, or failed the request."""


class ShardStoreClient:
    """Talks to the shard store at host:port."""

    def __init__(self, address: str, timeout_ms: int = DEFAULT_TIMEOUT_MS):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"shard store address must be host:port, got {address!r}")
        self.address = address
        self.host = host
        self.port = int(port)
        self.timeout_ms = timeout_ms

    def _request(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_ms / 1000)
        try:
            conn.request(
                method, path, body=body, headers={"Content-Type": "application/octet-stream"}
            )
            response = conn.getresponse()
            data = response.read()
            headers = {k.lower(): v for k, v in response.getheaders()}
        except (OSError, http.client.HTTPException) as e:  # TimeoutError is an OSError
            raise StoreUnavailableError(
                f"shard store {self.address}: {type(e).__name__}: {e}"
            ) from None
        finally:
            conn.close()
        if response.status >= 500:
            raise StoreUnavailableError(
                f"shard store {self.address}: HTTP {response.status}: {data[:200]!r}"
            )
        if response.status == 400:
            raise ValueError(f"shard store {self.address} refused the request: {data[:200]!r}")
        return response.status, headers, data

    def write(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        """Write a hole once; the answer says whether these bytes are in it."""
        status, headers, body = self._request("PUT", f"/v1/holes/{stream_id}/{offset}", data)
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
        status, _, body = self._request("GET", path)
        if status != 200:
            raise StoreUnavailableError(f"shard store {self.address}: range read answered {status}")
        try:
            return decode_range(body)
        except ValueError as e:
            raise StoreUnavailableError(f"shard store {self.address}: {e}") from None

    def fill_below(self, stream_id: int, mark: int) -> int:
        status, _, body = self._request("POST", f"/v1/fill/{stream_id}?below={mark}", b"")
        if status != 200:
            raise StoreUnavailableError(f"shard store {self.address}: fill answered {status}")
        return int(json.loads(body)["filled_below"])
