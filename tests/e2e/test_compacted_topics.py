"""Compacted topics (`cleanup.policy=compact`) against `automqctl cluster up` with real
Kafka clients and a real Spark (`local[2]`): after the compaction job, a consumer from the
beginning (brokers restarted, so reads come from the rewritten objects) sees exactly the
latest record of each live key at its original offset; a Kafka Connect-style config topic
round-trips; `min.compaction.lag.ms` protects young data. A second run (the CLI's job)
skips the partitions with no data past their cleaner checkpoint, cleans the new versions
of one topic while consumers read it from the beginning again and again (each sees a
consistent log), and `automqctl topic describe` shows the last compaction.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid

import pytest

from tests.support.spark import skip_module_without_spark

skip_module_without_spark()
from confluent_kafka import (  # noqa: E402
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from kafka import KafkaConsumer  # noqa: E402
from kafka import TopicPartition as KafkaTopicPartition  # noqa: E402

from cli import compaction_jobs  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from tests.support.ledger import automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MASTER = "local[2]"
KEYS = 10
VERSIONS = 50


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("compacted") / "cluster"
    with running_cluster(
        d,
        "--brokers",
        "1",
        "--controllers",
        "1",
        "--upload-interval-s",
        "0.5",
        "--object-delete-delay-s",
        "2",
    ) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


@pytest.fixture(scope="module")
def spark(cluster):
    """One SparkContext (local[2]) for the module's in-process runs."""
    from spark_jobs.compact import spark_context

    env = compaction_jobs.job_env(LocalCluster(cluster["dir"]).load())
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AUTOMQ_CONTROLLER_SECRET")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: env[k] for k in saved if k in env})
    sc = spark_context(MASTER)
    try:
        yield sc
    finally:
        sc.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run_job(cluster, sc) -> dict:
    from spark_jobs.compact import JobConfig, run

    config = LocalCluster(cluster["dir"]).load()
    job = JobConfig.model_validate(compaction_jobs.job_config(config, MASTER))
    return run(job, sc=sc)


def _image(cluster) -> dict:
    config = LocalCluster(cluster["dir"]).load()
    client = ControllerClient(config.quorum_config().api_addresses(), api_secret=config.api_secret)
    raw = client.leader_get("/v1/image")
    return json.loads(raw) if isinstance(raw, str) else raw


def _wait_in_objects(cluster, topic: str, end_offset: int, timeout_s: float = 60) -> None:
    """Until the partition's offsets below `end_offset` are committed in objects."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        image = _image(cluster)
        t = next(t for t in image["topics"].values() if t["name"] == topic)
        stream = image["streams"][str(t["partitions"]["0"]["stream_id"])]
        if stream["ranges"] and stream["ranges"][-1]["end_offset"] >= end_offset:
            return
        time.sleep(0.5)
    raise AssertionError(f"{topic}: offsets below {end_offset} not in objects after {timeout_s}s")


def _produce(bootstrap: str, topic: str, rounds: list[list[tuple[bytes, bytes | None]]], **conf):
    """One batch per round (flushed); the (offset, key, value) of every acked record."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all", **conf})
    acked: list[tuple[int, bytes, bytes | None]] = []

    def on_delivery(err, msg) -> None:
        assert err is None, err
        acked.append((msg.offset(), msg.key(), msg.value()))

    for records in rounds:
        for key, value in records:
            producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
        assert producer.flush(30) == 0
    return sorted(acked)


_NOT_SERVED_YET = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
}


def _high_watermark(consumer: Consumer, topic: str, timeout_s: float = 60) -> int:
    """Partition 0's high watermark, retrying retriable errors as clients do: right after
    `cluster up` a broker may still be opening the partition (NOT_LEADER_FOR_PARTITION)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        except KafkaException as exc:
            error = exc.args[0]
            retriable = error.retriable() or error.code() in _NOT_SERVED_YET
            if not retriable or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _consume_all(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record of partition 0 from the beginning to the high watermark."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        high = _high_watermark(consumer, topic)
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not out or out[-1][0] < high - 1):
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.offset(), msg.key(), msg.value()))
        return out
    finally:
        consumer.close()


def _latest(acked: list[tuple[int, bytes, bytes | None]]) -> dict[bytes, tuple[int, bytes | None]]:
    latest: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in acked:
        latest[key] = (offset, value)
    return latest


def _restart_brokers(cluster) -> None:
    """Down and up again: the brokers' log caches are empty, reads go to the objects."""
    assert automqctl("cluster", "down", cluster_dir=cluster["dir"]).returncode == 0
    up = automqctl("cluster", "up", "--format", "json", cluster_dir=cluster["dir"])
    assert up.returncode == 0, up.stderr + up.stdout
    cluster["bootstrap"] = json.loads(up.stdout)["bootstrap_servers"]


