"""The object-storage WAL against a real SeaweedFS: group commit, takeover fencing and
recovery by another owner, trim deleting the objects."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CollectorRegistry

from dataplane.objectstore import ObjectStorage, ObjectStoreMetrics
from dataplane.s3stream.wal import WALFencedError
from dataplane.s3stream.wal.factory import open_wal, take_over_wal, wal_exists
from tests.integration.test_objectstore_seaweed import uris_for

pytestmark = pytest.mark.integration


@pytest.fixture
def objects(seaweed):
    with ObjectStorage(
        uris_for(seaweed), metrics=ObjectStoreMetrics(CollectorRegistry()), merge_window_ms=0
    ) as store:
        yield store


def test_object_wal_on_seaweedfs_fences_the_old_owner_and_recovers_every_ack(objects):
    prefix = f"itest-wal/{uuid.uuid4().hex}"
    uri = f"s3://automq-failover/{prefix}"
    wal = open_wal(uri, 1, 7, capacity_bytes=64 << 20, objects=objects)
    payloads = [b"%04d-" % i + b"p" * (i * 37 % 3000) for i in range(200)]
    with ThreadPoolExecutor(8) as pool:  # concurrent producers: group commits of many records
        futures = list(pool.map(wal.append, payloads))
    acked = {f.result(30).offset: p for f, p in zip(futures, payloads, strict=True)}
    assert wal.put_count < len(payloads)
    assert len(objects.list_keys(1, prefix + "/data/")) == wal.put_count

    handle = take_over_wal(uri, 2, 8, objects=objects)
    try:
        with pytest.raises(WALFencedError):
            wal.append(b"after the takeover").result(30)
        records = list(handle.recover())
        assert [r.data for r in records] == [acked[o] for o in sorted(acked)]
        handle.trim(records[-1].next_offset)
        # left: only the fenced append's object, stored after the takeover's seal
        (late,) = objects.list_keys(1, prefix + "/data/")
        assert late.split("/")[-1].startswith("%020d-" % records[-1].next_offset)
    finally:
        handle.close()
        wal.close()
    assert wal_exists(uri, objects=objects)
    again = open_wal(uri, 1, 9, capacity_bytes=64 << 20, objects=objects)
    try:
        assert list(again.recover()) == []  # the fenced append never shows up
        assert objects.list_keys(1, prefix + "/data/") == []  # and its object was deleted
        assert again.append(b"next").result(30).offset == records[-1].next_offset
    finally:
        again.close()
