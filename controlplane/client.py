"""ControllerClient: how brokers, the CLI and Spark jobs talk to the controller quorum.

Writes go to the leader: the client remembers it, follows a follower's NOT_CONTROLLER hint,
and on connection errors or NO_LEADER tries the other controllers with a bounded backoff
until `timeout_s` has passed. Reads of the metadata log may go to any controller; they go to
the leader once one is known (the freshest log, and not a controller cut off from the quorum:
a long poll of one whose host was isolated would hold a broker's metadata until it timed out).

Each attempt is bounded by `request_timeout_s` and by what is left of the call's deadline, and
a controller that did not answer at the connection level is tried last for
UNREACHABLE_MEMORY_S: after its host is lost, a client finds the new leader among the others
instead of waiting on the old one again (brokers heartbeat with a fraction of their session
per attempt, `with_timeouts`).
"""

from __future__ import annotations

import copy
import dataclasses
import http.client
import json
import random
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from pydantic import BaseModel

from controlplane.auth import bearer_header, secret_from_env
from controlplane.calls import ControllerCalls
from controlplane.errors import ControllerError, ErrorCode
from controlplane.tls import ca_file_from_env, client_ssl_context

# LOG_NOT_PERSISTED: the leader's disk is full now; room may return, or another lead
_RETRIABLE = {
    ErrorCode.NOT_CONTROLLER,
    ErrorCode.NO_LEADER,
    ErrorCode.TIMEOUT,
    ErrorCode.LOG_NOT_PERSISTED,
}
# a leader-only object lookup is a second opinion on a short answer (reads wait on it):
# bounded well below the client's default
LEADER_LOOKUP_TIMEOUT_S = 2.0
# how long a controller that did not answer (connection refused, timed out) is tried last
UNREACHABLE_MEMORY_S = 10.0


