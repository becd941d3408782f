"""Compaction principals: a job that is not a broker prepares and commits compactions
through the one object uploader, fenced by its own epoch, never extending a stream."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from controlplane.errors import ControllerError, ErrorCode
from controlplane.inprocess import InProcessController
from controlplane.objects import commit_stream_set_object
from controlplane.records import ObjectState, S3ObjectRecord
from controlplane.requests import (
    CommitStreamSetObjectRequest,
    CompactorIdentity,
    PrepareObjectsRequest,
    RegisterCompactorRequest,
)
from controlplane.settings import ControllerSettings
from dataplane.config import StorageConfig, WALConfig
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.commit import Committer
from dataplane.s3stream.storage import S3Storage
from dataplane.s3stream.uploader import ObjectUploader

BUCKETS = "0@s3://automq-main?region=us-east-1"


@pytest.fixture
def controller() -> InProcessController:
    c = InProcessController(ControllerSettings(bucket_ids=[0]))
    epoch = c.call(
        "register_broker",
        {"node_id": 1, "az": "a", "host": "h", "kafka_port": 1, "incarnation_id": "b1"},
    )["node_epoch"]
    c.call("broker_heartbeat", {"node_id": 1, "node_epoch": epoch})
    return c


def unchanged(c: InProcessController, fn) -> ControllerError:
    before = (c.machine.image.fingerprint(), c.machine.next_offset)
    with pytest.raises(ControllerError) as exc:
        fn()
    assert (c.machine.image.fingerprint(), c.machine.next_offset) == before
    return exc.value


def test_registration_fences_earlier_instances(controller):
    first = controller.register_compactor(
        RegisterCompactorRequest(name="spark", incarnation_id="a")
    )
    again = controller.register_compactor(
        RegisterCompactorRequest(name="spark", incarnation_id="a")
    )
    assert first.epoch == again.epoch == 0  # a retried registration
    second = controller.register_compactor(
        RegisterCompactorRequest(name="spark", incarnation_id="b")
    )
    assert second.epoch == 1
    zombie = CompactorIdentity(name="spark", epoch=0)
    err = unchanged(
        controller,
        lambda: controller.prepare_objects(
            PrepareObjectsRequest(compactor=zombie, count=1, ttl_ms=1000)
        ),
    )
    assert err.code == ErrorCode.STALE_COMPACTOR_EPOCH
    err = unchanged(
        controller,
        lambda: controller.prepare_objects(
            PrepareObjectsRequest(
                compactor=CompactorIdentity(name="other", epoch=0), count=1, ttl_ms=1000
            )
        ),
    )
    assert err.code == ErrorCode.UNKNOWN_COMPACTOR
    ok = controller.prepare_objects(
        PrepareObjectsRequest(
            compactor=CompactorIdentity(name="spark", epoch=1), count=2, ttl_ms=1000
        )
    )
    assert ok.count == 2


def test_a_request_names_exactly_one_committer():
    with pytest.raises(ValueError):
        PrepareObjectsRequest(count=1, ttl_ms=1)  # neither
    with pytest.raises(ValueError):
        PrepareObjectsRequest(
            node_id=1,
            node_epoch=0,
            compactor=CompactorIdentity(name="x", epoch=0),
            count=1,
            ttl_ms=1,
        )


def test_a_compactor_cannot_extend_a_stream(controller):
    ident = CompactorIdentity(
        name="spark",
        epoch=controller.register_compactor(
            RegisterCompactorRequest(name="spark", incarnation_id="a")
        ).epoch,
    )
    sid = controller.call("create_stream", {"node_id": 1, "node_epoch": 0})["stream_id"]
    controller.call(
        "open_stream", {"node_id": 1, "node_epoch": 0, "stream_id": sid, "stream_epoch": 0}
    )
    oid = controller.prepare_objects(
        PrepareObjectsRequest(compactor=ident, count=1, ttl_ms=60_000)
    ).first_object_id
    new_data = dict(
        compactor=ident,
        object_id=oid,
        order_id=1,
        size_bytes=10,
        bucket_id=0,
        stream_ranges=[{"stream_id": sid, "stream_epoch": 0, "start_offset": 0, "end_offset": 5}],
    )
    err = unchanged(
        controller,
        lambda: controller.commit_stream_set_object(CommitStreamSetObjectRequest(**new_data)),
    )
    assert err.code == ErrorCode.INVALID_REQUEST  # not a compaction: refused
    err = unchanged(
        controller,
        lambda: controller.commit_stream_set_object(
            CommitStreamSetObjectRequest(**new_data, compacted_object_ids=[oid])
        ),
    )
    assert err.code == ErrorCode.INVALID_OFFSET  # past the committed end (0)


def test_a_job_compacts_through_the_uploader_with_no_broker(controller, tmp_path, monkeypatch):
    """A broker wrote three small objects; a compaction principal rewrites them as one via
    the same ObjectUploader the brokers use, and a cold reader gets identical records."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        objects = ObjectStorage(BUCKETS)
        config = StorageConfig(block_cache_bytes=16 << 20)
        wal = WALConfig(capacity_bytes=32 << 20)
        broker = S3Storage(config, 1, 0, controller, objects, data_dir=tmp_path / "b1", wal=wal)
        broker.start()
        try:
            stream = broker.open_stream(broker.create_stream(), 0)
            for round_no in range(3):  # three uploads: three stream-set objects
                for i in range(4):
                    stream.append(f"r{round_no}-{i}".encode()).result(5)
                broker.flush()
            image = controller.machine.image
            old_ids = sorted(image.stream_set_objects)
            assert len(old_ids) == 3
            batches = stream.fetch(0, 12, 1 << 20)
            assert len(batches) == 12
        finally:
            broker.close(close_streams=False)

        job = controller.register_compactor(
            RegisterCompactorRequest(name="spark", incarnation_id="j1")
        )
        uploader = ObjectUploader(
            controller,
            objects,
            lambda: Committer(compactor=CompactorIdentity(name="spark", epoch=job.epoch)),
        )
        result = uploader.upload(batches, compacted_object_ids=old_ids)
        assert result.batches == 12 and not result.dropped

        image = controller.machine.image
        assert all(image.objects[o].state == ObjectState.MARK_DESTROYED for o in old_ids)
        found = image.stream_objects_in_range(stream.stream_id, 0, 12)
        assert len(found) == 1 and found[0][0].object_id not in old_ids
        assert image.streams[stream.stream_id].end_offset == 12  # the stream did not move

        reader = S3Storage(
            StorageConfig(block_cache_bytes=16 << 20),
            1,
            0,
            controller,
            objects,
            data_dir=tmp_path / "b2",
            wal=WALConfig(capacity_bytes=32 << 20),
        )
        got = reader.read_committed(stream.stream_id, 0, 12, 1 << 20)
        assert [b.payload for b in got] == [b.payload for b in batches]
        objects.close()


