"""Spark compaction against `automqctl cluster up`, with a raw boto3 copy as the baseline.

    python benchmarks/compaction_bench.py [--runs 3] [--partitions 16] [--mib 32]
                                          [--seconds 15] [--master local[2]]

Per run: a new topic gets `mib` MiB of 1 KiB records over `seconds` seconds (brokers upload
every 0.5 s, so many small objects), then
1. baseline: a raw boto3 copy of the same committed objects (whole-object GET + PUT under a
   scratch key, 8 threads; the copies are deleted afterwards): MB/s of the object store;
2. `automqctl compaction run --master <master> --format json`: objects before/after, MB/s
   of bytes read over the whole run (JVM start-up included), over the Spark part (context
   start-up included) and over the executors' task time (reading, checking, writing);
3. every record of the run's topic is consumed back (count check).
Medians over `runs`; JSON on stdout. The cluster (2 brokers, 1 controller, embedded
SeaweedFS) lives in a temporary directory and is stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
from botocore.config import Config as BotoConfig  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from dataplane.objectstore import BucketURI, object_key  # noqa: E402
from tests.e2e.ledger import create_topic  # noqa: E402

MIB = 1024 * 1024


def automqctl(cluster_dir: Path, *args: str, timeout_s: float = 600) -> dict:
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *args, "--format", "json"],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise SystemExit(f"automqctl {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def cluster_down(cluster_dir: Path) -> None:
    """`automqctl cluster down` of a benchmark's cluster (best effort: the run is over)."""
    subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "down"],
        env={**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )


def committed_objects(cluster_dir: Path) -> list[tuple[int, int]]:
    config = LocalCluster(cluster_dir).load()
    client = ControllerClient(config.quorum_config().api_addresses(), api_secret=config.api_secret)
    raw = client.leader_get("/v1/image")
    image = json.loads(raw) if isinstance(raw, str) else raw
    out = []
    for oid in [*image["stream_set_objects"], *image["stream_objects"]]:
        meta = image["objects"].get(str(oid))
        if meta and meta["state"] == "committed":
            out.append((int(oid), meta["size_bytes"]))
    return out


def produce(bootstrap: str, topic: str, mib: int, seconds: float) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    count = mib * MIB // 1024
    value = os.urandom(1024)
    started = time.monotonic()
    for i in range(count):
        producer.produce(topic, value=value, key=str(i).encode())
        if i % 1000 == 0:
            producer.poll(0)
            lag = started + seconds * i / count - time.monotonic()
            if lag > 0:
                time.sleep(lag)
    assert producer.flush(120) == 0
    return count


def consume_count(bootstrap: str, topic: str, partitions: int, expected: int) -> int:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    deadline = time.monotonic() + 120
    while seen < expected and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            if not msg.error():
                seen += 1
    consumer.close()
    return seen


def raw_copy_mb_s(cluster_dir: Path, objects: list[tuple[int, int]]) -> float:
    bucket = LocalCluster(cluster_dir).load().buckets[0]
    uri = BucketURI.parse(bucket.uri)
    s3 = boto3.client(
        "s3",
        endpoint_url=uri.endpoint,
        aws_access_key_id=bucket.access_key,
        aws_secret_access_key=bucket.secret_key,
        config=BotoConfig(
            region_name=uri.region, s3={"addressing_style": "path"}, max_pool_connections=16
        ),
    )

    def copy(item: tuple[int, int]) -> int:
        oid, _ = item
        data = s3.get_object(Bucket=uri.bucket, Key=object_key(oid))["Body"].read()
        s3.put_object(Bucket=uri.bucket, Key=f"bench-copy/{oid}", Body=data)
        return len(data)

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(copy, objects))
    elapsed = time.monotonic() - started
    for oid, _ in objects:
        s3.delete_object(Bucket=uri.bucket, Key=f"bench-copy/{oid}")
    return total / elapsed / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--mib", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="compaction-bench-") as tmp:
        cdir = Path(tmp) / "cluster"
        status = automqctl(
            cdir,
            "cluster",
            "up",
            "--brokers",
            "2",
            "--controllers",
            "1",
            "--upload-interval-s",
            "0.5",
        )
        bootstrap = status["bootstrap_servers"]
        runs = []
        try:
            for _ in range(args.runs):
                topic = f"bench-{uuid.uuid4().hex[:6]}"
                create_topic(bootstrap, topic, args.partitions)
                count = produce(bootstrap, topic, args.mib, args.seconds)
                time.sleep(2)  # the last uploads
                objects = committed_objects(cdir)
                baseline = raw_copy_mb_s(cdir, objects)
                result = automqctl(
                    cdir, "compaction", "run", "--master", args.master, timeout_s=900
                )
                consumed = consume_count(bootstrap, topic, args.partitions, count)
                runs.append(
                    {
                        "objects_before": result["objects_before"],
                        "objects_after": result["objects_after"],
                        "bytes_read": result["bytes_read"],
                        "duration_s": result["duration_s"],
                        "spark_s": result["spark_s"],
                        "compaction_mb_s": result["bytes_read"] / result["duration_s"] / 1e6,
                        "compaction_spark_mb_s": result["bytes_read"] / result["spark_s"] / 1e6,
                        # executor throughput: bytes read per second of task time
                        "compaction_task_mb_s": result["bytes_read"] / result["tasks_s"] / 1e6,
                        "raw_boto3_copy_mb_s": baseline,
                        "records_consumed_ok": consumed == count,
                        "committed": result["committed"],
                    }
                )
                print(json.dumps(runs[-1]), file=sys.stderr)
        finally:
            cluster_down(cdir)

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 3)

    summary = {
        "runs": len(runs),
        "master": args.master,
        "objects_before": med("objects_before"),
        "objects_after": med("objects_after"),
        "objects_ratio": round(
            statistics.median(r["objects_before"] / max(r["objects_after"], 1) for r in runs), 1
        ),
        "compaction_mb_s": med("compaction_mb_s"),
        "compaction_spark_mb_s": med("compaction_spark_mb_s"),
        "compaction_task_mb_s": med("compaction_task_mb_s"),
        "raw_boto3_copy_mb_s": med("raw_boto3_copy_mb_s"),
        "task_ratio_to_raw": round(
            statistics.median(r["compaction_task_mb_s"] / r["raw_boto3_copy_mb_s"] for r in runs),
            3,
        ),
        "ratio_to_raw": round(
            statistics.median(r["compaction_mb_s"] / r["raw_boto3_copy_mb_s"] for r in runs), 3
        ),
        "spark_ratio_to_raw": round(
            statistics.median(r["compaction_spark_mb_s"] / r["raw_boto3_copy_mb_s"] for r in runs),
            3,
        ),
        "all_committed": all(r["committed"] for r in runs),
        "all_records_consumed": all(r["records_consumed_ok"] for r in runs),
        "per_run": runs,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
