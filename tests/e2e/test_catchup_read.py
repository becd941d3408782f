"""A catch-up read from the object store by a real client: after a broker restart (nothing
cached) a confluent-kafka consumer reads every partition from offset 0, in Fetches cut by
its byte limits, and gets every acknowledged record once, in order, with its bytes; the
broker's GETs (on SeaweedFS's plain http endpoint: without botocore, `ranged_get.py`)
all succeeded. Both isolation levels."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
import uuid

import pytest

from tests.support.ledger import automqctl, create_topic, running_cluster

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

PARTITIONS = 3
RECORDS = 12_000  # 1 KiB each: ~12 MB, several data blocks and GETs per partition


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("catchup") / "cluster"
    with running_cluster(d, "--brokers", "1") as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


def gets_ok(cluster_dir) -> float:
    """The broker's successful object-store GETs so far (its /metrics)."""
    status = json.loads(
        automqctl("cluster", "status", "--format", "json", cluster_dir=cluster_dir).stdout
    )
    address = status["brokers"][0]["metrics_address"]
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r'^automq_object_store_requests_total\{[^}]*op="get"[^}]*status="ok"[^}]*\} (\S+)$',
            text,
            re.M,
        )
    )


def test_catch_up_from_objects_reads_every_record_once(cluster):
    topic = f"catchup-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": cluster["bootstrap"], "linger.ms": 5, "acks": "all"})
    sent: dict[tuple[int, int], bytes] = {}
    errors: list = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            sent[(msg.partition(), msg.offset())] = msg.value()

    for i in range(RECORDS):
        producer.produce(topic, value=os.urandom(1024), key=b"%d" % i, on_delivery=on_delivery)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    # a broker stop uploads what its WAL holds; after the start nothing is cached
    for verb in ("stop", "start"):
        done = automqctl("broker", verb, "1", cluster_dir=cluster["dir"])
        assert done.returncode == 0, done.stderr + done.stdout
    ends = {p: 1 + max(o for q, o in sent if q == p) for p in range(PARTITIONS)}
    for isolation in ("read_uncommitted", "read_committed"):
        before = gets_ok(cluster["dir"])
        consumer = Consumer(
            {
                "bootstrap.servers": cluster["bootstrap"],
                "group.id": uuid.uuid4().hex,
                "enable.auto.commit": False,
                "isolation.level": isolation,
                # several Fetches per partition, each cut by these limits
                "fetch.max.bytes": 2 * 1024 * 1024,
                "max.partition.fetch.bytes": 512 * 1024,
            }
        )
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        got: dict[tuple[int, int], bytes] = {}
        last = dict.fromkeys(range(PARTITIONS), -1)
        deadline = time.monotonic() + 120
        try:
            while len(got) < len(sent) and time.monotonic() < deadline:
                for msg in consumer.consume(1000, 0.5):
                    assert msg.error() is None, msg.error()
                    p, o = msg.partition(), msg.offset()
                    assert o == last[p] + 1, f"{isolation}: partition {p}: {last[p]} -> {o}"
                    last[p] = o
                    got[(p, o)] = msg.value()
        finally:
            consumer.close()
        assert last == {p: ends[p] - 1 for p in range(PARTITIONS)}, isolation
        wrong = [k for k in sent if got.get(k) != sent[k]]
        assert not wrong and len(got) == len(sent), (isolation, wrong[:5])
        if isolation == "read_uncommitted":
            # the first read after the restart came from the object store
            assert gets_ok(cluster["dir"]) - before >= PARTITIONS
