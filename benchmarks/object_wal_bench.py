"""Object WAL benchmark: append latency of the s3:// WAL against a raw PUT of the same size.

    python benchmarks/object_wal_bench.py [--sizes 1024,65536] [--appends 200] [--threads 16]

Against a real SeaweedFS (embedded, on 127.0.0.1), in one run, for each record size:

* `raw_put`: one PUT (through ObjectStorage) of an object the size of a one-record WAL
  object, sequentially: the floor of any object-store WAL;
* `wal_serial_linger0`: one appender waiting for each ack, `linger_s=0` (PUT + owner GET);
* `wal_serial`: the same with the default `linger_s` (2 ms);
  (these three interleaved round-robin, so that they share the machine's load equally)
* `wal_concurrent`: `threads` appenders at once (group commit: PUTs per append < 1).

Reported: p50/p99 ms of each, their ratio to raw_put's p50, PUTs per append. JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.config import ObjectWALConfig  # noqa: E402
from dataplane.objectstore import ObjectStorage  # noqa: E402
from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402
from dataplane.s3stream.wal.object_chain import ObjectWALLocation  # noqa: E402
from dataplane.s3stream.wal.object_format import OBJECT_HEADER_BYTES  # noqa: E402
from dataplane.s3stream.wal.object_wal import ObjectWAL  # noqa: E402
from tests.integration.engine_harness import bucket_uris  # noqa: E402


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def summary(samples: list[float], base_p50_ms: float | None) -> dict:
    out = {"p50_ms": round(pct(samples, 0.5), 2), "p99_ms": round(pct(samples, 0.99), 2)}
    if base_p50_ms:
        out["p50_vs_raw_put"] = round(out["p50_ms"] / base_p50_ms, 2)
    return out


def serial(objects: ObjectStorage, size: int, count: int) -> dict[str, list[float]]:
    """Raw PUTs and appends of one waiting appender (linger 0, default linger), interleaved
    round-robin so that all three see the same load on a shared machine."""
    data = b"x" * (size + OBJECT_HEADER_BYTES + 8)  # a one-record WAL object's size
    raw_prefix = f"bench-raw/{uuid.uuid4().hex}"
    wals = {
        "wal_serial_linger0": ObjectWALConfig(linger_s=0.0),
        "wal_serial": ObjectWALConfig(),
    }
    opened = {
        name: ObjectWAL.open(
            objects,
            ObjectWALLocation(0, f"bench-wal/{uuid.uuid4().hex}"),
            1,
            0,
            capacity_bytes=1 << 30,
            config=config,
        )
        for name, config in wals.items()
    }
    record = b"r" * size
    samples: dict[str, list[float]] = {"raw_put": [], **{name: [] for name in wals}}
    try:
        for i in range(count):
            t0 = time.perf_counter()
            objects.put_object(0, f"{raw_prefix}/{i:08d}", data)
            samples["raw_put"].append(time.perf_counter() - t0)
            for name, wal in opened.items():
                t0 = time.perf_counter()
                wal.append(record).result(60)
                samples[name].append(time.perf_counter() - t0)
    finally:
        for wal in opened.values():
            wal.close()
    return samples


def wal_concurrent(
    objects: ObjectStorage, size: int, count: int, threads: int
) -> tuple[list[float], float]:
    where = ObjectWALLocation(0, f"bench-wal/{uuid.uuid4().hex}")
    wal = ObjectWAL.open(objects, where, 1, 0, capacity_bytes=1 << 30)
    record = b"r" * size
    samples: list[float] = []
    lock = threading.Lock()

    def run() -> None:
        mine = []
        for _ in range(count // threads):
            t0 = time.perf_counter()
            wal.append(record).result(60)
            mine.append(time.perf_counter() - t0)
        with lock:
            samples.extend(mine)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        puts_per_append = wal.put_count / len(samples)
    finally:
        wal.close()
    return samples, puts_per_append


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1024,65536")
    parser.add_argument("--appends", type=int, default=200)
    parser.add_argument("--threads", type=int, default=16)
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedSeaweed(Path(tmp)) as store:
        with ObjectStorage(bucket_uris(store), merge_window_ms=0) as objects:
            serial(objects, 1024, 20)  # warm up the connection pool
            for size in [int(s) for s in args.sizes.split(",")]:
                runs = serial(objects, size, args.appends)
                base = pct(runs["raw_put"], 0.5)
                conc, puts = wal_concurrent(objects, size, args.appends * 2, args.threads)
                results.append(
                    {
                        "record_bytes": size,
                        "raw_put": summary(runs["raw_put"], None),
                        "wal_serial_linger0": summary(runs["wal_serial_linger0"], base),
                        "wal_serial": summary(runs["wal_serial"], base),
                        "wal_concurrent": {
                            **summary(conc, base),
                            "threads": args.threads,
                            "puts_per_append": round(puts, 3),
                        },
                    }
                )
    print(json.dumps({"appends": args.appends, "results": results}, indent=2))


if __name__ == "__main__":
    main()
