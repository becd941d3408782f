"""Controller decisions for elastic operations: reassignment, controlled shutdown and the
WAL failover of a crashed broker (fencing rules included), on the pure state machine."""

from __future__ import annotations

import json

import pytest

from controlplane.records import StreamState
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from controlplane.wal_failover import plan_failovers
from tests.support.metadata_images import register_broker
from tests.unit.test_metadata_state_machine import NOW, err, ok, prepare, rejected_without_change


def register(sm, node, az, incarnation=None):
    return register_broker(sm, node, az, NOW, incarnation=incarnation)


@pytest.fixture
def sm() -> MetadataStateMachine:
    """Brokers 1 and 2 in az1, broker 3 in az2; topic t with 6 partitions (2 per broker),
    every partition's stream opened by its leader."""
    machine = MetadataStateMachine(ControllerSettings(bucket_ids=[0]))
    register(machine, 1, "az1")
    register(machine, 2, "az1")
    register(machine, 3, "az2")
    ok(machine.execute("create_topic", {"name": "t", "partitions": 6, "topic_id": "tid"}, NOW))
    for p in machine.image.topics["tid"].partitions.values():
        ok(
            machine.execute(
                "open_stream",
                {
                    "node_id": p.leader_node_id,
                    "node_epoch": 0,
                    "stream_id": p.stream_id,
                    "stream_epoch": 0,
                },
                NOW,
            )
        )
    return machine


def leaders(sm) -> dict[int, tuple[int, int]]:
    return {
        p.partition: (p.leader_node_id, p.leader_epoch)
        for p in sm.image.topics["tid"].partitions.values()
    }


def led_by(sm, node) -> list:
    return [p for p in sm.image.topics["tid"].partitions.values() if p.leader_node_id == node]


def close(sm, stream_id, node, epoch=0, node_epoch=0, failover_node_id=None):
    body = {
        "node_id": node,
        "node_epoch": node_epoch,
        "stream_id": stream_id,
        "stream_epoch": epoch,
    }
    if failover_node_id is not None:
        body["failover_node_id"] = failover_node_id
    return sm.execute("close_stream", body, NOW)


# ---------------------------------------------------------------- reassignment


def test_reassignment_moves_leader_with_a_new_epoch_and_needs_the_old_owner_to_close(sm):
    p = led_by(sm, 1)[0]
    res = ok(
        sm.execute(
            "reassign_partitions",
            {"moves": [{"topic": "t", "partition": p.partition, "node_id": 3}]},
            NOW,
        )
    )
    assert res == {"moved": 1, "unchanged": 0}
    assert leaders(sm)[p.partition] == (3, 1)
    # the new leader cannot open while broker 1 still has the stream open (WAL data)
    assert (
        err(
            sm.execute(
                "open_stream",
                {"node_id": 3, "node_epoch": 0, "stream_id": p.stream_id, "stream_epoch": 1},
                NOW,
            )
        )
        == "STREAM_NOT_CLOSED"
    )
    ok(close(sm, p.stream_id, 1))
    ok(
        sm.execute(
            "open_stream",
            {"node_id": 3, "node_epoch": 0, "stream_id": p.stream_id, "stream_epoch": 1},
            NOW,
        )
    )
    stream = sm.image.streams[p.stream_id]
    assert (stream.node_id, stream.epoch, stream.state) == (3, 1, StreamState.OPENED)
    last = json.loads(sm.image.kv["reassignment/last"])
    assert last["moves"] == [{"topic": "t", "partition": p.partition, "node_id": 3}]


def test_bad_reassignment_plans_change_nothing(sm):
    good = {"topic": "t", "partition": 0, "node_id": 3}
    for moves, code in [
        ([{"topic": "nope", "partition": 0, "node_id": 3}], "UNKNOWN_TOPIC"),
        ([good, {"topic": "t", "partition": 99, "node_id": 3}], "INVALID_PARTITIONS"),
        ([good, {"topic": "t", "partition": 1, "node_id": 42}], "UNKNOWN_NODE"),
        ([good, dict(good)], "INVALID_REQUEST"),
        ([{"topic": "t", "partition": -1, "node_id": 3}], "INVALID_REQUEST"),
        ([], "INVALID_REQUEST"),
    ]:
        assert rejected_without_change(sm, "reassign_partitions", {"moves": moves}) == code
    ok(sm.execute("fence_broker", {"node_id": 3, "node_epoch": 0, "reason": "test"}, NOW))
    assert (
        rejected_without_change(
            sm, "reassign_partitions", {"moves": [{"topic": "t", "partition": 0, "node_id": 3}]}
        )
        == "NODE_FENCED"
    )


