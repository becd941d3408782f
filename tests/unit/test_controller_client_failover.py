"""`ControllerClient` when the controller leader's host is lost: each attempt is bounded
(a broker's heartbeat by a quarter of its session), the other controllers are tried in turn,
a follower's leader hint is followed at once, and the lost controller is tried last
afterwards instead of being waited on again."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from controlplane.client import ControllerClient


class Controller:
    """An HTTP stand-in for one controller: answers every POST with `answer()`, and a GET of
    the metadata log with `log(wait_ms)`."""

    def __init__(self, answer, log=lambda wait_ms: {"records": [], "next_offset": 0}):
        outer = self
        self.requests = 0
        self.log_reads = 0

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                outer.log_reads += 1
                wait_ms = int(parse_qs(urlparse(self.path).query)["wait_ms"][0])
                body = json.dumps(log(wait_ms)).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                body = json.dumps(answer()).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def lost() -> Iterator[str]:
    """A controller whose host is gone: connections are taken but never answered."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield f"127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_a_heartbeat_finds_the_new_leader_well_within_the_session(lost):
    new_leader = Controller(lambda: {"result": {"fenced": False}})
    follower = Controller(
        lambda: {"error": {"code": "NOT_CONTROLLER", "leader_api": new_leader.address}}
    )
    try:
        session_s = 6.0
        main = ControllerClient([lost, follower.address, new_leader.address])
        main._remember_leader(lost)  # it was the leader a moment ago
        client = main.with_timeouts(timeout_s=session_s / 2, request_timeout_s=session_s / 4)
        started = time.monotonic()
        assert client.call("broker_heartbeat", {}) == {"fenced": False}
        first_s = time.monotonic() - started
        assert first_s < session_s / 4 + 1.0  # one bounded attempt on the lost one
        assert follower.requests == 1  # its hint was followed at once
        started = time.monotonic()
        for _ in range(3):
            client.call("broker_heartbeat", {})
        assert time.monotonic() - started < 1.0  # the new leader is remembered
        # the broker's main client (10 s per attempt) learnt from the heartbeats' one: it
        # does not wait on the lost leader it remembers
        started = time.monotonic()
        main.call("commit", {})
        assert time.monotonic() - started < 1.0
        # a client that lost its leader memory tries the lost controller last
        fresh = client.with_timeouts(timeout_s=3.0, request_timeout_s=1.5)
        fresh._remember_leader(None)
        started = time.monotonic()
        fresh.call("broker_heartbeat", {})
        assert time.monotonic() - started < 1.0
    finally:
        new_leader.close()
        follower.close()


def test_metadata_long_polls_go_to_the_leader_the_heartbeats_found():
    """A broker's metadata client, made before any leader was known, long-polls the leader
    its heartbeats found, not the first controller listed: one cut off from the quorum
    would hold the broker's metadata (a failover it must run) until the poll timed out."""

    def held(wait_ms: int) -> dict:  # a controller that learns nothing new: the poll waits
        time.sleep(wait_ms / 1000)
        return {"records": [], "next_offset": 0}

    leader = Controller(
        lambda: {"result": {"fenced": False}},
        lambda wait_ms: {"records": [], "next_offset": 8},
    )
    cut_off = Controller(
        lambda: {"error": {"code": "NOT_CONTROLLER", "leader_api": leader.address}}, held
    )
    try:
        main = ControllerClient([cut_off.address, leader.address])
        metadata = main.with_timeouts(timeout_s=15.0, request_timeout_s=3.0)
        heartbeats = main.with_timeouts(timeout_s=3.0, request_timeout_s=1.5)
        assert heartbeats.call("broker_heartbeat", {}) == {"fenced": False}
        started = time.monotonic()
        assert metadata.read_log(7, wait_ms=3_000)["next_offset"] == 8
        assert time.monotonic() - started < 1.0
        assert cut_off.log_reads == 0 and leader.log_reads == 1
    finally:
        leader.close()
        cut_off.close()


def test_no_attempt_outlasts_the_calls_deadline(lost):
    client = ControllerClient([lost], timeout_s=0.6, request_timeout_s=10.0)
    started = time.monotonic()
    with pytest.raises(Exception, match="no controller leader answered"):
        client.call("broker_heartbeat", {})
    assert time.monotonic() - started < 3.0
