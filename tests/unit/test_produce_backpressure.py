"""A full WAL never freezes the broker: produce waits for room without blocking the event
loop, answers a retriable REQUEST_TIMED_OUT past its bound, and goes on once uploads free
room. The real engine and Kafka APIs in-process (moto S3), uploads held back as a hung
object store would hold them."""

from __future__ import annotations

import asyncio
import threading
import time

from dataplane.formats.kafka_errors import KafkaError
from tests.unit.test_kafka_apis_inprocess import batch, ctx, fetch_req, produce_req, values_of

# a refused produce (timeout 1 s) waits ~0.8 s for room, then answers: well below this
# however busy the machine, and far below a wait for the store (held 60 s)
MAX_REFUSED_WAIT_S = 5.0
VALUE_BYTES = 64 * 1024
RECORDS_PER_REQUEST = 15  # ~1 MiB: what one batch of the test's builder holds


def test_a_full_wal_is_waited_for_without_blocking_the_loop(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "bp", "partitions": 1})
    sync()
    storage = apis.partitions.storage
    store_resumed = threading.Event()
    real_upload = storage.uploader.upload

    def hung_upload(*args, **kwargs):  # the object store does not answer until resumed
        assert store_resumed.wait(60), "the test never resumed the store"
        return real_upload(*args, **kwargs)

    storage.uploader.upload = hung_upload

    def request(i: int, timeout_ms: int):
        req = produce_req("bp", batch([b"%d:" % i + bytes(VALUE_BYTES)] * RECORDS_PER_REQUEST))
        req.timeout_ms = timeout_ms
        return req

    async def scenario():
        acked: list[int] = []
        refused = None
        try:
            for i in range(1000):  # bounded: the 32 MiB WAL is full after ~32 of these
                started = time.monotonic()
                res = await apis.data.produce(request(i, 1_000), ctx(0, 9))
                part = res.responses[0].partition_responses[0]
                if part.error_code != KafkaError.NONE:
                    refused = (i, part.error_code, time.monotonic() - started)
                    break
                acked.append(part.base_offset)
            assert refused is not None, "the WAL never filled"
            # while one producer waits for room (its timeout 20 s, the store held until the
            # test resumes it), the loop answers everything else: a wait that blocked the
            # loop would have ended the produce (refused) before Metadata was answered
            waiting = asyncio.create_task(apis.data.produce(request(10_000, 20_000), ctx(0, 9)))
            await apis.cluster.metadata(_metadata_req(), ctx(3, 12))
            assert not waiting.done(), "the produce waiting for room blocked the event loop"
            await asyncio.sleep(0.3)
            assert not waiting.done()
            store_resumed.set()  # uploads go through, the WAL is trimmed, room comes back
            late = (await asyncio.wait_for(waiting, 30)).responses[0].partition_responses[0]
        finally:
            store_resumed.set()
        return acked, refused, late

    acked, refused, late = asyncio.run(scenario())
    index, error, waited_s = refused
    # a retriable error that is no leader change, after waiting most of its timeout
    assert error == KafkaError.REQUEST_TIMED_OUT
    assert 0.5 <= waited_s < MAX_REFUSED_WAIT_S
    assert late.error_code == KafkaError.NONE
    assert late.base_offset == RECORDS_PER_REQUEST * len(
        acked
    )  # the refused request appended nothing

    async def read_all() -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        while len(out) < RECORDS_PER_REQUEST * (len(acked) + 1):
            res = (await apis.data.fetch(fetch_req("bp", len(out)), ctx(1, 12))).resolved()
            got = values_of(res.responses[0].partitions[0].records)
            assert got, f"nothing readable at {len(out)}"
            out += [(o, v) for o, v in got if o >= len(out)]
        return out

    records = asyncio.run(read_all())
    senders = [int(v.split(b":", 1)[0]) for _, v in records]
    assert senders == [i for i in [*range(len(acked)), 10_000] for _ in range(RECORDS_PER_REQUEST)]


def _metadata_req():
    from kafka.protocol.metadata import MetadataRequest

    return MetadataRequest[12](
        topics=[MetadataRequest.MetadataRequestTopic(topic_id=None, name="bp")],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
