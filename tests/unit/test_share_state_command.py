"""`put_share_state` (controlplane/share_state.py): only a partition's current leader, at its
leader epoch, stores or loads a share-partition's state; after a move the old leader's
writes are refused and the new leader loads what the old one stored last."""

from __future__ import annotations

import pytest

from controlplane.settings import ControllerSettings
from controlplane.share_state import share_state_key
from controlplane.state_machine import MetadataStateMachine

NOW = 1_000_000


def ok(result: dict) -> dict:
    assert "error" not in result, result
    return result["result"]


def err(result: dict) -> str:
    assert "error" in result, result
    return result["error"]["code"]


@pytest.fixture
def sm() -> MetadataStateMachine:
    machine = MetadataStateMachine(ControllerSettings(bucket_ids=[0, 1]))
    for node in (1, 2):
        ok(
            machine.execute(
                "register_broker",
                {
                    "node_id": node,
                    "az": f"az{node}",
                    "host": "127.0.0.1",
                    "kafka_port": 9000 + node,
                    "incarnation_id": f"inc-{node}",
                },
                NOW,
            )
        )
        ok(machine.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0}, NOW))
    ok(machine.execute("create_topic", {"name": "t", "partitions": 1, "topic_id": "tid"}, NOW))
    return machine


def put(sm, node: int, epoch: int, value: str | None = None, load: bool = False) -> dict:
    return sm.execute(
        "put_share_state",
        {
            "node_id": node,
            "node_epoch": 0,
            "group_id": "g",
            "topic_id": "tid",
            "partition": 0,
            "leader_epoch": epoch,
            "load": load,
            "value": value,
        },
        NOW,
    )


def test_only_the_leader_at_its_epoch_writes_and_a_move_fences_it(sm):
    part = sm.image.topics["tid"].partitions[0]
    leader, other, epoch = part.leader_node_id, 3 - part.leader_node_id, part.leader_epoch
    assert ok(put(sm, leader, epoch, load=True)) == {"value": None}
    ok(put(sm, leader, epoch, '{"v":1,"start":7,"runs":[]}'))
    assert err(put(sm, other, epoch, "x")) == "NOT_PARTITION_LEADER"
    assert err(put(sm, leader, epoch + 1, "x")) == "NOT_PARTITION_LEADER"
    ok(
        sm.execute(
            "reassign_partitions",
            {"moves": [{"topic": "t", "partition": 0, "node_id": other}]},
            NOW,
        )
    )
    moved = sm.image.topics["tid"].partitions[0]
    assert moved.leader_node_id == other and moved.leader_epoch > epoch
    # the old leader's late write is refused; the new one loads what was stored
    assert err(put(sm, leader, epoch, '{"v":1,"start":0,"runs":[]}')) == "NOT_PARTITION_LEADER"
    loaded = ok(put(sm, other, moved.leader_epoch, load=True))
    assert loaded == {"value": '{"v":1,"start":7,"runs":[]}'}
    assert sm.image.kv[share_state_key("g", "tid", 0)] == loaded["value"]


def test_unknown_partitions_and_bad_requests_change_nothing(sm):
    before = sm.image.fingerprint()
    body = {"node_id": 1, "node_epoch": 0, "group_id": "g", "topic_id": "nope"}
    assert err(sm.execute("put_share_state", {**body, "partition": 0, "leader_epoch": 0}, NOW)) == (
        "UNKNOWN_TOPIC"
    )
    assert err(sm.execute("put_share_state", {**body, "partition": -1, "leader_epoch": 0}, NOW))
    assert sm.image.fingerprint() == before


def test_deleting_a_topic_forgets_its_share_partitions(sm):
    part = sm.image.topics["tid"].partitions[0]
    ok(put(sm, part.leader_node_id, part.leader_epoch, '{"v":1,"start":3,"runs":[]}'))
    ok(sm.execute("create_topic", {"name": "u", "partitions": 1, "topic_id": "uid"}, NOW))
    other = sm.image.topics["uid"].partitions[0]
    body = {
        "node_id": other.leader_node_id,
        "node_epoch": 0,
        "group_id": "g/with/slashes",
        "topic_id": "uid",
        "partition": 0,
        "leader_epoch": other.leader_epoch,
        "value": "{}",
    }
    ok(sm.execute("put_share_state", body, NOW))
    ok(sm.execute("delete_topic", {"name": "t"}, NOW))
    assert share_state_key("g", "tid", 0) not in sm.image.kv
    assert share_state_key("g/with/slashes", "uid", 0) in sm.image.kv


