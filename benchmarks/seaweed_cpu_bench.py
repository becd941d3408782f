"""What the embedded object store itself costs: SeaweedFS CPU seconds per GB put and got.

    python benchmarks/seaweed_cpu_bench.py [--object-mib 64] [--objects 16] [--reps 2]
                                           [--weed-arg=-cpuprofile=/tmp/weed.prof ...]

An embedded SeaweedFS (`weed mini`, as `automqctl cluster up` starts it, data on this disk)
takes `objects` objects of `object-mib` MiB, PUT as the broker's uploader does (streamed,
UNSIGNED-PAYLOAD, 2 at a time), then serves ranged GETs of every object with 8 threads (as
`broker_limits_bench.py`'s raw-GET baseline does) for several range sizes. The figure is the
`weed` process's CPU time (user + system, from /proc) per GB moved, which bounds what a
broker sharing the machine's cores with it can do: at saturation every produced byte is
PUT once. `--weed-arg` passes an extra flag to `weed mini` (e.g. `-cpuprofile=FILE`, which
it writes on exit; `-filer.maxMB=16`). JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
from botocore.config import Config as BotoConfig  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from benchmarks.upload_put_bench import BLOCK_BYTES, uris  # noqa: E402
from dataplane.objectstore import (  # noqa: E402
    ObjectBody,
    ObjectStorage,
    ObjectStoreMetrics,
    seaweed,  # noqa: E402
)

MIB = 1024 * 1024
TICK = os.sysconf("SC_CLK_TCK")
GET_SIZES_MIB = (1, 4, 8)


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--object-mib", type=int, default=64)
    ap.add_argument("--objects", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--weed-arg", action="append", default=[], help="an extra weed mini flag")
    args = ap.parse_args()
    if args.weed_arg:
        command = seaweed.SeaweedConfig.command
        seaweed.SeaweedConfig.command = lambda self: command(self) + args.weed_arg  # type: ignore[method-assign]
    parts = [
        bytearray(os.urandom(BLOCK_BYTES)) for _ in range(args.object_mib * MIB // BLOCK_BYTES)
    ]
    with (
        tempfile.TemporaryDirectory(prefix="seaweed-cpu-") as tmp,
        seaweed.EmbeddedSeaweed(Path(tmp)) as store,
    ):
        assert store.proc is not None
        pid, cfg = store.proc.pid, store.config
        objects = ObjectStorage(
            uris(store),
            metrics=ObjectStoreMetrics(CollectorRegistry()),
            sign_payloads=False,
            merge_window_ms=0,
        )
        s3 = boto3.client(
            "s3",
            endpoint_url=cfg.endpoint,
            aws_access_key_id=cfg.access_key,
            aws_secret_access_key=cfg.secret_key,
            region_name="us-east-1",
            config=BotoConfig(s3={"addressing_style": "path"}, max_pool_connections=16),
        )
        try:
            objects.put_object(0, "warm", b"x")
            time.sleep(1)

            def measure(phase: str, work) -> None:
                cpu0, t0 = process_cpu_s(pid), time.monotonic()
                moved = work()
                wall = time.monotonic() - t0
                print(
                    json.dumps(
                        {
                            "phase": phase,
                            "mb_s": round(moved / wall / 1e6, 1),
                            "weed_cpu_s_per_gb": round(
                                (process_cpu_s(pid) - cpu0) / (moved / 1e9), 2
                            ),
                            "weed_cores_busy": round((process_cpu_s(pid) - cpu0) / wall, 2),
                        }
                    ),
                    flush=True,
                )

            size = len(parts) * BLOCK_BYTES
            for rep in range(args.reps):
                keys = [f"rep{rep}-obj{i}" for i in range(args.objects)]

                def put_all(keys: list[str] = keys) -> int:
                    with ThreadPoolExecutor(2) as pool:
                        list(
                            pool.map(
                                lambda name: objects.put_object(0, name, ObjectBody(parts)), keys
                            )
                        )
                    return size * len(keys)

                measure(f"put_{args.object_mib}mib", put_all)
                full_keys = {
                    o["Key"]
                    for o in s3.list_objects_v2(Bucket=cfg.buckets[0], Prefix="")["Contents"]
                    if o["Key"].endswith(tuple(keys))
                }
                for get_mib in GET_SIZES_MIB:
                    span = get_mib * MIB
                    ranges = [(k, at) for k in full_keys for at in range(0, size, span)]

                    def get_all(ranges: list = ranges, span: int = span) -> int:
                        def get(item: tuple[str, int]) -> int:
                            key, at = item
                            rng = f"bytes={at}-{min(at + span, size) - 1}"
                            return len(
                                s3.get_object(Bucket=cfg.buckets[0], Key=key, Range=rng)[
                                    "Body"
                                ].read()
                            )

                        with ThreadPoolExecutor(8) as pool:
                            return sum(pool.map(get, ranges))

                    measure(f"get_{get_mib}mib", get_all)
        finally:
            objects.close()


if __name__ == "__main__":
    main()
