"""Catch-up read benchmark of the storage engine against a real SeaweedFS and quorum.

    python benchmarks/catchup_bench.py [--streams 1000] [--backlog-kib 512] [--record-kib 16]
                                       [--workers 16] [--cache-mib 2048] [--runs 3]
                                       [--upload-mib 64] [--split-kib 8192]

1. A writer engine fills `streams` streams with a backlog each and uploads it every
   `upload-mib` (streams with at least `split-kib` in one upload get stream objects, the
   rest share a stream-set object). The defaults give stream-set objects (~170 KiB per
   stream per object); `--streams 64 --backlog-kib 8192 --upload-mib 256 --split-kib 2048
   --upload-interval-s 3600` gives 4 MiB stream objects, the layout of older data after
   AutoMQ's compaction.
2. Baseline: raw boto3 ranged GETs of every committed object, 512 KiB ranges, `workers`
   threads (the object store's own speed on this machine, in this run).
3. A fresh reader engine (empty caches) reads every stream from offset 0 to its end through
   the Stream API, `workers` threads taking streams round-robin, each stream at its own pace
   (max bytes per fetch between 64 KiB and 1 MiB), so read windows of all streams are active
   together. Reported: MB/s delivered, the ratio to the baseline, bytes fetched per byte
   delivered (by the block fetcher, and as received by the object store: index reads and
   bytes between merged ranges included), GET requests, and block-cache bytes per active
   read window (sampled; per reader with held blocks in the engine's list, which leaves out
   readers in the middle of a read, and per reader watching blocks in the cache).
Medians over `runs` runs; JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.objectstore import object_key  # noqa: E402
from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402
from tests.integration.engine_harness import make_engine  # noqa: E402
from tests.integration.quorum_harness import QuorumHarness  # noqa: E402

MIB = 1024 * 1024


def fill(
    q,
    store,
    tmp: Path,
    streams: int,
    backlog: int,
    record: int,
    upload_bytes: int = 64 * MIB,
    split_bytes: int = 8 * MIB,
    upload_interval_s: float = 5.0,
) -> list[tuple[int, int]]:
    writer = make_engine(
        q.client,
        store,
        tmp / "writer",
        1,
        upload_threshold_bytes=upload_bytes,
        stream_split_bytes=split_bytes,
        upload_interval_s=upload_interval_s,
        log_cache_uploaded_bytes=0,
        wal_capacity_bytes=max(512 * MIB, 2 * upload_bytes),
    )
    writer.start()
    ends = []
    try:
        ids = [writer.create_stream() for _ in range(streams)]
        handles = [writer.open_stream(sid, 0) for sid in ids]
        per_stream = max(backlog // record, 1)
        payload = b"x" * record
        for _round in range(per_stream):
            futures = [h.append(payload, 1) for h in handles]
            for f in futures:
                f.result(60)
        writer.flush()
        ends = [(h.stream_id, h.next_offset) for h in handles]
    finally:
        writer.close()
    return ends


def raw_baseline(q, store, ends, workers: int, per_block: bool = False) -> dict:
    """boto3 ranged GETs of every committed object: 512 KiB ranges, or (per_block) one GET
    per data block, the ranges the engine itself needs when nothing merges."""
    from dataplane.objectstore import ObjectStorage, parse_bucket_uris
    from tests.integration.engine_harness import bucket_uris

    objs = {}
    for sid, end in ends:
        for o in q.client.stream_objects(sid, 0, end, 10_000):
            objs[o["object_id"]] = (o["bucket_id"], o["size_bytes"])
    storage = ObjectStorage(parse_bucket_uris(bucket_uris(store)))
    client = storage.boto3_client(0)
    bucket = storage.bucket(0).bucket
    ranges = [
        (oid, start, min(start + 512 * 1024, size))
        for oid, (_, size) in objs.items()
        for start in range(0, size, 512 * 1024)
    ]
    if per_block:
        from dataplane.s3stream.stream_reader import IndexCache, ObjectLocation

        index = IndexCache(storage)
        ranges = []
        for oid, (_, size) in objs.items():
            loc = ObjectLocation(oid, 0, size, 0, 0)
            index.get(loc, 0)
            for entries in index._cache[oid].values():
                ranges += [(oid, e.position, e.end_position) for e in entries]

    def get(r):
        oid, start, end = r
        body = client.get_object(
            Bucket=bucket, Key=object_key(oid), Range=f"bytes={start}-{end - 1}"
        )["Body"].read()
        return len(body)

    t = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        total = sum(pool.map(get, ranges))
    elapsed = time.monotonic() - t
    storage.close()
    return {
        "bytes": total,
        "seconds": elapsed,
        "mb_per_s": total / elapsed / MIB,
        "objects": len(objs),
        "requests": len(ranges),
    }


def s3_gets(engine) -> tuple[int, int]:
    """(GET bytes received, GET requests) of the engine's object store (bucket 0)."""
    m = engine.objects.metrics
    return (
        int(m.bytes.labels(op="get", bucket_id="0")._value.get()),
        int(m.requests.labels(op="get", bucket_id="0", status="ok")._value.get()),
    )


