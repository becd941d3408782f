"""Sparse catch-up before and after Spark compaction, against raw GETs of the same run.

    python benchmarks/compaction_catchup_bench.py [--partitions 32] [--mib 64] [--seconds 20]
                                                  [--every 4] [--master local[2]]

A topic of `partitions` partitions gets `mib` MiB of 1 KiB records over `seconds` seconds;
the broker uploads every 0.5 s, so every partition's data is spread over many small
stream-set objects shared with all the others. Then:
1. baseline: raw boto3 ranged GETs (4 MiB ranges, 8 threads) of every committed object;
2. sparse catch-up, before: the broker is restarted (nothing cached), one confluent-kafka
   consumer reads every `every`-th partition from the beginning: MB/s of record bytes;
3. `automqctl compaction run --master <master>`;
4. sparse catch-up, after: restart again, the same partitions read again.
Reported: objects before/after, the three MB/s figures and the catch-up ratios to the raw
GETs. JSON on stdout. The cluster lives in a temporary directory, stopped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
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
from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from benchmarks.compaction_bench import automqctl, cluster_down, committed_objects, produce  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from dataplane.objectstore import BucketURI, object_key  # noqa: E402
from tests.e2e.ledger import create_topic  # noqa: E402

MIB = 1024 * 1024
RANGE_BYTES = 4 * MIB


def raw_get_mb_s(cluster_dir: Path, objects: list[tuple[int, int]]) -> float:
    """Every object read with 4 MiB ranged GETs, 8 threads: the store's speed in this run."""
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
    ranges = [
        (oid, start, min(start + RANGE_BYTES, size) - 1)
        for oid, size in objects
        for start in range(0, size, RANGE_BYTES)
    ]

    def get(item: tuple[int, int, int]) -> int:
        oid, start, end = item
        body = s3.get_object(Bucket=uri.bucket, Key=object_key(oid), Range=f"bytes={start}-{end}")
        return len(body["Body"].read())

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(get, ranges))
    return total / (time.monotonic() - started) / 1e6


def restart_broker(cluster_dir: Path, tree: Path = ROOT) -> None:
    """Restart broker 1 (nothing cached), with its code from `tree` (default: this one)."""
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "PYTHONPATH": str(tree)}
    for verb in ("stop", "start"):
        out = subprocess.run(
            [sys.executable, "-m", "cli.main", "broker", verb, "1"],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if out.returncode != 0:
            raise SystemExit(f"broker {verb} from {tree} failed: {out.stderr.strip()[-300:]}")


# A consumer set up for a catch-up: librdkafka sends a broker its next Fetch only while its
# prefetched-message queue is below queued.max.messages.kbytes (64 MiB by default), and
# parses each answer before it sends the next, so with the defaults one 48 MB answer nearly
# fills the queue and the client waits for the application instead of fetching
# (docs/benchmarks.md: 212 -> 350-390 MB/s against the same broker).
PREFETCHING_CONSUMER = {
    "queued.max.messages.kbytes": 1024 * 1024,
    "queued.min.messages": 10_000_000,
    "fetch.max.bytes": 128 * MIB,
    "max.partition.fetch.bytes": 16 * MIB,
}


def sparse_catchup_mb_s(
    bootstrap: str, topic: str, partitions: list[int], records: int, prefetching: bool = False
) -> float:
    """One consumer reads `partitions` from offset 0 to their end: MB/s of record values.
    `prefetching`: with PREFETCHING_CONSUMER's settings over the defaults here."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * MIB,
            "max.partition.fetch.bytes": 8 * MIB,
            **(PREFETCHING_CONSUMER if prefetching else {}),
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen = size = 0
    started = None
    deadline = time.monotonic() + 300
    while seen < records and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            if msg.error():
                continue
            if started is None:
                started = time.monotonic()
            seen += 1
            size += len(msg.value() or b"")
    elapsed = time.monotonic() - (started or time.monotonic())
    consumer.close()
    if seen < records:
        raise SystemExit(f"catch-up read {seen} of {records} records")
    return size / max(elapsed, 1e-6) / 1e6


def records_in(bootstrap: str, topic: str, partitions: list[int]) -> int:
    """How many records the partitions hold (high watermark minus log start)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        total = 0
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high - low
        return total
    finally:
        consumer.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=32)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="compaction-catchup-") as tmp:
        cdir = Path(tmp) / "cluster"
        status = automqctl(
            cdir,
            "cluster",
            "up",
            "--brokers",
            "1",
            "--controllers",
            "1",
            "--upload-interval-s",
            "0.5",
        )
        bootstrap = status["bootstrap_servers"]
        try:
            topic = f"catchup-{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, topic, args.partitions)
            count = produce(bootstrap, topic, args.mib, args.seconds)
            time.sleep(2)  # the last uploads
            sparse = list(range(0, args.partitions, args.every))
            wanted = records_in(bootstrap, topic, sparse)
            del count
            before_objects = committed_objects(cdir)
            raw = raw_get_mb_s(cdir, before_objects)
            restart_broker(cdir)
            before = sparse_catchup_mb_s(bootstrap, topic, sparse, wanted)
            result = automqctl(cdir, "compaction", "run", "--master", args.master, timeout_s=900)
            after_objects = committed_objects(cdir)
            raw_after = raw_get_mb_s(cdir, after_objects)
            restart_broker(cdir)
            after = sparse_catchup_mb_s(bootstrap, topic, sparse, wanted)
        finally:
            cluster_down(cdir)
    print(
        json.dumps(
            {
                "partitions_read": f"{len(sparse)} of {args.partitions}",
                "objects_before": len(before_objects),
                "objects_after": len(after_objects),
                "compaction_committed": result["committed"],
                "raw_get_mb_s_before": round(raw, 1),
                "raw_get_mb_s_after": round(raw_after, 1),
                "sparse_catchup_mb_s_before": round(before, 1),
                "sparse_catchup_mb_s_after": round(after, 1),
                "ratio_to_raw_before": round(before / raw, 3),
                "ratio_to_raw_after": round(after / raw_after, 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
