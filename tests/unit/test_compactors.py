"""Compaction principals: a job that is not a broker prepares and commits compactions
through the one object uploader, fenced by its own epoch, never extending a stream."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from controlplane.errors import ControllerError, ErrorCode
from controlplane.inprocess import InProcessController
from controlplane.records import ObjectState
from controlplane.requests import (
    CommitStreamSetObjectRequest,
    CompactorIdentity,
    PrepareObjectsRequest,
    RegisterCompactorRequest,
)
from controlplane.settings import ControllerSettings
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.storage import S3Storage, StorageConfig
from dataplane.s3stream.uploader import Committer, ObjectUploader

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
        config = StorageConfig(
            data_dir=tmp_path / "b1", wal_capacity_bytes=32 << 20, block_cache_bytes=16 << 20
        )
        broker = S3Storage(config, 1, 0, controller, objects)
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
            StorageConfig(
                data_dir=tmp_path / "b2", wal_capacity_bytes=32 << 20, block_cache_bytes=16 << 20
            ),
            1,
            0,
            controller,
            objects,
        )
        got = reader._read_objects(stream.stream_id, 0, 12, 1 << 20)
        assert [b.payload for b in got] == [b.payload for b in batches]
        objects.close()