def engine_catchup(
    q, store, tmp: Path, ends, workers: int, cache_mib: int, run: int, read_every: int = 1
) -> dict:
    ends = ends[::read_every]  # a sparse catch-up reads only some streams of each object
    reader = make_engine(
        q.client,
        store,
        tmp / f"reader-{run}",
        100 + run,
        block_cache_bytes=cache_mib * MIB,
        wal_capacity_bytes=16 * MIB,
    )
    reader.start()
    samples: list[float] = []
    watcher_samples: list[float] = []
    stop = threading.Event()

    def sample():
        while not stop.wait(0.05):
            active = [r for r in reader.readers if r.held_bytes > 0]
            if active:
                samples.append(reader.block_cache.used_bytes / len(active))
            # the cache's own count also includes readers in the middle of a read
            # (the engine's list above does not hold them while they read)
            watchers = reader.block_cache.watcher_count
            if watchers:
                watcher_samples.append(reader.block_cache.used_bytes / watchers)

    delivered = [0] * workers
    streams = {sid: reader.open_stream(sid, 1 + run) for sid, _ in ends}
    ends_by = dict(ends)
    paces = {sid: 64 * 1024 * (1 + (i % 16)) for i, sid in enumerate(streams)}

    def work(w: int):
        mine = [sid for i, sid in enumerate(streams) if i % workers == w]
        cursor = {sid: 0 for sid in mine}
        while mine:
            for sid in list(mine):
                batches = streams[sid].fetch(cursor[sid], ends_by[sid], paces[sid])
                if not batches:
                    raise RuntimeError(f"stream {sid} returned nothing at {cursor[sid]}")
                delivered[w] += sum(len(b.payload) for b in batches)
                cursor[sid] = batches[-1].last_offset
                if cursor[sid] >= ends_by[sid]:
                    mine.remove(sid)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    fetched_before = reader.fetcher.bytes_fetched
    gets_before = reader.fetcher.gets
    s3_before = s3_gets(reader)
    t = time.monotonic()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(work, range(workers)))
    elapsed = time.monotonic() - t
    stop.set()
    fetched = reader.fetcher.bytes_fetched - fetched_before
    gets = reader.fetcher.gets - gets_before
    s3_bytes, s3_requests = (a - b for a, b in zip(s3_gets(reader), s3_before))
    cache = reader.block_cache
    total = sum(delivered)
    reader.close()  # closes the streams so the next run's reader may open them
    return {
        "bytes": total,
        "seconds": elapsed,
        "mb_per_s": total / elapsed / MIB,
        "fetched_per_delivered": fetched / total,
        "block_gets": gets,
        # everything the engine's object store received (index reads and bytes
        # between merged ranges included), and its GET requests
        "s3_get_bytes_per_delivered": s3_bytes / total,
        "s3_get_requests": s3_requests,
        "prefetched_bytes": cache.prefetched_bytes,
        "prefetch_wasted_bytes": cache.prefetch_wasted_bytes,
        "held_bytes_per_window_median": median(samples),
        "held_bytes_per_window_p99": p99(samples),
        "held_bytes_per_watcher_median": median(watcher_samples),
        "held_bytes_per_watcher_p99": p99(watcher_samples),
    }


def median(samples: list[float]) -> float:
    return statistics.median(samples) if samples else 0.0


