"""The `automq` Spark source against `automqctl cluster up` (SeaweedFS, a controller
process, brokers), real Kafka clients and a real Spark (`local[2]`).

100,000 records in 6 partitions (gzip-, zstd- and un-compressed batches, headers, explicit
timestamps, one aborted and one committed transaction) are produced and uploaded; then
`spark.read.format("automq")` returns exactly the committed records with their offsets,
keys, values, timestamps and headers (read_committed), the aborted ones too under
read_uncommitted; a streaming query stopped and restarted from its checkpoint writes every
record once into a Parquet sink; a missing topic, an unreachable bucket and a corrupt
object give a clear error naming the topic or the object, and change nothing. A standalone
Spark cluster (a master and a worker started from the pyspark pip package) reads a topic
too (`--master spark://...`), every record once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.spark import skip_module_without_spark

skip_module_without_spark()
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from cli import compaction_jobs  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from controlplane.image import MetadataImage  # noqa: E402
from dataplane.objectstore.seaweed import find_free_ports  # noqa: E402
from spark_jobs import objects_io  # noqa: E402
from spark_jobs.topic_source.plan import committed_end  # noqa: E402
from tests.support.cluster import create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARTITIONS = 6
RECORDS = 100_000
TOPIC = "orders"
MASTER = "local[2]"
BASE_TS_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("topic-source") / "cluster"
    with running_cluster(
        d, "--brokers", "2", "--controllers", "1", "--upload-interval-s", "0.5"
    ) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


def _config(cluster):
    return LocalCluster(cluster["dir"]).load()


def _image(cluster) -> MetadataImage:
    config = _config(cluster)
    client = ControllerClient(config.quorum_config().api_addresses(), api_secret=config.api_secret)
    raw = client.leader_get("/v1/image")
    return (
        MetadataImage.model_validate_json(raw)
        if isinstance(raw, str)
        else MetadataImage.model_validate(raw)
    )


def _streams(image: MetadataImage, topic: str) -> dict[int, int]:
    t = image.topics[image.topic_ids_by_name[topic]]
    return {p: part.stream_id for p, part in t.partitions.items()}


def _wait_uploaded(cluster, topic: str, partitions: int, timeout_s: float = 120) -> None:
    """Until every partition's objects cover its high watermark (brokers upload every 0.5 s)."""
    consumer = Consumer({"bootstrap.servers": cluster["bootstrap"], "group.id": "wm"})
    try:
        highs = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()
    deadline = time.monotonic() + timeout_s
    while True:
        image = _image(cluster)
        ends = {p: committed_end(image.streams[s]) for p, s in _streams(image, topic).items()}
        if all(ends[p] >= highs[p] for p in highs):
            return
        assert time.monotonic() < deadline, f"not uploaded: {ends} < {highs}"
        time.sleep(0.5)


class _Recorder:
    """Delivery reports -> (partition, offset) -> (key, value, timestamp ms, headers)."""

    def __init__(self) -> None:
        self.records: dict[tuple[int, int], tuple] = {}
        self.errors: list[str] = []
        # delivery reports carry no headers: the headers sent, by key
        self.headers: dict[bytes, tuple] = {}

    def __call__(self, err, msg) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        headers = self.headers.get(msg.key(), ())
        self.records[(msg.partition(), msg.offset())] = (
            msg.key(),
            msg.value(),
            msg.timestamp()[1],
            headers,
        )


