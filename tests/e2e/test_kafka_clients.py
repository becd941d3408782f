"""Real Kafka clients against `automqctl cluster up`: every acked message exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import (  # noqa: E402
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


def automqctl(*args: str, cluster_dir: Path, timeout_s: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("kafka") / "cluster"
    # a killed broker must stay down (failover, `broker start`): no supervisor
    up = automqctl("cluster", "up", "--no-supervise", "--format", "json", cluster_dir=d)
    assert up.returncode == 0, up.stderr + up.stdout
    status = json.loads(up.stdout)
    try:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}
    finally:
        automqctl("cluster", "down", cluster_dir=d)


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
    futures[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=10)
        t = md.topics.get(name)
        if (
            t
            and t.error is None
            and len(t.partitions) == partitions
            and all(p.leader >= 0 for p in t.partitions.values())
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"topic {name} not ready")


def produce_confluent(bootstrap: str, topic: str, count: int, **config) -> list[dict]:
    """Produce `count` messages; return the acknowledged ones with their offsets."""
    acked: list[dict] = []
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **config})

    def on_delivery(err, msg, headers):
        if err is not None:
            errors.append(err)
            return
        # delivery reports do not carry headers: remember the ones we sent
        acked.append(
            {
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": msg.key(),
                "value": msg.value(),
                "headers": headers,
                "timestamp": msg.timestamp()[1],
            }
        )

    base_ts = int(time.time() * 1000) - 10_000
    for i in range(count):
        headers = [("h", b"%d" % i)]
        producer.produce(
            topic,
            key=b"key-%d" % (i % 17),
            value=b"value-%d-" % i + os.urandom(8),
            headers=headers,
            timestamp=base_ts + i,
            on_delivery=lambda err, msg, h=headers: on_delivery(err, msg, h),
        )
        if i % 500 == 0:
            producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0 and not errors, (remaining, errors[:3])
    return acked


def consume_all(
    bootstrap: str, topic: str, group: str, expected: int, timeout_s: float = 60
) -> list:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            got.append(msg)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return got


def assert_exactly_once(acked: list[dict], consumed: list) -> None:
    by_key = {(m["partition"], m["offset"]): m for m in acked}
    seen = set()
    per_partition = defaultdict(list)
    for msg in consumed:
        k = (msg.partition(), msg.offset())
        assert k not in seen, f"duplicate {k}"
        seen.add(k)
        per_partition[msg.partition()].append(msg.offset())
        a = by_key.get(k)
        if a is None:
            continue
        assert (msg.key(), msg.value()) == (a["key"], a["value"]), k
        assert msg.headers() == a["headers"], k
        assert msg.timestamp()[1] == a["timestamp"], k
    assert set(by_key) <= seen, f"missing {len(set(by_key) - seen)} acked messages"
    for offsets in per_partition.values():
        assert offsets == sorted(offsets)


def test_confluent_default_and_idempotent_producers_with_compression(cluster):
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 6)
    acked = produce_confluent(cluster["bootstrap"], topic, 2000, acks="all")
    acked += produce_confluent(
        cluster["bootstrap"],
        topic,
        2000,
        acks="all",
        **{"enable.idempotence": True, "compression.type": "lz4"},
    )
    acked += produce_confluent(
        cluster["bootstrap"],
        topic,
        2000,
        acks="all",
        **{"enable.idempotence": True, "compression.type": "zstd"},
    )
    assert len(acked) == 6000
    consumed = consume_all(cluster["bootstrap"], topic, f"g-{topic}", 6000)
    assert len(consumed) == 6000
    assert_exactly_once(acked, consumed)


def commit_sync(consumer: Consumer) -> None:
    """Commit what `consumer` delivered; having delivered nothing since its last commit is fine."""
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise


def test_consumer_group_of_three_rebalances_when_one_leaves(cluster):
    topic = f"events-{uuid.uuid4().hex[:6]}"
    partitions = 6
    create_topic(cluster["bootstrap"], topic, partitions)
    acked = produce_confluent(cluster["bootstrap"], topic, 3000, acks="all")
    ends = defaultdict(int)
    for a in acked:
        ends[a["partition"]] = max(ends[a["partition"]], a["offset"] + 1)
    group = f"g-{topic}"
    conf = {
        "bootstrap.servers": cluster["bootstrap"],
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6_000,
        "heartbeat.interval.ms": 500,
    }
    consumers = [Consumer(conf) for _ in range(3)]
    revoke_commit_errors = []

    def commit_on_revoke(consumer, revoked):
        # what a careful client does: commit what it consumed before it loses partitions
        # (the coordinator must accept it: the member is still in the rebalancing generation)
        try:
            commit_sync(consumer)
        except KafkaException as exc:  # never raise out of a librdkafka callback
            revoke_commit_errors.append(exc)

    for c in consumers:
        c.subscribe([topic], on_revoke=commit_on_revoke)
    unique = {}  # (partition, offset) -> first delivery, across all members
    delivered_by = defaultdict(set)

    def take(i: int, consumer: Consumer, max_messages: int) -> None:
        # consume() returns what is buffered at once: a member with nothing to deliver
        # costs its timeout, not one timeout per message of the others (poll(0.1) in turn
        # delivered ~10 messages/s and ran out of time under load, looking like loss)
        for msg in consumer.consume(max_messages, timeout=0.05):
            if msg.error():
                continue
            unique.setdefault((msg.partition(), msg.offset()), msg)
            delivered_by[i].add(msg.partition())

    all_tps = [TopicPartition(topic, p) for p in range(partitions)]
    try:
        # phase 1: all three share the partitions; stop part-way
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(unique) < 1000:
            for i, c in enumerate(consumers):
                take(i, c, 20)
        assert len(unique) >= 1000, f"phase 1 delivered only {len(unique)}"
        assert len([i for i in delivered_by if delivered_by[i]]) >= 2, "partitions were not shared"
        for c in consumers:
            commit_sync(c)
        leaving = consumers.pop()
        leaving.close()  # its on_revoke commits what it delivered since the commit above
        # phase 2: the remaining two take over the leaver's partitions from its commits.
        # Done when every acked message was delivered and the group's commits cover
        # everything (a member may still be redelivering what its last commit missed).
        deadline = time.monotonic() + 60
        committed = {}
        next_check = 0.0
        while time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                take(i, c, 500)
            if len(unique) >= len(acked) and time.monotonic() >= next_check:
                for c in consumers:
                    commit_sync(c)
                committed = {
                    tp.partition: tp.offset for tp in consumers[0].committed(all_tps, timeout=20)
                }
                if committed == dict(ends):
                    break
                next_check = time.monotonic() + 0.5
        for c in consumers:
            commit_sync(c)
    finally:
        for c in consumers:
            c.close()
    missing = sorted({(a["partition"], a["offset"]) for a in acked} - set(unique))
    assert not missing, (
        f"{len(missing)} acked messages never delivered to the group, e.g. {missing[:5]}"
    )
    assert len(unique) == 3000
    assert_exactly_once(acked, list(unique.values()))
    assert not revoke_commit_errors, revoke_commit_errors
    # committed offsets of the group cover everything
    admin_consumer = Consumer({"bootstrap.servers": cluster["bootstrap"], "group.id": group})
    try:
        committed = admin_consumer.committed(all_tps, timeout=20)
    finally:
        admin_consumer.close()
    assert {tp.partition: tp.offset for tp in committed} == dict(ends)


def test_kafka_python_idempotent_producer_and_group_consumer(cluster):
    from kafka import KafkaConsumer, KafkaProducer

    topic = f"kp-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 3)
    producer = KafkaProducer(bootstrap_servers=cluster["bootstrap"], acks="all")
    futures = [
        producer.send(topic, key=b"k%d" % i, value=b"v%d" % i, headers=[("i", b"%d" % i)])
        for i in range(500)
    ]
    producer.flush(30)
    acked = {}
    for i, f in enumerate(futures):
        md = f.get(timeout=30)
        acked[(md.partition, md.offset)] = (b"k%d" % i, b"v%d" % i)
    producer.close()
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=cluster["bootstrap"],
        group_id=f"g-{topic}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=20_000,
    )
    got = {}
    for msg in consumer:
        got[(msg.partition, msg.offset)] = (msg.key, msg.value)
        if len(got) >= 500:
            break
    consumer.commit()
    consumer.close()
    assert got == acked


def test_aiokafka_producer_and_consumer(cluster):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topic = f"aio-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 2)

    async def run():
        producer = AIOKafkaProducer(
            bootstrap_servers=cluster["bootstrap"], acks="all", enable_idempotence=True
        )
        await producer.start()
        acked = {}
        try:
            for i in range(300):
                md = await producer.send_and_wait(topic, key=b"k%d" % i, value=b"v%d" % i)
                acked[(md.partition, md.offset)] = (b"k%d" % i, b"v%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=cluster["bootstrap"],
            group_id=f"g-{topic}",
            auto_offset_reset="earliest",
        )
        await consumer.start()
        got = {}
        try:
            async with asyncio.timeout(30):
                async for msg in consumer:
                    got[(msg.partition, msg.offset)] = (msg.key, msg.value)
                    if len(got) >= 300:
                        break
        finally:
            await consumer.stop()
        return acked, got

    acked, got = asyncio.run(run())
    assert got == acked


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat (Debian kafkacat) not installed")
def test_kcat_metadata_produce_consume(cluster):
    topic = f"kcat-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 1)
    meta = subprocess.run(
        ["kcat", "-b", cluster["bootstrap"], "-L", "-J"], capture_output=True, text=True, timeout=30
    )
    assert meta.returncode == 0, meta.stderr
    assert topic in [t["topic"] for t in json.loads(meta.stdout)["topics"]]
    lines = "".join(f"line-{i}\n" for i in range(100))
    prod = subprocess.run(
        ["kcat", "-b", cluster["bootstrap"], "-P", "-t", topic],
        input=lines,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert prod.returncode == 0, prod.stderr
    cons = subprocess.run(
        ["kcat", "-b", cluster["bootstrap"], "-C", "-t", topic, "-o", "beginning", "-e", "-q"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert cons.returncode == 0, cons.stderr
    assert cons.stdout.splitlines() == [f"line-{i}" for i in range(100)]


def test_everything_survives_cluster_down_and_up(cluster):
    topic = f"durable-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 3)
    acked = produce_confluent(cluster["bootstrap"], topic, 1500, acks="all")
    group = f"g-{topic}"
    first = consume_all(cluster["bootstrap"], topic, group, 700, timeout_s=30)
    assert len(first) >= 700
    down = automqctl("cluster", "down", cluster_dir=cluster["dir"])
    assert down.returncode == 0, down.stderr
    up = automqctl("cluster", "up", "--format", "json", cluster_dir=cluster["dir"])
    assert up.returncode == 0, up.stderr
    # every message is still there, from the beginning
    everything = consume_all(cluster["bootstrap"], topic, f"fresh-{topic}", 1500)
    assert_exactly_once(acked, everything)
    assert len(everything) == 1500
    # and the group resumes from its committed offsets: nothing twice, nothing missing
    rest = consume_all(cluster["bootstrap"], topic, group, 1500 - len(first), timeout_s=30)
    assert len(first) + len(rest) == 1500
    assert_exactly_once(acked, first + rest)


def test_topic_cli_over_the_kafka_protocol(cluster):
    name = f"cli-{uuid.uuid4().hex[:6]}"
    res = automqctl("topic", "create", name, "-p", "4", cluster_dir=cluster["dir"])
    assert res.returncode == 0, res.stderr
    listed = json.loads(
        automqctl("topic", "list", "--format", "json", cluster_dir=cluster["dir"]).stdout
    )
    assert {"name": name, "partitions": 4} in listed
    described = json.loads(
        automqctl(
            "topic",
            "describe",
            name,
            "--format",
            "json",
            "--bootstrap-server",
            cluster["bootstrap"],
            cluster_dir=cluster["dir"],
        ).stdout
    )
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2, 3]
    assert {p["leader"] for p in described["partitions"]} <= {1, 2, 3}
    again = automqctl("topic", "create", name, "-p", "4", cluster_dir=cluster["dir"])
    assert again.returncode == 1 and "already exists" in again.stderr
    assert automqctl("topic", "delete", name, cluster_dir=cluster["dir"]).returncode == 0
    gone = automqctl("topic", "describe", name, cluster_dir=cluster["dir"])
    assert gone.returncode == 1 and "does not exist" in gone.stderr


def _raw_produce(bootstrap: str, topic: str, records: bytes) -> int:
    """Send one Produce v9 on a raw socket; the partition's error code."""
    import socket
    import struct

    from kafka.protocol.producer import ProduceRequest

    from dataplane.kafka.codec import decode_response, encode_request

    leader_host, leader_port = bootstrap.split(",")[0].rsplit(":", 1)
    req = ProduceRequest[9](
        transactional_id=None,
        acks=-1,
        timeout_ms=10_000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name=topic,
                partition_data=[
                    ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=records)
                ],
            )
        ],
    )
    with socket.create_connection((leader_host, int(leader_port)), timeout=15) as sock:
        sock.sendall(encode_request(req, correlation_id=7))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    _, resp = decode_response(frame, 0, 9)
    return resp.responses[0].partition_responses[0].error_code


