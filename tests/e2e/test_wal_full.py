"""A full WAL never freezes the broker (issue #27): with the object stores paused (SIGSTOP:
every request hangs) a broker keeps acknowledging into its WAL until the WAL is full; then
producers wait, and meanwhile that broker answers ApiVersions and Metadata at once and its
consumer groups keep their members. A produce that cannot wait any longer gets a retriable
error (REQUEST_TIMED_OUT, no leader change). Once the stores resume, every acknowledged
record is read back and the waiting producer's records are all acknowledged.

A 16 MiB WAL (the smallest `cluster up` allows) and an hour's upload interval: the WAL
fills after ~16 MiB of produce.
"""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
import uuid

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, Producer  # noqa: E402
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest  # noqa: E402

from dataplane.kafka.codec import decode_response, encode_request  # noqa: E402
from tests.support.cluster import create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WAL_MIB = 16
RECORD_BYTES = 16 * 1024
PRODUCE_MIB = 24  # > the WAL: the last third waits for room
BATCH_BYTES = 256 * 1024  # the waiting producer's batches: the WAL has less room than this
SINGLE_BYTES = 900_000  # a record that cannot fit either
MAX_ANSWER_S = 0.1  # ApiVersions / Metadata while producers wait (the median of probes)
FROZEN_ANSWER_S = 1.0  # no single probe may take this long (a blocked loop takes seconds)
STALL_OBSERVED_S = 10.0  # > the consumer's session timeout: a frozen broker loses the member
SESSION_TIMEOUT_MS = 6000


def _probe(port: int, api_key: int, request, version: int) -> float:
    """Seconds for one request's answer on a fresh connection."""
    frame = encode_request(request, correlation_id=7, client_id="probe", version=version)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(frame)
        head = b""
        while len(head) < 4:
            head += sock.recv(4 - len(head))
        (size,) = struct.unpack(">i", head)
        body = b""
        while len(body) < size:
            body += sock.recv(size - len(body))
        elapsed = time.monotonic() - started
    correlation_id, _ = decode_response(body, api_key, version)
    assert correlation_id == 7
    return elapsed


class _GroupWatch:
    """A consumer of a group on an unrelated topic, polling in a thread; counts the
    partitions it was given and had taken away."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.assigned = 0
        self.revoked = 0
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"watch-{uuid.uuid4().hex[:6]}",
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": 1000,
                "auto.offset.reset": "earliest",
            }
        )
        self._consumer.subscribe(
            [topic],
            on_assign=lambda c, ps: self._count("assigned", ps),
            on_revoke=lambda c, ps: self._count("revoked", ps),
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _count(self, what: str, partitions) -> None:
        setattr(self, what, getattr(self, what) + len(partitions))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._consumer.poll(0.1)

    def __enter__(self) -> _GroupWatch:
        self._thread.start()
        deadline = time.monotonic() + 60
        while self.assigned == 0:
            assert time.monotonic() < deadline, "the group never assigned the partition"
            time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def test_a_full_wal_with_a_hung_store_freezes_nothing(tmp_path, faults):
    d = tmp_path / "cluster"
    up_args = ("--brokers", "1", "--wal-capacity-mib", str(WAL_MIB), "--upload-interval-s", "3600")
    with running_cluster(d, *up_args) as up:
        bootstrap = up["bootstrap_servers"]
        port = int(bootstrap.split(",")[0].rsplit(":", 1)[1])
        create_topic(bootstrap, "full", 1)
        create_topic(bootstrap, "other", 1)
        acked: list[bytes] = []
        failed: list[KafkaError] = []

        def on_delivery(err, msg) -> None:
            if err is None:
                acked.append(msg.value()[:16])
            else:
                failed.append(err)

        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "batch.size": BATCH_BYTES,
                "request.timeout.ms": 5000,
                "message.timeout.ms": 600_000,  # waits out the stall: nothing may be lost
            }
        )
        with _GroupWatch(bootstrap, "other") as group:
            store_pids = faults.pause_object_stores(up)
            try:
                total = PRODUCE_MIB * 1024 * 1024 // RECORD_BYTES
                for i in range(total):
                    value = f"{i:016d}".encode().ljust(RECORD_BYTES, b"v")
                    while True:
                        try:
                            producer.produce("full", value, on_delivery=on_delivery)
                            break
                        except BufferError:  # librdkafka's queue: bounded, drains on poll
                            producer.poll(0.05)
                    producer.poll(0)
                # the WAL is full: acknowledgements stop while the rest waits
                last, last_change = -1, time.monotonic()
                deadline = time.monotonic() + 120
                while time.monotonic() - last_change < 3:
                    assert time.monotonic() < deadline, "acks never stopped"
                    producer.poll(0.2)
                    if len(acked) != last:
                        last, last_change = len(acked), time.monotonic()
                assert 0 < len(acked) < total, len(acked)
                assert len(acked) * RECORD_BYTES > (WAL_MIB // 2) * 1024 * 1024
                stalled_at = time.monotonic()
                # a producer that does not retry sees the retriable error the wait ends in
                single = Producer(
                    {
                        "bootstrap.servers": bootstrap,
                        "retries": 0,
                        "enable.idempotence": False,
                        "request.timeout.ms": 3000,
                        "message.timeout.ms": 20_000,
                    }
                )
                errors: list[KafkaError] = []
                single.produce(
                    "full", b"x" * SINGLE_BYTES, on_delivery=lambda e, m: errors.append(e)
                )
                # meanwhile the broker answers at once, over and over
                answers = []
                while time.monotonic() - stalled_at < STALL_OBSERVED_S:
                    answers.append(_probe(port, 18, ApiVersionsRequest[0](), 0))
                    meta = MetadataRequest[1](
                        topics=[MetadataRequest[1].MetadataRequestTopic(name="full")]
                    )
                    answers.append(_probe(port, 3, meta, 1))
                    single.poll(0.2)
                    producer.poll(0)
                single.flush(20)
                assert max(answers) < FROZEN_ANSWER_S, answers
                assert statistics.median(answers) < MAX_ANSWER_S, answers
                assert len(errors) == 1 and errors[0] is not None, errors
                # retriable in Kafka's error table (librdkafka reports the final error of a
                # producer told not to retry as not retriable)
                assert errors[0].code() == KafkaError.REQUEST_TIMED_OUT, errors[0]
                # the group kept its member through a stall longer than its session timeout
                assert (group.assigned, group.revoked) == (1, 0)
            finally:
                faults.resume(*store_pids)
            assert producer.flush(300) == 0, "records still unacknowledged after the stall"
        assert not failed, failed[:3]
        assert len(acked) == total
        # every acknowledged record reads back, once each
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"check-{uuid.uuid4().hex[:6]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        consumer.subscribe(["full"])
        read: list[bytes] = []
        deadline = time.monotonic() + 180
        try:
            while len(read) < total and time.monotonic() < deadline:
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    read.append(msg.value()[:16])
        finally:
            consumer.close()
        assert sorted(read) == sorted(acked)
