"""Partitions have an explicit kind (leader or erasure), and metadata written before they had
one reads as the right kind: log records, JSON image snapshots (a controller's `read_log`)
and pickled images (pysyncobj snapshots).

The fixtures were written by the code before partitions had a kind (commit 98a38e5): an image
with topic `led` (partition 0 led by broker 1, leader epoch 3) and topic `coded` (partition 0
erasure-coded: leader -1, shard stores 1..6), as JSON (`model_dump_json`) and pickled.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from pydantic import ValidationError

from controlplane import records as r
from controlplane.image import MetadataImage, PartitionState
from controlplane.records import PartitionKind, decode_record
from controlplane.state_machine import MetadataStateMachine
from dataplane.broker.metadata import MetadataFollower

FIXTURES = Path(__file__).parent / "fixtures"
OLD_IMAGE_JSON = FIXTURES / "metadata_image_before_partition_kind.json"
OLD_IMAGE_PICKLE = FIXTURES / "metadata_image_before_partition_kind.pickle"

# partition records as the metadata log held them before partitions had a kind
OLD_LED_RECORD = (
    '{"type":"partition","topic_id":"t-led","partition":1,"leader_node_id":2,'
    '"leader_epoch":0,"stream_id":2,"shard_stores":[]}'
)
OLD_ERASURE_RECORD = (
    '{"type":"partition","topic_id":"t-ec","partition":1,"leader_node_id":-1,'
    '"leader_epoch":0,"stream_id":3,"shard_stores":[2,3,4,5,6,1]}'
)


def _assert_old_partitions(image: MetadataImage) -> None:
    led = image.topic_by_name("led").partitions[0]
    coded = image.topic_by_name("coded").partitions[0]
    assert (led.kind, led.erasure_coded, led.leader_node_id, led.leader_epoch) == (
        PartitionKind.LEADER,
        False,
        1,
        3,
    )
    assert (coded.kind, coded.erasure_coded, coded.shard_stores) == (
        PartitionKind.ERASURE,
        True,
        [1, 2, 3, 4, 5, 6],
    )


def test_old_log_records_read_as_their_kind() -> None:
    led, coded = decode_record(OLD_LED_RECORD), decode_record(OLD_ERASURE_RECORD)
    assert led.kind is PartitionKind.LEADER
    assert coded.kind is PartitionKind.ERASURE
    # parsed dicts too (a follower gets the log as JSON objects)
    assert decode_record(json.loads(OLD_ERASURE_RECORD)).kind is PartitionKind.ERASURE
    # re-encoded, the kind is written
    assert json.loads(r.encode_record(coded))["kind"] == "erasure"


def test_old_records_applied_to_an_old_snapshot() -> None:
    image = MetadataImage.model_validate(json.loads(OLD_IMAGE_JSON.read_text()))
    _assert_old_partitions(image)
    image, _delta = image.with_records(
        [(decode_record(OLD_LED_RECORD), 6), (decode_record(OLD_ERASURE_RECORD), 7)]
    )
    _assert_old_partitions(image)
    assert image.topic_by_name("led").partitions[1].kind is PartitionKind.LEADER
    coded = image.topic_by_name("coded").partitions[1]
    assert coded.kind is PartitionKind.ERASURE and coded.shard_stores == [2, 3, 4, 5, 6, 1]


def test_old_pickled_snapshot_loads_with_kinds() -> None:
    """pysyncobj snapshots pickle the state machine; unpickling sets fields unvalidated."""
    image = pickle.loads(OLD_IMAGE_PICKLE.read_bytes())
    _assert_old_partitions(image)
    # the loaded image keeps working: copy on write, JSON, pickling again
    moved = r.PartitionRecord(
        topic_id="t-led",
        partition=0,
        kind=PartitionKind.LEADER,
        leader_node_id=2,
        leader_epoch=4,
        stream_id=0,
    )
    newer, _delta = image.with_records([(moved, 6)])
    assert newer.topic_by_name("led").partitions[0].leader_node_id == 2
    _assert_old_partitions(image)
    again = pickle.loads(pickle.dumps(image))
    assert again.fingerprint() == image.fingerprint()
    dumped = json.loads(image.model_dump_json())
    kinds = {t["name"]: t["partitions"]["0"]["kind"] for t in dumped["topics"].values()}
    assert kinds == {"led": "leader", "coded": "erasure"}


def test_old_pickled_snapshot_reaches_brokers_with_kinds() -> None:
    """A controller restarted from an old snapshot sends brokers an image with kinds."""
    machine = MetadataStateMachine()
    machine.image = pickle.loads(OLD_IMAGE_PICKLE.read_bytes())
    machine.log, machine.log_start_offset, machine.next_offset = [OLD_LED_RECORD], 6, 7
    machine = pickle.loads(pickle.dumps(machine))
    answer = machine.read_log(-1)
    image = MetadataImage.model_validate(answer["snapshot"])
    _assert_old_partitions(image)
    tail = machine.read_log(5)["records"]
    assert decode_record(tail[0]["record"]).kind is PartitionKind.LEADER


class _OldController:
    """Answers `read_log` as a controller before partitions had a kind: its snapshot, then
    one old record."""

    def read_log(self, after_offset: int, max_records: int, wait_ms: int) -> dict:
        return {
            "snapshot": json.loads(OLD_IMAGE_JSON.read_text()),
            "snapshot_offset": 5,
            "records": [{"offset": 6, "record": json.loads(OLD_ERASURE_RECORD)}],
            "next_offset": 7,
        }


def test_broker_follows_an_old_controller() -> None:
    follower = MetadataFollower(_OldController())  # type: ignore[arg-type]
    assert follower.poll_once() == 1
    _assert_old_partitions(follower.image)
    assert follower.image.topic_by_name("coded").partitions[1].erasure_coded


def test_old_leaderless_partition_without_shard_stores_keeps_a_leader_kind() -> None:
    """Before kinds, code tested shard_stores: a partition without them was led."""
    old = OLD_LED_RECORD.replace('"leader_node_id":2', '"leader_node_id":-1')
    assert decode_record(old).kind is PartitionKind.LEADER


@pytest.mark.parametrize(
    ("kind", "leader", "stores"),
    [
        (PartitionKind.ERASURE, r.NO_LEADER, []),  # erasure-coded without shard stores
        (PartitionKind.ERASURE, 1, [1, 2, 3]),  # erasure-coded with a leader
        (PartitionKind.LEADER, 1, [1, 2, 3]),  # led with shard stores
    ],
)
def test_placement_must_fit_the_kind(kind: PartitionKind, leader: int, stores: list[int]) -> None:
    fields = {
        "partition": 0,
        "kind": kind,
        "leader_node_id": leader,
        "leader_epoch": 0,
        "stream_id": 0,
        "shard_stores": stores,
    }
    with pytest.raises(ValidationError, match="partition"):
        r.PartitionRecord(topic_id="t", **fields)
    with pytest.raises(ValidationError, match="partition"):
        PartitionState(**fields)


def test_created_topics_name_their_kind() -> None:
    machine = MetadataStateMachine()
    for node in range(1, 7):
        register = {
            "node_id": node,
            "az": f"az{node % 3}",
            "host": "h",
            "kafka_port": 9000 + node,
            "incarnation_id": f"i{node}",
        }
        assert "error" not in machine.execute("register_broker", register, 0)
        heartbeat = {"node_id": node, "node_epoch": 0}
        assert "error" not in machine.execute("broker_heartbeat", heartbeat, 0)
    for name, configs in (("led", {}), ("coded", {"automq.partition.mode": "erasure"})):
        request = {"name": name, "partitions": 2, "topic_id": name, "configs": configs}
        assert "error" not in machine.execute("create_topic", request, 0)
    image = machine.image
    assert {p.kind for p in image.topic_by_name("led").partitions.values()} == {
        PartitionKind.LEADER
    }
    coded = image.topic_by_name("coded").partitions.values()
    assert {p.kind for p in coded} == {PartitionKind.ERASURE}
    assert all(p.leader_node_id == r.NO_LEADER and len(p.shard_stores) == 6 for p in coded)