class ControllerUnavailableError(ControllerError):
    """No controller answered within the deadline."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.NO_LEADER, message)


@dataclasses.dataclass
class _ControllersView:
    """What a client and the clients made from it by `with_timeouts` learned of the
    controllers: a broker's metadata long polls go to the leader its heartbeats found.
    Thread-safety: plain references replaced whole (a race only changes which controller
    is tried first)."""

    leader: str | None = None
    leader_at: float = 0.0  # when `leader` was learned (monotonic)
    # address -> when it last failed at the connection level (bounded by the addresses)
    unreachable_at: dict[str, float] = dataclasses.field(default_factory=dict)


class ControllerClient(ControllerCalls):
    """The controller API over HTTP (typed commands from `ControllerCalls`).

    `api_secret` is the cluster's controller API secret (controlplane/auth.py); None takes it
    from AUTOMQ_CONTROLLER_SECRET / AUTOMQ_CONTROLLER_SECRET_FILE if set. `ca_file`: the
    cluster's CA for an HTTPS controller API (None: AUTOMQ_CONTROLLER_CA_FILE, else HTTP).

    Thread-safety: safe to share; each call opens its own connection, and the remembered
    leader and the unreachable controllers' times are plain references (a race only changes
    which controller is tried first).
    """

    def __init__(
        self,
        api_addresses: list[str],
        timeout_s: float = 15.0,
        request_timeout_s: float = 10.0,
        api_secret: str | None = None,
        ca_file: str | Path | None = None,
    ):
        if not api_addresses:
            raise ValueError("at least one controller API address is needed")
        secret = api_secret if api_secret is not None else secret_from_env()
        self._auth_headers = bearer_header(secret) if secret else {}
        # HTTPS when the cluster's CA is known (argument or AUTOMQ_CONTROLLER_CA_FILE)
        ca = ca_file if ca_file is not None else ca_file_from_env()
        self._ssl_context = client_ssl_context(ca) if ca else None
        self.addresses = list(api_addresses)
        self.timeout_s = timeout_s
        self.request_timeout_s = request_timeout_s
        # shared with the clients made by `with_timeouts`: what one learns, all know
        self._view = _ControllersView()

    def with_timeouts(self, timeout_s: float, request_timeout_s: float) -> ControllerClient:
        """A client for the same controllers and credentials with other timeouts (e.g. a
        broker's heartbeats: a fraction of its session per attempt)."""
        other = copy.copy(self)
        other.addresses = list(self.addresses)
        other.timeout_s = timeout_s
        other.request_timeout_s = request_timeout_s
        return other  # `_view` is shared on purpose

    @property
    def _leader(self) -> str | None:
        return self._view.leader

    @property
    def _unreachable_at(self) -> dict[str, float]:
        return self._view.unreachable_at

    def _remember_leader(self, address: str | None) -> None:
        self._view.leader = address
        self._view.leader_at = time.monotonic()

    def _next_address(self, attempt: int) -> str:
        """The remembered leader, else the next controller in turn that has not failed to
        answer lately (all failed lately: the next in turn)."""
        leader = self._leader
        if leader is not None:
            failed_at = self._unreachable_at.get(leader)
            if failed_at is None or failed_at < self._view.leader_at:
                return leader
            self._view.leader = None  # it stopped answering since (seen by this or a sibling)
        now = time.monotonic()
        count = len(self.addresses)
        for i in range(count):
            address = self.addresses[(attempt + i) % count]
            failed_at = self._unreachable_at.get(address)
            if failed_at is None or now - failed_at > UNREACHABLE_MEMORY_S:
                return address
        return self.addresses[attempt % count]

    def _unreachable(self, address: str) -> None:
        self._unreachable_at[address] = time.monotonic()
        if self._view.leader == address:
            self._view.leader = None

    def _ordered(self, addresses: list[str]) -> list[str]:
        """`addresses` with the ones that failed to answer lately last (stable)."""
        now = time.monotonic()
        return sorted(
            addresses,
            key=lambda a: (
                now - self._unreachable_at.get(a, now - 2 * UNREACHABLE_MEMORY_S)
                <= UNREACHABLE_MEMORY_S
            ),
        )

    # ------------------------------------------------------------ transport

    def _http(
        self, address: str, method: str, path: str, body: bytes | None, timeout_s: float
    ) -> tuple[int, Any]:
        host, port = address.rsplit(":", 1)
        # connecting is bounded by the request timeout even for a long poll: a lost host
        # does not answer a SYN
        connect_timeout_s = min(timeout_s, self.request_timeout_s)
        if self._ssl_context is not None:
            conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, int(port), timeout=connect_timeout_s, context=self._ssl_context
            )
        else:
            conn = http.client.HTTPConnection(host, int(port), timeout=connect_timeout_s)
        try:
            conn.connect()
            if conn.sock is not None:
                conn.sock.settimeout(timeout_s)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers={**headers, **self._auth_headers})
            resp = conn.getresponse()
            self._unreachable_at.pop(address, None)  # it answers
            raw = resp.read()
            if resp.status == 401:
                raise ControllerError(
                    ErrorCode.UNAUTHORIZED,
                    f"controller {address} refused the credential (set the cluster's secret: "
                    "AUTOMQ_CONTROLLER_SECRET or AUTOMQ_CONTROLLER_SECRET_FILE)",
                )
            return resp.status, json.loads(raw) if raw else {}
        finally:
            conn.close()

    # ------------------------------------------------------------ commands

    def call(self, command: str, body: dict | BaseModel, timeout_s: float | None = None) -> dict:
        """Send one command to the leader and return its result; raise ControllerError."""
        if isinstance(body, BaseModel):
            body = body.model_dump(mode="json")
        payload = json.dumps(body).encode()
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.timeout_s)
        attempt = 0
        last_error = "no attempt"
        while True:
            address = self._next_address(attempt)
            attempt += 1
            left_s = max(deadline - time.monotonic(), 0.1)
            try:
                status, data = self._http(
                    address, "POST", f"/v1/{command}", payload, min(self.request_timeout_s, left_s)
                )
            except (OSError, http.client.HTTPException) as exc:
                self._unreachable(address)
                last_error = f"{address}: {exc}"
            else:
                if "error" not in data:
                    self._remember_leader(address)
                    return data.get("result", {})
                err = data["error"]
                try:
                    code = ErrorCode(err.get("code"))
                except ValueError:
                    raise ControllerError(
                        ErrorCode.INVALID_REQUEST, f"{err.get('code')}: {err.get('message')}"
                    ) from None
                if code not in _RETRIABLE:
                    raise ControllerError(
                        code,
                        err.get("message", ""),
                        ControllerError.parse_stream_errors(err.get("stream_errors")),
                    )
                last_error = f"{address}: {code.value} {err.get('message', '')}"
                self._remember_leader(
                    err.get("leader_api") if code == ErrorCode.NOT_CONTROLLER else None
                )
                if self._leader is not None and self._leader != address:
                    continue  # follow the hint at once
                self._view.leader = None
            if time.monotonic() >= deadline:
                raise ControllerUnavailableError(
                    f"no controller leader answered {command} in time (last: {last_error})"
                )
            time.sleep(min(0.05 * (2 ** min(attempt, 5)), 0.5) * (0.5 + random.random()))

    # ------------------------------------------------------------ reads

    def _get(self, path: str, timeout_s: float | None = None, address: str | None = None) -> Any:
        """GET from `address` or from any controller that answers."""
        candidates = (
            [address]
            if address
            else self._ordered(([self._leader] if self._leader else []) + self.addresses)
        )
        last_error = ""
        for addr in dict.fromkeys(candidates):
            try:
                status, data = self._http(
                    addr, "GET", path, None, timeout_s or self.request_timeout_s
                )
            except (OSError, http.client.HTTPException) as exc:
                self._unreachable(addr)
                last_error = f"{addr}: {exc}"
                continue
            if status == 200:
                return data
            err = data.get("error", {}) if isinstance(data, dict) else {}
            raise ControllerError(
                ErrorCode(err.get("code", "INVALID_REQUEST")), err.get("message", f"HTTP {status}")
            )
        raise ControllerUnavailableError(f"no controller reachable for {path} ({last_error})")

    def read_log(
        self,
        after_offset: int,
        max_records: int = 1000,
        wait_ms: int = 0,
        address: str | None = None,
    ) -> dict:
        query = urlencode({"after": after_offset, "max": max_records, "wait_ms": wait_ms})
        return self._get(
            f"/v1/log?{query}", timeout_s=wait_ms / 1000 + self.request_timeout_s, address=address
        )

    def status(self, address: str) -> dict:
        return self._get("/v1/status", address=address)

    def leader_get(self, path: str, timeout_s: float | None = None) -> Any:
        """GET something only the leader can answer: follow NOT_CONTROLLER hints, retry on
        NO_LEADER with a bounded backoff until `timeout_s` (default: the client's), each
        request bounded by what is left of it."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        attempt = 0
        last_error = "no attempt"
        while True:
            address = self._next_address(attempt)
            attempt += 1
            left_s = max(deadline - time.monotonic(), 0.1)
            try:
                status, data = self._http(
                    address, "GET", path, None, min(self.request_timeout_s, left_s)
                )
            except (OSError, http.client.HTTPException) as exc:
                self._unreachable(address)
                last_error = f"{address}: {exc}"
            else:
                if status == 200:
                    self._remember_leader(address)
                    return data
                err = data.get("error", {}) if isinstance(data, dict) else {}
                try:
                    code = ErrorCode(err.get("code", "INVALID_REQUEST"))
                except ValueError:
                    code = ErrorCode.INVALID_REQUEST
                if code not in _RETRIABLE:
                    raise ControllerError(code, err.get("message", f"HTTP {status}"))
                last_error = f"{address}: {code.value} {err.get('message', '')}"
                hint = err.get("leader_api") if code == ErrorCode.NOT_CONTROLLER else None
                self._remember_leader(hint if hint != address else None)
                if self._leader is not None and time.monotonic() < deadline:
                    continue  # follow the hint at once
            if time.monotonic() >= deadline:
                raise ControllerUnavailableError(
                    f"no controller leader answered {path} in time (last: {last_error})"
                )
            time.sleep(min(0.05 * (2 ** min(attempt, 5)), 0.5) * (0.5 + random.random()))

    def balancer_status(self) -> dict:
        """The self-balancer's state, from the leader (see controlplane/balancer.py)."""
        return self.leader_get("/v1/balancer")

    def image(self) -> dict:
        return self._get("/v1/image")

    def stream(self, stream_id: int) -> dict:
        """A stream's metadata (epoch, state, node_id, start_offset, end_offset)."""
        return self._get(f"/v1/streams/{stream_id}")

    def stream_objects(
        self,
        stream_id: int,
        start_offset: int,
        end_offset: int,
        limit: int = 100,
        from_leader: bool = False,
    ) -> list[dict]:
        query = {"start": start_offset, "end": end_offset, "limit": limit}
        if from_leader:
            path = f"/v1/streams/{stream_id}/objects?{urlencode({**query, 'leader': 1})}"
            return self.leader_get(path, timeout_s=LEADER_LOOKUP_TIMEOUT_S)["objects"]
        return self._get(f"/v1/streams/{stream_id}/objects?{urlencode(query)}")["objects"]
