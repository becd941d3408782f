"""CPU seconds per GB of building an upload's object with `ObjectWriter` (add + finish).

    python benchmarks/object_writer_bench.py [--payload-kib 1,16,64] [--object-mib 64] [--runs 5]

Batches of `payload-kib` KiB (a batch is one Kafka record batch) of 6 streams, stream by
stream as the uploader adds them, into one object of `object-mib` MiB with 512 KiB blocks;
process CPU time of `add_all` + `finish`, median of `runs`. Run the script from two trees
(PYTHONPATH) to compare them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataplane.formats.object_format import ObjectWriter  # noqa: E402
from dataplane.formats.stream_records import StreamRecordBatch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload-kib", default="1,16,64")
    ap.add_argument("--object-mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    result = {}
    for kib in (int(k) for k in args.payload_kib.split(",")):
        payload = os.urandom(kib * 1024)
        count = args.object_mib * 1024 // kib
        batches = [StreamRecordBatch(1 + i % 6, 0, i // 6 * 10, 10, payload) for i in range(count)]
        batches.sort(key=lambda b: b.stream_id)
        runs = []
        for _ in range(args.runs):
            t0 = time.process_time()
            writer = ObjectWriter(512 * 1024, 1024 * 1024 * 1024)
            writer.add_all(batches)
            obj = writer.finish()
            runs.append((time.process_time() - t0) / (obj.size_bytes / 1e9))
        result[f"{kib} KiB"] = round(statistics.median(runs), 3)
    print(json.dumps({"tree": str(ROOT), "cpu_s_per_gb": result}))


if __name__ == "__main__":
    main()
