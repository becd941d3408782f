"""Produce and fetch through the Kafka API layer with no server: an in-process controller
(the real state machine), a temp-dir WAL, the real engine and partition backend, moto S3."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecords, MemoryRecordsBuilder

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.registry import RequestContext
from tests.support.kafka_requests import fetch_request


def batch(values: list[bytes], producer: tuple[int, int, int] | None = None) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    if producer is not None:
        builder.set_producer_state(*producer, False)
    for i, value in enumerate(values):
        builder.append(timestamp=1_700_000_000_000 + i, key=b"k", value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def ctx(api_key: int, version: int) -> RequestContext:
    return RequestContext(
        api_key=api_key,
        api_version=version,
        correlation_id=1,
        client_id="unit",
        peer=("127.0.0.1", 1),
    )


def produce_req(topic: str, records: bytes, acks: int = -1):
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
    return ProduceRequest[9](
        transactional_id=None,
        acks=acks,
        timeout_ms=5_000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=[part])],
    )


def fetch_req(topic: str, offset: int):
    return fetch_request(topic, {0: offset})


def reads_objects(self, offset: int, max_bytes: int, end: int | None = None) -> None:
    """`PartitionLog.read_cached` of records no longer in memory: `read` (off the loop)."""
    return None


def values_of(records: bytes) -> list[tuple[int, bytes]]:
    out = []
    mr = MemoryRecords(records)
    while (b := mr.next_batch()) is not None:
        out += [(r.offset, r.value) for r in b]
    return out


def test_produce_then_fetch_through_the_api_layer_with_no_server(broker):
    apis, controller, sync = broker
    started = time.monotonic()
    controller.call("create_topic", {"name": "orders", "partitions": 1})
    sync()

    async def scenario():
        first = await apis.data.produce(produce_req("orders", batch([b"a", b"b", b"c"])), ctx(0, 9))
        second = await apis.data.produce(produce_req("orders", batch([b"d"])), ctx(0, 9))
        fetched = (await apis.data.fetch(fetch_req("orders", 1), ctx(1, 12))).resolved()
        latest = await apis.data.list_offsets(
            ListOffsetsRequest[7](
                replica_id=-1,
                isolation_level=0,
                topics=[
                    ListOffsetsRequest.ListOffsetsTopic(
                        name="orders",
                        partitions=[
                            ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition(
                                partition_index=0, current_leader_epoch=-1, timestamp=-1
                            )
                        ],
                    )
                ],
            ),
            ctx(2, 7),
        )
        return first, second, fetched, latest

    first, second, fetched, latest = asyncio.run(scenario())
    p1 = first.responses[0].partition_responses[0]
    p2 = second.responses[0].partition_responses[0]
    assert (p1.error_code, p1.base_offset) == (KafkaError.NONE, 0)
    assert (p2.error_code, p2.base_offset) == (KafkaError.NONE, 3)
    part = fetched.responses[0].partitions[0]
    assert part.error_code == KafkaError.NONE and part.high_watermark == 4
    # a fetch returns whole batches: the first batch (0-2) holds offset 1
    assert values_of(part.records) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]
    assert latest.topics[0].partitions[0].offset == 4
    assert time.monotonic() - started < 5  # no servers to start: well under a second usually


def test_a_fetch_at_the_tail_is_answered_from_memory_without_the_io_pool(broker):
    """Records still in the LogCache are read on the event loop: with the I/O pool shut
    down (any read handed to it would fail the request) the tail is still served."""
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "tail", "partitions": 1})
    sync()

    async def scenario():
        await apis.data.produce(produce_req("tail", batch([b"a", b"b"])), ctx(0, 9))
        apis.io.shutdown(wait=True)
        return (await apis.data.fetch(fetch_req("tail", 1), ctx(1, 12))).resolved()

    part = asyncio.run(scenario()).responses[0].partitions[0]
    assert part.error_code == KafkaError.NONE
    assert values_of(part.records) == [(0, b"a"), (1, b"b")]


def test_idempotent_retry_gets_the_original_offset_and_bad_batches_change_nothing(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    sync()
    records = batch([b"x", b"y"], producer=(7, 0, 0))

    async def scenario():
        a = await apis.data.produce(produce_req("t", records), ctx(0, 9))
        retry = await apis.data.produce(produce_req("t", records), ctx(0, 9))
        corrupt = bytearray(batch([b"z"]))
        corrupt[-1] ^= 0xFF  # the CRC no longer matches
        bad = await apis.data.produce(produce_req("t", bytes(corrupt)), ctx(0, 9))
        gap = await apis.data.produce(
            produce_req("t", batch([b"w"], producer=(7, 0, 5))), ctx(0, 9)
        )
        unknown = await apis.data.produce(produce_req("nope", batch([b"q"])), ctx(0, 9))
        fetched = (await apis.data.fetch(fetch_req("t", 0), ctx(1, 12))).resolved()
        return a, retry, bad, gap, unknown, fetched

    a, retry, bad, gap, unknown, fetched = asyncio.run(scenario())
    first = a.responses[0].partition_responses[0]
    again = retry.responses[0].partition_responses[0]
    assert (first.error_code, first.base_offset) == (0, 0)
    assert (again.error_code, again.base_offset) == (0, 0)  # deduplicated, not re-appended
    assert bad.responses[0].partition_responses[0].error_code == KafkaError.CORRUPT_MESSAGE
    assert (
        gap.responses[0].partition_responses[0].error_code
        == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    )
    assert (
        unknown.responses[0].partition_responses[0].error_code
        == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )
    part = fetched.responses[0].partitions[0]
    assert part.high_watermark == 2
    assert values_of(part.records) == [(0, b"x"), (1, b"y")]


def test_a_read_from_a_bucket_that_is_down_is_a_retriable_error_not_a_failed_request(
    broker, monkeypatch
):
    """Object-storage failover: older data in a dead bucket cannot be read; the fetch
    answers KAFKA_STORAGE_ERROR (clients retry) for that partition and nothing is skipped."""
    from dataplane.kafka.partition_log import PartitionLog
    from dataplane.objectstore import ObjectStoreUnavailableError

    apis, controller, sync = broker
    controller.call("create_topic", {"name": "old", "partitions": 1})
    sync()

    def bucket_down(self, offset: int, max_bytes: int, end: int | None = None) -> bytes:
        raise ObjectStoreUnavailableError("bucket 0 is unavailable (writes failing); retry later")

    async def scenario():
        await apis.data.produce(produce_req("old", batch([b"a", b"b"])), ctx(0, 9))
        with monkeypatch.context() as m:
            m.setattr(PartitionLog, "read", bucket_down)
            m.setattr(PartitionLog, "read_cached", reads_objects)  # older data: not in memory
            down = (await apis.data.fetch(fetch_req("old", 0), ctx(1, 12))).resolved()
        healed = (await apis.data.fetch(fetch_req("old", 0), ctx(1, 12))).resolved()
        return down, healed

    down, healed = asyncio.run(scenario())
    part = down.responses[0].partitions[0]
    assert part.error_code == KafkaError.KAFKA_STORAGE_ERROR and not part.records
    assert KafkaError.KAFKA_STORAGE_ERROR.retriable
    again = healed.responses[0].partitions[0]
    assert again.error_code == KafkaError.NONE
    assert values_of(again.records) == [(0, b"a"), (1, b"b")]


def list_offsets_req(topic: str, timestamp: int):
    P = ListOffsetsRequest.ListOffsetsTopic.ListOffsetsPartition
    return ListOffsetsRequest[7](
        replica_id=-1,
        isolation_level=0,
        topics=[
            ListOffsetsRequest.ListOffsetsTopic(
                name=topic,
                partitions=[P(partition_index=0, current_leader_epoch=-1, timestamp=timestamp)],
            )
        ],
    )


@pytest.mark.parametrize("compression", [0, 3])  # none, lz4
def test_offsets_for_times_is_exact_inside_a_batch(broker, compression):
    """100 records 1 s apart in one batch: the timestamp of record 50 finds offset 50 (it used
    to find the batch's first offset, 0)."""
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "times", "partitions": 1})
    sync()
    base_ts = 1_700_000_000_000
    builder = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 20)
    for i in range(100):
        builder.append(timestamp=base_ts + i * 1000, key=None, value=b"v%d" % i, headers=[])
    builder.close()
    later = MemoryRecordsBuilder(magic=2, compression_type=compression, batch_size=1 << 20)
    later.append(timestamp=base_ts + 500_000, key=None, value=b"late", headers=[])
    later.close()

    def lookup(ts: int) -> tuple[int, int]:
        res = asyncio.run(apis.data.list_offsets(list_offsets_req("times", ts), ctx(2, 7)))
        p = res.topics[0].partitions[0]
        assert p.error_code == KafkaError.NONE
        return p.offset, p.timestamp

    for records in (bytes(builder.buffer()), bytes(later.buffer())):
        res = asyncio.run(apis.data.produce(produce_req("times", records), ctx(0, 9)))
        assert res.responses[0].partition_responses[0].error_code == KafkaError.NONE
    assert lookup(base_ts + 50_000) == (50, base_ts + 50_000)
    assert lookup(base_ts + 49_500) == (50, base_ts + 50_000)  # first at or after
    assert lookup(base_ts) == (0, base_ts)
    assert lookup(base_ts + 99_001) == (100, base_ts + 500_000)  # in the next batch
    assert lookup(base_ts + 500_001) == (-1, -1)


