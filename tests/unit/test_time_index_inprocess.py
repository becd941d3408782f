"""The time index through the Kafka API layer (in-process controller, real engine, moto S3):
ListOffsets by timestamp finds the first record at or after it across many uploaded objects
and the WAL tail, reading O(log n) pieces; MAX_TIMESTAMP finds the record with the largest
timestamp."""

from __future__ import annotations

import asyncio
import math

import pytest
from kafka.record.memory_records import MemoryRecordsBuilder

from dataplane.formats.kafka_errors import KafkaError
from tests.unit.test_kafka_apis_inprocess import ctx, list_offsets_req, produce_req

BASE_TS = 1_700_000_000_000
PIECES = 32
PER_BATCH = 10


def batch(timestamps: list[int]) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for ts in timestamps:
        builder.append(timestamp=ts, key=None, value=b"v", headers=[])
    builder.close()
    return bytes(builder.buffer())


def lookup(apis, ts: int) -> tuple[int, int]:
    res = asyncio.run(apis.data.list_offsets(list_offsets_req("t", ts), ctx(2, 7)))
    p = res.topics[0].partitions[0]
    assert p.error_code == KafkaError.NONE
    return p.offset, p.timestamp


def produce(apis, timestamps: list[int]) -> None:
    res = asyncio.run(apis.data.produce(produce_req("t", batch(timestamps)), ctx(0, 9)))
    assert res.responses[0].partition_responses[0].error_code == KafkaError.NONE


@pytest.fixture
def many_pieces(broker):
    """Topic t: PIECES uploaded objects of PER_BATCH records 1 s apart, then one batch in the
    WAL; record i has timestamp BASE_TS + i * 1000 (the WAL batch: 1 s after the last)."""
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    sync()
    for piece in range(PIECES):
        first = piece * PER_BATCH
        produce(apis, [BASE_TS + (first + i) * 1000 for i in range(PER_BATCH)])
        apis.partitions.storage.flush()
    sync()
    produce(apis, [BASE_TS + (PIECES * PER_BATCH + i) * 1000 for i in range(PER_BATCH)])
    topic = controller.machine.image.topic_by_name("t")
    return apis, apis.partitions.get(topic.topic_id, 0)


def test_lookup_is_exact_across_pieces_and_the_wal_tail(many_pieces):
    apis, plog = many_pieces
    total = (PIECES + 1) * PER_BATCH
    for i in (0, 1, 9, 10, 155, 319, 320, 325, total - 1):
        assert lookup(apis, BASE_TS + i * 1000) == (i, BASE_TS + i * 1000), i
        assert lookup(apis, BASE_TS + i * 1000 - 500) == (i, BASE_TS + i * 1000), i
    assert lookup(apis, BASE_TS + total * 1000) == (-1, -1)


def test_a_lookup_reads_log_n_pieces(many_pieces):
    apis, plog = many_pieces
    cache = apis.partitions.piece_timestamps
    assert len(cache._cache) == 0
    assert lookup(apis, BASE_TS + 200 * 1000) == (200, BASE_TS + 200 * 1000)
    # the binary search read the largest timestamp of ceil(log2(32)) + 1 pieces at most
    assert 0 < len(cache._cache) <= math.ceil(math.log2(PIECES)) + 1


def test_max_timestamp_finds_the_record_with_the_largest_timestamp(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    sync()
    assert lookup(apis, -3) == (-1, -1)  # empty partition
    produce(apis, [BASE_TS, BASE_TS + 1])
    apis.partitions.storage.flush()
    produce(apis, [BASE_TS + 2, BASE_TS + 99_000, BASE_TS + 3])  # offset 3: the largest
    apis.partitions.storage.flush()
    sync()
    produce(apis, [BASE_TS + 4])  # in the WAL, smaller
    assert lookup(apis, -3) == (3, BASE_TS + 99_000)
    produce(apis, [BASE_TS + 100_000])  # offset 6, in the WAL: now the largest
    assert lookup(apis, -3) == (6, BASE_TS + 100_000)
