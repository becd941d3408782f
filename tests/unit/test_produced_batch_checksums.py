"""A produced batch's checked Kafka CRC is carried to the WAL record and the object block
that hold it instead of reading the batch again (`crc32c_combine`). Their checksums must
still be those of their bytes: a wrong one makes recovery refuse the WAL and readers refuse
the object. Through the Kafka API, the real engine (FileWAL in a temp dir) and moto S3."""

from __future__ import annotations

import asyncio

import boto3
import pytest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from dataplane.config import StorageConfig
from dataplane.formats.crc32c_combine import COMBINE_PAYS_FROM_BYTES
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.object_format import check_block, parse_object
from dataplane.formats.record_batch import parse_batches
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.kafka.registry import RequestContext
from tests.unit.inprocess_broker import inprocess_broker

# one batch each: below the combine's threshold, just above it, large with an odd length
VALUE_BYTES = (100, COMBINE_PAYS_FROM_BYTES + 1, 300_001)


def batch_of(value: bytes) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 21)
    builder.append(timestamp=1_700_000_000_000, key=b"k", value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def produce(apis, topic: str, records: bytes) -> int:
    P = ProduceRequest.TopicProduceData
    request = ProduceRequest[9](
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[P(name=topic, partition_data=[P.PartitionProduceData(0, records)])],
    )
    ctx = RequestContext(
        api_key=0, api_version=9, correlation_id=1, client_id="unit", peer=("x", 1)
    )
    response = asyncio.run(apis.data.produce(request, ctx))
    return response.responses[0].partition_responses[0].error_code


@pytest.fixture
def broker(tmp_path, monkeypatch):
    """An in-process broker that uploads only when asked: no upload trims the WAL before
    the test reads it back."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    config = StorageConfig(
        block_cache_bytes=16 << 20, log_cache_uploaded_bytes=16 << 20, upload_interval_s=3600
    )
    with inprocess_broker(tmp_path, storage_config=config) as parts:
        yield parts


def test_large_batches_get_wal_and_object_checksums_of_their_bytes(broker, monkeypatch):
    apis, controller, sync = broker
    combined = []  # payload sizes of the WAL records whose checksum came from a carried CRC
    real_encoded = StreamRecordBatch.encoded_crc32c

    def encoded_crc32c(self, header):
        crc = real_encoded(self, header)
        if crc is not None:
            combined.append(len(self.payload))
        return crc

    monkeypatch.setattr(StreamRecordBatch, "encoded_crc32c", encoded_crc32c)
    controller.call("create_topic", {"name": "plain", "partitions": 1})
    controller.call(
        "create_topic",
        {
            "name": "stamped",
            "partitions": 1,
            "configs": {"message.timestamp.type": "LogAppendTime"},
        },
    )
    sync()
    for topic in ("plain", "stamped"):  # a stamped batch gets a new CRC on the broker
        for size in VALUE_BYTES:
            assert produce(apis, topic, batch_of(bytes([size % 251]) * size)) == KafkaError.NONE
    storage = apis.partitions.storage
    # the batches from the combine's threshold on carried their CRC (else this tests nothing)
    large = [size for size in VALUE_BYTES if size >= COMBINE_PAYS_FROM_BYTES]
    assert len(combined) == 2 * len(large)
    assert all(size >= COMBINE_PAYS_FROM_BYTES for size in combined)

    # the WAL: every record reads back (recovery checks each record's checksum)
    logged = [StreamRecordBatch.decode(r.data)[0] for r in storage.wal.recover()]
    payloads = [b.payload for b in logged if len(b.payload) > 1000]
    assert len(payloads) == 2 * (len(VALUE_BYTES) - 1)
    for payload in payloads:  # each is a whole batch whose own CRC is right
        assert len(parse_batches(payload, client_origin=False)) == 1

    # the objects: every block of every uploaded object checks
    storage.flush()
    s3 = boto3.client("s3", region_name="us-east-1")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="automq-main")["Contents"]]
    blocks = 0
    for key in keys:
        data = s3.get_object(Bucket="automq-main", Key=key)["Body"].read()
        for entry in parse_object(data)[1]:
            check_block(data[entry.position : entry.position + entry.size], entry)
            blocks += 1
    assert blocks >= 2
