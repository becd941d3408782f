"""The leader's session rule: a broker is fenced when its session expires, and a session
starts at the broker's registration (as this leader first sees it) or its last heartbeat,
never earlier. Found under load: brokers that registered 1.7 s after a leader election were
fenced at once with a 2 s session, because their session was counted from the election."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from controlplane import server
from controlplane.server import ControllerNode


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def leader(brokers: dict[int, int], monkeypatch, timeout_ms: int = 2_000):
    """A stand-in with the fields `_expired_sessions` reads; brokers: node id -> epoch."""
    clock = Clock()
    monkeypatch.setattr(server.time, "monotonic", clock)
    image = SimpleNamespace(
        brokers={
            n: SimpleNamespace(node_id=n, node_epoch=e, fenced=False, fence_reason="")
            for n, e in brokers.items()
        }
    )
    node = SimpleNamespace(
        config=SimpleNamespace(settings=SimpleNamespace(broker_session_timeout_ms=timeout_ms)),
        quorum=SimpleNamespace(machine=SimpleNamespace(image=image)),
        _hb_lock=threading.Lock(),
        _heartbeats={},
        _leader_since=clock.now,
    )
    return node, image, clock


def expired(node) -> list[tuple[int, int]]:
    return ControllerNode._expired_sessions(node)


def test_a_broker_registered_after_the_election_gets_a_full_session(monkeypatch):
    node, image, clock = leader({}, monkeypatch)
    clock.now += 1.7  # the election was 1.7 s ago; now broker 2 registers
    image.brokers[2] = SimpleNamespace(node_id=2, node_epoch=0, fenced=False, fence_reason="")
    assert expired(node) == []
    clock.now += 1.9  # 3.6 s after the election, 1.9 s after the registration
    assert expired(node) == []
    clock.now += 0.2
    assert expired(node) == [(2, 0)]


def test_heartbeats_keep_a_session_and_silence_ends_it(monkeypatch):
    node, _, clock = leader({1: 3}, monkeypatch)
    assert expired(node) == []
    for _ in range(5):
        clock.now += 1.5
        node._heartbeats[1] = (3, clock.now)  # what a heartbeat records
        assert expired(node) == []
    clock.now += 2.1
    assert expired(node) == [(1, 3)]


def test_the_round_after_a_session_expires_runs_when_it_expires(monkeypatch):
    """A silent broker is fenced when its session ends, not up to a lifecycle interval
    (0.5 s) later: its partitions move that much sooner."""
    node, _, clock = leader({1: 3}, monkeypatch)
    node._heartbeats[1] = (3, clock.now)
    clock.now += 1.8
    assert expired(node) == []
    wait_s = ControllerNode._lifecycle_wait_s(node)
    assert abs(wait_s - (0.2 + server.SESSION_EXPIRY_SLACK_S)) < 1e-9
    clock.now += wait_s
    assert expired(node) == [(1, 3)]
    # nothing expires soon (or no round looked): the usual interval
    assert ControllerNode._lifecycle_wait_s(node) == server.LIFECYCLE_INTERVAL_S
    node._heartbeats[1] = (3, clock.now)
    assert expired(node) == []
    assert ControllerNode._lifecycle_wait_s(node) == server.LIFECYCLE_INTERVAL_S


def test_a_new_epoch_starts_a_new_session(monkeypatch):
    node, image, clock = leader({1: 0}, monkeypatch)
    node._heartbeats[1] = (0, clock.now)
    clock.now += 1.9
    image.brokers[1].node_epoch = 1  # re-registered: the old epoch's heartbeat is old
    assert expired(node) == []
    clock.now += 1.9
    assert expired(node) == []
    clock.now += 0.2
    assert expired(node) == [(1, 1)]


def test_a_new_leader_gives_every_broker_a_full_session_from_its_election(monkeypatch):
    """KRaft's rule: session deadlines are not carried over a leader change. A controller
    that led before (its heartbeat times are old) or never saw these brokers fences none of
    them until one full session after it became the leader again."""
    node, _, clock = leader({1: 3, 2: 5}, monkeypatch, timeout_ms=6_000)
    node._heartbeats.update({1: (3, clock.now), 2: (5, clock.now)})  # from its earlier term
    node.node_id, node._upload_stats, node._rates, node._bucket_health = 0, {}, {}, {}
    clock.now += 20  # another controller led meanwhile; this one is elected again now
    ControllerNode._start_leadership(node)
    assert expired(node) == []
    clock.now += 5.9
    assert expired(node) == []
    node._heartbeats[1] = (3, clock.now)  # broker 1 found the new leader; broker 2 did not
    clock.now += 0.2
    assert expired(node) == [(2, 5)]


def test_a_report_made_to_a_new_leader_survives_its_lifecycle_loop_noticing_the_term(
    monkeypatch,
):
    """Found in CI: a heartbeat reached a controller elected a moment earlier, its stats were
    kept, and then the lifecycle loop noticed the new leadership and cleared them. Whoever
    sees a new term first begins it; the same term never begins twice."""
    node, _, clock = leader({1: 3}, monkeypatch)
    term: list[int | None] = [None]
    node.node_id, node._upload_stats, node._rates, node._bucket_health = 0, {}, {}, {}
    node.quorum.leader_term = lambda: term[0]
    node._leading_term, node._leadership_lock = None, threading.Lock()
    node._start_leadership = lambda: ControllerNode._start_leadership(node)

    def observe() -> bool:
        return ControllerNode._observe_leadership(node)

    assert observe() is False
    term[0] = 7  # elected
    assert observe() is True  # a heartbeat's look begins the term ...
    node._upload_stats[1] = {"upload_lag_s": 2.5}  # ... and keeps its report
    assert observe() is True  # the lifecycle loop's look, same term
    assert node._upload_stats == {1: {"upload_lag_s": 2.5}}
    term[0] = None  # lost leadership, then elected again: a new term, a fresh start
    assert observe() is False
    term[0] = 9
    assert observe() is True and node._upload_stats == {}
    node._upload_stats[1] = {"upload_lag_s": 1.0}
    term[0] = 11  # lost and regained between two looks: still a new term
    assert observe() is True and node._upload_stats == {}
