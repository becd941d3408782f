"""Kafka transactions with real clients against `automqctl cluster up`: commit and abort,
read_committed vs read_uncommitted, a consume-transform-produce loop with
send_offsets_to_transaction, and kill -9 of the transaction coordinator's broker."""

from __future__ import annotations

import json
import socket
import struct
import time
import uuid

import pytest

from tests.e2e.test_kafka_clients import automqctl, create_topic

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("txn") / "cluster"
    # a killed broker must stay down (failover, `broker start`): no supervisor
    up = automqctl("cluster", "up", "--no-supervise", "--format", "json", cluster_dir=d)
    assert up.returncode == 0, up.stderr + up.stdout
    status = json.loads(up.stdout)
    try:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}
    finally:
        automqctl("cluster", "down", cluster_dir=d)


def read_all(bootstrap: str, topic: str, isolation: str, expected: int, timeout_s: float = 30):
    """Values of `topic` read from the start with `isolation`, until `expected` are read
    and nothing more arrives for a second (bounded by timeout_s)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"read-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": isolation,
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                if len(values) >= expected:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 1.0:
                        break
                continue
            quiet_since = None
            if msg.error():
                continue
            values.append(msg.value())
    finally:
        consumer.close()
    return values


def test_confluent_commit_and_abort_read_committed_and_uncommitted(cluster):
    bootstrap = cluster["bootstrap"]
    topic = f"txn-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 3)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"tx-{topic}",
            "transaction.timeout.ms": 60_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(30):
        producer.produce(topic, value=b"c1-%d" % i, partition=i % 3)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(20):
        producer.produce(topic, value=b"ab-%d" % i, partition=i % 3)
    producer.flush(30)  # the aborted records are in the log
    producer.abort_transaction(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, value=b"c2-%d" % i, partition=i % 3)
    producer.commit_transaction(30)

    committed = read_all(bootstrap, topic, "read_committed", 40)
    assert sorted(committed) == sorted(
        [b"c1-%d" % i for i in range(30)] + [b"c2-%d" % i for i in range(10)]
    )
    uncommitted = read_all(bootstrap, topic, "read_uncommitted", 60)
    assert len(uncommitted) == 60 and {v for v in uncommitted if v.startswith(b"ab-")} == {
        b"ab-%d" % i for i in range(20)
    }

    # a second instance with the same transactional id fences the first
    other = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    other.init_transactions(30)
    with pytest.raises(KafkaException) as fenced:
        producer.begin_transaction()
        producer.produce(topic, value=b"zombie", partition=0)
        producer.commit_transaction(30)
    assert fenced.value.args[0].fatal() or "fenced" in str(fenced.value).lower()
    assert b"zombie" not in read_all(bootstrap, topic, "read_committed", 40)


def test_transaction_timeout_above_the_broker_maximum_fails_at_once(cluster):
    producer = Producer(
        {
            "bootstrap.servers": cluster["bootstrap"],
            "transactional.id": f"tx-long-{uuid.uuid4().hex[:6]}",
            "transaction.timeout.ms": 3_600_000,  # Flink's default: above 15 min
        }
    )
    started = time.monotonic()
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(30)
    assert (
        "INVALID_TRANSACTION_TIMEOUT" in str(refused.value)
        or "timeout" in str(refused.value).lower()
    )
    assert time.monotonic() - started < 10


def find_coordinator(bootstrap: str, key: str, key_type: int = 1) -> int:
    """The node id FindCoordinator names for `key` (key_type 1: a transactional id, 0: a
    group), by a raw request."""
    from kafka.protocol.metadata import FindCoordinatorRequest

    from dataplane.kafka.codec import decode_response, encode_request

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    frame = encode_request(
        FindCoordinatorRequest[4](key_type=key_type, coordinator_keys=[key]), 7, version=4
    )
    for _ in range(50):  # COORDINATOR_NOT_AVAILABLE is retriable, as clients treat it
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(frame)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            data = sock.recv(size, socket.MSG_WAITALL)
        _, resp = decode_response(data, 10, 4)
        c = resp.coordinators[0]
        if c.error_code == 0:
            return c.node_id
        time.sleep(0.2)
    raise AssertionError(f"no coordinator for {key}: {c}")


def test_consume_transform_produce_exactly_once_across_kill_9_of_the_coordinator(cluster):
    """Each input record is transformed and written to the output with its input offset
    committed in the same transaction; the transaction coordinator's broker is killed -9
    mid-run (its slot, partitions and WAL move to the survivors). The output read with
    read_committed holds every input record exactly once.

    The consumer group is coordinated by another broker: librdkafka's
    send_offsets_to_transaction can hang past its timeout when the group coordinator's
    broker disappears from the metadata (confluentinc/librdkafka#5511, #5456; stock Kafka
    drops a dead broker from metadata the same way)."""
    bootstrap = cluster["bootstrap"]
    suffix = uuid.uuid4().hex[:6]
    src, dst, txn_id = f"in-{suffix}", f"out-{suffix}", f"eos-{suffix}"
    victim = find_coordinator(bootstrap, txn_id)
    group = next(
        g
        for g in (f"eos-group-{suffix}-{i}" for i in range(200))
        if find_coordinator(bootstrap, g, key_type=0) != victim
    )
    create_topic(bootstrap, src, 3)
    create_topic(bootstrap, dst, 3)
    total = 600
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(total):
        producer.produce(src, key=b"%d" % i, value=b"in-%d" % i, partition=i % 3)
    assert producer.flush(30) == 0

    def make_clients():
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "session.timeout.ms": 10_000,
            }
        )
        consumer.subscribe([src])
        txp = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": txn_id,
                "transaction.timeout.ms": 20_000,
                "linger.ms": 5,
            }
        )
        txp.init_transactions(60)
        return consumer, txp

    consumer, txp = make_clients()
    processed = 0
    killed = False
    restarts = 0
    deadline = time.monotonic() + 150
    try:
        while time.monotonic() < deadline:
            msgs = consumer.consume(50, 1.0)
            msgs = [m for m in msgs if not m.error()]
            if not msgs:
                # done when the group's committed offsets cover the whole input
                committed = consumer.committed([TopicPartition(src, p) for p in range(3)], 10)
                if sum(max(tp.offset, 0) for tp in committed) >= total:
                    break
                continue
            try:
                txp.begin_transaction()
                for m in msgs:
                    txp.produce(
                        dst, key=m.key(), value=b"out-" + m.value(), partition=m.partition()
                    )
                txp.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()),
                    consumer.consumer_group_metadata(),
                    30,
                )
                if not killed and processed >= total // 3:
                    # mid-transaction: the commit goes to the new coordinator, which knows
                    # the open transaction only from the controller's KV
                    out = automqctl("broker", "kill", str(victim), cluster_dir=cluster["dir"])
                    assert out.returncode == 0, out.stderr
                    killed = True
                txp.commit_transaction(60)
                processed += len(msgs)
            except KafkaException as exc:
                # abort or fatal: start over from the committed offsets with a new instance
                # (its InitProducerId completes or aborts what this one left)
                restarts += 1
                assert restarts <= 10, exc
                try:
                    consumer.close()
                except KafkaException:
                    pass
                consumer, txp = make_clients()
        assert killed
    finally:
        consumer.close()
        if killed:
            automqctl("broker", "start", str(victim), cluster_dir=cluster["dir"])

    out = read_all(bootstrap, dst, "read_committed", total, timeout_s=60)
    expected = sorted(b"out-in-%d" % i for i in range(total))
    assert len(out) == total and sorted(out) == expected, (len(out), len(set(out)))


def test_kafka_python_transactional_producer_commit_and_abort(cluster):
    from kafka import KafkaConsumer, KafkaProducer

    bootstrap = cluster["bootstrap"].split(",")
    topic = f"kptxn-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 2)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"kp-{topic}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(10):
            producer.send(topic, b"c%d" % i, partition=i % 2)
        producer.commit_transaction()
        producer.begin_transaction()
        for i in range(5):
            producer.send(topic, b"a%d" % i, partition=i % 2)
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close()

    def read(isolation: str) -> list[bytes]:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            auto_offset_reset="earliest",
            isolation_level=isolation,
            consumer_timeout_ms=4000,
            group_id=None,
        )
        try:
            return [m.value for m in consumer]
        finally:
            consumer.close()

    assert sorted(read("read_committed")) == sorted(b"c%d" % i for i in range(10))
    assert sorted(read("read_uncommitted")) == sorted(
        [b"c%d" % i for i in range(10)] + [b"a%d" % i for i in range(5)]
    )


def test_kafka_transactions_admin_list_describe_and_producers(cluster):
    """What `kafka-transactions.sh list|describe|describe-producers` calls, from
    kafka-python's admin client, on an open transaction and after its commit."""
    from kafka import KafkaAdminClient, KafkaProducer, TopicPartition

    bootstrap = cluster["bootstrap"].split(",")
    topic = f"txadm-{uuid.uuid4().hex[:6]}"
    txn_id = f"adm-{topic}"
    create_topic(cluster["bootstrap"], topic, 1)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=txn_id)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"x", partition=0)
        producer.flush()
        listed = [t for rows in admin.list_transactions().values() for t in rows]
        mine = [t for t in listed if t.transactional_id == txn_id]
        assert len(mine) == 1 and mine[0].state.value == "Ongoing", listed
        described = admin.describe_transactions([txn_id])[txn_id]
        assert described.state.value == "Ongoing"
        assert described.producer_id == mine[0].producer_id
        assert set(described.topic_partitions) == {TopicPartition(topic, 0)}
        [state] = admin.describe_producers([TopicPartition(topic, 0)])[
            TopicPartition(topic, 0)
        ].active_producers
        assert state.producer_id == described.producer_id
        assert state.current_transaction_start_offset == 0
        producer.commit_transaction()
        after = admin.describe_transactions([txn_id])[txn_id]
        assert after.state.value == "CompleteCommit" and not after.topic_partitions
    finally:
        producer.close()
        admin.close()


def test_kafkajs_transactions_commit_abort_and_read_committed(cluster):
    """kafkajs (tests/js/txn.js, installed by tests/run.sh with npm): a committed and an
    aborted transaction; read_committed sees only the committed records."""
    import shutil
    import subprocess
    from pathlib import Path

    js = Path(__file__).resolve().parents[1] / "js"
    if shutil.which("node") is None or not (js / "node_modules" / "kafkajs").is_dir():
        pytest.skip("node or kafkajs missing (tests/run.sh installs them)")
    topic = f"jstxn-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 2)
    res = subprocess.run(
        ["node", str(js / "txn.js"), cluster["bootstrap"], topic],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["committed"] == [f"c{i}" for i in range(5)]
    assert out["uncommitted"] == sorted([f"c{i}" for i in range(5)] + [f"a{i}" for i in range(3)])