def _three_objects_of_two_streams(controller):
    """Streams a, b; three stream-set objects each holding [5i, 5i+5) of both."""
    sids = [controller.call("create_stream", {"node_id": 1, "node_epoch": 0})["stream_id"]]
    sids.append(controller.call("create_stream", {"node_id": 1, "node_epoch": 0})["stream_id"])
    for sid in sids:
        controller.call(
            "open_stream", {"node_id": 1, "node_epoch": 0, "stream_id": sid, "stream_epoch": 0}
        )
    old = []
    for i in range(3):
        oid = controller.prepare_objects(
            PrepareObjectsRequest(node_id=1, node_epoch=0, count=1, ttl_ms=60_000)
        ).first_object_id
        controller.commit_stream_set_object(
            CommitStreamSetObjectRequest(
                node_id=1,
                node_epoch=0,
                object_id=oid,
                order_id=i,
                size_bytes=100,
                bucket_id=0,
                stream_ranges=[
                    {
                        "stream_id": s,
                        "stream_epoch": 0,
                        "start_offset": 5 * i,
                        "end_offset": 5 * i + 5,
                    }
                    for s in sids
                ],
            )
        )
        old.append(oid)
    return sids, old


def _compaction(controller, sids, old, ranges=None, job="spark"):
    ident = CompactorIdentity(
        name=job,
        epoch=controller.register_compactor(
            RegisterCompactorRequest(name=job, incarnation_id="a")
        ).epoch,
    )
    oid = controller.prepare_objects(
        PrepareObjectsRequest(compactor=ident, count=1, ttl_ms=60_000)
    ).first_object_id
    return CommitStreamSetObjectRequest(
        compactor=ident,
        object_id=oid,
        order_id=0,
        size_bytes=300,
        bucket_id=0,
        stream_ranges=ranges
        or [{"stream_id": s, "stream_epoch": 0, "start_offset": 0, "end_offset": 15} for s in sids],
        compacted_object_ids=old,
    )


def test_a_compaction_replaces_objects_in_one_batch(controller):
    sids, old = _three_objects_of_two_streams(controller)
    req = _compaction(controller, sids, old)
    # the pure handler answers with ONE record list: the quorum replicates and applies it
    # as one entry, so readers see the old objects or the new one, never neither
    recs, _ = commit_stream_set_object(
        controller.machine.image, req, 0, controller.machine.settings
    )
    states = {(rec.object_id, rec.state) for rec in recs if isinstance(rec, S3ObjectRecord)}
    assert states == {(req.object_id, ObjectState.COMMITTED)} | {
        (o, ObjectState.MARK_DESTROYED) for o in old
    }
    controller.commit_stream_set_object(req)
    image = controller.machine.image
    assert all(image.objects[o].state == ObjectState.MARK_DESTROYED for o in old)
    assert all(o not in image.stream_set_objects for o in old)
    for sid in sids:
        found = image.stream_objects_in_range(sid, 0, 15)
        assert [o.object_id for o, _ in found] == [req.object_id]


