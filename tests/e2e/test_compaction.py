"""Spark compaction of objects against `automqctl cluster up` (SeaweedFS, a controller
process, brokers) with real Kafka clients and a real Spark (`local[2]`).

Every acknowledged record reads back identical after compaction (with the brokers restarted,
so reads come from the compacted objects, not their log caches); consumers reading from the
objects while a run commits see no error, no duplicate, no gap; compaction concurrent with
produce loses nothing; a run that lost a race is refused whole and its objects are deleted;
a job killed with SIGKILL leaves the cluster readable, the next run finishes the work, and
nothing of the killed run is left once its prepared ids' TTL has passed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid

import pytest

from tests.support.spark import skip_module_without_spark

skip_module_without_spark()
import boto3  # noqa: E402
from botocore.config import Config as BotoConfig  # noqa: E402
from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from cli import compaction_jobs  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from dataplane.objectstore import BucketURI, object_key  # noqa: E402
from tests.support.ledger import AckLedger, automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARTITIONS = 6
MASTER = "local[2]"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("compaction") / "cluster"
    with running_cluster(
        d,
        "--brokers",
        "2",
        "--controllers",
        "1",
        "--upload-interval-s",
        "0.5",
        # objects no longer needed are deleted 2 s later (readers of compacted objects
        # re-locate; a killed job's objects are gone soon after their prepared TTL)
        "--object-delete-delay-s",
        "2",
    ) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


@pytest.fixture(scope="module")
def spark(cluster):
    """One SparkContext (local[2]) for the module's in-process runs; the object-store
    credentials and the controller API secret in this process's environment (as the CLI
    gives them to its job)."""
    from controlplane.auth import SECRET_ENV
    from spark_jobs.compact import spark_context

    env = compaction_jobs.job_env(_config(cluster))
    names = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", SECRET_ENV)
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


def _run_in_process(cluster, sc, emit=None) -> dict:
    from spark_jobs.compact import JobConfig, run

    job = JobConfig.model_validate(compaction_jobs.job_config(_config(cluster), MASTER))
    return run(job, emit=emit, sc=sc)


def _config(cluster):
    return LocalCluster(cluster["dir"]).load()


def _image(cluster) -> dict:
    config = _config(cluster)
    client = ControllerClient(config.quorum_config().api_addresses(), api_secret=config.api_secret)
    raw = client.leader_get("/v1/image")
    return json.loads(raw) if isinstance(raw, str) else raw


def _object_ids(cluster) -> set[int]:
    """Committed objects readers may use."""
    image = _image(cluster)
    return {
        int(oid)
        for oid in [*image["stream_set_objects"], *image["stream_objects"]]
        if image["objects"].get(str(oid), {}).get("state") == "committed"
    }


def _objects(cluster) -> int:
    return len(_object_ids(cluster))


def _compact(cluster, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = automqctl(
        "compaction",
        "run",
        "--master",
        MASTER,
        "--format",
        "json",
        *extra,
        cluster_dir=cluster["dir"],
        timeout_s=240,
    )
    return out, (json.loads(out.stdout) if out.stdout.strip().startswith("{") else {})


def _produce(cluster, seconds: float) -> AckLedger:
    topic = f"compact-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    ledger = AckLedger(cluster["bootstrap"], topic, PARTITIONS, rate_per_partition=40).start()
    time.sleep(seconds)
    return ledger


def _restart_brokers(cluster) -> None:
    """Down and up again: the brokers' log caches are empty, reads go to the objects."""
    assert automqctl("cluster", "down", cluster_dir=cluster["dir"]).returncode == 0
    up = automqctl("cluster", "up", "--format", "json", cluster_dir=cluster["dir"])
    assert up.returncode == 0, up.stderr + up.stdout
    cluster["bootstrap"] = json.loads(up.stdout)["bootstrap_servers"]


def assert_exact(ledger: AckLedger, bootstrap: str) -> None:
    ledger.bootstrap = bootstrap
    report = ledger.verify()
    assert report.acked > 0
    assert not report.missing, f"{len(report.missing)} acked records missing"
    assert not report.duplicated, f"{len(report.duplicated)} duplicated"
    assert not report.out_of_order_partitions
    assert report.consumed == report.acked


def _read_pass(bootstrap: str, ledger: AckLedger, timeout_s: float = 60) -> dict:
    """One consumer reads every partition of the ledger's topic from the beginning to its
    acked end: partition -> [(offset, value)], and the errors the client reported."""
    ends: dict[int, int] = {}
    for a in ledger.snapshot():
        ends[a.partition] = max(ends.get(a.partition, 0), a.offset + 1)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"during-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    errors: list[str] = []
    try:
        consumer.assign([TopicPartition(ledger.topic, p, 0) for p in ends])
        deadline = time.monotonic() + timeout_s
        while any((read[p][-1][0] + 1 if read[p] else 0) < end for p, end in ends.items()):
            assert time.monotonic() < deadline, "a read during compaction stalled"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                errors.append(str(msg.error()))
                continue
            read[msg.partition()].append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    return {"read": read, "errors": errors}


