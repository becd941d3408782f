"""Link Records (the zone router's ConfirmWAL): a main's WAL keeps a pointer into the
proxy's RouterChannel instead of the data; reads and uploads get the data; recovery of the
main's WAL (here: another broker's failover of it) reads the data back from the channel,
byte for byte; a link whose channel record was trimmed fails recovery with a clear error."""

from __future__ import annotations

import threading
import time

import boto3
import pytest
from moto import mock_aws

from dataplane.formats.link_record import (
    LINK_PAYLOAD_BYTES,
    LinkRecord,
    resolve,
    resolved_size_bytes,
)
from dataplane.formats.record_batch import parse_batches, patch_batch
from dataplane.formats.stream_records import HEADER_SIZE_BYTES, StreamRecordBatch
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.recovery import LinkResolution
from dataplane.s3stream.storage import StorageError
from dataplane.s3stream.wal.object_chain import ObjectWALLocation
from dataplane.s3stream.wal.object_readers import ObjectWALReader, WALTrimmedError
from dataplane.s3stream.wal.object_wal import ObjectWAL
from dataplane.zonerouter.channel import ChannelReaders, channel_location
from tests.unit.test_kafka_apis_inprocess import batch

BUCKETS = "0@s3://automq-main?region=us-east-1"


def test_link_payload_round_trip_and_bad_payloads():
    link = LinkRecord(3, 12345, 61, 200, 1_700_000_000_000)
    assert LinkRecord.decode(link.encode()) == link
    assert len(link.encode()) == LINK_PAYLOAD_BYTES
    for bad in (b"", b"\x00" * LINK_PAYLOAD_BYTES, link.encode()[:-1]):
        with pytest.raises(ValueError):
            LinkRecord.decode(bad)
    with pytest.raises(ValueError, match="invalid link"):
        LinkRecord.decode(LinkRecord(-1, 0, 0, 10, 0).encode())


def test_resolve_patches_the_partition_offset_and_epoch_into_the_channel_bytes():
    first, second = batch([b"a", b"b"]), batch([b"c"])
    channel_record = first + second
    link = LinkRecord(2, 0, len(first), len(second), 0)
    linked = StreamRecordBatch(7, 4, 100, -1, link.encode())
    got = resolve(linked, channel_record)
    assert (got.stream_id, got.epoch, got.base_offset, got.count) == (7, 4, 100, 1)
    assert got.payload == patch_batch(second, 100, 4)
    # the resolved size is known from the link alone (recovery sizes its upload chunks so)
    assert resolved_size_bytes(linked) == got.size_bytes
    with pytest.raises(ValueError, match="past the channel record"):
        resolve(linked, first)


def _link_batch(offset: int) -> StreamRecordBatch:
    return StreamRecordBatch(7, 0, offset, -1, LinkRecord(2, offset, 0, 10, 0).encode())


def test_recovery_resolves_several_links_at_once_and_keeps_the_wal_order():
    """A failover of a zone-routed broker resolves each kept link with a GET: one at a time
    that took seconds before the partitions could move."""
    workers = 4
    started = threading.Barrier(workers, timeout=10)  # broken unless 4 resolve at once
    order = list(range(12))

    def slow_resolve(link_batch: StreamRecordBatch) -> StreamRecordBatch:
        if link_batch.base_offset < workers:
            started.wait()
        time.sleep(0.001 * (12 - link_batch.base_offset))  # later links finish first
        return StreamRecordBatch(7, 0, link_batch.base_offset, 1, b"x" * 10)

    data = StreamRecordBatch(7, 0, 100, 1, b"plain")
    with LinkResolution(slow_resolve, workers=workers) as links:
        for offset in order:
            links.add(_link_batch(offset))
        links.add(data)
        assert links.pending_bytes == 12 * (HEADER_SIZE_BYTES + 10) + data.size_bytes
        got = links.take()
        assert links.pending_bytes == 0 and links.take() == []
    assert [b.base_offset for b in got] == [*order, 100]
    assert all(b.count == 1 for b in got[:-1]) and got[-1] is data


def test_a_link_that_cannot_be_resolved_fails_the_take_in_its_place():
    def resolve_or_fail(link_batch: StreamRecordBatch) -> StreamRecordBatch:
        if link_batch.base_offset == 2:
            raise WALTrimmedError("offset 2 is below the trim point 5")
        return link_batch

    with LinkResolution(resolve_or_fail, workers=2) as links:
        for offset in range(2):
            links.add(_link_batch(offset))
        assert [b.base_offset for b in links.take()] == [0, 1]
        for offset in range(2, 5):
            links.add(_link_batch(offset))
        with pytest.raises(WALTrimmedError, match="below the trim point"):
            links.take()


