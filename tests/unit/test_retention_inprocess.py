"""DeleteRecords and time/size retention through the Kafka API layer with no server
(in-process controller, real engine, moto S3): the log start offset advances, reads below it
are OFFSET_OUT_OF_RANGE, and objects that held only removed data are marked destroyed."""

from __future__ import annotations

import asyncio

from kafka.protocol.admin import DeleteRecordsRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from controlplane.records import ObjectState
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.admin_apis import AdminApis
from dataplane.kafka.retention import RetentionManager, retention_start_offset
from dataplane.kafka.time_index import StoredPiece
from tests.unit.test_kafka_apis_inprocess import ctx, fetch_req, list_offsets_req, produce_req

NOW_MS = 1_800_000_000_000


def records(count: int, ts_ms: int, size: int = 1000, keyed: bool = False) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i in range(count):
        builder.append(
            timestamp=ts_ms + i, key=b"k%d" % i if keyed else None, value=b"x" * size, headers=[]
        )
    builder.close()
    return bytes(builder.buffer())


def topic_with_uploads(apis, controller, sync, name: str, configs: dict, batches: list[int]):
    """A topic whose partition 0 got one uploaded object per batch timestamp in `batches`."""
    controller.call("create_topic", {"name": name, "partitions": 1, "configs": configs})
    sync()
    for ts in batches:
        # a compacted topic refuses null keys (Kafka's rule)
        keyed = "compact" in configs.get("cleanup.policy", "")
        res = asyncio.run(
            apis.data.produce(produce_req(name, records(10, ts, keyed=keyed)), ctx(0, 9))
        )
        assert res.responses[0].partition_responses[0].error_code == KafkaError.NONE
        apis.partitions.storage.flush()  # one object per batch
    sync()
    topic = controller.machine.image.topic_by_name(name)
    return apis.partitions.get(topic.topic_id, 0), topic.partitions[0].stream_id


def earliest(apis, name: str) -> int:
    res = asyncio.run(apis.data.list_offsets(list_offsets_req(name, -2), ctx(2, 7)))
    return res.topics[0].partitions[0].offset


def live_objects(controller, stream_id: int) -> set[int]:
    image = controller.machine.image
    return {
        r.object_id
        for r in image.streams[stream_id].object_ranges
        if image.objects[r.object_id].state == ObjectState.COMMITTED
    }


def test_delete_records_advances_the_log_start_and_destroys_whole_objects(broker):
    apis, controller, sync = broker
    plog, stream_id = topic_with_uploads(apis, controller, sync, "dr", {}, [NOW_MS] * 3)
    objects_before = live_objects(controller, stream_id)
    assert len(objects_before) == 3
    admin = AdminApis(1, lambda: controller.machine.image, controller, apis.partitions, apis.io)

    def delete(offset: int, partition: int = 0, topic: str = "dr"):
        P = DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition
        req = DeleteRecordsRequest[2](
            topics=[
                DeleteRecordsRequest.DeleteRecordsTopic(
                    name=topic, partitions=[P(partition_index=partition, offset=offset)]
                )
            ],
            timeout_ms=10_000,
        )
        res = asyncio.run(admin.delete_records(req, ctx(21, 2)))
        p = res.topics[0].partitions[0]
        return p.error_code, p.low_watermark

    assert delete(25) == (KafkaError.NONE, 25)
    assert earliest(apis, "dr") == 25
    fetched = asyncio.run(apis.data.fetch(fetch_req("dr", 5), ctx(1, 12))).resolved()
    assert fetched.responses[0].partitions[0].error_code == KafkaError.OFFSET_OUT_OF_RANGE
    sync()
    image = controller.machine.image
    assert image.streams[stream_id].start_offset == 25
    # the first two objects held only offsets 0-19: destroyed; the third is partly live
    destroyed = [o for o in objects_before if image.objects[o].state != ObjectState.COMMITTED]
    assert len(destroyed) == 2

    assert delete(10) == (KafkaError.NONE, 25)  # below the start: nothing changes
    assert delete(31)[0] == KafkaError.OFFSET_OUT_OF_RANGE  # past the high watermark
    assert delete(-1) == (KafkaError.NONE, 30)  # -1: up to the high watermark
    assert delete(0, partition=7)[0] == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert delete(0, topic="nope")[0] == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    assert earliest(apis, "dr") == 30


def test_time_retention_removes_the_pieces_older_than_retention_ms(broker):
    apis, controller, sync = broker
    old, new = NOW_MS - 3_600_000, NOW_MS - 1_000
    plog, stream_id = topic_with_uploads(
        apis, controller, sync, "tr", {"retention.ms": "60000"}, [old, old, new]
    )
    retention = RetentionManager(
        lambda: controller.machine.image, apis.partitions.logs, clock_ms=lambda: NOW_MS
    )
    assert retention.check() == 1
    sync()
    assert earliest(apis, "tr") == 20  # the two old batches are gone, the new one stays
    assert retention.check() == 0  # nothing more is out of retention
    assert len(live_objects(controller, stream_id)) == 1


def test_size_retention_keeps_at_least_retention_bytes(broker):
    apis, controller, sync = broker
    plog, stream_id = topic_with_uploads(
        apis, controller, sync, "sr", {"retention.bytes": "15000"}, [NOW_MS] * 4
    )
    retention = RetentionManager(
        lambda: controller.machine.image, apis.partitions.logs, clock_ms=lambda: NOW_MS
    )
    assert retention.check() == 1
    sync()
    # each object holds ~10 KB: keeping >= 15 KB keeps the last two
    assert earliest(apis, "sr") == 20
    assert retention.check() == 0


def test_compact_only_topics_and_unlimited_retention_are_left_alone(broker):
    apis, controller, sync = broker
    topic_with_uploads(
        apis, controller, sync, "c", {"cleanup.policy": "compact", "retention.bytes": "1"}, [0]
    )
    topic_with_uploads(apis, controller, sync, "u", {"retention.ms": "-1"}, [0])
    retention = RetentionManager(
        lambda: controller.machine.image, apis.partitions.logs, clock_ms=lambda: NOW_MS
    )
    assert retention.check() == 0
    assert earliest(apis, "c") == 0 and earliest(apis, "u") == 0


def test_retention_start_offset_rules():
    pieces = [StoredPiece(i, i * 10, i * 10 + 10, 100) for i in range(4)]
    ts = {0: 1_000, 1: 2_000, 2: 9_000, 3: 1_500}  # out of order: stops at the first kept
    calls: list[int] = []

    def max_ts(piece):
        calls.append(piece.object_id)
        return ts[piece.object_id]

    assert retention_start_offset(pieces, 0, 10_000, 5_000, -1, max_ts) == 20
    assert calls == [0, 1, 2]  # the newer pieces were not read
    assert retention_start_offset(pieces, 0, 10_000, -1, 250, max_ts) == 10
    assert retention_start_offset(pieces, 0, 10_000, -1, 0, max_ts) == 40
    assert retention_start_offset(pieces, 15, 10_000, -1, 150, max_ts) == 20
    assert retention_start_offset(pieces, 0, 10_000, -1, -1, max_ts) is None
    assert retention_start_offset([], 0, 10_000, 0, 0, max_ts) is None