# ---------------------------------------------------------------- controlled shutdown


def test_controlled_shutdown_moves_partitions_to_the_same_az_first(sm):
    mine = {p.partition for p in led_by(sm, 1)}
    res = ok(sm.execute("controlled_shutdown", {"node_id": 1, "node_epoch": 0}, NOW))
    assert res == {"moved": 2, "remaining": 0}
    assert sm.image.brokers[1].shutting_down and not sm.image.brokers[1].fenced
    for partition in mine:
        assert leaders(sm)[partition] == (2, 1)  # broker 2 shares az1
    # a shutting-down broker gets no new partitions, but may still close its streams
    ok(sm.execute("create_partitions", {"name": "t", "total_count": 8}, NOW))
    assert not led_by(sm, 1)
    for p in sm.image.topics["tid"].partitions.values():
        if p.partition in mine:
            ok(close(sm, p.stream_id, 1))


def test_controlled_shutdown_of_the_last_broker_keeps_its_partitions():
    machine = MetadataStateMachine(ControllerSettings(bucket_ids=[0]))
    register(machine, 1, "az1")
    ok(machine.execute("create_topic", {"name": "t", "partitions": 2, "topic_id": "tid"}, NOW))
    res = ok(machine.execute("controlled_shutdown", {"node_id": 1, "node_epoch": 0}, NOW))
    assert res == {"moved": 0, "remaining": 2}


# ---------------------------------------------------------------- crash failover


def expire(sm, node, epoch=0):
    return ok(sm.execute("lifecycle_tick", {"expired_brokers": [[node, epoch]]}, NOW))


def test_session_expiry_moves_partitions_and_starts_wal_failover(sm):
    mine = led_by(sm, 1)
    expire(sm, 1)
    assert sm.image.brokers[1].fenced
    wal = sm.image.node_wals[1]
    assert wal.failover_mode and wal.failover_target_node_id == 2  # same AZ
    assert wal.node_epoch == 1  # greater than any epoch node 1 wrote with
    for p in mine:
        assert leaders(sm)[p.partition][1] == 1 and leaders(sm)[p.partition][0] != 1
    # the new leader waits for the failover to close the stream
    p = mine[0]
    new_leader = leaders(sm)[p.partition][0]
    assert (
        err(
            sm.execute(
                "open_stream",
                {
                    "node_id": new_leader,
                    "node_epoch": 0,
                    "stream_id": p.stream_id,
                    "stream_epoch": 1,
                },
                NOW,
            )
        )
        == "STREAM_NOT_CLOSED"
    )
    # nothing more to plan until something changes
    assert plan_failovers(sm.image) == []