def test_garbage_record_batches_are_refused_and_store_nothing(cluster):
    from dataplane.formats.record_batch import build_batch

    topic = f"bad-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 1)
    # make broker 1 (the first bootstrap address) the leader-agnostic target: find the leader
    admin = AdminClient({"bootstrap.servers": cluster["bootstrap"]})
    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    brokers = cluster["bootstrap"].split(",")
    target = brokers[leader - 1]
    good = build_batch(b"\x00" * 10, 1)
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 0xFF
    wrong_magic = bytearray(good)
    wrong_magic[16] = 1
    negative = build_batch(b"", 1, last_offset_delta=-5)
    for records, expected in [
        (bytes(bad_crc), 2),
        (bytes(wrong_magic), 2),
        (negative, 87),
        (b"\x00\x01garbage", 2),
    ]:
        code = _raw_produce(target, topic, records)
        assert code in (expected, 2, 87), (records[:20], code)
        assert code != 0
    consumer = Consumer({"bootstrap.servers": cluster["bootstrap"], "group.id": "x"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert (low, high) == (0, 0)  # nothing stored
    # the broker keeps serving well-formed requests
    assert _raw_produce(target, topic, good) == 0


def test_broker_kill_9_and_restart_loses_no_acked_message(cluster):
    topic = f"crash-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, 3)
    acked = produce_confluent(
        cluster["bootstrap"], topic, 3000, acks="all", **{"enable.idempotence": True}
    )
    admin = AdminClient({"bootstrap.servers": cluster["bootstrap"]})
    leader = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    killed = automqctl("broker", "kill", str(leader), cluster_dir=cluster["dir"])
    assert killed.returncode == 0, killed.stderr
    listed = json.loads(
        automqctl("broker", "list", "--format", "json", cluster_dir=cluster["dir"]).stdout
    )
    assert next(b for b in listed if b["node_id"] == leader)["pid"] is None
    started = automqctl("broker", "start", str(leader), cluster_dir=cluster["dir"])
    assert started.returncode == 0, started.stderr + started.stdout
    # the WAL was recovered: every acknowledged message is readable, once
    consumed = consume_all(cluster["bootstrap"], topic, f"g-{topic}", 3000)
    assert len(consumed) == 3000
    assert_exactly_once(acked, consumed)
    stopped = automqctl("broker", "stop", str(leader), cluster_dir=cluster["dir"])
    assert stopped.returncode == 0
    assert automqctl("broker", "start", str(leader), cluster_dir=cluster["dir"]).returncode == 0
    assert automqctl("broker", "stop", "99", cluster_dir=cluster["dir"]).returncode == 1
