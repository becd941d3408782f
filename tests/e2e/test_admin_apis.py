"""Admin APIs that stock Kafka tools call, from kafka-python's KafkaAdminClient on a real
cluster: DescribeLogDirs reports object-store bytes per partition, AlterPartitionReassignments
moves a partition (and refuses what cannot be), ListPartitionReassignments, OffsetDelete."""

from __future__ import annotations

import time
import uuid

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition  # noqa: E402
from kafka.errors import (  # noqa: E402
    GroupSubscribedToTopicError,
    InvalidReplicationAssignmentError,
    NoError,
    NoReassignmentInProgressError,
)
from kafka.structs import OffsetAndMetadata  # noqa: E402

from tests.e2e.ledger import create_topic, running_cluster  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("admin") / "cluster"
    with running_cluster(d, "--upload-interval-s", "1", "--wal-capacity-mib", "64") as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


@pytest.fixture
def admin(cluster):
    client = KafkaAdminClient(bootstrap_servers=cluster["bootstrap"], request_timeout_ms=30_000)
    try:
        yield client
    finally:
        client.close()


def produce(bootstrap: str, topic: str, count: int, partition: int | None = None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 30_000})
    failed: list = []
    for i in range(count):
        kw = {} if partition is None else {"partition": partition}
        producer.produce(
            topic, value=b"v%06d" % i + b"." * 1000, on_delivery=lambda e, m: failed.append(e), **kw
        )
    assert producer.flush(60) == 0
    assert [e for e in failed if e is not None] == []


def leaders(admin: KafkaAdminClient, topic: str) -> dict[int, int]:
    [meta] = admin.describe_topics([topic])
    return {p["partition_index"]: p["leader_id"] for p in meta["partitions"]}


def test_describe_log_dirs_reports_object_store_bytes_per_partition(cluster, admin):
    topic = f"dirs-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 2)
    produce(cluster["bootstrap"], topic, 200, partition=0)  # ~200 KB, partition 1 stays empty
    sizes: dict[int, int] = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # bytes count once uploaded (every second here)
        sizes = {}
        for broker in admin.describe_log_dirs(topic_partitions=[topic]):
            for result in broker["log_dirs"]:
                assert result["error_code"] == 0, result
                for t in result["topics"]:
                    assert t["name"] == topic
                    for p in t["partitions"]:
                        sizes[p["partition_index"]] = p["partition_size"]
        if sizes.get(0, 0) >= 200 * 1000:
            break
        time.sleep(0.5)
    assert set(sizes) == {0, 1}, sizes  # each partition reported once, by its leader
    assert sizes[0] >= 200 * 1000, sizes
    assert sizes[1] == 0, sizes


def test_alter_and_list_partition_reassignments_move_a_partition(cluster, admin):
    topic = f"move-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 1)
    produce(cluster["bootstrap"], topic, 50)
    source = leaders(admin, topic)[0]
    brokers = sorted(b["broker_id"] for b in admin.describe_cluster()["brokers"])
    target = next(b for b in brokers if b != source)
    tp = TopicPartition(topic, 0)

    # what cannot be done is refused per partition, and nothing moves
    refused = admin.alter_partition_reassignments({tp: [target, source]})
    assert refused[tp] is InvalidReplicationAssignmentError, refused  # one replica only
    refused = admin.alter_partition_reassignments({tp: [999]})
    assert refused[tp] is InvalidReplicationAssignmentError, refused
    cancel = admin.alter_partition_reassignments({tp: None})
    assert cancel[tp] is NoReassignmentInProgressError, cancel
    assert leaders(admin, topic)[0] == source

    moved = admin.alter_partition_reassignments({tp: [target]})
    assert moved[tp] is None, moved
    deadline = time.monotonic() + 60
    ongoing = None
    while time.monotonic() < deadline:
        ongoing = admin.list_partition_reassignments()
        if leaders(admin, topic)[0] == target and tp not in ongoing:
            break
        time.sleep(0.3)
    assert leaders(admin, topic)[0] == target
    assert tp not in ongoing, ongoing  # the new leader opened it: the move finished

    # the moved partition keeps its data and takes more
    produce(cluster["bootstrap"], topic, 50)
    consumer = KafkaConsumer(
        bootstrap_servers=cluster["bootstrap"],
        auto_offset_reset="earliest",
        consumer_timeout_ms=10_000,
    )
    consumer.assign([tp])
    values = [m.value[:7] for m in consumer]
    consumer.close()
    assert values == [b"v%06d" % i for i in range(50)] * 2


def test_offset_delete_refuses_subscribed_topics_and_deletes_the_rest(cluster, admin):
    a, b = (f"od{x}-{uuid.uuid4().hex[:6]}" for x in "ab")
    group = f"g-{uuid.uuid4().hex[:6]}"
    for t in (a, b):
        create_topic(cluster["bootstrap"], t, 1)
        produce(cluster["bootstrap"], t, 10)
    # an offset of a topic the group will not subscribe to (stored while it has no members)
    stored = admin.alter_group_offsets(group, {TopicPartition(b, 0): OffsetAndMetadata(7, "", -1)})
    assert set(stored.values()) == {NoError}, stored
    consumer = KafkaConsumer(
        a,
        bootstrap_servers=cluster["bootstrap"],
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=10_000,
    )
    try:
        assert len(list(consumer)) == 10
        consumer.commit()
        committed = admin.list_group_offsets(group)[group]
        assert {tp.topic: o.offset for tp, o in committed.items()} == {a: 10, b: 7}

        deleted = admin.delete_group_offsets(group, [TopicPartition(a, 0), TopicPartition(b, 0)])
        assert deleted == {
            TopicPartition(a, 0): GroupSubscribedToTopicError,
            TopicPartition(b, 0): NoError,
        }
        committed = admin.list_group_offsets(group)[group]
        assert {tp.topic: o.offset for tp, o in committed.items()} == {a: 10}
    finally:
        consumer.close()
    # the group is empty now: its offsets of the subscribed topic can go too
    deleted = admin.delete_group_offsets(group, [TopicPartition(a, 0)])
    assert deleted == {TopicPartition(a, 0): NoError}
    assert admin.list_group_offsets(group)[group] == {}
