"""Spark compaction against `automqctl cluster up`, each figure beside its baseline of the same run.

    python benchmarks/compaction_bench.py throughput [--runs 3] [--partitions 16] [--mib 32]
                                                     [--seconds 15] [--master local[2]]
    python benchmarks/compaction_bench.py catchup [--partitions 32] [--mib 64] [--seconds 20]
                                                  [--every 4] [--master local[2]]
    python benchmarks/compaction_bench.py produce-p99 [--rounds 2] [--duration 30] [--rate 2000]

Every mode runs its own cluster (`benchmarks/_harness.py`: 1 controller, uploads every 0.5 s,
so many small stream-set objects) in a temporary directory, always stopped at the end; JSON
on stdout, each run's figures on stderr as they come.

throughput (2 brokers): per run a new topic gets `mib` MiB of 1 KiB records over `seconds`;
  1. baseline: a raw boto3 copy of the same committed objects (whole-object GET + PUT,
     8 threads): MB/s of the object store;
  2. `automqctl compaction run --master <master>`: objects before/after, MB/s of bytes read
     over the whole run (JVM start-up included), over the Spark part and over the
     executors' task time;
  3. every record read back (count check). Medians over `runs`.
catchup (1 broker): sparse catch-up before and after a compaction, against raw 4 MiB ranged
  GETs of the same objects: one consumer reads every `every`-th partition from offset 0
  after a broker restart (nothing cached), before and after `compaction run`.
produce-p99 (2 brokers): produce p50/p99 of `automqctl perf` (8 partitions, 1 KiB, `rate`
  records/s, acks=all) for `duration` s idle, then again with `compaction run` started 3 s
  into it; medians over rounds. Spark's JVM competes with the brokers for the same cores
  (on a real deployment Spark runs elsewhere).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    automqctl,
    committed_objects,
    consume_count,
    emit,
    medians,
    perf,
    produce_paced,
    progress,
    raw_copy_mb_s,
    raw_get_mb_s,
    records_in,
    restart_broker,
    running_cluster,
    sparse_catchup_mb_s,
)
from tests.support.ledger import create_topic  # noqa: E402

SMALL_OBJECTS = ("--controllers", "1", "--upload-interval-s", "0.5")


def throughput_run(cdir: Path, bootstrap: str, args: argparse.Namespace) -> dict:
    """One run of the throughput mode: a new topic, the raw copy, the compaction, a read-back."""
    topic = f"bench-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, args.partitions)
    count = produce_paced(bootstrap, topic, args.mib, args.seconds)
    time.sleep(2)  # the last uploads
    baseline = raw_copy_mb_s(cdir, committed_objects(cdir))
    result = automqctl(cdir, "compaction", "run", "--master", args.master, timeout_s=900)
    consumed = consume_count(bootstrap, topic, args.partitions, count)
    return {
        "objects_before": result["objects_before"],
        "objects_after": result["objects_after"],
        "objects_ratio": result["objects_before"] / max(result["objects_after"], 1),
        "bytes_read": result["bytes_read"],
        "duration_s": result["duration_s"],
        "spark_s": result["spark_s"],
        "compaction_mb_s": result["bytes_read"] / result["duration_s"] / 1e6,
        "compaction_spark_mb_s": result["bytes_read"] / result["spark_s"] / 1e6,
        # executor throughput: bytes read per second of task time
        "compaction_task_mb_s": result["bytes_read"] / result["tasks_s"] / 1e6,
        "raw_boto3_copy_mb_s": baseline,
        "ratio_to_raw": result["bytes_read"] / result["duration_s"] / 1e6 / baseline,
        "spark_ratio_to_raw": result["bytes_read"] / result["spark_s"] / 1e6 / baseline,
        "task_ratio_to_raw": result["bytes_read"] / result["tasks_s"] / 1e6 / baseline,
        "records_consumed_ok": consumed == count,
        "committed": result["committed"],
    }


def throughput(args: argparse.Namespace) -> dict:
    with running_cluster(brokers=2, up_args=SMALL_OBJECTS) as (cdir, status):
        runs = []
        for _ in range(args.runs):
            runs.append(throughput_run(cdir, status["bootstrap_servers"], args))
            progress(runs[-1])
    return {
        "mode": "throughput",
        "master": args.master,
        "medians": medians(runs),
        "all_committed": all(r["committed"] for r in runs),
        "all_records_consumed": all(r["records_consumed_ok"] for r in runs),
        "runs": runs,
    }


def catchup(args: argparse.Namespace) -> dict:
    with running_cluster(brokers=1, up_args=SMALL_OBJECTS) as (cdir, status):
        bootstrap = status["bootstrap_servers"]
        topic = f"catchup-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, args.partitions)
        produce_paced(bootstrap, topic, args.mib, args.seconds)
        time.sleep(2)  # the last uploads
        sparse = list(range(0, args.partitions, args.every))
        wanted = records_in(bootstrap, topic, sparse)
        before_objects = committed_objects(cdir)
        raw = raw_get_mb_s(cdir, before_objects)
        restart_broker(cdir)
        before = sparse_catchup_mb_s(bootstrap, topic, sparse, wanted)
        result = automqctl(cdir, "compaction", "run", "--master", args.master, timeout_s=900)
        after_objects = committed_objects(cdir)
        raw_after = raw_get_mb_s(cdir, after_objects)
        restart_broker(cdir)
        after = sparse_catchup_mb_s(bootstrap, topic, sparse, wanted)
    return {
        "mode": "catchup",
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
    }


def produce_p99(args: argparse.Namespace) -> dict:
    perf_args = [
        "--partitions",
        "8",
        "--record-size",
        "1024",
        "--send-rate",
        str(args.rate),
        "--duration",
        str(args.duration),
        "--acks",
        "all",
    ]
    rows = []
    with running_cluster(brokers=2, up_args=SMALL_OBJECTS) as (cdir, _status):
        for _ in range(args.rounds):
            idle = perf(cdir, *perf_args)
            results: list[dict] = []

            def compact(results: list[dict] = results, cdir: Path = cdir) -> None:
                time.sleep(3)
                results.append(automqctl(cdir, "compaction", "run", "--master", "local[2]"))

            t = threading.Thread(target=compact)
            t.start()
            busy = perf(cdir, *perf_args)
            t.join()
            rows.append(
                {
                    "idle_p50_ms": idle["produce_p50_ms"],
                    "idle_p99_ms": idle["produce_p99_ms"],
                    "compacting_p50_ms": busy["produce_p50_ms"],
                    "compacting_p99_ms": busy["produce_p99_ms"],
                    "p99_ratio": busy["produce_p99_ms"] / idle["produce_p99_ms"],
                    "compaction_committed": bool(results and results[0]["committed"]),
                    "compaction_duration_s": results[0]["duration_s"] if results else None,
                }
            )
            progress(rows[-1])
    return {"mode": "produce-p99", "medians": medians(rows, 2), "rounds": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = ap.add_subparsers(dest="mode", required=True)
    t = modes.add_parser("throughput", help="compaction MB/s against a raw boto3 copy")
    t.add_argument("--runs", type=int, default=3)
    t.add_argument("--partitions", type=int, default=16)
    t.add_argument("--mib", type=int, default=32)
    t.add_argument("--seconds", type=float, default=15)
    t.add_argument("--master", default="local[2]")
    c = modes.add_parser("catchup", help="sparse catch-up before/after a compaction")
    c.add_argument("--partitions", type=int, default=32)
    c.add_argument("--mib", type=int, default=64)
    c.add_argument("--seconds", type=float, default=20)
    c.add_argument("--every", type=int, default=4)
    c.add_argument("--master", default="local[2]")
    p = modes.add_parser("produce-p99", help="produce p99 while a compaction runs vs idle")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--rate", type=float, default=2000)
    args = ap.parse_args()
    run = {"throughput": throughput, "catchup": catchup, "produce-p99": produce_p99}[args.mode]
    emit(run(args))


if __name__ == "__main__":
    main()
