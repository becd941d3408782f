"""The controller's HTTP/JSON service for brokers, the CLI and Spark jobs.

POST /v1/<command>            a request body from `requests.py`; writes go to the leader
                              (a follower answers 421 NOT_CONTROLLER with the leader's
                              address, which `ControllerClient` follows)
GET  /v1/log?after=N&max=M&wait_ms=T   metadata log records after offset N (long-poll);
                              any controller serves it from its replicated state
GET  /v1/status               raft state of this controller, brokers with heartbeat ages
GET  /v1/image                the whole metadata image (JSON)
GET  /v1/balancer             the self-balancer's state (leader only: it has the rates)
GET  /v1/streams/<id>         a stream's epoch, state, owner, start and end offsets
GET  /v1/streams/<id>/objects?start=&end=&limit=[&leader=1]   objects holding a stream's
                              offsets (leader=1: only the leader answers, NOT_CONTROLLER
                              elsewhere: read-your-writes after a commit)
GET  /metrics                 Prometheus text format

Every route needs `Authorization: Bearer <cluster secret>` when the quorum config has an
`api_secret` (controlplane/auth.py): without it or with a wrong one the answer is 401 before
anything is read or changed, the attempt is logged with the client address and counted in
`controller_api_unauthorized_total`.

Hostile or broken input gets a 4xx, never a 500: a Content-Length that is not a decimal
number (400), over MAX_REQUEST_BYTES (413), a Transfer-Encoding (400), a body that does not
come within BODY_TIMEOUT_S + its size at MIN_BODY_BYTES_PER_S (408), a body that is not a
JSON object or nests deeper than MAX_JSON_DEPTH (400). Connections are served by
`controlplane.http_server` (a selector and at most MAX_CONCURRENT_REQUESTS threads, at most
MAX_CONNECTIONS connections: idle ones hold no thread).
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import time
import uuid
from typing import Protocol
from urllib.parse import parse_qs, urlparse

from prometheus_client import Counter

from controlplane.auth import is_authorized
from controlplane.config import QuorumConfig
from controlplane.errors import ControllerError, ErrorCode
from controlplane.http_server import BoundedHTTPServer, PooledRequestHandler
from controlplane.quorum import MetadataQuorum
from controlplane.requests import REQUEST_TYPES

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_CONCURRENT_REQUESTS = 64  # handler threads (a long-poll holds one for up to 30 s)
MAX_CONNECTIONS = 1024  # open at once, idle or not; past it: 503
BUSY_WAIT_S = 5.0  # a request that waited this long for a handler thread: 503, try later
MAX_JSON_DEPTH = 32  # of a request body (the deepest command body nests 5)
BODY_TIMEOUT_S = 10.0  # for a body to come, plus its size at the rate below
MIN_BODY_BYTES_PER_S = 1024 * 1024
_DECIMAL = re.compile(r"[0-9]{1,12}")
MAX_LONG_POLL_MS = 30_000
MAX_LOG_RECORDS_PER_READ = 5_000
# commands only the leader's own timers submit (their bodies carry the leader's decisions)
INTERNAL_COMMANDS = frozenset({"lifecycle_tick", "balance_partitions", "bump_route_epoch"})

UNAUTHORIZED = Counter(
    "controller_api_unauthorized_total",
    "Controller API requests refused for a missing or wrong credential",
)

_STATUS_FOR_ERROR = {
    ErrorCode.NOT_CONTROLLER: 421,
    ErrorCode.NO_LEADER: 503,
    ErrorCode.TIMEOUT: 503,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.UNKNOWN_COMMAND: 404,
    ErrorCode.REQUEST_TOO_LARGE: 413,
    ErrorCode.LOG_NOT_PERSISTED: 507,  # Insufficient Storage: the leader's disk is full
}


class ControllerNode(Protocol):
    """What the HTTP service needs of a controller (server.ControllerNode implements it)."""

    config: QuorumConfig
    quorum: MetadataQuorum

    def handle_heartbeat(self, body: dict) -> dict: ...

    def status(self) -> dict: ...


class ControllerHTTPServer(BoundedHTTPServer):
    """The controller's API server: `_Handler` on a `BoundedHTTPServer`."""

    def __init__(
        self,
        address: tuple[str, int],
        node: ControllerNode,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.node = node
        super().__init__(
            address,
            _Handler,
            max_workers=MAX_CONCURRENT_REQUESTS,
            max_connections=MAX_CONNECTIONS,
            ssl_context=ssl_context,
        )


class _Handler(PooledRequestHandler):
    server: ControllerHTTPServer  # type: ignore[assignment]

    def log_message(self, fmt: str, *args: object) -> None:  # access log at debug level
        log.debug("%s %s", self.address_string(), fmt % args)

    # ------------------------------------------------------------ plumbing

    def _send(self, status: int, body: dict | str, content_type: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, exc: ControllerError, extra: dict | None = None) -> None:
        body = exc.to_dict()
        if extra:
            body["error"].update(extra)
        self._send(_STATUS_FOR_ERROR.get(exc.code, 409), body)

    def _authorized(self) -> bool:
        """Answer 401 (and close: the body is not read) unless the request carries the
        cluster's secret."""
        if is_authorized(self.headers.get("Authorization"), self.server.node.config.api_secret):
            return True
        UNAUTHORIZED.inc()
        log.warning(
            "refused %s %s from %s: missing or wrong credential",
            self.command,
            urlparse(self.path).path,
            self.client_address[0],
        )
        self.close_connection = True
        self.send_response(401)
        body = b'{"error": {"code": "UNAUTHORIZED", "message": "missing or wrong credential"}}'
        self.send_header("WWW-Authenticate", 'Bearer realm="automq-controller"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        return False

    def _guarded(self, fn) -> None:
        self._body_read = False
        try:
            self._guarded_call(fn)
        finally:
            if not self._body_read and (
                self.headers.get("Content-Length", "0").strip() != "0"
                or "Transfer-Encoding" in self.headers
            ):
                self.close_connection = True  # its unread body must not be taken as a request

    def _guarded_call(self, fn) -> None:
        if not self._authorized():
            return
        if self.waited_s > BUSY_WAIT_S:
            self.close_connection = True  # a body, if any, is not read
            self._send(503, ControllerError(ErrorCode.TIMEOUT, "controller busy").to_dict())
            return
        try:
            fn()
        except ControllerError as exc:
            self._send_error(
                exc,
                self._leader_hint()
                if exc.code in (ErrorCode.NOT_CONTROLLER, ErrorCode.NO_LEADER)
                else None,
            )
        except _RequestTimeout:
            self._send(408, {"error": {"code": "TIMEOUT", "message": "body not sent in time"}})
        except (BrokenPipeError, ConnectionResetError) as exc:
            # the client went away (killed, or gave up waiting): nothing to answer
            log.debug("client of %s went away: %s", self.path, exc)
            self.close_connection = True
        except Exception as exc:  # a bug: answer 500 instead of dropping the connection
            log.exception("internal error serving %s", self.path)
            self._send(500, {"error": {"code": "INTERNAL", "message": str(exc)}})

    def _leader_hint(self) -> dict:
        node = self.server.node
        leader_api = node.config.api_for_raft(node.quorum.leader_address())
        return {"leader_api": leader_api} if leader_api else {}

    # ------------------------------------------------------------ POST: commands

    def do_POST(self) -> None:
        self._guarded(self._post)

    def _post(self) -> None:
        path = urlparse(self.path).path
        if not path.startswith("/v1/"):
            raise ControllerError(ErrorCode.UNKNOWN_COMMAND, f"no such endpoint {path}")
        command = path[len("/v1/") :]
        if command not in REQUEST_TYPES or command in INTERNAL_COMMANDS:
            raise ControllerError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {command!r}")
        body = self._json_body()
        node = self.server.node
        if not node.quorum.is_leader():
            if node.config.api_for_raft(node.quorum.leader_address()) is None:
                # right after an election a follower may not know the leader yet: say so
                # (retriable, try another controller) instead of a redirect without a target
                raise ControllerError(ErrorCode.NO_LEADER, "no controller leader known here yet")
            raise ControllerError(ErrorCode.NOT_CONTROLLER, "this controller is not the leader")
        if command == "broker_heartbeat":
            result = node.handle_heartbeat(body)
        else:
            if command == "create_topic" and isinstance(body, dict) and not body.get("topic_id"):
                body["topic_id"] = str(uuid.uuid4())
            result = node.quorum.submit(command, body)
        if "error" in result:
            code = ErrorCode(result["error"]["code"])
            self._send(_STATUS_FOR_ERROR.get(code, 409), result)
        else:
            self._send(200, result)

    def _json_body(self) -> dict:
        """The request's body as a JSON object, within every limit (ControllerError if not;
        an error before the whole body is read closes the connection)."""
        length = self._content_length()
        try:
            raw = self.rfile.read_body(length, BODY_TIMEOUT_S + length / MIN_BODY_BYTES_PER_S)
        except TimeoutError:
            self.close_connection = True
            raise _RequestTimeout() from None
        self._body_read = True
        if len(raw) < length:
            self.close_connection = True
            raise ControllerError(ErrorCode.INVALID_REQUEST, "body shorter than Content-Length")
        try:
            body = json.loads(raw or b"{}")
        except RecursionError:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST, f"body nests deeper than {MAX_JSON_DEPTH}"
            ) from None
        except ValueError as exc:
            raise ControllerError(ErrorCode.INVALID_REQUEST, f"body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ControllerError(ErrorCode.INVALID_REQUEST, "body must be a JSON object")
        if _nests_deeper(body, MAX_JSON_DEPTH):
            raise ControllerError(
                ErrorCode.INVALID_REQUEST, f"body nests deeper than {MAX_JSON_DEPTH}"
            )
        return body

    def _content_length(self) -> int:
        """The body's declared size: one decimal Content-Length, at most MAX_REQUEST_BYTES."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            raise ControllerError(
                ErrorCode.INVALID_REQUEST, "Transfer-Encoding is not supported: send Content-Length"
            )
        values = self.headers.get_all("Content-Length") or []
        if not values:
            return 0
        text = values[0].strip()
        if len(set(values)) > 1 or not _DECIMAL.fullmatch(text):
            self.close_connection = True
            raise ControllerError(ErrorCode.INVALID_REQUEST, "Content-Length must be one number")
        length = int(text)
        if length > MAX_REQUEST_BYTES:
            self.close_connection = True
            raise ControllerError(
                ErrorCode.REQUEST_TOO_LARGE,
                f"request of {length} bytes is over {MAX_REQUEST_BYTES}",
            )
        return length

    # ------------------------------------------------------------ GET: reads

    def do_GET(self) -> None:
        self._guarded(self._get)

    def _get(self) -> None:
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        node = self.server.node
        if url.path != "/v1/log" and url.path != "/metrics":
            # reads from the leader see every record its predecessor acknowledged
            node.quorum.wait_leader_ready()
        if url.path == "/v1/log":
            after = _int(query, "after", -1)
            max_records = min(_int(query, "max", 1000), MAX_LOG_RECORDS_PER_READ)
            wait_ms = min(_int(query, "wait_ms", 0), MAX_LONG_POLL_MS)
            if wait_ms > 0:
                node.quorum.wait_for_offset(after, wait_ms / 1000)
            self._send(200, node.quorum.machine.read_log(after, max_records))
        elif url.path == "/v1/status":
            self._send(200, node.status())
        elif url.path == "/v1/balancer":
            self._send(200, node.balancer_status())
        elif url.path == "/v1/image":
            self._send(200, node.quorum.machine.image.model_dump_json())
        elif url.path.startswith("/v1/streams/") and url.path.count("/") == 3:
            stream = node.quorum.machine.image.streams.get(_path_int(url.path, 3))
            if stream is None:
                raise ControllerError(ErrorCode.UNKNOWN_STREAM, f"no stream {url.path}")
            self._send(
                200,
                {
                    **stream.model_dump(mode="json", exclude={"object_ranges"}),
                    "end_offset": stream.end_offset,
                },
            )
        elif url.path.startswith("/v1/streams/") and url.path.endswith("/objects"):
            stream_id = _path_int(url.path, 3)
            if query.get("leader") == "1" and not node.quorum.is_leader():
                # read-your-writes: a follower may not have applied the latest commits yet
                raise ControllerError(ErrorCode.NOT_CONTROLLER, "this controller is not the leader")
            image = node.quorum.machine.image
            found = image.stream_objects_in_range(
                stream_id,
                _int(query, "start", 0),
                _int(query, "end", 2**62),
                min(_int(query, "limit", 100), 10_000),
            )
            self._send(
                200,
                {
                    "objects": [
                        {
                            **rng.model_dump(),
                            "bucket_id": meta.bucket_id,
                            "size_bytes": meta.size_bytes,
                        }
                        for rng, meta in found
                    ]
                },
            )
        elif url.path == "/metrics":
            from prometheus_client import generate_latest

            self._send(200, generate_latest().decode(), "text/plain; version=0.0.4")
        elif url.path == "/healthz":
            self._send(200, {"ok": True, "time_ms": int(time.time() * 1000)})
        else:
            raise ControllerError(ErrorCode.UNKNOWN_COMMAND, f"no such endpoint {url.path}")


class _RequestTimeout(Exception):
    """The body did not come in time (answered 408)."""


def _nests_deeper(value: object, limit: int) -> bool:
    """Whether a parsed JSON value nests objects/arrays deeper than `limit` levels."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))  # type: ignore[union-attr]
    return False


def _path_int(path: str, index: int) -> int:
    try:
        return int(path.split("/")[index])
    except (IndexError, ValueError):
        raise ControllerError(ErrorCode.INVALID_REQUEST, f"bad id in {path}") from None


def _int(query: dict, key: str, default: int) -> int:
    try:
        return int(query.get(key, default))
    except ValueError:
        raise ControllerError(ErrorCode.INVALID_REQUEST, f"{key} must be an integer") from None