def _produce_plain(bootstrap: str, recorder: _Recorder, count: int) -> None:
    """`count` records over three producers: gzip, zstd and uncompressed batches."""
    producers = [
        Producer({"bootstrap.servers": bootstrap, "compression.type": c, "linger.ms": 20})
        for c in ("gzip", "zstd", "none")
    ]
    for i in range(count):
        producer = producers[(i // 1000) % 3]
        headers = [("i", str(i).encode())] + ([("even", b"")] if i % 2 == 0 else [])
        recorder.headers[f"key-{i}".encode()] = tuple(headers)
        producer.produce(
            TOPIC,
            key=f"key-{i}".encode(),
            value=f"value-{i}-".encode() * (1 + i % 5),
            partition=i % PARTITIONS,
            timestamp=BASE_TS_MS + i,
            headers=headers,
            on_delivery=recorder,
        )
        if i % 5000 == 0:
            producer.poll(0)
    for producer in producers:
        assert producer.flush(60) == 0


def _produce_transactions(bootstrap: str, aborted: _Recorder, committed: _Recorder) -> None:
    """One aborted and one committed transaction (zstd), over partitions 0 and 1."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "orders-tx",
            "compression.type": "zstd",
        }
    )
    producer.init_transactions(30)
    for recorder, name in ((aborted, "aborted"), (committed, "committed")):
        producer.begin_transaction()
        for i in range(50):
            producer.produce(
                TOPIC,
                key=f"{name}-{i}".encode(),
                value=f"{name} value {i}".encode(),
                partition=i % 2,
                timestamp=BASE_TS_MS + RECORDS + i,
                on_delivery=recorder,
            )
        producer.flush(30)
        if name == "aborted":
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)


@pytest.fixture(scope="module")
def produced(cluster):
    """The topic's records: {"plain", "aborted", "committed"}: (partition, offset) -> record."""
    create_topic(cluster["bootstrap"], TOPIC, PARTITIONS)
    plain, aborted, committed = _Recorder(), _Recorder(), _Recorder()
    _produce_plain(cluster["bootstrap"], plain, RECORDS // 2)
    _produce_transactions(cluster["bootstrap"], aborted, committed)
    _produce_plain_tail(cluster["bootstrap"], plain)
    for r in (plain, aborted, committed):
        assert not r.errors, r.errors[:3]
    assert len(plain.records) + len(committed.records) == RECORDS
    _wait_uploaded(cluster, TOPIC, PARTITIONS)
    return {"plain": plain.records, "aborted": aborted.records, "committed": committed.records}


def _produce_plain_tail(bootstrap: str, recorder: _Recorder) -> None:
    """The second half of the plain records (after the transactions)."""
    before = len(recorder.records)
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "gzip"})
    for i in range(RECORDS // 2, RECORDS - 50):
        recorder.headers[f"key-{i}".encode()] = (("i", str(i).encode()),)
        producer.produce(
            TOPIC,
            key=f"key-{i}".encode(),
            value=f"value-{i}-".encode(),
            partition=i % PARTITIONS,
            timestamp=BASE_TS_MS + i,
            headers=[("i", str(i).encode())],
            on_delivery=recorder,
        )
        if i % 5000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    assert len(recorder.records) - before == RECORDS // 2 - 50


@pytest.fixture(scope="module")
def spark(cluster):
    """One SparkSession (local[2]) with the source registered; the buckets' keys go to the
    executors as environment (as the compaction job's)."""
    from spark_jobs.topic_source import spark_session

    env = compaction_jobs.job_env(_config(cluster))
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: env[k] for k in names if k in env})
    session = spark_session(MASTER, cluster["dir"])
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _read(spark, cluster, **options):
    reader = spark.read.format("automq").option("cluster", str(cluster["dir"]))
    for key, value in options.items():
        reader = reader.option(key.replace("_", "."), value)
    return reader


def _as_records(rows) -> dict[tuple[int, int], tuple]:
    out = {}
    for r in rows:
        assert (r.partition, r.offset) not in out, f"duplicate {r.partition}/{r.offset}"
        headers = tuple((h.key, h.value) for h in r.headers)
        ts_ms = int(r.timestamp.timestamp() * 1000)
        out[(r.partition, r.offset)] = (r.key, r.value, ts_ms, headers)
    return out


def test_batch_read_returns_exactly_the_committed_records(spark, cluster, produced):
    df = _read(spark, cluster, topic=TOPIC).load()
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert df.rdd.getNumPartitions() >= PARTITIONS
    rows = df.collect()
    assert {r.topic for r in rows} == {TOPIC}
    assert {r.timestampType for r in rows} == {0}
    got = _as_records(rows)
    expected = {**produced["plain"], **produced["committed"]}
    assert len(got) == RECORDS
    missing = set(expected) - set(got)
    assert not missing, f"{len(missing)} missing, e.g. {sorted(missing)[:3]}"
    assert set(got) == set(expected), sorted(set(got) - set(expected))[:3]
    wrong = [k for k in expected if got[k] != expected[k]]
    assert not wrong, f"{len(wrong)} differ: {wrong[:1]} {got[wrong[0]]} != {expected[wrong[0]]}"


def test_read_uncommitted_returns_the_aborted_records_too(spark, cluster, produced):
    rows = _read(spark, cluster, topic=TOPIC, isolation_level="read_uncommitted").load()
    got = _as_records(rows.collect())
    expected = {**produced["plain"], **produced["committed"], **produced["aborted"]}
    assert got == expected


def test_offsets_json_selects_ranges(spark, cluster, produced):
    starting = json.dumps({TOPIC: {"0": 100, "1": -2}})
    ending = json.dumps({TOPIC: {"0": 150, "1": 10, "2": 0, "3": 0, "4": 0, "5": 0}})
    rows = (
        _read(spark, cluster, subscribePattern="ord.*")
        .option("startingOffsets", starting)
        .option("endingOffsets", ending)
        .load()
        .collect()
    )
    got = _as_records(rows)
    plain = produced["plain"]
    expected = {k: v for k, v in plain.items() if k[0] == 0 and 100 <= k[1] < 150}
    expected |= {k: v for k, v in plain.items() if k[0] == 1 and k[1] < 10}
    assert got == expected


