"""Two versions of the broker's catch-up read on the same data: the broker restarted from each tree in turn.

    python benchmarks/catchup_tree_ab_bench.py --tree old=/path/to/old --tree new=/path/to/new
                                               [--rounds 4] [--mib 384] [--prefetching]

Each catch-up of `broker_cpu_bench.py` runs on a cluster of its own, so the data and the
cluster's state differ between the trees' runs. Here one `automqctl cluster up --brokers 1`
(from this file's tree) gets `mib` MiB of 1 KiB records in 6 partitions once; then, `rounds`
times and for each tree in turn, the broker is restarted from that tree (`automqctl broker
stop/start` with `PYTHONPATH` on the tree, so nothing is cached) and one confluent-kafka
consumer reads everything from offset 0: the broker's CPU seconds per GB (user + system
from /proc) and the catch-up MB/s. The trees must speak the same controller protocol as
this file's tree. Medians per tree and every run as JSON.
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

from benchmarks.broker_cpu_bench import broker_pid, cpu_s  # noqa: E402
from benchmarks.broker_limits_bench import filled_topic  # noqa: E402
from benchmarks.compaction_bench import automqctl, cluster_down  # noqa: E402
from benchmarks.compaction_catchup_bench import (  # noqa: E402
    restart_broker,
    sparse_catchup_mb_s,
)

PARTITIONS = 6


def code_path_of(pid: int) -> str:
    """The PYTHONPATH the broker process runs with (which tree it imports)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        if item.startswith(b"PYTHONPATH="):
            return item.split(b"=", 1)[1].decode()
    return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH, two or more")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--mib", type=int, default=384)
    ap.add_argument(
        "--prefetching", action="store_true", help="the consumer with PREFETCHING_CONSUMER"
    )
    args = ap.parse_args()
    trees = {}
    for spec in args.tree:
        name, _, path = spec.partition("=")
        if not name or not path or not (Path(path) / "dataplane").is_dir():
            raise SystemExit(f"--tree {spec!r}: need NAME=PATH of a source tree")
        trees[name] = Path(path).resolve()
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="catchup-ab-") as tmp:
        cdir = Path(tmp) / "cluster"
        status = automqctl(cdir, "cluster", "up", "--brokers", "1", timeout_s=300)
        bootstrap = status["bootstrap_servers"]
        try:
            topic, partitions, wanted = filled_topic(bootstrap, PARTITIONS, args.mib)
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    restart_broker(cdir, tree)
                    pid = broker_pid(cdir)
                    if code_path_of(pid) != str(tree):
                        raise SystemExit(f"the broker does not run {tree}")
                    time.sleep(2)  # start-up work is not catch-up work
                    load = os.getloadavg()[0]
                    before = cpu_s(pid)
                    mb_s = sparse_catchup_mb_s(
                        bootstrap, topic, partitions, wanted, args.prefetching
                    )
                    cpu = cpu_s(pid) - before
                    runs[name].append(
                        {
                            "catchup_cpu_s_per_gb": cpu / (wanted * 1024 / 1e9),
                            "catchup_mb_s": mb_s,
                            "load_average_1m": load,
                        }
                    )
        finally:
            cluster_down(cdir)
    medians = {
        name: {
            k: round(statistics.median(r[k] for r in rs), 2)
            for k in ("catchup_cpu_s_per_gb", "catchup_mb_s")
        }
        for name, rs in runs.items()
    }
    print(json.dumps({"medians": medians, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
