"""The shard store's network service (one per broker), HTTP on a local address.

PUT  /v1/holes/<stream>/<offset>        body: the hole's bytes. 200 accepted, 409 taken; the
                                        body of either answer is what the hole now holds
PUT  /v1/repair/<stream>/<offset>       body: a shard of a decided write (the repairer): also
                                        taken by a hole that is junk only by the fill mark;
                                        a hole holding bytes is never changed (see
                                        HoleStore.repair); answers as PUT /v1/holes
GET  /v1/holes/<stream>/<offset>        200 with the hole's bytes, 404 empty
GET  /v1/holes/<stream>?start=&end=&max_holes=&max_bytes=
                                        the filled holes of a range, binary (see encode_range)
GET  /v1/heads/<stream>?start=&end=&max_holes=
                                        as above, each hole cut to a shard header's length
POST /v1/fill/<stream>?below=<offset>   fill empty holes below the mark with junk; JSON answer
POST /v1/drop/<stream>?below=<offset>   forget the holes below the mark (sealed into object
                                        storage); JSON answer. Range reads answer the drop
                                        mark in X-Dropped-Below
GET  /v1/find/<stream>?crc=<payload crc> recent offsets whose shard names that payload CRC
                                        (a retried batch finds its first attempt); JSON
POST /v1/inject-delay?active=<0|1>       switch the injected write delay (benchmarks); JSON
GET  /v1/status                         JSON: holes held, the injected write delay in force

Every write is durable before its answer. With a secret (a broker's store: the cluster's
controller API secret) every request must carry `Authorization: Bearer <secret>` (401
otherwise, nothing read or written). Requests are bounded in size and count, and
sockets time out, so a stuck client cannot pin the service.

Run: python -m dataplane.erasure.store_server --data-dir DIR [--host 127.0.0.1] [--port 0]
[--inject-delay-ms N [--inject-delay-off]]
(prints "LISTENING <port>" once it serves). A benchmark or test slows and heals a store at
run time with POST /v1/inject-delay?active=1|0 (only a store started with an injected delay
takes it; healing lets writes waiting in the delay go on at once), so healthy and slow
phases can be interleaved on the same stores and disk.
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import socket
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from controlplane.signal_watcher import SignalWatcher
from dataplane.erasure.holes import AcceptResult
from dataplane.erasure.store import MAX_HOLE_BYTES, HoleStore, RangeAnswer, StoreFullError

log = logging.getLogger(__name__)

MAX_CONCURRENT_REQUESTS = 64
SOCKET_TIMEOUT_S = 10.0
MAX_RANGE_HOLES = 10_000
MAX_RANGE_BYTES = 32 * 1024 * 1024
_RANGE_HEAD = struct.Struct(">qqI")
_RANGE_ENTRY = struct.Struct(">qI")
RESULT_HEADER = "X-Hole-Result"
FILL_MARK_HEADER = "X-Filled-Below"
DROP_MARK_HEADER = "X-Dropped-Below"


def encode_range(answer: RangeAnswer) -> bytes:
    """complete_below i64 | filled_below i64 | count u32 | (offset i64 | length u32 | bytes)*"""
    parts = [_RANGE_HEAD.pack(answer.complete_below, answer.filled_below, len(answer.holes))]
    for offset, data in answer.holes:
        parts.append(_RANGE_ENTRY.pack(offset, len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_range(body: bytes) -> RangeAnswer:
    """The inverse of encode_range; raises ValueError on malformed bytes."""
    if len(body) < _RANGE_HEAD.size:
        raise ValueError("range answer shorter than its header")
    complete_below, filled_below, count = _RANGE_HEAD.unpack_from(body)
    pos = _RANGE_HEAD.size
    holes = []
    for _ in range(count):
        if pos + _RANGE_ENTRY.size > len(body):
            raise ValueError("truncated range answer")
        offset, length = _RANGE_ENTRY.unpack_from(body, pos)
        pos += _RANGE_ENTRY.size
        if pos + length > len(body):
            raise ValueError("truncated range answer")
        holes.append((offset, body[pos : pos + length]))
        pos += length
    return RangeAnswer(holes, complete_below, filled_below)


# benchmarks' slow node, not a product setting: a broker whose environment holds this
# starts its shard store with that write delay, switched off (POST /v1/inject-delay)
INJECT_DELAY_ENV = "AUTOMQ_BENCH_SHARD_STORE_DELAY_MS"


def bench_inject_delay_ms() -> int:
    """The write delay a benchmark asked of this process's shard store (0: none)."""
    raw = os.environ.get(INJECT_DELAY_ENV, "").strip()
    if not raw:
        return 0
    delay_ms = int(raw)
    if not 0 <= delay_ms <= 60_000:
        raise ValueError(f"{INJECT_DELAY_ENV}={raw}: expected 0..60000 ms")
    return delay_ms


