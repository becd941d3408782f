#!/usr/bin/env python3
"""Ranged-GET throughput: raw boto3 vs ObjectStorage, against an embedded SeaweedFS.

Starts `weed mini` on 127.0.0.1 in a temporary directory, writes N objects of M MiB, then
reads every object back in R KiB ranges (the BlockCache's data-block size) K times each way:

* raw:        boto3 `get_object(Range=...)`, one request per range, T threads;
* store:      `ObjectStorage.get_range_async` for every range (pool of T, range merging on);
* store_nomerge: the same with merging off (`merge_window_ms=0`), to show its effect.

Then the PUTs' CPU: each object PUT again as an `ObjectBody` of 512 KiB views (as the
uploader sends its data blocks), K times each way, interleaved: without botocore
(`lean_put.py`, the default for such a bucket) and through botocore (`lean_puts=false`),
the calling thread's CPU seconds per GB (a sync `put_object` sends on it), beside the
floor of the same run: the kernel's own loopback send per GB.

Every byte read is compared with what was written. Prints one JSON summary (MB/s = 10**6
bytes per second, medians over the K runs, the store/raw ratio, GETs per run). The store is
stopped at exit, also on errors, Ctrl-C and SIGTERM.

    python benchmarks/objectstore_bench.py --objects 4 --object-mib 8 --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# runnable as a plain script from the repository root
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3  # noqa: E402
from _harness import loopback_copy_cpu_s_per_gb  # noqa: E402
from botocore.config import Config as BotoConfig  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from dataplane.objectstore import (  # noqa: E402
    ObjectBody,
    ObjectStorage,
    ObjectStoreMetrics,
    Priority,
)
from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402

MiB = 1024 * 1024
MAX_TOTAL_MIB = 4096


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=4, help="number of objects (N)")
    p.add_argument("--object-mib", type=int, default=8, help="object size in MiB (M)")
    p.add_argument("--range-kib", type=int, default=512, help="size of one ranged read")
    p.add_argument("--runs", type=int, default=5, help="runs per variant (K); medians")
    p.add_argument("--concurrency", type=int, default=8, help="threads / pool size (T)")
    p.add_argument("--merge-window-ms", type=float, default=5.0)
    p.add_argument("--merge-max-kib", type=int, default=4096)
    p.add_argument("--json-out", type=Path, default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if not (
        1 <= args.objects <= 1000
        and 1 <= args.object_mib <= 1024
        and args.objects * args.object_mib <= MAX_TOTAL_MIB
    ):
        p.error(f"need 1 <= objects <= 1000, 1 <= object-mib <= 1024, total <= {MAX_TOTAL_MIB} MiB")
    if not (
        1 <= args.range_kib <= 64 * 1024 and 1 <= args.runs <= 100 and 1 <= args.concurrency <= 256
    ):
        p.error("need 1 <= range-kib <= 65536, 1 <= runs <= 100, 1 <= concurrency <= 256")
    return args


def ranges_of(size: int, step: int) -> list[tuple[int, int]]:
    return [(s, min(size, s + step)) for s in range(0, size, step)]


def run_raw(client, bucket: str, objects: dict[str, bytes], step: int, threads: int) -> float:
    """Seconds to read every range of every object with plain boto3 calls."""
    jobs = [(k, s, e) for k, v in objects.items() for s, e in ranges_of(len(v), step)]

    def one(job: tuple[str, int, int]) -> bytes:
        key, start, end = job
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
        try:
            return body.read()
        finally:
            body.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(one, jobs))
    elapsed = time.perf_counter() - t0
    check(objects, jobs, results)
    return elapsed


def run_store(store: ObjectStorage, objects: dict[str, bytes], step: int) -> float:
    """Seconds to read every range of every object through ObjectStorage's pool."""
    jobs = [(k, s, e) for k, v in objects.items() for s, e in ranges_of(len(v), step)]
    t0 = time.perf_counter()
    futures = [store.get_range_async(0, k, s, e, Priority.CATCH_UP) for k, s, e in jobs]
    results = [f.result(timeout=300) for f in futures]
    elapsed = time.perf_counter() - t0
    check(objects, jobs, results)
    return elapsed


def put_cpu_s_per_gb(store: ObjectStorage, objects: dict[str, bytes]) -> float:
    """CPU seconds of this thread per GB to PUT every object again through `store`, each as
    an ObjectBody of 512 KiB views (the uploader's shape)."""
    block = 512 * 1024
    bodies = {
        f"{k}-put": ObjectBody([memoryview(v)[i : i + block] for i in range(0, len(v), block)])
        for k, v in objects.items()
    }
    t0 = time.thread_time()
    for key, body in bodies.items():
        store.put_object(0, key, body)
    return (time.thread_time() - t0) / (sum(len(b) for b in bodies.values()) / 1e9)


def check(objects: dict[str, bytes], jobs: list, results: list[bytes]) -> None:
    for (key, start, end), got in zip(jobs, results):
        if got != objects[key][start:end]:
            raise SystemExit(f"data mismatch in {key} [{start}, {end})")


