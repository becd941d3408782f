"""The `automq` Spark source against `automqctl cluster up`: read MB/s beside raw 4 MiB
GETs of the same objects in the same run, and broker CPU against the Spark side's CPU.

    python benchmarks/topic_source_bench.py [--mib 1024] [--partitions 8] [--runs 3]
                                            [--master local[2]] [--idle-s 15]

One cluster (1 broker, 1 controller; `benchmarks/_harness.py`) in a temporary directory,
always stopped at the end. A new topic gets `mib` MiB of 1 KiB records (random, so
incompressible) and is uploaded; then per run:
  1. baseline: every committed object of the cluster read with 4 MiB ranged GETs, 8 threads
     (`raw_get_mb_s`): the object store's speed in this run;
  2. `spark.read.format("automq")...load()` summing the values' lengths (every row decoded
     and handed to the JVM): MB/s of stored bytes over the query's wall time, and the CPU
     seconds of the brokers against the Spark side's (the JVM and its Python workers,
     this driver process included) over the same interval, and the brokers' CPU over
     their idle CPU (measured for `idle_s` before the read: no client at all).
JSON on stdout (medians over runs), each run's figures on stderr as they come.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    TICK,
    cluster_cpu_s,
    committed_objects,
    emit,
    fill,
    medians,
    progress,
    raw_get_mb_s,
    records_in,
    running_cluster,
)
from cli.compaction_jobs import job_env  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from tests.support.cluster import create_topic  # noqa: E402

UPLOAD_WAIT_S = 600


def _descendants(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc's parent links)."""
    parents: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, []))
    return out


def spark_side_cpu_s() -> float:
    """CPU seconds of this process and everything below it (the JVM, its Python workers;
    children already reaped count through their parent's cutime/cstime)."""
    total = 0.0
    for pid in _descendants(os.getpid()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / TICK
    return total


def _wait_uploaded(cdir: Path, topic: str, partitions: int) -> None:
    from controlplane.client import ControllerClient
    from controlplane.image import MetadataImage
    from spark_jobs.topic_source.plan import committed_end

    config = LocalCluster(cdir).load()
    client = ControllerClient(config.quorum_config().api_addresses(), api_secret=config.api_secret)
    expected = records_in(config.bootstrap_servers(), topic, list(range(partitions)))
    deadline = time.monotonic() + UPLOAD_WAIT_S
    while time.monotonic() < deadline:
        raw = client.leader_get("/v1/image")
        image = (
            MetadataImage.model_validate_json(raw)
            if isinstance(raw, str)
            else MetadataImage.model_validate(raw)
        )
        t = image.topics[image.topic_ids_by_name[topic]]
        uploaded = sum(committed_end(image.streams[p.stream_id]) for p in t.partitions.values())
        if uploaded >= expected:
            return
        time.sleep(1)
    raise SystemExit("the topic was not uploaded in time")


def broker_idle_cpu_per_s(cdir: Path, seconds: float) -> float:
    """The brokers' CPU seconds per second with no client at all (heartbeats, metrics,
    upload checks): what they spend during a read whether or not the read touches them."""
    before = cluster_cpu_s(cdir).get("broker", 0.0)
    time.sleep(seconds)
    return (cluster_cpu_s(cdir).get("broker", 0.0) - before) / seconds


def spark_run(spark, cdir: Path, topic: str, stored_bytes: int, idle_per_s: float) -> dict:
    from pyspark.sql import functions as F

    before_broker = cluster_cpu_s(cdir).get("broker", 0.0)
    before_spark = spark_side_cpu_s()
    started = time.monotonic()
    row = (
        spark.read.format("automq")
        .option("cluster", str(cdir))
        .option("topic", topic)
        .load()
        .agg(F.count("*").alias("rows"), F.sum(F.length("value")).alias("value_bytes"))
        .collect()[0]
    )
    seconds = time.monotonic() - started
    broker_cpu = cluster_cpu_s(cdir).get("broker", 0.0) - before_broker
    spark_cpu = spark_side_cpu_s() - before_spark
    return {
        "rows": row["rows"],
        "value_mb": row["value_bytes"] / 1e6,
        "spark_s": seconds,
        "spark_mb_s": stored_bytes / seconds / 1e6,
        "spark_value_mb_s": row["value_bytes"] / seconds / 1e6,
        "broker_cpu_s": broker_cpu,
        "spark_cpu_s": spark_cpu,
        "broker_cpu_pct_of_spark": 100 * broker_cpu / max(spark_cpu, 1e-9),
        # over the brokers' idle CPU in the same time: the read's own broker cost
        "broker_cpu_over_idle_s": broker_cpu - idle_per_s * seconds,
        "spark_cpu_s_per_gb": spark_cpu / (stored_bytes / 1e9),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--idle-s", type=float, default=15.0)
    args = ap.parse_args()
    with running_cluster(up_args=("--controllers", "1")) as (cdir, status):
        bootstrap = status["bootstrap_servers"]
        topic = f"source-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, args.partitions)
        started = time.monotonic()
        fill(bootstrap, topic, args.mib)
        _wait_uploaded(cdir, topic, args.partitions)
        fill_s = time.monotonic() - started
        objects = committed_objects(cdir)
        stored = sum(size for _, size in objects)
        os.environ.update(
            {k: v for k, v in job_env(LocalCluster(cdir).load()).items() if "AWS_" in k}
        )
        from spark_jobs.topic_source import spark_session

        spark = spark_session(args.master, cdir, app_name="topic-source-bench")
        rounds = []
        try:
            for run in range(args.runs):
                row = {"run": run, "raw_get_mb_s": raw_get_mb_s(cdir, objects)}
                idle = broker_idle_cpu_per_s(cdir, args.idle_s)
                row["broker_idle_cpu_pct"] = 100 * idle
                row |= spark_run(spark, cdir, topic, stored, idle)
                row["spark_ratio_to_raw"] = row["spark_mb_s"] / row["raw_get_mb_s"]
                progress(row)
                rounds.append(row)
        finally:
            spark.stop()
    emit(
        {
            "mib": args.mib,
            "partitions": args.partitions,
            "master": args.master,
            "stored_mb": stored / 1e6,
            "objects": len(objects),
            "fill_and_upload_s": round(fill_s, 1),
            "runs": args.runs,
            "medians": medians(rounds),
        }
    )


if __name__ == "__main__":
    main()