def test_stream_restarted_from_its_checkpoint_writes_every_record_once(
    spark, cluster, produced, tmp_path
):
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start():
        return (
            spark.readStream.format("automq")
            .option("cluster", str(cluster["dir"]))
            .option("topic", TOPIC)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "15000")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )

    query = start()
    deadline = time.monotonic() + 300
    while query.isActive and len(query.recentProgress) < 2:  # stopped mid-way
        assert time.monotonic() < deadline
        time.sleep(0.2)
    query.stop()
    first = sum(p["numInputRows"] for p in query.recentProgress)
    assert 0 < first < RECORDS
    query = start()
    query.awaitTermination(600)
    assert len(query.recentProgress) >= 1
    rows = spark.read.parquet(str(out)).collect()
    got = _as_records(rows)  # asserts no (partition, offset) twice
    assert set(got) == set(produced["plain"]) | set(produced["committed"])


def test_missing_topic_is_a_clear_error(spark, cluster, produced):
    with pytest.raises(Exception, match="topic 'no-such-topic' does not exist"):
        _read(spark, cluster, topic="no-such-topic").load().collect()


def test_unreachable_bucket_names_the_object(spark, cluster, produced):
    image = _image(cluster)
    bucket_ids = {o.bucket_id for o in image.objects.values()}
    unreachable = {
        str(b): f"{b}@s3://nowhere?region=us-east-1&endpoint=http://127.0.0.1:9" for b in bucket_ids
    }
    with pytest.raises(Exception, match=r"cannot read object [0-9]+ \(bucket") as info:
        _read(spark, cluster, topic=TOPIC, buckets=json.dumps(unreachable)).option(
            "endingOffsets", json.dumps({TOPIC: dict.fromkeys(map(str, range(6)), 5)})
        ).load().collect()
    assert "key" in str(info.value)
    _assert_unchanged(cluster, image)


def _assert_unchanged(cluster, before: MetadataImage) -> None:
    after = _image(cluster)
    for stream_id in _streams(before, TOPIC).values():
        assert after.streams[stream_id].object_ranges == before.streams[stream_id].object_ranges
        assert after.streams[stream_id].start_offset == before.streams[stream_id].start_offset