class ShardStoreHTTPServer(ThreadingHTTPServer):
    """Serves one HoleStore. Thread-safe: handlers share the store, which locks itself."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        store: HoleStore,
        inject_delay_ms: int = 0,
        secret: str | None = None,
        delay_active: bool = True,
    ):
        self.store = store
        # the cluster secret every request must carry (Authorization: Bearer); None: open
        # (a store on a loopback address, tests)
        self.secret = secret
        # a slow node for benchmarks and tests: every write waits this long before it is
        # handled while the delay is active (switched at run time by POST /v1/inject-delay)
        self.inject_delay_ms = inject_delay_ms
        self._healed = threading.Event()  # set: no delay; delayed writes go on at once
        self.set_delay_active(delay_active)
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)
        super().__init__(address, _Handler)

    @property
    def delay_active(self) -> bool:
        return not self._healed.is_set()

    @property
    def write_delay_ms(self) -> int:
        """The delay every write waits now (0: none)."""
        return self.inject_delay_ms if self.delay_active else 0

    def set_delay_active(self, active: bool) -> None:
        """Switch the injected delay (a request handler calls it, never a signal handler:
        an Event's lock is not safe there, see controlplane/signal_watcher.py)."""
        if active:
            self._healed.clear()
        else:
            self._healed.set()  # writes waiting in the delay go on now

    def delay_write(self) -> None:
        """Wait the injected delay while it stays active (no polling: a slow store's
        sleeping writes must not cost CPU the healthy ones need)."""
        if self.write_delay_ms:
            self._healed.wait(self.write_delay_ms / 1000)

    def handle_error(self, request: object, client_address: object) -> None:
        # a client that died or timed out mid-request (a broker killed, a writer's timeout)
        # is routine: one line, not socketserver's traceback on stderr
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            log.debug("shard store client %s went away: %s", client_address, error)
        else:
            super().handle_error(request, client_address)


class _BadRequest(ValueError):
    pass


def _int_param(query: dict[str, list[str]], name: str, default: int | None = None) -> int:
    values = query.get(name)
    if not values:
        if default is None:
            raise _BadRequest(f"missing query parameter {name}")
        return default
    try:
        return int(values[0])
    except ValueError:
        raise _BadRequest(f"query parameter {name} must be an integer, got {values[0]!r}") from None


class _Handler(BaseHTTPRequestHandler):
    server: ShardStoreHTTPServer
    protocol_version = "HTTP/1.1"
    timeout = SOCKET_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        # an answer is written as headers then body: without this, on a kept connection the
        # body waits for the client's delayed ACK of the headers (~40 ms, Nagle)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, fmt: str, *args: object) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/octet-stream",
        **headers: str,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._send(status, json.dumps({"error": message}).encode(), "application/json")

    def _body(self) -> bytes:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            raise _BadRequest("bad Content-Length") from None
        if length < 0 or length > MAX_HOLE_BYTES:
            # the body is not read: close the connection rather than parse it as a request
            self.close_connection = True
            raise _BadRequest(f"body of {length} bytes exceeds {MAX_HOLE_BYTES}")
        return self.rfile.read(length)

    def _dispatch(self, method: str) -> None:
        secret = self.server.secret
        if secret is not None:
            given = self.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {secret}".encode()):
                self.close_connection = True  # the body is not read
                self._error(401, "missing or wrong cluster secret")
                return
        if not self.server.slots.acquire(timeout=1.0):
            self.close_connection = True
            self._error(503, "shard store busy")
            return
        try:
            url = urlparse(self.path)
            parts = [p for p in url.path.split("/") if p]
            query = parse_qs(url.query)
            self._route(method, parts, query)
        except _BadRequest as e:
            self._error(400, str(e))
        except StoreFullError as e:
            self._error(507, str(e))
        except ValueError as e:
            self._error(400, str(e))
        except (ConnectionError, TimeoutError) as e:  # the client went away: nobody to answer
            self.close_connection = True
            log.debug("shard store client went away: %s", e)
        except Exception as e:  # one bad request must not kill the service
            log.exception("shard store request failed")
            self._error(500, f"{type(e).__name__}: {e}")
        finally:
            self.server.slots.release()

    def _route(self, method: str, parts: list[str], query: dict[str, list[str]]) -> None:
        store = self.server.store
        if parts[:1] != ["v1"]:
            raise _BadRequest(f"unknown path {self.path}")
        try:
            ids = [int(p) for p in parts[2:]]
        except ValueError:
            raise _BadRequest(f"stream and offset must be integers in {self.path}") from None
        route = (method, parts[1] if len(parts) > 1 else "", len(ids))
        if route == ("PUT", "holes", 2):
            self.server.delay_write()
            answer = store.write(ids[0], ids[1], self._body())
            status = 200 if answer.result is AcceptResult.ACCEPTED else 409
            headers = {
                RESULT_HEADER: answer.result.value,
                FILL_MARK_HEADER: str(answer.filled_below),
            }
            self._send(status, answer.content, **headers)
        elif route == ("PUT", "repair", 2):
            answer = store.repair(ids[0], ids[1], self._body())
            status = 200 if answer.result is AcceptResult.ACCEPTED else 409
            headers = {
                RESULT_HEADER: answer.result.value,
                FILL_MARK_HEADER: str(answer.filled_below),
            }
            self._send(status, answer.content, **headers)
        elif route == ("GET", "holes", 2):
            data = store.read(ids[0], ids[1])
            if data is None:
                self._send(404, b"")
            else:
                self._send(200, data)
        elif route == ("GET", "holes", 1):
            start = _int_param(query, "start")
            end = _int_param(query, "end")
            max_holes = min(_int_param(query, "max_holes", MAX_RANGE_HOLES), MAX_RANGE_HOLES)
            max_bytes = min(_int_param(query, "max_bytes", MAX_RANGE_BYTES), MAX_RANGE_BYTES)
            if max_holes < 1 or max_bytes < 1:
                raise _BadRequest("max_holes and max_bytes must be positive")
            answer = store.read_range(ids[0], start, end, max_holes, max_bytes)
            self._send(200, encode_range(answer), **{DROP_MARK_HEADER: str(answer.dropped_below)})
        elif route == ("GET", "heads", 1):
            start = _int_param(query, "start")
            end = _int_param(query, "end")
            max_holes = min(_int_param(query, "max_holes", MAX_RANGE_HOLES), MAX_RANGE_HOLES)
            if max_holes < 1:
                raise _BadRequest("max_holes must be positive")
            answer = store.list_heads(ids[0], start, end, max_holes)
            self._send(200, encode_range(answer), **{DROP_MARK_HEADER: str(answer.dropped_below)})
        elif route == ("POST", "inject-delay", 0):
            self._body()  # none expected; read so the connection stays in step
            if not self.server.inject_delay_ms:
                raise _BadRequest(
                    "this store has no injected delay (--inject-delay-ms, or the broker's "
                    f"environment {INJECT_DELAY_ENV})"
                )
            self.server.set_delay_active(_int_param(query, "active") != 0)
            body = {"write_delay_ms": self.server.write_delay_ms}
            self._send(200, json.dumps(body).encode(), "application/json")
        elif route == ("POST", "fill", 1):
            self._body()
            mark = store.fill_below(ids[0], _int_param(query, "below"))
            self._send(200, json.dumps({"filled_below": mark}).encode(), "application/json")
        elif route == ("POST", "drop", 1):
            self._body()
            mark = store.drop_below(ids[0], _int_param(query, "below"))
            self._send(200, json.dumps({"dropped_below": mark}).encode(), "application/json")
        elif route == ("GET", "find", 1):
            offsets = store.find(ids[0], _int_param(query, "crc"))
            self._send(200, json.dumps({"offsets": offsets}).encode(), "application/json")
        elif route == ("GET", "status", 0):
            body = {"holes": store.hole_count, "write_delay_ms": self.server.write_delay_ms}
            self._send(200, json.dumps(body).encode(), "application/json")
        else:
            raise _BadRequest(f"unknown request {method} {self.path}")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_POST(self) -> None:
        self._dispatch("POST")


def serve(
    data_dir: Path, host: str, port: int, inject_delay_ms: int = 0, delay_active: bool = True
) -> None:
    """Run a shard store until SIGTERM/SIGINT."""
    store = HoleStore(data_dir)
    server = ShardStoreHTTPServer((host, port), store, inject_delay_ms, delay_active=delay_active)
    stop = SignalWatcher.install().stop_event
    thread = threading.Thread(
        target=server.serve_forever, args=(0.1,), name="shard-store-http", daemon=True
    )
    thread.start()
    print(f"LISTENING {server.server_address[1]}", flush=True)
    stop.wait()
    server.shutdown()
    server.server_close()
    store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="an erasure-coded partition's shard store")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument(
        "--inject-delay-ms", type=int, default=0, help="delay every write (benchmarks)"
    )
    parser.add_argument(
        "--inject-delay-off",
        action="store_true",
        help="start with the injected delay switched off (POST /v1/inject-delay?active=1)",
    )
    args = parser.parse_args(argv)
    if args.inject_delay_ms < 0:
        parser.error("--inject-delay-ms must not be negative")
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    serve(args.data_dir, args.host, args.port, args.inject_delay_ms, not args.inject_delay_off)
    return 0


if __name__ == "__main__":
    sys.exit(main())
