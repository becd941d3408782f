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
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol
from urllib.parse import parse_qs, urlparse

from prometheus_client import Counter

from controlplane.auth import is_authorized
from controlplane.config import QuorumConfig
from controlplane.errors import ControllerError, ErrorCode
from controlplane.quorum import MetadataQuorum
from controlplane.requests import REQUEST_TYPES

log = logging.getLogger(__name__)

MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_CONCURRENT_REQUESTS = 64
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that starts TLS and goes silent is dropped
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
}


class ControllerNode(Protocol):
    """What the HTTP service needs of a controller (server.ControllerNode implements it)."""

    config: QuorumConfig
    quorum: MetadataQuorum

    def handle_heartbeat(self, body: dict) -> dict: ...

    def status(self) -> dict: ...


class ControllerHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default backlog of 5 overflows when brokers' long-polls, heartbeats and
    # commits arrive together; a dropped SYN costs the client a 1 s retransmission
    request_queue_size = 256

    def __init__(
        self,
        address: tuple[str, int],
        node: ControllerNode,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.node = node
        self.slots = threading.BoundedSemaphore(MAX_CONCURRENT_REQUESTS)
        self.ssl_context = ssl_context  # None: plain HTTP
        super().__init__(address, _Handler)

    def get_request(self):
        """With TLS, the handshake runs in the request's own thread (`_Handler.setup`), so a
        slow or silent client never holds up the accept loop."""
        sock, addr = super().get_request()
        if self.ssl_context is not None:
            sock = self.ssl_context.wrap_socket(
                sock, server_side=True, do_handshake_on_connect=False
            )
        return sock, addr


class _Handler(BaseHTTPRequestHandler):
    server: ControllerHTTPServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(TLS_HANDSHAKE_TIMEOUT_S)
            self.request.do_handshake()  # a failure closes just this connection
            self.request.settimeout(None)
        super().setup()

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
        if not self._authorized():
            return
        if not self.server.slots.acquire(timeout=5):
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
        except (BrokenPipeError, ConnectionResetError) as exc:
            # the client went away (killed, or gave up waiting): nothing to answer
            log.debug("client of %s went away: %s", self.path, exc)
            self.close_connection = True
        except Exception as exc:  # a bug: answer 500 instead of dropping the connection
            log.exception("internal error serving %s", self.path)
            self._send(500, {"error": {"code": "INTERNAL", "message": str(exc)}})
        finally:
            self.server.slots.release()

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
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_REQUEST_BYTES:
            self.close_connection = True
            raise ControllerError(
                ErrorCode.REQUEST_TOO_LARGE,
                f"request of {length} bytes is over {MAX_REQUEST_BYTES}",
            )
        raw = self.rfile.read(length) if length else b"{}"
        try:
            body = json.loads(raw or b"{}")
        except ValueError as exc:
            raise ControllerError(ErrorCode.INVALID_REQUEST, f"body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ControllerError(ErrorCode.INVALID_REQUEST, "body must be a JSON object")
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
