"""The Kafka listeners' network limits: the asyncio priority limiter (producer traffic
first, tail reads next, catch-up reads last; bounded waits), and produce and fetch through
the Kafka API layer under ingress and egress limits."""

from __future__ import annotations

import asyncio
import time

import pytest

from dataplane.config import BrokerConfig, NetworkConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.network_limits import (
    AsyncPriorityLimiter,
    NetworkLimits,
    TrafficClass,
    kept_partitions,
)
from tests.unit.test_kafka_apis_inprocess import batch, ctx, fetch_req, produce_req, values_of


async def drained(rate: int, max_waiters: int = 100) -> AsyncPriorityLimiter:
    """A limiter of `rate` (burst: one second's) with no tokens left."""
    limiter = AsyncPriorityLimiter(rate, max_waiters=max_waiters)
    assert await limiter.acquire(rate, TrafficClass.PRODUCE, 0) == rate
    return limiter


def test_waiters_are_served_produce_then_tail_then_catch_up():
    async def scenario():
        limiter = await drained(20_000)  # each 2,000-byte request waits ~0.1 s
        order: list[str] = []

        async def one(name: str, traffic: TrafficClass) -> None:
            assert await limiter.acquire(2_000, traffic, 30) == 2_000
            order.append(name)

        tasks = []
        for name, traffic in [
            ("catch-up 1", TrafficClass.CATCH_UP_READ),
            ("tail 1", TrafficClass.TAIL_READ),
            ("catch-up 2", TrafficClass.CATCH_UP_READ),
            ("produce", TrafficClass.PRODUCE),
            ("tail 2", TrafficClass.TAIL_READ),
        ]:
            tasks.append(asyncio.create_task(one(name, traffic)))
            await asyncio.sleep(0)  # arrive in this order
        await asyncio.gather(*tasks)
        return order, limiter.waiting_count

    order, waiting = asyncio.run(scenario())
    assert order == ["produce", "tail 1", "tail 2", "catch-up 1", "catch-up 2"]
    assert waiting == 0


def test_a_wait_ends_at_its_timeout_with_what_is_there():
    async def scenario():
        limiter = await drained(1_000)  # empty: 1,000 B/s from now on
        t0 = time.monotonic()
        whole = await limiter.acquire(5_000, TrafficClass.CATCH_UP_READ, 0.05)
        partial = await limiter.acquire(5_000, TrafficClass.CATCH_UP_READ, 0.3, partial=True)
        return whole, partial, time.monotonic() - t0, limiter.waiting_count

    whole, partial, elapsed_s, waiting = asyncio.run(scenario())
    assert whole == 0  # not granted: the caller answers without the bytes
    assert 0 < partial <= 400  # ~0.35 s of 1,000 B/s were there at the end
    assert elapsed_s < 5 and waiting == 0


def test_a_full_queue_answers_at_once():
    async def scenario():
        limiter = await drained(1_000, max_waiters=1)
        blocked = asyncio.create_task(limiter.acquire(900, TrafficClass.TAIL_READ, 30))
        await asyncio.sleep(0)
        t0 = time.monotonic()
        refused = await limiter.acquire(10, TrafficClass.PRODUCE, 30)
        elapsed = time.monotonic() - t0
        blocked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await blocked
        return refused, elapsed, limiter.waiting_count

    refused, elapsed_s, waiting = asyncio.run(scenario())
    assert refused == 0 and elapsed_s < 1 and waiting == 0  # a cancelled waiter leaves too


def test_the_rate_caps_a_stream_of_reads():
    """Fetch-sized grants for 1.5 s at 400 KB/s: about 1.5 s of the rate plus one burst."""

    async def scenario():
        limiter = AsyncPriorityLimiter(400_000, 100_000, max_waiters=10)
        granted, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 1.5:
            granted += await limiter.acquire(50_000, TrafficClass.CATCH_UP_READ, 5)
        return granted, time.monotonic() - t0

    granted, elapsed_s = asyncio.run(scenario())
    assert granted <= 400_000 * elapsed_s + 100_000 + 50_000
    assert granted >= 400_000 * 1.5 * 0.5  # the noisy machine's timers: a generous floor


def test_kept_partitions():
    assert kept_partitions([100, 200, 300], 10_000) == 3
    assert kept_partitions([100, 200, 300], 350) == 2
    assert kept_partitions([100, 200, 300], 50) == 1  # progress: at least the first
    assert kept_partitions([100, 200, 300], 0) == 0
    assert kept_partitions([], 10) == 0


def test_network_limits_are_broker_configs():
    cfg = BrokerConfig.model_validate(
        {
            "node_id": 1,
            "az": "az1",
            "kafka_port": 0,
            "data_dir": "/tmp/x",
            "controllers": [],
            "network": {"ingress_bytes_per_s": 50_000_000, "egress_bytes_per_s": 20_000_000},
        }
    )
    limits = NetworkLimits.from_config(cfg.network)
    assert limits.ingress.limited and limits.egress.limited
    assert not NetworkLimits.from_config(NetworkConfig()).egress.limited  # 0: unlimited
    with pytest.raises(ValueError):
        NetworkConfig(egress_bytes_per_s=-1)