def test_deleting_a_share_group_removes_its_state_and_a_stale_leader_cannot_restore_it(sm):
    """DeleteGroups of a share group: its coordinator (only it, at its slot epoch) deletes
    every stored share-partition state of the group, no other group's; a leader that still
    holds the state loaded stores with must_exist and is refused (it reloads a fresh state)
    instead of bringing the deleted state back."""
    from controlplane.coordinators import slot_of

    part = sm.image.topics["tid"].partitions[0]
    leader, epoch = part.leader_node_id, part.leader_epoch
    ok(put(sm, leader, epoch, '{"v":1,"start":7,"runs":[]}'))
    other_group = dict(
        node_id=leader, node_epoch=0, group_id="h", topic_id="tid", partition=0, leader_epoch=epoch
    )
    ok(sm.execute("put_share_state", {**other_group, "value": "{}"}, NOW))
    slot = sm.image.coordinator_slots[slot_of(sm.image, "g")]
    owner, not_owner = slot.node_id, 3 - slot.node_id

    def delete(node: int, coordinator_epoch: int) -> dict:
        return sm.execute(
            "delete_share_group_state",
            {
                "node_id": node,
                "node_epoch": 0,
                "group_id": "g",
                "coordinator_epoch": coordinator_epoch,
            },
            NOW,
        )

    assert err(delete(not_owner, slot.epoch)) == "NOT_COORDINATOR"
    assert err(delete(owner, slot.epoch + 1)) == "NOT_COORDINATOR"
    assert share_state_key("g", "tid", 0) in sm.image.kv  # nothing changed
    assert ok(delete(owner, slot.epoch)) == {"deleted": 1}
    assert share_state_key("g", "tid", 0) not in sm.image.kv
    assert share_state_key("h", "tid", 0) in sm.image.kv  # another group's state stays
    stale = sm.execute(
        "put_share_state",
        {**other_group, "group_id": "g", "value": '{"v":1,"start":9}', "must_exist": True},
        NOW,
    )
    assert err(stale) == "NOT_PARTITION_LEADER"
    assert share_state_key("g", "tid", 0) not in sm.image.kv
    # a fresh start (no must_exist: the first store of a load) is accepted
    ok(sm.execute("put_share_state", {**other_group, "group_id": "g", "value": "{}"}, NOW))
    assert ok(delete(owner, slot.epoch)) == {"deleted": 1}
    assert ok(delete(owner, slot.epoch)) == {"deleted": 0}  # deleting again: nothing left


def test_deleting_a_share_groups_offsets_of_some_topics_keeps_the_others(sm):
    """DeleteShareGroupOffsets: the coordinator deletes the group's stored states of the
    named topics only (the other topics' and other groups' stay)."""
    from controlplane.coordinators import slot_of

    ok(sm.execute("create_topic", {"name": "u", "partitions": 2, "topic_id": "uid"}, NOW))
    for topic_id, partition in (("tid", 0), ("uid", 0), ("uid", 1)):
        part = sm.image.topics[topic_id].partitions[partition]
        for group in ("g", "h"):
            body = {
                "node_id": part.leader_node_id,
                "node_epoch": 0,
                "group_id": group,
                "topic_id": topic_id,
                "partition": partition,
                "leader_epoch": part.leader_epoch,
                "value": '{"v":1,"start":1,"runs":[]}',
            }
            ok(sm.execute("put_share_state", body, NOW))
    slot = sm.image.coordinator_slots[slot_of(sm.image, "g")]
    body = {
        "node_id": slot.node_id,
        "node_epoch": 0,
        "group_id": "g",
        "coordinator_epoch": slot.epoch,
        "topic_ids": ["uid"],
    }
    assert ok(sm.execute("delete_share_group_state", body, NOW)) == {"deleted": 2}
    kv = sm.image.kv
    assert share_state_key("g", "tid", 0) in kv
    assert share_state_key("g", "uid", 0) not in kv and share_state_key("g", "uid", 1) not in kv
    assert share_state_key("h", "uid", 0) in kv and share_state_key("h", "uid", 1) in kv