def test_a_compaction_that_lost_a_race_is_refused_whole(controller):
    sids, old = _three_objects_of_two_streams(controller)
    first = _compaction(controller, sids, old)
    other = _compaction(controller, sids, old, job="other")  # planned the same objects
    controller.commit_stream_set_object(other)
    err = unchanged(controller, lambda: controller.commit_stream_set_object(first))
    assert err.code == ErrorCode.UNKNOWN_OBJECT  # the sources were compacted meanwhile
    assert controller.machine.image.objects[first.object_id].state == ObjectState.PREPARED


def test_a_compaction_refused_after_a_trim_or_delete(controller):
    sids, old = _three_objects_of_two_streams(controller)
    req = _compaction(
        controller,
        sids,
        old,
        ranges=[
            {"stream_id": sids[0], "stream_epoch": 0, "start_offset": 0, "end_offset": 5},
            {"stream_id": sids[1], "stream_epoch": 0, "start_offset": 0, "end_offset": 15},
        ],
    )
    # holds only [0, 5) of stream a: it drops live offsets
    err = unchanged(controller, lambda: controller.commit_stream_set_object(req))
    assert err.code == ErrorCode.INVALID_OFFSET
    req = _compaction(
        controller,
        sids,
        old[:1],
        ranges=[
            {"stream_id": s, "stream_epoch": 0, "start_offset": 0, "end_offset": 10} for s in sids
        ],
    )
    # holds offsets the compacted object did not
    err = unchanged(controller, lambda: controller.commit_stream_set_object(req))
    assert err.code == ErrorCode.INVALID_OFFSET
    planned = _compaction(
        controller,
        sids,
        old[:1],
        ranges=[
            {"stream_id": s, "stream_epoch": 0, "start_offset": 0, "end_offset": 5} for s in sids
        ],
    )
    controller.call(
        "trim_stream",
        {
            "node_id": 1,
            "node_epoch": 0,
            "stream_id": sids[0],
            "stream_epoch": 0,
            "new_start_offset": 5,
        },
    )
    err = unchanged(controller, lambda: controller.commit_stream_set_object(planned))
    assert err.code == ErrorCode.INVALID_OFFSET  # stream a's range is trimmed away
    planned = _compaction(
        controller,
        sids,
        old[1:],
        ranges=[
            {"stream_id": s, "stream_epoch": 0, "start_offset": 5, "end_offset": 15} for s in sids
        ],
    )
    controller.call(
        "delete_stream",
        {"node_id": 1, "node_epoch": 0, "stream_id": sids[1], "stream_epoch": 0},
    )
    err = unchanged(controller, lambda: controller.commit_stream_set_object(planned))
    assert err.code == ErrorCode.UNKNOWN_STREAM


def test_cleaner_checkpoints_are_recorded_by_the_current_epoch_only(controller):
    from controlplane.requests import CleanerCheckpoint, SetCleanerCheckpointsRequest

    node = {"node_id": 1, "node_epoch": controller.machine.image.brokers[1].node_epoch}
    sid = controller.call("create_stream", node)["stream_id"]
    controller.call("open_stream", {**node, "stream_id": sid, "stream_epoch": 0})
    job = controller.register_compactor(RegisterCompactorRequest(name="s", incarnation_id="a"))
    ident = CompactorIdentity(name="s", epoch=job.epoch)

    def req(*cps: tuple[int, int], who: CompactorIdentity = ident):
        return SetCleanerCheckpointsRequest(
            compactor=who,
            checkpoints=[CleanerCheckpoint(stream_id=s, cleaned_offset=o) for s, o in cps],
        )

    # past the committed end (nothing is committed yet), a repeated stream, a fenced epoch
    err = unchanged(controller, lambda: controller.set_cleaner_checkpoints(req((sid, 1))))
    assert err.code == ErrorCode.INVALID_OFFSET
    err = unchanged(controller, lambda: controller.set_cleaner_checkpoints(req((sid, 0), (sid, 0))))
    assert err.code == ErrorCode.INVALID_REQUEST
    controller.register_compactor(RegisterCompactorRequest(name="s", incarnation_id="b"))
    err = unchanged(controller, lambda: controller.set_cleaner_checkpoints(req((sid, 0))))
    assert err.code == ErrorCode.STALE_COMPACTOR_EPOCH
    ident = CompactorIdentity(name="s", epoch=job.epoch + 1)
    with pytest.raises(ValueError):
        req((-1, 0))
    out = controller.set_cleaner_checkpoints(req((sid, 0), (sid + 99, 5), who=ident))
    assert out.recorded == [sid] and out.skipped == [sid + 99]  # a deleted stream: skipped
    stream = controller.machine.image.streams[sid]
    assert stream.cleaned_offset == 0 and stream.cleaned_ms > 0
