"""Whose CPU a catch-up costs: SeaweedFS, the broker, the consumer, against raw GETs.

    python benchmarks/catchup_cpu_split_bench.py [--mib 256] [--repeats 2]

On a fresh `automqctl cluster up --brokers 1`: `mib` MiB of 1 KiB records into 6 partitions,
the broker restarted; then, `repeats` times, raw boto3 4 MiB ranged GETs of every object (as
`broker_limits_bench.py`'s baseline) and a catch-up of one confluent-kafka consumer from
offset 0 (as its catch-up). For each phase, the CPU seconds per GB of the cluster's processes
by kind (from /proc: SeaweedFS, the broker, the controllers) and of this process (the GET
client or the consumer), and the same over 2 s of idle (the background rate that a longer
phase also pays). A catch-up's MB/s against the raw GETs' is bounded by the ratio of their
CPU per GB when the cores are the limit. JSON lines on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.broker_limits_bench import cluster_cpu_s, filled_topic, own_cpu_s  # noqa: E402
from benchmarks.compaction_bench import automqctl, cluster_down, committed_objects  # noqa: E402
from benchmarks.compaction_catchup_bench import (  # noqa: E402
    raw_get_mb_s,
    restart_broker,
    sparse_catchup_mb_s,
)

PARTITIONS = 6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    gb = args.mib * 1.048576 / 1000
    with tempfile.TemporaryDirectory(prefix="catchup-cpu-split-") as tmp:
        cdir = Path(tmp) / "cluster"
        bootstrap = automqctl(cdir, "cluster", "up", "--brokers", "1", timeout_s=300)[
            "bootstrap_servers"
        ]
        try:
            topic, partitions, wanted = filled_topic(bootstrap, PARTITIONS, args.mib)
            objects = committed_objects(cdir)
            restart_broker(cdir)
            for phase in ["idle"] + ["raw_get", "catchup"] * args.repeats:
                before, own, started = cluster_cpu_s(cdir), own_cpu_s(), time.monotonic()
                if phase == "idle":
                    time.sleep(2)
                    mb_s = 0.0
                elif phase == "raw_get":
                    mb_s = raw_get_mb_s(cdir, objects)
                else:
                    mb_s = sparse_catchup_mb_s(bootstrap, topic, partitions, wanted)
                after = cluster_cpu_s(cdir)
                cpu = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
                cpu["this_process"] = own_cpu_s() - own
                wall = time.monotonic() - started
                unit = wall if phase == "idle" else gb
                print(
                    json.dumps(
                        {
                            "phase": phase,
                            "mb_s": round(mb_s, 1),
                            "wall_s": round(wall, 2),
                            # idle: CPU seconds per second; otherwise per GB moved
                            "cpu": {k: round(v / unit, 2) for k, v in sorted(cpu.items())},
                            "cpu_total": round(sum(cpu.values()) / unit, 2),
                            "load_average": round(os.getloadavg()[0], 1),
                        }
                    ),
                    flush=True,
                )
        finally:
            cluster_down(cdir)


if __name__ == "__main__":
    main()