def test_corrupt_object_names_the_object_and_changes_nothing(spark, cluster, produced):
    """A byte of one block of the topic flipped in the bucket (put back afterwards)."""
    image = _image(cluster)
    stream_id = _streams(image, TOPIC)[3]
    rng = image.streams[stream_id].object_ranges[0]
    meta = image.objects[rng.object_id]
    uri = {b.bucket_id: b.uri for b in _config(cluster).buckets}[meta.bucket_id]
    entry = next(
        e
        for e in objects_io.read_index(uri, rng.object_id, meta.size_bytes)
        if e.stream_id == stream_id
    )
    original = objects_io.get_range(uri, rng.object_id, 0, meta.size_bytes)
    damaged = bytearray(original)
    damaged[entry.position + entry.size // 2] ^= 0xFF
    objects_io.put(uri, rng.object_id, bytes(damaged))
    try:
        ending = {TOPIC: {str(p): 0 for p in range(PARTITIONS)}}
        ending[TOPIC]["3"] = rng.end_offset
        with pytest.raises(Exception, match=f"object {rng.object_id} .*CRC32C mismatch"):
            _read(spark, cluster, topic=TOPIC).option(
                "endingOffsets", json.dumps(ending)
            ).load().collect()
    finally:
        objects_io.put(uri, rng.object_id, original)
    _assert_unchanged(cluster, image)


def test_read_committed_stops_at_an_open_transaction(spark, cluster, produced):
    """Records after an open transaction's first offset wait for its end (the brokers'
    last stable offset), as a read_committed consumer's do."""
    topic = "open-txn"
    create_topic(cluster["bootstrap"], topic, 1)
    plain = Producer({"bootstrap.servers": cluster["bootstrap"]})
    txn = Producer({"bootstrap.servers": cluster["bootstrap"], "transactional.id": "open-tx"})
    txn.init_transactions(30)
    for i in range(10):
        plain.produce(topic, value=b"before-%d" % i, partition=0)
    assert plain.flush(30) == 0
    txn.begin_transaction()
    for i in range(5):
        txn.produce(topic, value=b"in-txn-%d" % i, partition=0)
    txn.flush(30)
    for i in range(10):
        plain.produce(topic, value=b"after-%d" % i, partition=0)
    assert plain.flush(30) == 0
    _wait_uploaded(cluster, topic, 1)

    def offsets(**options) -> list[int]:
        rows = _read(spark, cluster, topic=topic, **options).load().collect()
        return sorted(r.offset for r in rows)

    assert offsets() == list(range(10))
    assert offsets(isolation_level="read_uncommitted") == list(range(25))
    txn.commit_transaction(30)
    _wait_uploaded(cluster, topic, 1)
    assert offsets() == list(range(25))  # the marker (offset 25) is never a row


# the driver of the standalone read: a process of its own, as `spark-submit` or a user's
# script is (the pytest process already holds this module's local[2] SparkContext); its
# environment is the compaction job's (compaction_jobs.job_env), and spark_session hands
# the buckets' keys from it to the executors
_STANDALONE_DRIVER = """
import json, sys
from spark_jobs.topic_source import spark_session

master, cluster_dir, topic = sys.argv[1:4]
spark = spark_session(master, app_name="automq-standalone-read")
try:
    rows = spark.read.format("automq").option("cluster", cluster_dir).option("topic", topic)
    rows = rows.load().select("partition", "offset", "key", "value").collect()
    print(json.dumps({
        "master": spark.sparkContext.master,
        "rows": [[r.partition, r.offset, r.key.decode(), r.value.decode()] for r in rows],
    }))
finally:
    spark.stop()
"""
STANDALONE_TIMEOUT_S = 120
_NOT_IN_WORKER_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AUTOMQ_S3_", "PYTHONPATH")


def _spark_daemon(log_path, *args: str) -> subprocess.Popen:
    """`spark-class <args>` from the pyspark pip package (its own session, so the whole
    group stops), stdout and stderr to `log_path`; no credentials nor PYTHONPATH in its
    environment: the executors get theirs from the driver."""
    import pyspark

    home = os.path.dirname(pyspark.__file__)
    env = {k: v for k, v in os.environ.items() if not k.startswith(_NOT_IN_WORKER_ENV)}
    env.update(SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1")
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [os.path.join(home, "bin", "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _wait_for_line(proc: subprocess.Popen, log_path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log_path.read_text(errors="replace"):
        assert proc.poll() is None, f"exited {proc.returncode}: {log_path.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in {timeout_s}s: {log_path}"
        time.sleep(0.2)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the process's group (SIGKILL after 30 s)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.mark.timeout(600)
def test_standalone_cluster_reads_every_record_once(cluster, tmp_path):
    """A standalone Spark master and one worker (1 core) from the pip package; a driver
    with `--master spark://...` reads a topic through them: every record once, the buckets'
    keys reaching the executors the way compaction's do (never in the worker's env)."""
    topic, count = "standalone", 3000
    create_topic(cluster["bootstrap"], topic, 3)
    producer = Producer({"bootstrap.servers": cluster["bootstrap"], "compression.type": "zstd"})
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    _wait_uploaded(cluster, topic, 3)
    master_port, master_ui, worker_port, worker_ui = find_free_ports(4)
    master_url = f"spark://127.0.0.1:{master_port}"
    procs: list[subprocess.Popen] = []
    try:
        master_log = tmp_path / "master.log"
        procs.append(
            _spark_daemon(
                master_log,
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(master_port)),
                *("--webui-port", str(master_ui)),
            )
        )
        _wait_for_line(procs[0], master_log, "New state: ALIVE", STANDALONE_TIMEOUT_S)
        worker_log = tmp_path / "worker.log"
        procs.append(
            _spark_daemon(
                worker_log,
                "org.apache.spark.deploy.worker.Worker",
                master_url,
                *("--host", "127.0.0.1", "--port", str(worker_port)),
                *("--webui-port", str(worker_ui), "--cores", "1", "--memory", "1g"),
                *("--work-dir", str(tmp_path / "work")),
            )
        )
        # the driver starts while the worker registers (its application waits for an
        # executor); the registration is still checked, bounded
        driver = subprocess.Popen(
            [sys.executable, "-c", _STANDALONE_DRIVER, master_url, str(cluster["dir"]), topic],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=compaction_jobs.job_env(_config(cluster)),
            start_new_session=True,
        )
        procs.append(driver)
        _wait_for_line(procs[1], worker_log, "Successfully registered", STANDALONE_TIMEOUT_S)
        stdout, stderr = driver.communicate(timeout=STANDALONE_TIMEOUT_S * 2)
    finally:
        for proc in reversed(procs):
            _stop_group(proc)
    assert driver.returncode == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["master"] == master_url
    got = {(p, o): (k, v) for p, o, k, v in out["rows"]}
    assert len(got) == len(out["rows"]) == count  # no record twice
    assert sorted(k for k, _ in got.values()) == sorted(f"k{i}" for i in range(count))
    assert all(v == "v" + k[1:] for k, v in got.values())
    # the tasks ran on the worker's executor (its stderr is in the worker's work dir)
    assert list((tmp_path / "work").glob("app-*/*/stderr")), "no executor ran on the worker"