def multi_fetch_req(topic: str, partitions: int, max_bytes: int, partition_max_bytes: int):
    return fetch_request(
        topic,
        dict.fromkeys(range(partitions), 0),
        max_bytes=max_bytes,
        partition_max_bytes=partition_max_bytes,
    )


def test_the_partitions_of_one_fetch_are_read_at_once_within_max_bytes(broker, monkeypatch):
    """A catch-up read waits for object-store GETs: the partitions of one Fetch are read
    concurrently (each read here waits until all four are in progress: read one after the
    other they would time out), and the response still keeps max_bytes: partitions past it
    get nothing, the first partitions' records come back whole and in request order."""
    from concurrent.futures import ThreadPoolExecutor

    from dataplane.kafka.partition_log import PartitionLog

    apis, controller, sync = broker
    apis.io.shutdown(wait=True)
    apis.io = ThreadPoolExecutor(4, thread_name_prefix="kafka-io")
    controller.call("create_topic", {"name": "wide", "partitions": 4})
    sync()
    value = b"v" * 10_000
    original = PartitionLog.read
    together = threading.Barrier(4, timeout=10)
    reads: list[int] = []

    def slow_read(self, offset: int, max_bytes: int, end: int | None = None) -> bytes:
        reads.append(self.partition)
        together.wait()  # an object-store GET's latency, which the four reads share
        return original(self, offset, max_bytes, end)

    def produce_to(p: int):
        part = ProduceRequest.TopicProduceData.PartitionProduceData(index=p, records=batch([value]))
        return ProduceRequest[9](
            transactional_id=None,
            acks=-1,
            timeout_ms=5_000,
            topic_data=[ProduceRequest.TopicProduceData(name="wide", partition_data=[part])],
        )

    async def scenario():
        for p in range(4):
            await apis.data.produce(produce_to(p), ctx(0, 9))
        with monkeypatch.context() as m:
            m.setattr(PartitionLog, "read", slow_read)
            m.setattr(PartitionLog, "read_cached", reads_objects)  # a catch-up: not in memory
            wide = await apis.data.fetch(multi_fetch_req("wide", 4, 4 << 20, 1 << 20), ctx(1, 12))
            wide = wide.resolved()
        # max_bytes 25,000, 12,000 per partition: partitions 0 and 1 whole, 2 with what is
        # left (still one whole batch), 3 nothing
        narrow = await apis.data.fetch(multi_fetch_req("wide", 4, 25_000, 12_000), ctx(1, 12))
        return wide, narrow.resolved()

    wide, narrow = asyncio.run(scenario())
    assert sorted(reads) == [0, 1, 2, 3]
    got = wide.responses[0].partitions
    assert [p.partition_index for p in got] == [0, 1, 2, 3]
    assert all(values_of(p.records) == [(0, value)] for p in got)
    parts = narrow.responses[0].partitions
    assert [p.partition_index for p in parts] == [0, 1, 2, 3]
    assert [len(values_of(p.records)) for p in parts] == [1, 1, 1, 0]
    assert all(p.error_code == KafkaError.NONE for p in parts)
