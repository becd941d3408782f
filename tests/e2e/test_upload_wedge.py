"""Issue #10 "Nothing wedges", part 1: deleting a topic must not wedge its broker's uploads.

Repro on a real cluster with real clients: a topic whose records are still only in a
broker's WAL is deleted. Before the fix that broker logged `UNKNOWN_STREAM` upload failures
forever, uploaded nothing else, its WAL filled and every produce to it failed ("WAL full");
a graceful stop could not upload either. Here, after the delete, more than 1.5x the WAL is
produced to the same broker and all of it must be acknowledged, the status must show healthy
uploads, `automqctl broker stop` must finish cleanly in normal time, and everything acked
must be read back from the partitions' new leader (so it was uploaded).

The issue asks for 600 MiB against the default 512 MiB WAL; that is heavy for a 2-core CI,
so this cluster's brokers get a 64 MiB WAL (`cluster up --wal-capacity-mib 64`) and the test
produces 100 MiB (> 1.5x the WAL) — the same crossing of the WAL capacity, 6x cheaper. A
one-hour upload interval keeps the doomed topic's records in the WAL until it is deleted,
every time (uploads then happen on size, at a quarter of the WAL, and on close/stop).
"""

from __future__ import annotations

import time
import urllib.request
import uuid

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from cli.local_cluster import STOP_TIMEOUT_S  # noqa: E402
from tests.support.ledger import automqctl, cluster_status, create_topic, leaders, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

WAL_MIB = 64
PRODUCE_MIB = 100  # > 1.5x the WAL: would hit "WAL full" if anything held the WAL
RECORD_BYTES = 16 * 1024
UPLOAD_INTERVAL_S = 3600  # no timed upload during the test: see the module docstring
MAX_LAG_S = 120  # the last size-triggered upload happened during the bulk produce


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("upload-wedge") / "cluster"
    with running_cluster(
        d,
        "--brokers",
        "2",
        "--wal-capacity-mib",
        str(WAL_MIB),
        "--upload-interval-s",
        str(UPLOAD_INTERVAL_S),
    ) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


def broker_status(cluster, node: int) -> dict:
    return next(b for b in cluster_status(cluster["dir"])["brokers"] if b["node_id"] == node)


