"""CPU seconds of the broker-side PUT of one upload-sized object: joined and payload-signed
(before issue #16's change) against streamed from its buffers as UNSIGNED-PAYLOAD (now).

    python benchmarks/upload_put_bench.py [--object-mib 64] [--runs 5]

An embedded SeaweedFS on 127.0.0.1 (its data on this disk, as `cluster up` has it) takes
`object-mib` MiB objects built like the uploader's: 512 KiB block buffers plus a small index
and footer. Variants, interleaved run by run, each on its own `ObjectStorage`:

* `joined_signed`:    `b"".join(parts)`, SHA-256 of the payload (SigV4 signed payload);
* `joined_unsigned`:  `b"".join(parts)`, UNSIGNED-PAYLOAD;
* `streamed_unsigned`: `ObjectBody(parts)`, UNSIGNED-PAYLOAD (the uploader now).

The figure is this process's CPU time (user + system) per put, which the store's own work
does not enter (it runs in another process); medians as JSON, with the wall time per put.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from dataplane.objectstore import ObjectBody, ObjectStorage, ObjectStoreMetrics  # noqa: E402
from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402

BLOCK_BYTES = 512 * 1024


def uris(seaweed: EmbeddedSeaweed) -> str:
    cfg = seaweed.config
    return (
        f"0@s3://{cfg.buckets[0]}?region=us-east-1&endpoint={cfg.endpoint}"
        f"&accessKey={cfg.access_key}&secretKey={cfg.secret_key}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--object-mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    parts = [bytearray(os.urandom(BLOCK_BYTES)) for _ in range(args.object_mib * 2)]
    parts += [os.urandom(4096), os.urandom(48)]  # index, footer
    variants = {
        "joined_signed": (True, lambda: b"".join(parts)),
        "joined_unsigned": (False, lambda: b"".join(parts)),
        "streamed_unsigned": (False, lambda: ObjectBody(parts)),
    }
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    wall: dict[str, list[float]] = {v: [] for v in variants}
    with (
        tempfile.TemporaryDirectory(prefix="upload-put-") as tmp,
        EmbeddedSeaweed(Path(tmp)) as seaweed,
    ):
        stores = {
            name: ObjectStorage(
                uris(seaweed),
                metrics=ObjectStoreMetrics(CollectorRegistry()),
                sign_payloads=signed,
                merge_window_ms=0,
            )
            for name, (signed, _) in variants.items()
        }
        try:
            for name, store in stores.items():  # warm up clients and connections
                store.put_object(0, f"warm-{name}", b"x")
            for run in range(args.runs):
                for name, (_, body_of) in variants.items():
                    c0, t0 = time.process_time(), time.monotonic()
                    stores[name].put_object(0, f"obj-{name}-{run}", body_of())
                    cpu[name].append(time.process_time() - c0)
                    wall[name].append(time.monotonic() - t0)
        finally:
            for store in stores.values():
                store.close()
    base = statistics.median(cpu["joined_signed"])
    print(
        json.dumps(
            {
                "object_mib": args.object_mib,
                "runs": args.runs,
                "cpu_s_per_put": {v: round(statistics.median(cpu[v]), 4) for v in variants},
                "cpu_vs_joined_signed": {
                    v: round(statistics.median(cpu[v]) / base, 3) for v in variants
                },
                "wall_s_per_put": {v: round(statistics.median(wall[v]), 4) for v in variants},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
