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

import pytest

from controlplane.client import ControllerClient


class Controller:
    """An HTTP stand-in for one controller: answers every POST with `answer()`."""

    def __init__(self, answer):
        outer = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
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


def test_no_attempt_outlasts_the_calls_deadline(lost):
    client = ControllerClient([lost], timeout_s=0.6, request_timeout_s=10.0)
    started = time.monotonic()
    with pytest.raises(Exception, match="no controller leader answered"):
        client.call("broker_heartbeat", {})
    assert time.monotonic() - started < 3.0