def test_compacted_topics_keep_the_latest_record_per_key(cluster, spark):
    bootstrap = cluster["bootstrap"]
    tag = uuid.uuid4().hex[:6]
    # 10 keys x 50 versions (lz4, one batch per version), then tombstones for 2 keys,
    # which are older than delete.retention.ms=1000 by the time the job runs
    events = f"events-{tag}"
    create_topic(
        bootstrap,
        events,
        1,
        configs={
            "cleanup.policy": "compact,delete",
            "delete.retention.ms": "1000",
            # the second run's new versions are a small share of the cleaned log
            "min.cleanable.dirty.ratio": "0.05",
        },
    )
    rounds = [
        [(f"k{k}".encode(), f"v{v}-{k}".encode() * 20) for k in range(KEYS)]
        for v in range(VERSIONS)
    ]
    rounds.append([(b"k8", None), (b"k9", None)])
    events_acked = _produce(bootstrap, events, rounds, **{"compression.type": "lz4"})
    # a Kafka Connect config topic: connector and task configs rewritten, commits, target
    # states; connector "b" deleted (its tombstone stays: delete.retention.ms is a day)
    configs = f"connect-configs-{tag}"
    create_topic(bootstrap, configs, 1, configs={"cleanup.policy": "compact"})
    connect_rounds = []
    for gen in range(20):
        round_ = []
        for name in ("a", "b"):
            conf = {"connector.class": "FileStreamSource", "tasks.max": "1", "gen": gen}
            round_ += [
                (f"connector-{name}".encode(), json.dumps({"properties": conf}).encode()),
                (f"task-{name}-0".encode(), json.dumps({"properties": conf}).encode()),
                (f"commit-{name}".encode(), json.dumps({"tasks": 1}).encode()),
                (f"target-state-{name}".encode(), json.dumps({"state": "STARTED"}).encode()),
            ]
        connect_rounds.append(round_)
    connect_rounds.append([(b"connector-b", None), (b"task-b-0", None)])
    configs_acked = _produce(bootstrap, configs, connect_rounds)
    # young data: min.compaction.lag.ms keeps it uncompacted
    young = f"young-{tag}"
    create_topic(
        bootstrap,
        young,
        1,
        configs={"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"},
    )
    young_acked = _produce(bootstrap, young, rounds[:5])
    for topic, acked in ((events, events_acked), (configs, configs_acked), (young, young_acked)):
        _wait_in_objects(cluster, topic, acked[-1][0] + 1)
    time.sleep(1.5)  # every tombstone of `events` is older than its delete.retention.ms

    result = _run_job(cluster, spark)
    cleaner = result["log_cleaner"]
    assert cleaner["committed"] is True, result
    assert cleaner["removed_records"] == sum(
        p["removable_records"] for p in cleaner["partition_results"]
    )
    by_topic = {p["topic"]: p for p in cleaner["partition_results"]}
    # 510 records: 8 live keys remain, superseded versions and expired tombstones go
    assert by_topic[events]["removable_records"] == len(events_acked) - 8, by_topic
    assert by_topic[young]["removable_records"] == 0
    assert by_topic[young]["stopped"] == "min.compaction.lag.ms"

    # new versions of k0..k7: data past the cleaner checkpoint of `events` only
    newer = _produce(
        bootstrap,
        events,
        [[(f"k{k}".encode(), f"w{v}-{k}".encode() * 20) for k in range(8)] for v in range(3)],
        **{"compression.type": "lz4"},
    )
    _wait_in_objects(cluster, events, newer[-1][0] + 1)
    _restart_brokers(cluster)  # reads come from the rewritten objects (and the new ones)
    bootstrap = cluster["bootstrap"]
    expected = sorted(
        (offset, key, value)
        for key, (offset, value) in _latest(events_acked).items()
        if value is not None
    )
    assert len(expected) == 8 and expected[-1][0] < events_acked[-1][0]
    assert _consume_all(bootstrap, events) == expected + newer
    # kafka-python reads the gaps and the empty batches too
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=5_000
    )
    try:
        consumer.assign([KafkaTopicPartition(events, 0)])
        assert [(m.offset, m.key, m.value) for m in consumer] == expected + newer
    finally:
        consumer.close()
    all_acked = sorted(events_acked + newer)
    expected = sorted(
        (offset, key, value)
        for key, (offset, value) in _latest(all_acked).items()
        if value is not None
    )
    # `automqctl compaction run` (its own job process) while consumers read `events` from
    # the beginning, again and again: the commit swaps the objects under them
    passes: list[list[tuple[int, bytes, bytes | None]]] = []
    errors: list[BaseException] = []
    job_done = threading.Event()

    def read_while_cleaning() -> None:
        try:
            while not job_done.is_set() and len(passes) < 200:
                passes.append(_consume_all(bootstrap, events))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    reader = threading.Thread(target=read_while_cleaning, daemon=True)
    reader.start()
    try:
        out = automqctl(
            "compaction",
            "run",
            "--master",
            MASTER,
            "--format",
            "json",
            cluster_dir=cluster["dir"],
            timeout_s=240,
        )
    finally:
        job_done.set()
        reader.join(120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert not errors, errors
    acked_set = set(all_acked)
    for seen in passes:  # a consistent log in every pass
        offsets = [o for o, _, _ in seen]
        assert offsets == sorted(set(offsets))  # strictly increasing
        assert set(seen) <= acked_set  # only acked records, each at its own offset
        assert set(expected) <= set(seen)  # every key's latest value
    assert len(passes) >= 2 and len(passes[0]) > len(expected)  # the first read was dirty
    again = json.loads(out.stdout)["log_cleaner"]
    assert again["committed"] is True, again
    by_topic = {p["topic"]: p for p in again["partition_results"]}
    # the 8 records left by the first run and 16 of the 24 new ones are superseded
    assert by_topic[events]["removable_records"] == 24, by_topic
    assert by_topic[events]["cleaned_offset"] == newer[-1][0] + 1
    skipped = {p["topic"]: p["reason"] for p in again["skipped_partitions"]}
    assert "no dirty data" in skipped[configs], again  # clean since the first run: not read
    assert by_topic[young]["removable_records"] == 0
    # readers move to the rewritten objects once the old ones are deleted (after 2 s here;
    # until then they read the old ones, a consistent log too)
    deadline = time.monotonic() + 60
    while (seen := _consume_all(bootstrap, events)) != expected and time.monotonic() < deadline:
        time.sleep(1)
    assert seen == expected
    described = automqctl(
        "topic", "describe", events, "--format", "json", cluster_dir=cluster["dir"]
    )
    assert described.returncode == 0, described.stderr
    (part,) = json.loads(described.stdout)["partitions"]
    assert part["cleaned_offset"] == newer[-1][0] + 1
    assert abs(part["last_compaction_ms"] / 1000 - time.time()) < 300
    events_acked = all_acked
    # the log end is unchanged: the next record gets the next offset
    more = _produce(bootstrap, events, [[(b"k0", b"after")]], **{"compression.type": "lz4"})
    assert more[0][0] == events_acked[-1][0] + 1

    # Connect rebuilds its state by reading the config topic from the beginning
    state = {key: value for _, key, value in _consume_all(bootstrap, configs)}
    assert state == {key: value for key, (_, value) in _latest(configs_acked).items()}
    assert (
        state[b"connector-b"] is None
        and json.loads(state[b"connector-a"])["properties"]["gen"] == 19
    )
    read = _consume_all(bootstrap, configs)
    assert read == sorted((o, k, v) for k, (o, v) in _latest(configs_acked).items())
    update = _produce(bootstrap, configs, [[(b"connector-a", b'{"properties": {"gen": 20}}')]])
    state = {key: value for _, key, value in _consume_all(bootstrap, configs)}
    assert state[b"connector-a"] == b'{"properties": {"gen": 20}}'
    assert update[0][0] == configs_acked[-1][0] + 1

    assert _consume_all(bootstrap, young) == young_acked  # nothing removed: too young
