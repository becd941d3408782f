"""The log-cleaner stage without Spark (tests/e2e/test_compacted_topics.py runs the real
job): which objects of which partitions it selects, one partition cleaned against moto S3,
the one commit the in-process controller accepts, and the objects read back."""

from __future__ import annotations

import boto3
import pytest
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from moto import mock_aws

from controlplane.image import PartitionState, TopicState
from controlplane.inprocess import InProcessController
from controlplane.records import ObjectState
from controlplane.requests import (
    CommitStreamSetObjectRequest,
    CompactorIdentity,
    PrepareObjectsRequest,
    RegisterCompactorRequest,
)
from controlplane.settings import ControllerSettings
from dataplane.formats.object_format import decode_block, parse_object
from dataplane.formats.record_batch import parse_batches, patch_batch
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.objectstore import object_key
from spark_jobs import objects_io
from spark_jobs.compact import cleaner_commit_request
from spark_jobs.compact_topics import clean_stream, select_clean_tasks, survey_stream
from tests.unit.test_compaction_plan import BUCKET_URI, NODE, Cluster

DAY_MS = 86_400_000


@pytest.fixture
def controller() -> InProcessController:
    c = InProcessController(ControllerSettings(bucket_ids=[0]))
    c.call(
        "register_broker",
        {"node_id": 1, "az": "a", "host": "h", "kafka_port": 1, "incarnation_id": "b1"},
    )
    c.call("broker_heartbeat", NODE)
    return c


