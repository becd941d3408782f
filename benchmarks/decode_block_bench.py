"""CPU seconds per GB of `decode_block` (the catch-up read path's block decode).

    python benchmarks/decode_block_bench.py [--payload-kib 1,16,64] [--object-mib 64] [--runs 5]

Builds one object of `object-mib` MiB with `ObjectWriter` (512 KiB blocks) from batches of
`payload-kib` KiB (a batch is one Kafka record batch), then decodes every block, as the
block cache does on a miss; process CPU time, median of `runs`. Run the script from two
trees (PYTHONPATH) to compare them.
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

from dataplane.formats.object_format import ObjectWriter, decode_block  # noqa: E402
from dataplane.formats.stream_records import StreamRecordBatch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--payload-kib", default="1,16,64")
    ap.add_argument("--object-mib", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    result = {}
    for kib in (int(k) for k in args.payload_kib.split(",")):
        writer = ObjectWriter(512 * 1024, 1024 * 1024 * 1024)
        payload = os.urandom(kib * 1024)
        for i in range(args.object_mib * 1024 // kib):
            writer.add(StreamRecordBatch(1, 0, i * 10, 10, payload))
        obj = writer.finish()
        data = memoryview(obj.data)
        blocks = [(e, data[e.position : e.position + e.size]) for e in obj.index]
        runs = []
        for _ in range(args.runs):
            t0 = time.process_time()
            for entry, block in blocks:
                decode_block(block, entry)
            runs.append((time.process_time() - t0) / (len(data) / 1e9))
        result[f"{kib} KiB"] = round(statistics.median(runs), 3)
    print(json.dumps({"tree": str(ROOT), "cpu_s_per_gb": result}))


if __name__ == "__main__":
    main()