def test_altering_a_share_groups_offsets_bumps_the_state_epoch_and_fences_stale_leaders(sm):
    """AlterShareGroupOffsets: the coordinator (only it) replaces states at state epoch + 1
    (all or nothing: an unknown partition changes nothing); a leader's write naming the
    state epoch it loaded before the alter is refused (it reloads); one naming the new
    epoch is accepted. Entries stored without a state epoch read as epoch 0."""
    import json

    from controlplane.coordinators import slot_of

    part = sm.image.topics["tid"].partitions[0]
    leader, epoch = part.leader_node_id, part.leader_epoch
    ok(put(sm, leader, epoch, '{"v":1,"start":7,"runs":[[7,9,0,1]]}'))  # epoch 0 (absent)
    slot = sm.image.coordinator_slots[slot_of(sm.image, "g")]
    key = share_state_key("g", "tid", 0)

    def alter(node: int, states: list, coordinator_epoch: int = slot.epoch) -> dict:
        body = {
            "node_id": node,
            "node_epoch": 0,
            "group_id": "g",
            "coordinator_epoch": coordinator_epoch,
            "states": states,
        }
        return sm.execute("alter_share_group_state", body, NOW)

    new = {"topic_id": "tid", "partition": 0, "value": '{"v":1,"start":3,"runs":[]}'}
    before = sm.image.fingerprint()
    assert err(alter(3 - slot.node_id, [new])) == "NOT_COORDINATOR"
    assert err(alter(slot.node_id, [new], slot.epoch + 1)) == "NOT_COORDINATOR"
    gone = {**new, "partition": 5}
    assert err(alter(slot.node_id, [new, gone])) == "UNKNOWN_TOPIC"
    assert err(alter(slot.node_id, [{**new, "value": "[1]"}])) == "INVALID_REQUEST"
    assert sm.image.fingerprint() == before  # nothing changed
    assert ok(alter(slot.node_id, [new])) == {"altered": 1}
    assert json.loads(sm.image.kv[key]) == {"v": 1, "start": 3, "runs": [], "state_epoch": 1}
    # the leader loaded epoch 0 before the alter: its write-back is refused
    stale = sm.execute(
        "put_share_state",
        {
            "node_id": leader,
            "node_epoch": 0,
            "group_id": "g",
            "topic_id": "tid",
            "partition": 0,
            "leader_epoch": epoch,
            "value": '{"v":1,"start":10,"runs":[]}',
            "must_exist": True,
        },
        NOW,
    )
    assert err(stale) == "NOT_PARTITION_LEADER"
    assert json.loads(sm.image.kv[key])["start"] == 3
    reloaded = sm.execute(
        "put_share_state",
        {
            "node_id": leader,
            "node_epoch": 0,
            "group_id": "g",
            "topic_id": "tid",
            "partition": 0,
            "leader_epoch": epoch,
            "value": '{"v":1,"start":4,"runs":[],"state_epoch":1}',
            "must_exist": True,
            "state_epoch": 1,
        },
        NOW,
    )
    ok(reloaded)
    assert ok(alter(slot.node_id, [new])) == {"altered": 1}
    assert json.loads(sm.image.kv[key])["state_epoch"] == 2
    # a partition never read by the group: stored at epoch 1
    ok(sm.execute("create_topic", {"name": "u", "partitions": 1, "topic_id": "uid"}, NOW))
    assert ok(alter(slot.node_id, [{**new, "topic_id": "uid"}])) == {"altered": 1}
    assert json.loads(sm.image.kv[share_state_key("g", "uid", 0)])["state_epoch"] == 1