def p99(samples: list[float]) -> float:
    return sorted(samples)[int(len(samples) * 0.99)] if samples else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--backlog-kib", type=int, default=512)
    p.add_argument("--record-kib", type=int, default=16)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--cache-mib", type=int, default=2048)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--upload-mib", type=int, default=64, help="writer's upload threshold")
    p.add_argument("--split-kib", type=int, default=8192, help="writer's stream_split_bytes")
    p.add_argument(
        "--read-every",
        type=int,
        default=1,
        help="read only every Nth stream (sparse catch-up: prefetch must not "
        "fetch what nobody reads; the MB/s ratio then means little)",
    )
    p.add_argument(
        "--upload-interval-s",
        type=float,
        default=5.0,
        help="writer's upload interval (large: uploads by threshold only)",
    )
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with (
            EmbeddedSeaweed(tmp / "s3") as store,
            QuorumHarness(tmp / "q", session_timeout_ms=600_000) as q,
        ):
            q.leader()
            t = time.monotonic()
            ends = fill(
                q,
                store,
                tmp,
                a.streams,
                a.backlog_kib * 1024,
                a.record_kib * 1024,
                a.upload_mib * MIB,
                a.split_kib * 1024,
                a.upload_interval_s,
            )
            fill_s = time.monotonic() - t
            raws, blocks, engines = [], [], []
            for run in range(a.runs):
                raws.append(raw_baseline(q, store, ends, a.workers))
                blocks.append(raw_baseline(q, store, ends, a.workers, per_block=True))
                engines.append(
                    engine_catchup(q, store, tmp, ends, a.workers, a.cache_mib, run, a.read_every)
                )
    raw_mb = statistics.median(r["mb_per_s"] for r in raws)
    eng_mb = statistics.median(e["mb_per_s"] for e in engines)
    block_mb = statistics.median(r["mb_per_s"] for r in blocks)
    print(
        json.dumps(
            {
                "streams": a.streams,
                "backlog_per_stream_kib": a.backlog_kib,
                "record_kib": a.record_kib,
                "workers": a.workers,
                "cache_mib": a.cache_mib,
                "upload_mib": a.upload_mib,
                "split_kib": a.split_kib,
                "upload_interval_s": a.upload_interval_s,
                "read_every": a.read_every,
                "fill_seconds": round(fill_s, 1),
                "objects": raws[0]["objects"],
                "mean_object_mib": round(raws[0]["bytes"] / raws[0]["objects"] / MIB, 1),
                "raw_get_mb_per_s_median": round(raw_mb, 1),
                "engine_mb_per_s_median": round(eng_mb, 1),
                "ratio_engine_to_raw": round(eng_mb / raw_mb, 3),
                "raw_per_block_get_mb_per_s_median": round(block_mb, 1),
                "ratio_engine_to_raw_per_block": round(eng_mb / block_mb, 3),
                "fetched_per_delivered_median": round(
                    statistics.median(e["fetched_per_delivered"] for e in engines), 3
                ),
                "held_bytes_per_window_median_kib": round(
                    statistics.median(e["held_bytes_per_window_median"] for e in engines) / 1024, 1
                ),
                "held_bytes_per_window_p99_kib": round(
                    statistics.median(e["held_bytes_per_window_p99"] for e in engines) / 1024, 1
                ),
                "held_bytes_per_watcher_median_kib": round(
                    statistics.median(e["held_bytes_per_watcher_median"] for e in engines) / 1024, 1
                ),
                "held_bytes_per_watcher_p99_kib": round(
                    statistics.median(e["held_bytes_per_watcher_p99"] for e in engines) / 1024, 1
                ),
                "s3_get_bytes_per_delivered_median": round(
                    statistics.median(e["s3_get_bytes_per_delivered"] for e in engines), 3
                ),
                "engine_s3_get_requests_median": statistics.median(
                    e["s3_get_requests"] for e in engines
                ),
                "raw_get_requests": raws[0]["requests"],
                # each engine run against the raw run just before it
                "ratio_per_run": [
                    round(e["mb_per_s"] / r["mb_per_s"], 3) for e, r in zip(engines, raws)
                ],
                "runs": {"raw": raws, "raw_per_block": blocks, "engine": engines},
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
