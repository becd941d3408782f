"""Route epochs in the metadata quorum (controlplane/route_epochs.py): the leader's bump,
conditional on the epoch it expects, and when it is due."""

from __future__ import annotations

from controlplane.route_epochs import bump_due, committed_epoch
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from tests.unit.zone_images import register_brokers


def test_bump_fences_the_previous_epoch_and_a_retry_does_not_bump_twice():
    sm = MetadataStateMachine(ControllerSettings())
    epochs = sm.image.route_epoch
    assert (epochs.current_epoch, epochs.fenced_epoch) == (0, -1)
    out = sm.execute("bump_route_epoch", {"expected_current_epoch": 0}, now_ms=1)
    assert out["result"] == {"current_epoch": 1, "bumped": True}
    assert (sm.image.route_epoch.current_epoch, sm.image.route_epoch.fenced_epoch) == (1, 0)
    # the same command again (a retry) changes nothing
    offset = sm.next_offset
    out = sm.execute("bump_route_epoch", {"expected_current_epoch": 0}, now_ms=2)
    assert out["result"] == {"current_epoch": 1, "bumped": False}
    assert sm.next_offset == offset and sm.image.route_epoch.current_epoch == 1
    sm.execute("bump_route_epoch", {"expected_current_epoch": 1}, now_ms=3)
    assert (sm.image.route_epoch.current_epoch, sm.image.route_epoch.fenced_epoch) == (2, 1)
    # a bad body is refused and changes nothing
    out = sm.execute("bump_route_epoch", {"expected_current_epoch": -5}, now_ms=4)
    assert "error" in out and sm.image.route_epoch.current_epoch == 2


def test_bump_is_due_every_interval_once_brokers_exist():
    sm = MetadataStateMachine(ControllerSettings())
    assert not bump_due(sm.image, None, 0, 10_000)  # no broker yet
    sm.execute(
        "register_broker",
        {
            "node_id": 1,
            "az": "az1",
            "host": "127.0.0.1",
            "kafka_port": 9001,
            "incarnation_id": "i1",
            "wal_uri": "file:///tmp/w",
        },
        now_ms=0,
    )
    assert bump_due(sm.image, None, 5, 10_000)  # a new leader bumps at once
    assert not bump_due(sm.image, 0, 9_999, 10_000)
    assert bump_due(sm.image, 0, 10_000, 10_000)
    assert not bump_due(sm.image, 0, 10**9, 0)  # 0: never


def test_committed_epoch_is_the_minimum_persisted_and_only_advances():
    sm = MetadataStateMachine(ControllerSettings())
    register_brokers(sm, (1, 2), kafka_port=9001)
    assert committed_epoch(sm.image, {1: 4}) is None  # broker 2 has not reported
    assert committed_epoch(sm.image, {1: 4, 2: 2}) == 2
    # a fenced broker with no open stream no longer counts
    sm.execute("fence_broker", {"node_id": 2, "node_epoch": 0, "reason": "test"}, now_ms=1)
    assert committed_epoch(sm.image, {1: 4, 2: None}) == 4
    for expected, committed in ((0, 0), (1, -1), (2, 1), (3, 9)):
        sm.execute(
            "bump_route_epoch",
            {"expected_current_epoch": expected, "committed_epoch": committed},
            now_ms=2,
        )
    epochs = sm.image.route_epoch
    # never backwards (the -1 of a new leader), never past what the bump fences
    assert (epochs.current_epoch, epochs.fenced_epoch, epochs.committed_epoch) == (4, 3, 3)