@pytest.fixture
def objects(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        with ObjectStorage(BUCKETS, merge_window_ms=0) as store:
            yield store


def _setup(objects, tmp_path):
    from controlplane.settings import ControllerSettings
    from controlplane.state_machine import MetadataStateMachine
    from dataplane.config import StorageConfig, WALConfig
    from dataplane.s3stream.storage import S3Storage
    from tests.unit.test_upload_stream_errors import HookedController

    ctrl = HookedController(MetadataStateMachine(ControllerSettings(bucket_ids=[0])))
    for node in (1, 2):
        ctrl.execute(
            "register_broker",
            {
                "node_id": node,
                "az": f"az{node}",
                "host": "127.0.0.1",
                "kafka_port": 9000 + node,
                "incarnation_id": f"i{node}",
                "wal_uri": f"s3://automq-main/wal/node-{node}",
            },
        )
        ctrl.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0})

    def engine(node: int) -> S3Storage:
        cfg = StorageConfig(
            upload_interval_s=3600, upload_threshold_bytes=1 << 30, block_cache_bytes=16 << 20
        )
        wal = WALConfig(uri=f"s3://automq-main/wal/node-{node}", capacity_bytes=16 << 20)
        e = S3Storage(
            cfg,
            node,
            0,
            ctrl,
            objects,
            data_dir=tmp_path / f"node{node}",
            wal=wal,
            link_resolver=ChannelReaders(objects).resolve,
        )
        e.start()
        return e

    return ctrl, engine


def _stop(engine) -> None:
    engine._stop.set()
    engine.request_upload()
    engine._uploader.join(10)
    engine.wal.close()


def _open_streams_of(ctrl, node: int):
    return lambda: [
        (s.stream_id, s.epoch)
        for s in ctrl.machine.image.streams.values()
        if s.state.value == "opened" and s.node_id == node
    ]


def _linked_main(objects, ctrl, engine):
    """Proxy node 2 writes a produce request's data (two Kafka batches) to its channel;
    main node 1 appends it with Link Records and crashes before uploading."""
    channel = ObjectWAL.open(objects, channel_location(2), 2, 0, capacity_bytes=64 << 20)
    records = batch([b"x%d" % i for i in range(5)]) + batch([b"y"])
    channel_offset = channel.append(records).result(10).offset
    main = engine(1)
    stream = main.open_stream(main.create_stream(), 0)
    futures = []
    position = 0
    for b in parse_batches(records):
        link = LinkRecord(2, channel_offset, position, len(b.data), 0).encode()
        base = stream.append_offset
        futures.append(
            stream.append_at(base, b.last_offset_delta + 1, patch_batch(b.data, base, 0), link)
        )
        position += len(b.data)
    assert [f.result(10) for f in futures] == [0, 5]
    with pytest.raises(StorageError, match="next offset is 6"):
        stream.append_at(3, 1, b"x")  # offsets are its writer's: the next ones, or none
    # the main reads the data from its LogCache
    assert b"".join(x.payload for x in stream.fetch(0, 6)) == (
        patch_batch(records[: len(records) - len(batch([b"y"]))], 0, 0)
        + patch_batch(batch([b"y"]), 5, 0)
    )
    # its WAL holds only two Link Records (header + link payload each), not the data
    reader = ObjectWALReader(objects, ObjectWALLocation(0, "wal/node-1"))
    first = reader.read(0)
    second = reader.read(first.next_offset)
    for rec in (first, second):
        logged, _ = StreamRecordBatch.decode(rec.data)
        assert logged.is_link and len(rec.data) == HEADER_SIZE_BYTES + LINK_PAYLOAD_BYTES
    _stop(main)
    return channel, channel_offset, records, stream.stream_id


def test_a_mains_wal_keeps_links_and_its_failover_reads_the_data_from_the_channel(
    objects, tmp_path
):
    from dataplane.formats.object_format import decode_block, parse_object
    from dataplane.objectstore import object_key
    from dataplane.s3stream.wal_failover import recover_failed_wal

    ctrl, engine = _setup(objects, tmp_path)
    channel, _, records, stream_id = _linked_main(objects, ctrl, engine)
    ctrl.execute("fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "test crash"})
    ctrl.execute("lifecycle_tick", {"expired_brokers": []})
    wal = ctrl.machine.image.node_wals[1]
    target = engine(2)
    try:
        result = recover_failed_wal(
            target, 1, wal.wal_uri, wal.node_epoch, _open_streams_of(ctrl, 1)
        )
        assert result.records_read == 2 and result.batches_uploaded == 2
        assert ctrl.machine.image.streams[stream_id].end_offset == 6
        got = b""
        for obj in ctrl.machine.image.objects.values():
            if obj.state.value == "committed":
                data = objects.get_object(obj.bucket_id, object_key(obj.object_id))
                for entry in parse_object(data)[1]:
                    blk = data[entry.position : entry.end_position]
                    got += b"".join(b.payload for b in decode_block(blk, entry))
        second = batch([b"y"])
        assert got == patch_batch(records[: -len(second)], 0, 0) + patch_batch(second, 5, 0)
    finally:
        _stop(target)
        channel.close()


def test_a_link_to_a_trimmed_channel_record_fails_recovery_with_a_clear_error(objects, tmp_path):
    from dataplane.s3stream.wal_failover import recover_failed_wal

    ctrl, engine = _setup(objects, tmp_path)
    channel, channel_offset, records, stream_id = _linked_main(objects, ctrl, engine)
    more = channel.append(b"later").result(10)
    channel.trim(more.offset)  # the proxy released the record too early
    ctrl.execute("fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "test crash"})
    ctrl.execute("lifecycle_tick", {"expired_brokers": []})
    wal = ctrl.machine.image.node_wals[1]
    target = engine(2)
    try:
        with pytest.raises(WALTrimmedError, match="below the trim point"):
            recover_failed_wal(target, 1, wal.wal_uri, wal.node_epoch, _open_streams_of(ctrl, 1))
        # nothing was committed from a half-resolved WAL
        assert ctrl.machine.image.streams[stream_id].end_offset == 0
    finally:
        _stop(target)
        channel.close()
