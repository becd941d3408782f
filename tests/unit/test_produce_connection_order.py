"""A connection's Produce requests reach their partitions in the order they were sent, as
Kafka applies one connection's requests one after the other: an idempotent producer
pipelines batches of a partition (seq n, n+1, ...) and counts every batch acked before a
later one was refused as persisted, so a later request appending first (its sequence then
skips the ones still waiting) makes librdkafka fail for good on OUT_OF_ORDER_SEQUENCE_NUMBER
("sequence desynchronization"). In-process broker behind a real `KafkaServer` connection on
loopback; the first request waits for WAL room."""

from __future__ import annotations

import asyncio
import struct

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import decode_response, encode_request
from dataplane.kafka.partition_backend import BackendBackpressure
from dataplane.kafka.registry import ApiRegistry
from dataplane.kafka.server import KafkaServer
from tests.unit.test_kafka_apis_inprocess import batch, produce_req

PRODUCER_ID, PRODUCER_EPOCH = 7, 0
PRODUCE_KEY, PRODUCE_VERSION = 0, 9
WAIT_S = 10.0


class _HeldRoom:
    """WAL room that comes back only when the test says so."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.freed = asyncio.Event()

    def wait(self, after_generation: int, timeout_s: float) -> bool:
        raise AssertionError("the event loop must not block on room")

    async def wait_async(self, after_generation: int, timeout_s: float) -> bool:
        self.waiting.set()
        await asyncio.wait_for(self.freed.wait(), timeout_s)
        return True


def _idempotent(seq: int):
    return produce_req("order", batch([b"v%d" % seq], (PRODUCER_ID, PRODUCER_EPOCH, seq)))


async def _started(correlation_id: int, appends: list) -> None:
    """Until Produce `correlation_id` (the third append tried) has started: its handler
    task exists (named kafka-<connection>-ProduceRequest-<correlation id>: the server read
    its frame) or it already tried its append."""
    suffix = f"-ProduceRequest-{correlation_id}"
    async with asyncio.timeout(WAIT_S):
        while len(appends) < 2 and not any(
            t.get_name().endswith(suffix) for t in asyncio.all_tasks()
        ):
            await asyncio.sleep(0.001)


async def _answer(reader: asyncio.StreamReader):
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    correlation_id, body = decode_response(
        await reader.readexactly(size), PRODUCE_KEY, PRODUCE_VERSION
    )
    part = body.responses[0].partition_responses[0]
    return correlation_id, part.error_code, part.base_offset


def test_a_request_waiting_for_room_is_not_overtaken_by_a_later_one(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "order", "partitions": 1})
    sync()
    (plog,) = apis.partitions.logs()
    registry = ApiRegistry()
    for cls, lo, hi, handler in apis.registrations():
        registry.register(cls, lo, hi, handler)
    real_append = plog.append
    room_full_once = []
    appends = []  # the records of each append tried once the WAL is made full

    def send(writer: asyncio.StreamWriter, seq: int) -> None:
        writer.write(encode_request(_idempotent(seq), correlation_id=seq, version=PRODUCE_VERSION))

    async def scenario():
        room = _HeldRoom()

        def append(records):
            appends.append(records)
            if not room_full_once:  # the WAL has no room for the next append, once
                room_full_once.append(True)
                raise BackendBackpressure("WAL full", room, 0, 5.0)
            return real_append(records)

        async with KafkaServer(registry, "127.0.0.1", 0) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            try:
                send(writer, 0)
                first = await asyncio.wait_for(_answer(reader), WAIT_S)
                plog.append = append
                send(writer, 1)
                await asyncio.wait_for(room.waiting.wait(), WAIT_S)
                send(writer, 2)
                await _started(2, appends)
                for _ in range(20):  # the later request runs as far as it may
                    await asyncio.sleep(0)
                room.freed.set()
                later = [await asyncio.wait_for(_answer(reader), WAIT_S) for _ in range(2)]
                return [first, *later]
            finally:
                plog.append = real_append
                writer.close()

    answers = asyncio.run(scenario())
    # (correlation id, error, base offset): each appended in the order sent
    assert answers == [(0, KafkaError.NONE, 0), (1, KafkaError.NONE, 1), (2, KafkaError.NONE, 2)]