def wait_broker(cluster, node: int, predicate, what: str, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    b: dict = {}
    while time.monotonic() < deadline:
        b = broker_status(cluster, node)
        if predicate(b):
            return b
        time.sleep(0.5)
    raise AssertionError(f"broker {node}: {what} not reached in {timeout_s}s: {b}")


def broker_log(cluster, node: int) -> str:
    return (cluster["dir"] / "logs" / f"broker-{node}.log").read_text(errors="replace")


def value_of(i: int) -> bytes:
    return f"{i}:".encode().ljust(RECORD_BYTES, b"v")


def produce_bulk(
    bootstrap: str, topic: str, partitions: list[int], total_bytes: int, timeout_s: float = 300
) -> tuple[dict[int, tuple[int, int]], list[str]]:
    """Produce `total_bytes` of records round-robin over `partitions` (acks=all,
    idempotent); returns {record id: (partition, offset)} of the acked ones and errors."""
    acked: dict[int, tuple[int, int]] = {}
    errors: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 20,
            "batch.size": 1024 * 1024,
            "message.timeout.ms": 90_000,
            "queue.buffering.max.kbytes": 256 * 1024,
        }
    )

    def on_delivery(i: int):
        def cb(err, msg) -> None:
            if err is not None:
                if len(errors) < 20:
                    errors.append(str(err))
                return
            acked[i] = (msg.partition(), msg.offset())

        return cb

    deadline = time.monotonic() + timeout_s
    count = total_bytes // RECORD_BYTES
    for i in range(count):
        while time.monotonic() < deadline:
            try:
                producer.produce(
                    topic,
                    value=value_of(i),
                    partition=partitions[i % len(partitions)],
                    on_delivery=on_delivery(i),
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(max(1.0, deadline - time.monotonic()))
    assert left == 0, f"{left} records neither acked nor failed in {timeout_s}s ({errors[:3]})"
    return acked, errors


def consume_all(
    bootstrap: str, topic: str, ends: dict[int, int], timeout_s: float = 180
) -> dict[tuple[int, int], bytes]:
    """Read every partition of `ends` from offset 0 to its end: {(partition, offset): value}."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"wedge-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    seen: dict[tuple[int, int], bytes] = {}
    positions = {p: 0 for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(positions[p] < e for p, e in ends.items()):
            for msg in consumer.consume(500, 0.5):
                if msg.error():
                    continue
                seen[(msg.partition(), msg.offset())] = msg.value()
                positions[msg.partition()] = msg.offset() + 1
    finally:
        consumer.close()
    return seen


def test_deleted_topic_does_not_wedge_uploads_wal_or_shutdown(cluster):
    bootstrap = cluster["bootstrap"]
    # 1. the repro: records of a topic, still only in the WAL of its leader, then delete it
    doomed = f"doomed-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, doomed, 1)
    node = leaders(bootstrap, doomed)[0]
    acked, errors = produce_bulk(bootstrap, doomed, [0], 100 * 1024)
    assert len(acked) == 100 // 16 and not errors, errors
    # the heartbeat-carried stats show the records pending (not uploaded before the delete)
    wait_broker(
        cluster,
        node,
        lambda b: (b["upload_lag_s"] or 0) > 0 and b["wal_used_bytes"],
        "pending WAL data",
        timeout_s=10,
    )
    deleted = automqctl("topic", "delete", doomed, cluster_dir=cluster["dir"])
    assert deleted.returncode == 0, deleted.stderr

    # 2. a topic on the same broker takes more than 1.5x its WAL, all acknowledged
    topic = f"after-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 4)
    mine = sorted(p for p, leader in leaders(bootstrap, topic).items() if leader == node)
    assert mine, f"no partition of {topic} on broker {node}"
    started = time.monotonic()
    acked, errors = produce_bulk(bootstrap, topic, mine, PRODUCE_MIB * 1024 * 1024)
    took_s = time.monotonic() - started
    print(f"produced {PRODUCE_MIB} MiB to broker {node} (WAL {WAL_MIB} MiB) in {took_s:.1f}s")
    assert not errors, errors
    assert len(acked) == PRODUCE_MIB * 1024 * 1024 // RECORD_BYTES

    # 3. status and /metrics: healthy uploads, the WAL within its capacity
    b = wait_broker(
        cluster,
        node,
        lambda b: (
            b["last_upload_error"] is None
            and b["upload_lag_s"] is not None
            and b["upload_lag_s"] < MAX_LAG_S
        ),
        "healthy uploads",
    )
    assert b["wal_capacity_bytes"] == WAL_MIB * 1024 * 1024
    assert 0 <= b["wal_used_bytes"] <= b["wal_capacity_bytes"]
    assert all(
        {"wal_used_bytes", "upload_lag_s", "last_upload_error"} <= set(x)
        for x in cluster_status(cluster["dir"])["brokers"]
    )
    with urllib.request.urlopen(f"http://{b['metrics_address']}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    for name in (
        "automq_wal_used_bytes",
        "automq_stream_upload_lag_seconds",
        "automq_stream_upload_failing 0.0",
        "automq_stream_upload_dropped_batches_total",
    ):
        assert name in metrics, name
    text = broker_log(cluster, node)
    assert "upload failed" not in text
    # the repro path was taken: the commit refused the deleted stream, its data left out
    assert "left out of the upload (UNKNOWN_STREAM" in text

    # 4. a graceful stop uploads everything and exits by itself (SIGKILL comes only after
    #    STOP_TIMEOUT_S)
    started = time.monotonic()
    stopped = automqctl("broker", "stop", str(node), cluster_dir=cluster["dir"])
    stop_s = time.monotonic() - started
    print(f"broker {node} stopped in {stop_s:.1f}s")
    assert stopped.returncode == 0, stopped.stderr
    assert stop_s < STOP_TIMEOUT_S
    text = broker_log(cluster, node)
    assert f"broker {node} stopping" in text
    for bad in ("upload failed", "uploading the WAL on shutdown failed", "Traceback"):
        assert bad not in text, bad

    # 5. every acknowledged record is read back, from the partitions' new leader
    ends: dict[int, int] = {}
    for p, off in acked.values():
        ends[p] = max(ends.get(p, 0), off + 1)
    seen = consume_all(bootstrap, topic, ends)
    missing = [i for i, where in acked.items() if seen.get(where) != value_of(i)]
    assert not missing, f"{len(missing)} acked records missing or different: {missing[:5]}"
    assert len(seen) == len(acked)
