"""Kafka 3.9 behaviours librdkafka's regression suite checks on the broker, through the
in-process API layer (no server): compacted topics refuse null keys per record (KIP-467),
offsets of unknown topics are refused, illegal topic names, LogAppendTime, manual replica
assignments, broker configs Kafka accepts."""

from __future__ import annotations

import asyncio

from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from dataplane.formats.kafka_errors import KafkaError
from tests.unit.test_kafka_apis_inprocess import ctx


def keyed_batch(keys: list[bytes | None], timestamp_ms: int = 1_700_000_000_000) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i, key in enumerate(keys):
        builder.append(timestamp=timestamp_ms + i, key=key, value=b"v%d" % i, headers=[])
    builder.close()
    return bytes(builder.buffer())


def produce(topic: str, records_by_partition: dict[int, bytes], version: int = 9):
    parts = [
        ProduceRequest.TopicProduceData.PartitionProduceData(index=index, records=records)
        for index, records in records_by_partition.items()
    ]
    return ProduceRequest[version](
        transactional_id=None,
        acks=-1,
        timeout_ms=5_000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=parts)],
    )


def test_null_keys_on_a_compacted_topic_fail_exactly_those_records(broker):
    apis, controller, sync = broker
    controller.call(
        "create_topic",
        {"name": "table", "partitions": 2, "configs": {"cleanup.policy": "compact"}},
    )
    sync()
    req = produce("table", {0: keyed_batch([b"a", None, b"c", None]), 1: keyed_batch([b"x"])})
    resp = asyncio.run(apis.data.produce(req, ctx(0, 9)))
    bad, good = resp.responses[0].partition_responses
    assert bad.error_code == KafkaError.INVALID_RECORD and bad.base_offset == -1
    assert [(e.batch_index, e.batch_index_error_message) for e in bad.record_errors] == [
        (1, "Compacted topic cannot accept message without key"),
        (3, "Compacted topic cannot accept message without key"),
    ]
    assert bad.error_message
    # the other partition of the same request is appended
    assert (good.error_code, good.base_offset, good.record_errors) == (KafkaError.NONE, 0, [])
    resp.encode()  # the response serializes (record_errors is a v8+ field)
    image = apis.data.broker.image_fn()
    topic = image.topic_by_name("table")
    assert apis.data.broker.routing.get(topic.topic_id, 0, "az1").high_watermark == 0


def test_null_keys_are_fine_on_a_delete_topic(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "events", "partitions": 1})
    sync()
    resp = asyncio.run(apis.data.produce(produce("events", {0: keyed_batch([None])}), ctx(0, 9)))
    part = resp.responses[0].partition_responses[0]
    assert (part.error_code, part.base_offset) == (KafkaError.NONE, 0)
