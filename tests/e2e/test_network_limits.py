"""The broker's egress limit with real clients (seed 002, "Network Prioritization and Rate
Limiting"): a cluster started with `--broker-config network.egress_bytes_per_s=...` caps a
catch-up consumer reading a backlog at that rate, while a producer beside it keeps getting
its acknowledgements (produced bytes take no egress tokens: producer traffic first).

Uploaded records leave the log cache at once (`storage.log_cache_uploaded_bytes=0`) and the
upload interval is short, so the consumer reads the backlog from object storage: catch-up
reads, the lowest class.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from tests.support.ledger import create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EGRESS_BYTES_PER_S = 3_000_000
BACKLOG_BYTES = 24 * 1024 * 1024
RECORD_BYTES = 16 * 1024
PARTITIONS = 4
TICK_RECORDS_S = 200  # the producer beside the catch-up: 1 KiB records


def _fill(bootstrap: str, topic: str) -> dict[int, int]:
    """BACKLOG_BYTES of records into `topic`; the end offset of each partition."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    value = b"b" * RECORD_BYTES
    for i in range(BACKLOG_BYTES // RECORD_BYTES):
        producer.produce(topic, value, partition=i % PARTITIONS)
        producer.poll(0)
    assert producer.flush(60) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends"})
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
        for p in range(PARTITIONS)
    }
    consumer.close()
    assert sum(ends.values()) == BACKLOG_BYTES // RECORD_BYTES
    return ends


class _TickingProducer:
    """Produces 1 KiB records at TICK_RECORDS_S in a thread (acks=all); counts the acks."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked = 0
        self.failed: list[object] = []
        self._stop = threading.Event()
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True}
        )
        self._topic = topic
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, err, _msg) -> None:
        if err is None:
            self.acked += 1
        else:
            self.failed.append(err)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._producer.produce(self._topic, b"t" * 1024, on_delivery=self._on_delivery)
            self._producer.poll(1 / TICK_RECORDS_S)

    def __enter__(self) -> _TickingProducer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(30)


def _catch_up(bootstrap: str, topic: str, ends: dict[int, int]) -> tuple[int, float]:
    """Read `topic` from offset 0 to `ends`; (record bytes read, seconds it took)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"catch-up-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    left = dict(ends)
    read_bytes = 0
    started = time.monotonic()
    try:
        while any(left.values()):
            assert time.monotonic() - started < 300, f"catch-up stuck: {left} left"
            for msg in consumer.consume(500, 1.0):
                assert msg.error() is None, msg.error()
                if msg.offset() < ends[msg.partition()]:
                    read_bytes += len(msg.value())
                    left[msg.partition()] = max(ends[msg.partition()] - msg.offset() - 1, 0)
        return read_bytes, time.monotonic() - started
    finally:
        consumer.close()


def test_an_egress_limit_caps_a_catch_up_while_produce_acks_flow(tmp_path):
    up_args = (
        "--brokers",
        "1",
        "--controllers",
        "1",
        "--upload-interval-s",
        "0.5",
        "--broker-config",
        f"network.egress_bytes_per_s={EGRESS_BYTES_PER_S}",
        "--broker-config",
        "storage.log_cache_uploaded_bytes=0",
    )
    with running_cluster(tmp_path / "cluster", *up_args) as up:
        bootstrap = up["bootstrap_servers"]
        create_topic(bootstrap, "backlog", PARTITIONS)
        create_topic(bootstrap, "ticks", 1)
        ends = _fill(bootstrap, "backlog")
        with _TickingProducer(bootstrap, "ticks") as ticks:
            acked_before = ticks.acked
            read_bytes, elapsed_s = _catch_up(bootstrap, "backlog", ends)
            acked_during = ticks.acked - acked_before
        assert read_bytes == BACKLOG_BYTES
        # at most the limit plus one burst (a second's worth), with room for timers
        floor_s = (BACKLOG_BYTES - EGRESS_BYTES_PER_S) / EGRESS_BYTES_PER_S
        assert elapsed_s >= 0.8 * floor_s, (
            f"{BACKLOG_BYTES / elapsed_s / 1e6:.1f} MB/s read past a "
            f"{EGRESS_BYTES_PER_S / 1e6:.0f} MB/s egress limit"
        )
        # the producer beside it: acknowledged all along (a generous share of its rate)
        assert not ticks.failed, ticks.failed[:3]
        assert acked_during >= 0.3 * TICK_RECORDS_S * elapsed_s, (acked_during, elapsed_s)