def kafka_batch(base: int, records: list[tuple[bytes, bytes | None]], ts: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i, (key, value) in enumerate(records):
        b.append(i, ts, key, value, [])
    return patch_batch(bytes(b.build()), base, 0)


def kafka_so(cl: Cluster, sid: int, batches: list[list[tuple[bytes, bytes | None]]], ts: int):
    """Commit a stream object of Kafka batches (one per list) for stream `sid`."""
    stored = []
    for records in batches:
        base = cl.next[sid]
        stored.append(StreamRecordBatch(sid, 0, base, len(records), kafka_batch(base, records, ts)))
        cl.next[sid] += len(records)
    oid, obj = cl._object(stored)
    r = obj.ranges[0]
    cl.c.commit_stream_set_object(
        CommitStreamSetObjectRequest(
            **NODE,
            object_id=-1,
            order_id=oid,
            size_bytes=0,
            bucket_id=0,
            stream_objects=[
                {
                    "object_id": oid,
                    "stream_id": sid,
                    "stream_epoch": 0,
                    "start_offset": r.start_offset,
                    "end_offset": r.end_offset,
                    "size_bytes": len(obj.data),
                }
            ],
        )
    )
    return oid


def mark_topic(cl: Cluster, sid: int, name: str, configs: dict[str, str]) -> None:
    """Make stream `sid` partition 0 of topic `name` (the image is the test's to shape)."""
    cl.c.machine.image.topics[name] = TopicState(
        topic_id=name,
        name=name,
        configs=configs,
        partitions={
            0: PartitionState(partition=0, leader_node_id=1, leader_epoch=0, stream_id=sid)
        },
    )


def read_object(oid: int) -> list[StreamRecordBatch]:
    s3 = objects_io.client(BUCKET_URI)
    data = s3.get_object(Bucket="automq-main", Key=object_key(oid))["Body"].read()
    _, entries = parse_object(data)
    view = memoryview(data)
    return [b for e in entries for b in decode_block(view[e.position : e.end_position], e)]


def test_only_compacted_topics_contiguous_stream_objects_are_selected(controller):
    cl = Cluster(controller)
    compacted, plain, gap = cl.stream(), cl.stream(), cl.stream()
    first = kafka_so(cl, compacted, [[(b"a", b"1")]], 1)
    second = kafka_so(cl, compacted, [[(b"a", b"2")]], 1)
    kafka_so(cl, plain, [[(b"a", b"1")]], 1)
    gap_first = kafka_so(cl, gap, [[(b"a", b"1")]], 1)
    cl.sso({gap: 1})  # the next offsets of `gap` are still in a stream-set object
    kafka_so(cl, gap, [[(b"a", b"2")]], 1)
    mark_topic(cl, compacted, "c", {"cleanup.policy": "compact", "delete.retention.ms": "5"})
    mark_topic(cl, plain, "p", {})
    mark_topic(cl, gap, "g", {"cleanup.policy": "compact,delete"})
    tasks = {t.topic: t for t in select_clean_tasks(controller.machine.image, 1 << 30, 100)}
    assert set(tasks) == {"c", "g"}
    assert [s.object_id for s in tasks["c"].sources] == [first, second]
    assert tasks["c"].delete_retention_ms == 5 and tasks["c"].min_compaction_lag_ms == 0
    assert [s.object_id for s in tasks["g"].sources] == [gap_first]  # stops at the gap
    limited = select_clean_tasks(controller.machine.image, 1 << 30, 1)
    assert [(t.topic, len(t.sources)) for t in limited] == [("c", 1)]


def test_clean_one_partition_commit_and_read_back(controller, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        objects_io._clients.clear()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        cl = Cluster(controller, s3=True)
        sid = cl.stream()
        old_ts, now_ms = 1_000, 10 * DAY_MS
        one = kafka_so(cl, sid, [[(b"a", b"1"), (b"b", b"1")], [(b"c", b"1")]], old_ts)
        two = kafka_so(cl, sid, [[(b"a", b"2"), (b"c", None)]], old_ts)
        clean = kafka_so(cl, sid, [[(b"d", b"1")]], old_ts)  # nothing to remove in it
        mark_topic(cl, sid, "t", {"cleanup.policy": "compact"})
        (task,) = select_clean_tasks(controller.machine.image, 1 << 30, 100)
        job = controller.register_compactor(RegisterCompactorRequest(name="t", incarnation_id="x"))
        ident = CompactorIdentity(name="t", epoch=job.epoch)
        survey = survey_stream(task, {0: BUCKET_URI}, now_ms)
        assert survey["removable_records"] == 3 and survey["keys"] == 4
        assert survey["rewrite"] == [one, two] and survey["stopped"] == ""  # not `clean`
        prepared = controller.prepare_objects(
            PrepareObjectsRequest(compactor=ident, count=2, ttl_ms=60_000)
        )
        task.new_object_ids = {one: prepared.first_object_id, two: prepared.first_object_id + 1}
        out = clean_stream(task, {0: BUCKET_URI}, 0, now_ms)
        assert [d["replaces"] for d in out["new"]] == [one, two]
        assert sum(d["removed_records"] for d in out["new"]) == 3
        controller.commit_stream_set_object(cleaner_commit_request(ident, out["new"], 0))
        image = controller.machine.image
        assert image.objects[one].state == ObjectState.MARK_DESTROYED
        assert image.objects[clean].state == ObjectState.COMMITTED
        batches = [b for d in out["new"] for b in read_object(d["object_id"])]
        # same offset ranges for the stream layer (0-2, 3, 4-5), smaller payloads
        assert [(b.base_offset, b.count) for b in batches] == [(0, 2), (2, 1), (3, 2)]
        records = []
        for b in batches:
            parse_batches(b.payload, client_origin=False)
            records += [(r.offset, r.key, r.value) for r in DefaultRecordBatch(b.payload)]
        # b's only version stays; a's newest; c's tombstone (expired) and c's old value go
        assert records == [(1, b"b", b"1"), (3, b"a", b"2")]
        objects_io._clients.clear()


def test_young_data_is_not_cleaned(controller, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        objects_io._clients.clear()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        cl = Cluster(controller, s3=True)
        sid = cl.stream()
        now_ms = 10 * DAY_MS
        kafka_so(cl, sid, [[(b"a", b"1")]], now_ms - 5_000)
        kafka_so(cl, sid, [[(b"a", b"2")]], now_ms - 100)  # younger than the lag
        mark_topic(cl, sid, "t", {"cleanup.policy": "compact", "min.compaction.lag.ms": "1000"})
        (task,) = select_clean_tasks(controller.machine.image, 1 << 30, 100)
        survey = survey_stream(task, {0: BUCKET_URI}, now_ms)
        # a@0 is old, but its newer version is too young to count: nothing is removed
        assert survey["rewrite"] == [] and survey["stopped"] == "min.compaction.lag.ms"
        assert survey["cleanable_objects"] == 1
        objects_io._clients.clear()


def test_checkpoint_dirty_ratio_and_max_compaction_lag_choose_partitions(controller, monkeypatch):
    from controlplane.requests import CleanerCheckpoint, SetCleanerCheckpointsRequest
    from spark_jobs.compact_topics import first_batch_max_timestamp

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        objects_io._clients.clear()
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        cl = Cluster(controller, s3=True)
        sid = cl.stream()
        now_ms = 10 * DAY_MS
        first = kafka_so(cl, sid, [[(b"a", b"1"), (b"b", b"1")]], now_ms - DAY_MS)
        for key in (b"c", b"d", b"e"):
            kafka_so(cl, sid, [[(key, b"1")]], now_ms - DAY_MS)
        mark_topic(cl, sid, "t", {"cleanup.policy": "compact", "max.compaction.lag.ms": "60000"})
        job = controller.register_compactor(RegisterCompactorRequest(name="t", incarnation_id="x"))
        ident = CompactorIdentity(name="t", epoch=job.epoch)
        read_ts = []

        def first_dirty(task, source):
            read_ts.append(source.object_id)
            return first_batch_max_timestamp(task, source, BUCKET_URI)

        def select(at_ms: int, skipped: list | None = None):
            image = controller.machine.image
            return select_clean_tasks(image, 1 << 30, 100, at_ms, first_dirty, skipped)

        (task,) = select(now_ms)  # never cleaned: everything is dirty
        survey = survey_stream(task, {0: BUCKET_URI}, now_ms)
        assert survey["rewrite"] == [] and survey["cleaned_offset"] == 5 and survey["keys"] == 5
        controller.set_cleaner_checkpoints(
            SetCleanerCheckpointsRequest(
                compactor=ident, checkpoints=[CleanerCheckpoint(stream_id=sid, cleaned_offset=5)]
            )
        )
        skipped: list = []
        assert select(now_ms, skipped) == [] and "no dirty data" in skipped[0].decision.reason
        # one small new object: a dirty ratio far below 0.5, its data younger than the lag
        newer = kafka_so(cl, sid, [[(b"a", b"2")]], now_ms - 1_000)
        skipped = []
        assert select(now_ms, skipped) == []
        assert skipped[0].decision.dirty_ratio < 0.5 and read_ts == [newer]
        # a minute later the dirty data is older than max.compaction.lag.ms: cleaned
        later_ms = now_ms + 60_000
        (task,) = select(later_ms)
        assert "max.compaction.lag.ms" in task.decision.reason
        survey = survey_stream(task, {0: BUCKET_URI}, later_ms)
        # only the dirty object is mapped; the clean one holding a@0 loses it
        assert survey["keys"] == 1 and survey["rewrite"] == [first]
        assert survey["removable_records"] == 1 and survey["cleaned_offset"] == 6
        objects_io._clients.clear()