def test_produce_past_the_ingress_limit_times_out_and_appends_nothing(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "orders", "partitions": 1})
    sync()
    apis.network = NetworkLimits.from_config(NetworkConfig(ingress_bytes_per_s=1_000))
    big = batch([b"x" * 5_000])

    async def scenario():
        first = await apis.data.produce(produce_req("orders", big), ctx(0, 9))  # a burst
        req = produce_req("orders", big)
        req.timeout_ms = 200  # the bucket is 4 s in debt
        second = await apis.data.produce(req, ctx(0, 9))
        fetched = (await apis.data.fetch(fetch_req("orders", 0), ctx(1, 12))).resolved()
        return first, second, fetched

    first, second, fetched = asyncio.run(scenario())
    assert first.responses[0].partition_responses[0].error_code == KafkaError.NONE
    assert second.responses[0].partition_responses[0].error_code == KafkaError.REQUEST_TIMED_OUT
    assert fetched.responses[0].partitions[0].high_watermark == 1  # the second not appended


def test_a_fetch_past_the_egress_limit_answers_in_time_with_fewer_records(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "orders", "partitions": 1})
    sync()
    apis.network = NetworkLimits.from_config(
        NetworkConfig(egress_bytes_per_s=1_000, burst_ms=1_000)
    )

    async def scenario():
        await apis.data.produce(produce_req("orders", batch([b"y" * 3_000])), ctx(0, 9))
        first = (await apis.data.fetch(fetch_req("orders", 0), ctx(1, 12))).resolved()
        req = fetch_req("orders", 0)
        req.max_wait_ms = 200  # the bucket is 2 s in debt
        t0 = time.monotonic()
        second = (await apis.data.fetch(req, ctx(1, 12))).resolved()
        return first, second, time.monotonic() - t0

    first, second, elapsed_s = asyncio.run(scenario())
    assert values_of(first.responses[0].partitions[0].records) == [(0, b"y" * 3_000)]
    part = second.responses[0].partitions[0]
    assert part.error_code == KafkaError.NONE and part.high_watermark == 1
    assert not part.records  # nothing sent now: the consumer fetches again
    assert elapsed_s < 5  # answered about its max wait, never hanging


def test_cluster_up_broker_config_flag_reaches_every_broker(tmp_path):
    """`automqctl cluster up --broker-config network.egress_bytes_per_s=...`: kept in the
    cluster's config, written into each broker's, refused when bad or when it differs on a
    restart."""
    from cli.cluster_config import ClusterError
    from cli.config_files import broker_config, parse_broker_overrides
    from cli.flag_differences import flag_differences
    from cli.local_cluster import LocalCluster

    flags = ["network.egress_bytes_per_s=20000000", "object_store.read_bandwidth_bytes_per_s=7"]
    overrides = parse_broker_overrides(flags)
    assert overrides == {
        "network": {"egress_bytes_per_s": 20_000_000},
        "object_store": {"read_bandwidth_bytes_per_s": 7},
    }
    config = LocalCluster(tmp_path / "c").create(
        1, 1, ["a"], None, None, 6000, broker_overrides=overrides
    )
    cfg = broker_config(config, config.brokers[0], tmp_path / "b", tmp_path / "tls", None)
    assert cfg.network.egress_bytes_per_s == 20_000_000 and cfg.network.ingress_bytes_per_s == 0
    assert cfg.object_store.read_bandwidth_bytes_per_s == 7
    assert cfg.object_store.max_concurrency == 64  # the rest of the section keeps its defaults
    assert flag_differences(config, broker_config=flags) == []
    assert flag_differences(config, broker_config=["network.egress_bytes_per_s=1"])
    for bad in [
        "network.egress_bytes_per_s=-1",
        "network.no_such_key=1",
        "egress_bytes_per_s=1",
        "node_id.x=1",
        "network.egress_bytes_per_s",
    ]:
        with pytest.raises(ClusterError):
            parse_broker_overrides([bad])


def test_a_read_that_reached_object_storage_ranks_as_a_catch_up_read(monkeypatch):
    """The fetch path ranks a partition read by where it was served from: through the
    committed readers (object storage) a catch-up read, else (the log cache) a tail read."""
    from types import SimpleNamespace

    from dataplane.config import StorageConfig
    from dataplane.kafka import data_apis
    from dataplane.s3stream import committed_readers

    class StubReader:
        next_offset = 5
        last_used = float("inf")  # never expires

        def __init__(self, *args: object) -> None:
            pass

        def read(self, start: int, end: int, max_bytes: int) -> list:
            return []

        def release(self) -> None:
            pass

    monkeypatch.setattr(committed_readers, "StreamReader", StubReader)
    cache = SimpleNamespace(used_bytes=0, hits=0, misses=0)
    readers = committed_readers.CommittedReaders(None, None, None, cache, StorageConfig())

    class Backend:
        def __init__(self, from_objects: bool) -> None:
            self.from_objects = from_objects

        def read(self, offset: int, max_bytes: int, end: int) -> bytes:
            if self.from_objects:
                readers.read(1, offset, end, max_bytes)
            return b"records"

    assert data_apis._read_noting_objects(Backend(True), 0, 100, 5) == (b"records", True)
    assert data_apis._read_noting_objects(Backend(False), 0, 100, 5) == (b"records", False)