def gets_so_far(registry: CollectorRegistry) -> int:
    return int(
        registry.get_sample_value(
            "automq_object_store_requests_total", {"op": "get", "bucket_id": "0", "status": "ok"}
        )
        or 0
    )


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the `with` blocks: the store stops


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    step = args.range_kib * 1024
    total_bytes = args.objects * args.object_mib * MiB
    with (
        tempfile.TemporaryDirectory(prefix="objectstore-bench-") as tmp,
        EmbeddedSeaweed(Path(tmp)) as seaweed,
    ):
        cfg = seaweed.config
        uri = (
            f"0@s3://{cfg.buckets[0]}?region=us-east-1&endpoint={cfg.endpoint}"
            f"&accessKey={cfg.access_key}&secretKey={cfg.secret_key}"
        )
        merged_registry, plain_registry = CollectorRegistry(), CollectorRegistry()
        common = dict(max_concurrency=args.concurrency, merge_max_bytes=args.merge_max_kib * 1024)
        with (
            ObjectStorage(
                uri,
                metrics=ObjectStoreMetrics(merged_registry),
                merge_window_ms=args.merge_window_ms,
                **common,
            ) as store,
            ObjectStorage(
                uri, metrics=ObjectStoreMetrics(plain_registry), merge_window_ms=0, **common
            ) as plain,
            ObjectStorage(
                uri, metrics=ObjectStoreMetrics(CollectorRegistry()), lean_puts=False, **common
            ) as boto_puts,
        ):
            objects = {
                f"bench/{i:04d}": os.urandom(args.object_mib * MiB) for i in range(args.objects)
            }
            t0 = time.perf_counter()
            for f in [store.put_object_async(0, k, v) for k, v in objects.items()]:
                f.result(timeout=600)
            write_s = time.perf_counter() - t0
            # plain boto3, configured like any application would (no retries, pool = threads)
            raw_client = boto3.session.Session().client(
                "s3",
                endpoint_url=cfg.endpoint,
                region_name="us-east-1",
                aws_access_key_id=cfg.access_key,
                aws_secret_access_key=cfg.secret_key,
                config=BotoConfig(
                    s3={"addressing_style": "path"},
                    max_pool_connections=args.concurrency,
                    retries={"total_max_attempts": 1},
                ),
            )
            # warm-up: connections, the server's caches
            run_raw(raw_client, cfg.buckets[0], objects, step, args.concurrency)
            run_store(store, objects, step)
            run_store(plain, objects, step)
            runs: dict[str, list[float]] = {"raw": [], "store": [], "store_nomerge": []}
            gets: dict[str, list[int]] = {"store": [], "store_nomerge": []}
            for _ in range(args.runs):  # interleaved, so drift hits every variant alike
                runs["raw"].append(
                    total_bytes
                    / run_raw(raw_client, cfg.buckets[0], objects, step, args.concurrency)
                    / 1e6
                )
                before = gets_so_far(merged_registry)
                runs["store"].append(total_bytes / run_store(store, objects, step) / 1e6)
                gets["store"].append(gets_so_far(merged_registry) - before)
                before = gets_so_far(plain_registry)
                runs["store_nomerge"].append(total_bytes / run_store(plain, objects, step) / 1e6)
                gets["store_nomerge"].append(gets_so_far(plain_registry) - before)
            raw_client.close()
            put_cpu: dict[str, list[float]] = {"lean": [], "botocore": []}
            put_cpu_s_per_gb(store, objects)  # warm-up
            put_cpu_s_per_gb(boto_puts, objects)
            for _ in range(args.runs):
                put_cpu["lean"].append(put_cpu_s_per_gb(store, objects))
                put_cpu["botocore"].append(put_cpu_s_per_gb(boto_puts, objects))
            floor = loopback_copy_cpu_s_per_gb(mib=256)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    summary = {
        "config": {
            "objects": args.objects,
            "object_mib": args.object_mib,
            "range_kib": args.range_kib,
            "runs": args.runs,
            "concurrency": args.concurrency,
            "merge_window_ms": args.merge_window_ms,
            "merge_max_kib": args.merge_max_kib,
            "cpus": os.cpu_count(),
        },
        "write_mb_s": round(total_bytes / write_s / 1e6, 1),
        "raw_boto3_mb_s": round(medians["raw"], 1),
        "store_mb_s": round(medians["store"], 1),
        "store_nomerge_mb_s": round(medians["store_nomerge"], 1),
        "ratio_store_vs_raw": round(medians["store"] / medians["raw"], 3),
        "ratio_store_nomerge_vs_raw": round(medians["store_nomerge"] / medians["raw"], 3),
        "raw_gets_per_run": len(ranges_of(args.object_mib * MiB, step)) * args.objects,
        "store_gets_per_run": statistics.median(gets["store"]),
        "store_nomerge_gets_per_run": statistics.median(gets["store_nomerge"]),
        "runs_mb_s": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        "put_cpu_s_per_gb": {k: round(statistics.median(v), 3) for k, v in put_cpu.items()},
        "runs_put_cpu_s_per_gb": {k: [round(x, 3) for x in v] for k, v in put_cpu.items()},
        "put_floor_loopback_send_cpu_s_per_gb": floor["loopback_send_cpu_s_per_gb"],
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
