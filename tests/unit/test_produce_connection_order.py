"""A connection's Produce requests reach their partitions in the order they were sent, as
Kafka applies one connection's requests one after the other: an idempotent producer
pipelines batches of a partition (seq n, n+1, ...) and counts every batch acked before a
later one was refused as persisted, so a later request appending first (its sequence then
skips the ones still waiting) makes librdkafka fail for good on OUT_OF_ORDER_SEQUENCE_NUMBER
("sequence desynchronization"). In-process broker; the first request waits for WAL room."""

from __future__ import annotations

import asyncio

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.partition_backend import BackendBackpressure
from tests.unit.test_kafka_apis_inprocess import batch, ctx, produce_req

PRODUCER_ID, PRODUCER_EPOCH = 7, 0


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


def test_a_request_waiting_for_room_is_not_overtaken_by_a_later_one(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "order", "partitions": 1})
    sync()
    (plog,) = apis.partitions.logs()
    connection = ctx(0, 9)  # one client connection: its requests share this context
    real_append = plog.append
    room_full_once = []

    async def scenario():
        room = _HeldRoom()

        def append(records):
            if not room_full_once:  # the WAL has no room for the next append, once
                room_full_once.append(True)
                raise BackendBackpressure("WAL full", room, 0, 5.0)
            return real_append(records)

        first = await apis.data.produce(_idempotent(0), connection)
        plog.append = append
        try:
            waiting = asyncio.create_task(apis.data.produce(_idempotent(1), connection))
            await asyncio.wait_for(room.waiting.wait(), 5)
            later = asyncio.create_task(apis.data.produce(_idempotent(2), connection))
            for _ in range(20):  # the later request runs as far as it may
                await asyncio.sleep(0)
            room.freed.set()
            return first, await waiting, await later
        finally:
            plog.append = real_append

    answers = asyncio.run(scenario())
    parts = [a.responses[0].partition_responses[0] for a in answers]
    assert [p.error_code for p in parts] == [KafkaError.NONE] * 3, parts
    assert [p.base_offset for p in parts] == [0, 1, 2]