def _bucket_client(cluster):
    bucket = _config(cluster).buckets[0]
    uri = BucketURI.parse(bucket.uri)
    s3 = boto3.client(
        "s3",
        endpoint_url=uri.endpoint,
        aws_access_key_id=bucket.access_key,
        aws_secret_access_key=bucket.secret_key,
        config=BotoConfig(region_name=uri.region, s3={"addressing_style": "path"}),
    )
    return s3, uri.bucket


def test_compaction_keeps_every_record_and_cuts_the_objects(cluster, spark):
    """Many small objects compact to few while consumers read them from the beginning
    (no error, no duplicate, nothing missing); then a second run while producing; after a
    broker restart (reads from the compacted objects) every acked record reads back."""
    quiet = _produce(cluster, 6)
    deadline = time.monotonic() + 30  # a loaded machine uploads less often
    while _objects(cluster) < 20 and time.monotonic() < deadline:
        time.sleep(0.5)
    quiet.stop()
    assert all(a.offset is not None for a in quiet.snapshot())  # no fault: every offset known
    time.sleep(1.5)  # the last uploads
    before_ids = _object_ids(cluster)
    before = len(before_ids)
    assert before >= 20, f"only {before} objects: the test needs many small ones"
    dry, plan = _compact(cluster, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert plan["committed"] is False and plan["plan"]["compacted_objects"] >= before
    assert before_ids <= _object_ids(cluster)  # the dry run compacted nothing away
    # brokers restarted: their caches are empty, so the readers below read the objects the
    # run compacts, from the beginning, again and again while the run commits
    _restart_brokers(cluster)
    passes: list[dict] = []
    failures: list[BaseException] = []
    run_done = threading.Event()

    def read_while_compacting() -> None:
        try:
            while not run_done.is_set() and len(passes) < 100:
                passes.append(_read_pass(cluster["bootstrap"], quiet))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    reader = threading.Thread(target=read_while_compacting, daemon=True)
    reader.start()
    try:
        out, result = _compact(cluster)
    finally:
        run_done.set()
        reader.join(120)
    assert out.returncode == 0, out.stderr + out.stdout
    assert result["committed"] is True, result
    assert not failures, failures
    passes.append(_read_pass(cluster["bootstrap"], quiet))  # after the commit
    acked = {(a.partition, a.offset, a.value) for a in quiet.snapshot()}
    for one in passes:  # every pass: no error, strictly increasing, each acked record once
        assert not one["errors"], one["errors"]
        seen = {(p, o, v) for p, records in one["read"].items() for o, v in records}
        for records in one["read"].values():
            offsets = [o for o, _ in records]
            assert offsets == sorted(set(offsets))
        assert seen == acked  # only acked records, every one of them, none twice
        assert sum(len(r) for r in one["read"].values()) == len(acked)
    assert len(passes) >= 3  # the run (a JVM start, a plan, a commit) took several passes
    busy = _produce(cluster, 2)
    try:
        result = _run_in_process(cluster, spark)  # producing all along
        assert result["committed"] is True, result
    finally:
        busy.stop()
    assert_exact(busy, cluster["bootstrap"])  # consumers during/after the run
    _restart_brokers(cluster)
    assert_exact(quiet, cluster["bootstrap"])
    assert_exact(busy, cluster["bootstrap"])


def test_a_run_that_lost_a_race_is_refused_whole(cluster, spark):
    """A topic is deleted between the plan and the commit: nothing is committed, the
    run's new objects are deleted, and the other topic reads back complete."""
    keep = _produce(cluster, 3)
    doomed = _produce(cluster, 3)
    keep.stop()
    doomed.stop()
    time.sleep(1.5)
    admin = AdminClient({"bootstrap.servers": cluster["bootstrap"]})

    def on_event(event: dict) -> None:
        if event.get("event") == "plan":  # after the plan, before the commit
            admin.delete_topics([doomed.topic], operation_timeout=30)[doomed.topic].result(30)

    before = _objects(cluster)
    result = _run_in_process(cluster, spark, emit=on_event)
    assert result["committed"] is False
    assert result["reason"].startswith("commit refused"), result
    assert result["new_object_ids"]
    s3, bucket = _bucket_client(cluster)
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    keys = {o["Key"] for o in listed}
    assert not keys & {object_key(o) for o in result["new_object_ids"]}
    assert _objects(cluster) <= before  # the delete may have destroyed objects; nothing new
    assert_exact(keep, cluster["bootstrap"])


KILLED_JOB_TTL_MS = 8_000


def _exists(s3, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
        return True
    except s3.exceptions.ClientError as exc:
        if exc.response["Error"]["Code"] in ("404", "NoSuchKey", "NotFound"):
            return False
        raise


def _prepared_by_the_killed_job(cluster) -> set[int]:
    """Ids PREPARED with the killed job's TTL (brokers prepare theirs with 60 min)."""
    return {
        int(oid)
        for oid, o in _image(cluster)["objects"].items()
        if o["state"] == "prepared" and o["deadline_ms"] - o["prepared_ms"] == KILLED_JOB_TTL_MS
    }


def test_a_killed_job_leaves_the_cluster_readable_and_the_next_run_finishes(cluster, spark):
    """kill -9 of the job after it prepared its object ids: the cluster stays readable, the
    next run finishes the work, and once the ids' TTL has passed nothing of the killed run
    is left in the bucket or the metadata (an object an executor had put under one of them
    included)."""
    ledger = _produce(cluster, 4)
    ledger.stop()
    time.sleep(1.5)
    config = _config(cluster)
    cfg_path = compaction_jobs.write_job_config(cluster["dir"], config, MASTER)
    job = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**job, "prepared_ttl_ms": KILLED_JOB_TTL_MS}))
    proc = subprocess.Popen(
        compaction_jobs.job_argv(cfg_path, MASTER, dry_run=False),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=compaction_jobs.job_env(config),
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if '"event": "plan"' in line:
                break
        deadline = time.monotonic() + 10
        while not (orphans := _prepared_by_the_killed_job(cluster)):
            assert time.monotonic() < deadline, "the job prepared no object ids"
            time.sleep(0.1)
        time.sleep(0.5)  # mid-run: ids prepared, Spark starting or writing
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM
        proc.wait(timeout=30)
    # what an executor killed after its put leaves behind: an object nothing references
    s3, bucket = _bucket_client(cluster)
    s3.put_object(Bucket=bucket, Key=object_key(min(orphans)), Body=b"written, never committed")
    assert_exact(ledger, cluster["bootstrap"])
    result = _run_in_process(cluster, spark)
    assert result["committed"] is True, result
    assert result["objects_after"] < result["objects_before"]
    assert_exact(ledger, cluster["bootstrap"])
    # past the TTL the controller destroys the ids and deletes their objects (2 s later)
    deadline = time.monotonic() + KILLED_JOB_TTL_MS / 1000 + 30
    while True:
        left = orphans & {int(oid) for oid in _image(cluster)["objects"]}
        in_bucket = {o for o in orphans if _exists(s3, bucket, object_key(o))}
        if not left and not in_bucket:
            break
        assert time.monotonic() < deadline, f"leaked: ids {left}, objects {in_bucket}"
        time.sleep(0.5)


def test_compaction_cli_errors_are_one_line_and_change_nothing(cluster, tmp_path):
    bad = automqctl("compaction", "run", "--master", "bogus", cluster_dir=cluster["dir"])
    assert bad.returncode == 1 and "invalid --master" in bad.stderr
    bad = automqctl("compaction", "schedule", "--every", "3x", cluster_dir=cluster["dir"])
    assert bad.returncode == 1 and "invalid interval" in bad.stderr
    missing = automqctl("compaction", "status", cluster_dir=tmp_path / "none")
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert not (cluster["dir"] / "compaction" / "schedule.json").exists()


def test_schedule_starts_a_scheduler_the_cluster_knows_about(cluster):
    d = cluster["dir"]
    out = automqctl("compaction", "schedule", "--every", "10m", "--format", "json", cluster_dir=d)
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["every_s"] == 600 and info["cron"].startswith("*/10 * * * *")
    assert "spark-submit --master local[*]" in info["spark_submit"]
    status = json.loads(automqctl("cluster", "status", "--format", "json", cluster_dir=d).stdout)
    assert status["compaction_scheduler"]["pid"] == info["scheduler_pid"]
    comp = json.loads(automqctl("compaction", "status", "--format", "json", cluster_dir=d).stdout)
    assert comp["schedule"] == {"every_s": 600, "master": "local[*]"}
    assert comp["scheduler_pid"] == info["scheduler_pid"]
    out = automqctl("compaction", "unschedule", cluster_dir=d)
    assert out.returncode == 0, out.stderr
    assert LocalCluster(d).running("compaction-scheduler") is None
    status = json.loads(automqctl("cluster", "status", "--format", "json", cluster_dir=d).stdout)
    assert status["compaction_scheduler"] is None and status["healthy"]
