"""A broker no controller answers for a session fences itself (`ControllerLease`): it stops
serving once one session passed since the last answered heartbeat was *sent*, its client
connections are closed and new ones refused, and it serves again once a controller
answers."""

from __future__ import annotations

import socket
import struct
import time

from dataplane.broker.lease import ControllerLease
from dataplane.kafka.registry import ApiRegistry
from dataplane.kafka.server import KafkaServerThread


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease_with_events() -> tuple[ControllerLease, Clock, list[str]]:
    clock, events = Clock(), []
    lease = ControllerLease(lambda: events.append("lost"), lambda: events.append("regained"), clock)
    return lease, clock, events


def test_no_lease_before_the_first_answer_holds_nothing_back():
    lease, clock, events = lease_with_events()
    clock.now += 1000
    lease.tick()
    assert lease.holds() and events == []


def test_a_session_without_an_answer_fences_the_broker_until_one_comes():
    lease, clock, events = lease_with_events()
    lease.renewed(clock.now - 0.2, 6000)  # sent 0.2 s ago, answered now
    clock.now += 5.7
    lease.tick()
    assert lease.holds() and events == []
    clock.now += 0.2  # one session after the heartbeat was sent, not received
    assert not lease.holds()  # at once, before the watch ticks
    lease.tick()
    lease.tick()
    assert events == ["lost"]  # told once
    lease.renewed(clock.now - 10, 6000)  # an old heartbeat's late answer proves nothing
    assert not lease.holds()
    lease.renewed(clock.now - 0.1, 6000)
    assert lease.holds() and events == ["lost", "regained"]


def test_regular_answers_keep_the_lease():
    lease, clock, events = lease_with_events()
    for _ in range(50):
        lease.renewed(clock.now, 6000)
        clock.now += 1.0
        lease.tick()
    assert lease.holds() and events == []


def _api_versions_answered(port: int) -> bool:
    body = struct.pack(">hhih", 18, 0, 1, 5) + b"probe"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        try:
            return bool(s.recv(4))
        except ConnectionError:
            return False


def test_a_self_fenced_broker_closes_client_connections_and_refuses_new_ones():
    holds = [True]
    server = KafkaServerThread(ApiRegistry(), accepting=lambda: holds[0])
    server.start()
    try:
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        deadline = time.monotonic() + 5
        while server.server.connection_count < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.server.connection_count == 1
        holds[0] = False
        server.close_connections("self-fenced")
        idle.settimeout(5)
        try:
            assert idle.recv(1) == b""  # closed by the broker
        except ConnectionError:
            pass
        idle.close()
        assert not _api_versions_answered(server.port)
        holds[0] = True
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as again:
            deadline = time.monotonic() + 5
            while server.server.connection_count < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert server.server.connection_count == 1
            again.close()
    finally:
        server.stop()
