"""Admin APIs that stock Kafka tools call, from kafka-python's KafkaAdminClient and
confluent-kafka on a real cluster: DescribeLogDirs reports object-store bytes per partition,
AlterPartitionReassignments moves a partition (and refuses what cannot be),
ListPartitionReassignments, OffsetDelete, DeleteRecords; time retention (the objects that
held only old data are deleted from the bucket) and size retention under steady produce;
`automqctl topic describe`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicCollection  # noqa: E402
from confluent_kafka import TopicPartition as CkTopicPartition  # noqa: E402
from confluent_kafka.admin import AclOperation, AdminClient  # noqa: E402
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition  # noqa: E402
from kafka.errors import (  # noqa: E402
    GroupSubscribedToTopicError,
    InvalidReplicationAssignmentError,
    NoError,
    NoReassignmentInProgressError,
)
from kafka.structs import OffsetAndMetadata  # noqa: E402

from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from dataplane.objectstore import BucketURI, object_key  # noqa: E402
from tests.support.ledger import create_topic, running_cluster  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("admin") / "cluster"
    with running_cluster(
        d,
        "--upload-interval-s",
        "1",
        "--wal-capacity-mib",
        "64",
        "--retention-check-interval-s",
        "1",
        "--object-delete-delay-s",
        "2",
    ) as status:
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


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        return consumer.get_watermark_offsets(CkTopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()


def first_offset_read(bootstrap: str, topic: str) -> int:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10_000
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        return next(iter(consumer)).offset
    finally:
        consumer.close()


def test_delete_records_from_confluent_and_kafka_python(cluster, admin):
    bootstrap = cluster["bootstrap"]
    topic = f"dr-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, 30)
    confluent = AdminClient({"bootstrap.servers": bootstrap})
    [future] = confluent.delete_records([CkTopicPartition(topic, 0, 10)]).values()
    assert future.result(30).low_watermark == 10
    assert watermarks(bootstrap, topic) == (10, 30)
    assert first_offset_read(bootstrap, topic) == 10

    deleted = admin.delete_records({TopicPartition(topic, 0): 25})
    assert deleted[TopicPartition(topic, 0)]["low_watermark"] == 25
    assert watermarks(bootstrap, topic) == (25, 30)
    assert first_offset_read(bootstrap, topic) == 25


def _image(cluster) -> dict:
    config = LocalCluster(cluster["dir"]).load()
    client = ControllerClient(config.quorum_config().api_addresses(), api_secret=config.api_secret)
    raw = client.leader_get("/v1/image")
    return json.loads(raw) if isinstance(raw, str) else raw


def _stream(image: dict, topic: str) -> dict:
    t = next(t for t in image["topics"].values() if t["name"] == topic)
    return image["streams"][str(t["partitions"]["0"]["stream_id"])]


def _bucket_keys(cluster) -> set[str]:
    import boto3
    from botocore.config import Config as BotoConfig

    bucket = LocalCluster(cluster["dir"]).load().buckets[0]
    uri = BucketURI.parse(bucket.uri)
    s3 = boto3.client(
        "s3",
        endpoint_url=uri.endpoint,
        aws_access_key_id=bucket.access_key,
        aws_secret_access_key=bucket.secret_key,
        config=BotoConfig(region_name=uri.region, s3={"addressing_style": "path"}),
    )
    keys: set[str] = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket):
        keys |= {o["Key"] for o in page.get("Contents", [])}
    return keys


def test_time_retention_moves_the_earliest_offset_past_old_records(cluster, admin):
    bootstrap = cluster["bootstrap"]
    topic = f"ret-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 1, configs={"retention.ms": "3000"})
    produce(bootstrap, topic, 100)
    # the objects that hold the old records, once they are all uploaded (before 3 s pass)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stream = _stream(_image(cluster), topic)
        if stream["ranges"] and stream["ranges"][-1]["end_offset"] >= 100:
            break
        time.sleep(0.2)
    old_objects = {r["object_id"] for r in stream["object_ranges"]}
    assert old_objects and all(object_key(o) in _bucket_keys(cluster) for o in old_objects)
    deadline = time.monotonic() + 60
    low = 0
    while time.monotonic() < deadline and low < 100:
        low, _ = watermarks(bootstrap, topic)
        time.sleep(0.5)
    assert low == 100  # every record is older than 3 s, uploaded and removed
    produce(bootstrap, topic, 5)
    assert first_offset_read(bootstrap, topic) == 100
    # objects no other stream still needs are destroyed and deleted from the bucket after
    # the delay (2 s here); one holding another stream's live data stays
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        image = _image(cluster)
        kept = {
            o for o in old_objects if image["objects"].get(str(o), {}).get("state") == "committed"
        }
        gone = old_objects - kept
        if gone and not {object_key(o) for o in gone} & _bucket_keys(cluster):
            break
        time.sleep(0.5)
    assert gone, "no object of the old records was destroyed"
    assert not {object_key(o) for o in gone} & _bucket_keys(cluster)
    for o in kept:  # only a stream-set object shared with a stream whose data is live
        sso = image["stream_set_objects"][str(o)]
        assert any(
            r["end_offset"] > image["streams"][str(r["stream_id"])]["start_offset"]
            for r in sso["ranges"]
            if str(r["stream_id"]) in image["streams"]
        )


def test_size_retention_keeps_retained_bytes_near_the_limit_under_steady_produce(cluster, admin):
    bootstrap = cluster["bootstrap"]
    topic = f"retb-{uuid.uuid4().hex[:6]}"
    limit = 50_000
    create_topic(bootstrap, topic, 1, configs={"retention.bytes": str(limit)})
    stop = threading.Event()
    sent = [0]

    def steady() -> None:  # ~60 KB/s of 1 KB records for 10 s
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50})
        started = time.monotonic()
        while not stop.is_set() and (elapsed := time.monotonic() - started) < 10:
            # paced by the clock, not by loop turns: on a loaded machine a turn takes more
            # than its 0.1 s sleep and a fixed 6 records per turn fell short of 500 KB
            due = min(600, int(elapsed * 60) + 6)
            while sent[0] < due:
                producer.produce(topic, value=b"r" * 1000)
                sent[0] += 1
            producer.poll(0)
            time.sleep(0.1)
        assert producer.flush(30) == 0

    thread = threading.Thread(target=steady, daemon=True)
    thread.start()
    samples: list[int] = []
    try:
        time.sleep(4)  # a few uploads and checks in
        sample_until = time.monotonic() + 60
        # at least 5 samples even where a slow describe_log_dirs outlasts the produce
        while (thread.is_alive() or len(samples) < 5) and time.monotonic() < sample_until:
            sizes = [
                p["partition_size"]
                for broker in admin.describe_log_dirs(topic_partitions=[topic])
                for d in broker["log_dirs"]
                for t in d["topics"]
                for p in t["partitions"]
            ]
            samples += sizes
            time.sleep(0.5)
    finally:
        stop.set()
        thread.join(60)
    produced = sent[0] * 1000
    # without retention the object store would hold everything produced (~600 KB); with
    # it the partition holds the limit plus what arrived since the last check (1 s
    # uploads, 1 s checks) and the piece that straddles the limit
    assert produced > 500_000 and len(samples) >= 5, (produced, samples)
    assert max(samples) < produced / 2, (produced, samples)
    # once everything is uploaded and checked: exactly Kafka's rule over the pieces (one
    # per uploaded object) - at least the limit stays, and dropping the oldest remaining
    # piece would leave less than the limit
    from controlplane.image import MetadataImage
    from dataplane.kafka.time_index import stored_pieces

    deadline = time.monotonic() + 30
    while True:
        raw = _image(cluster)
        image = MetadataImage.model_validate(raw)
        stream = image.streams[_stream(raw, topic)["stream_id"]]
        live = [
            p for p in stored_pieces(image, stream.stream_id) if p.end_offset > stream.start_offset
        ]
        retained = sum(p.size_bytes for p in live)
        settled = (
            bool(live) and stream.end_offset == sent[0] and retained - live[0].size_bytes < limit
        )
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert settled and retained >= limit, (retained, [p.size_bytes for p in live])
    low, high = watermarks(bootstrap, topic)
    assert high == sent[0] and low == stream.start_offset > sent[0] // 3, (low, high)
    assert first_offset_read(bootstrap, topic) == low


def test_topic_describe_shows_offsets_and_object_store_bytes(cluster):
    import json

    from tests.support.ledger import automqctl

    bootstrap = cluster["bootstrap"]
    topic = f"desc-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 2)
    produce(bootstrap, topic, 40, partition=1)
    confluent = AdminClient({"bootstrap.servers": bootstrap})  # kept: its futures need it
    [deleted] = confluent.delete_records([CkTopicPartition(topic, 1, 15)]).values()
    assert deleted.result(30).low_watermark == 15
    out = automqctl("topic", "describe", topic, "--format", "json", cluster_dir=cluster["dir"])
    assert out.returncode == 0, out.stderr
    parts = {p["partition"]: p for p in json.loads(out.stdout)["partitions"]}
    assert (parts[0]["log_start_offset"], parts[0]["end_offset"]) == (0, 0)
    assert (parts[1]["log_start_offset"], parts[1]["end_offset"]) == (15, 40)
    # DeleteRecords uploaded the data first: the partition's bytes are in the object store
    assert parts[1]["object_store_bytes"] > 10 * 1000
    # DeleteRecords moved partition 1's start just now; nothing ever trimmed partition 0,
    # and the topic is not compacted
    assert parts[0]["last_retention_ms"] == -1
    assert abs(parts[1]["last_retention_ms"] / 1000 - time.time()) < 60
    assert parts[0]["last_compaction_ms"] == parts[1]["last_compaction_ms"] == -1
    table = automqctl("topic", "describe", topic, cluster_dir=cluster["dir"])
    assert table.returncode == 0 and "object-store bytes" in table.stdout
    assert "last retention" in table.stdout and "last compaction" in table.stdout


OLD_KAFKA_PYTHON = Path(__file__).resolve().parents[1] / ".clients" / "kafka-python-2.3.3"

_OLD_ADMIN_SCRIPT = """
import json, sys
from kafka import KafkaAdminClient, TopicPartition
import kafka
admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=30000)
topic = sys.argv[2]
out = {"version": kafka.__version__}
out["listed"] = topic in admin.list_topics()
[described] = admin.describe_topics([topic])
out["described_error"] = described["error_code"]
out["partitions"] = len(described["partitions"])
out["brokers"] = len(admin.describe_cluster()["brokers"])
deleted = admin.delete_records({TopicPartition(topic, 0): 2})
out["low_watermark"] = deleted[TopicPartition(topic, 0)]["low_watermark"]
admin.close()
print(json.dumps(out))
"""


def test_kafka_python_2_3_admin_client_and_authorized_operations(cluster):
    """kafka-python 2.3.x asks Metadata for authorized operations and fails on Kafka's
    "not provided" value (ValueError: 31 is not a valid ACLOperation); confluent-kafka's
    describe_topics(include_authorized_operations=True) got None. Without ACLs every
    operation of the resource type is authorized, as in Kafka without an authorizer."""
    if not (OLD_KAFKA_PYTHON / "kafka").is_dir():
        pytest.skip(f"kafka-python 2.3.3 is not installed in {OLD_KAFKA_PYTHON} (tests/run.sh)")
    topic = f"old-admin-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 2)
    produce(cluster["bootstrap"], topic, 5, partition=0)
    ck = AdminClient({"bootstrap.servers": cluster["bootstrap"]})
    described_cluster = ck.describe_cluster(
        request_timeout=30, include_authorized_operations=True
    ).result(timeout=60)
    assert AclOperation.CLUSTER_ACTION in set(described_cluster.authorized_operations or ())
    described = ck.describe_topics(
        TopicCollection([topic]), request_timeout=30, include_authorized_operations=True
    )[topic].result(timeout=60)
    assert set(described.authorized_operations or ()) == {
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.CREATE,
        AclOperation.DESCRIBE,
        AclOperation.DELETE,
        AclOperation.ALTER,
        AclOperation.DESCRIBE_CONFIGS,
        AclOperation.ALTER_CONFIGS,
    }

    done = subprocess.run(
        [sys.executable, "-c", _OLD_ADMIN_SCRIPT, cluster["bootstrap"], topic],
        env={**os.environ, "PYTHONPATH": str(OLD_KAFKA_PYTHON)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {
        "version": "2.3.3",
        "listed": True,
        "described_error": 0,
        "partitions": 2,
        "brokers": len(described_cluster.nodes),
        "low_watermark": 2,
    }