def test_failover_target_commits_and_closes_for_the_failed_node_then_completes(sm):
    mine = led_by(sm, 1)
    expire(sm, 1)
    p = mine[0]
    oid = prepare(sm, node=2)
    body = {
        "node_id": 2,
        "node_epoch": 0,
        "object_id": oid,
        "order_id": 7,
        "size_bytes": 10,
        "bucket_id": 0,
        "failover_node_id": 1,
        "stream_ranges": [
            {"stream_id": p.stream_id, "stream_epoch": 0, "start_offset": 0, "end_offset": 5}
        ],
    }
    # the fenced node itself can no longer commit; a non-target cannot act for it
    assert (
        rejected_without_change(
            sm, "commit_stream_set_object", {**body, "node_id": 1, "failover_node_id": None}
        )
        == "NODE_FENCED"
    )
    assert (
        rejected_without_change(sm, "commit_stream_set_object", {**body, "node_id": 3})
        == "NOT_FAILOVER_TARGET"
    )
    ok(sm.execute("commit_stream_set_object", body, NOW))
    assert sm.image.streams[p.stream_id].end_offset == 5
    assert sm.image.stream_set_objects[oid].node_id == 1
    # retried commit is idempotent
    assert ok(sm.execute("commit_stream_set_object", body, NOW)) == {"idempotent": True}
    complete = {"node_id": 2, "node_epoch": 0, "failed_node_id": 1, "failover_epoch": 1}
    assert rejected_without_change(sm, "complete_wal_failover", complete) == "STREAM_NOT_CLOSED"
    assert err(close(sm, p.stream_id, 3, failover_node_id=1)) == "NOT_FAILOVER_TARGET"
    for q in mine:
        ok(close(sm, q.stream_id, 2, failover_node_id=1))
    assert (
        rejected_without_change(sm, "complete_wal_failover", {**complete, "failover_epoch": 0})
        == "NOT_FAILOVER_TARGET"
    )
    ok(sm.execute("complete_wal_failover", complete, NOW))
    assert not sm.image.node_wals[1].failover_mode
    # the new leader opens with the new epoch at the committed end
    new_leader = leaders(sm)[p.partition][0]
    res = ok(
        sm.execute(
            "open_stream",
            {"node_id": new_leader, "node_epoch": 0, "stream_id": p.stream_id, "stream_epoch": 1},
            NOW,
        )
    )
    assert res["next_offset"] == 5
    # and the failed node may register again, with an epoch above the failover epoch
    assert register(sm, 1, "az1", incarnation="again") == 2


def test_failed_node_cannot_register_during_failover_unless_the_target_is_down(sm):
    expire(sm, 1)
    assert (
        rejected_without_change(
            sm,
            "register_broker",
            {
                "node_id": 1,
                "az": "az1",
                "host": "h",
                "kafka_port": 1,
                "incarnation_id": "back",
                "wal_uri": "file:///wal/1",
            },
        )
        == "WAL_FAILOVER_IN_PROGRESS"
    )
    # the target dies too: another one is chosen with a greater failover epoch
    expire(sm, 2)
    wal = sm.image.node_wals[1]
    assert wal.failover_mode and wal.failover_target_node_id == 3 and wal.node_epoch == 2
    # the old target's commits on the failed node's behalf are refused from now on
    assert rejected_without_change(
        sm,
        "close_stream",
        {
            "node_id": 2,
            "node_epoch": 0,
            "stream_id": led_by(sm, 3)[0].stream_id,
            "stream_epoch": 0,
            "failover_node_id": 1,
        },
    ) in ("NODE_FENCED", "NOT_FAILOVER_TARGET")
    # the last broker dies: node 1 comes back and recovers its own WAL
    expire(sm, 3)
    epoch = register(sm, 1, "az1", incarnation="back")
    assert epoch > 2 and not sm.image.node_wals[1].failover_mode


def test_a_restarted_failover_target_gets_a_new_failover_epoch(sm):
    expire(sm, 1)
    assert sm.image.node_wals[1].node_epoch == 1
    register(sm, 2, "az1", incarnation="restarted")
    wal = sm.image.node_wals[1]
    assert wal.failover_target_node_id == 2 and wal.node_epoch == 2


def test_fencing_a_broker_without_open_streams_starts_no_failover(sm):
    for p in led_by(sm, 1):
        ok(close(sm, p.stream_id, 1))
    ok(
        sm.execute(
            "fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "controlled shutdown"}, NOW
        )
    )
    assert not sm.image.node_wals[1].failover_mode
    assert not led_by(sm, 1)  # its partitions still moved


def test_an_orphan_close_is_refused_while_the_partition_is_still_led_with_that_epoch(sm):
    p = led_by(sm, 1)[0]
    body = {
        "node_id": 1,
        "node_epoch": 0,
        "stream_id": p.stream_id,
        "stream_epoch": 0,
        "orphaned_only": True,
    }
    # a broker mid-replay may think it no longer leads the partition: the controller knows
    assert rejected_without_change(sm, "close_stream", body) == "STREAM_IN_USE"
    ok(
        sm.execute(
            "reassign_partitions",
            {"moves": [{"topic": "t", "partition": p.partition, "node_id": 2}]},
            NOW,
        )
    )
    ok(sm.execute("close_stream", body, NOW))
