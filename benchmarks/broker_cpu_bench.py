"""Broker CPU seconds per GB produced and per GB read back from the object store.

    python benchmarks/broker_cpu_bench.py [--produce-mib 600] [--catchup-mib 384] [--rounds 1]

Throughput on a shared, noisy machine swings with the neighbours; the CPU time the broker
process itself spends on a fixed amount of work does much less, so two versions of the code
can be compared on it even while other jobs run (the process's user + system time from
/proc, which excludes time spent waiting for a core). Per round, on a fresh
`automqctl cluster up --brokers 1`:
1. produce: `produce-mib` MiB of 1 KiB records with `automqctl perf` at a fixed rate
   (acks=all, idempotent, 6 partitions), no consumer: broker CPU seconds per GB;
2. catch-up: the broker restarted (nothing cached), one confluent-kafka consumer reads the
   `catchup-mib` MiB of a second topic from offset 0: broker CPU seconds per GB.
Also the wall-clock MB/s of both (noisy) for context. Medians over rounds as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.broker_limits_bench import fill, perf  # noqa: E402
from benchmarks.compaction_bench import automqctl, cluster_down  # noqa: E402
from benchmarks.compaction_catchup_bench import (  # noqa: E402
    records_in,
    restart_broker,
    sparse_catchup_mb_s,
)
from tests.e2e.ledger import create_topic  # noqa: E402

PARTITIONS = 6
PRODUCE_RATE = 30_000  # records/s: a load every version sustains, so the work is the same


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def broker_pid(cluster_dir: Path) -> int:
    return int(automqctl(cluster_dir, "cluster", "status")["brokers"][0]["pid"])


def one_round(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="broker-cpu-") as tmp:
        cdir = Path(tmp) / "cluster"
        status = automqctl(cdir, "cluster", "up", "--brokers", "1", timeout_s=300)
        bootstrap = status["bootstrap_servers"]
        try:
            pid = broker_pid(cdir)
            before = cpu_s(pid)
            result = perf(
                cdir,
                "--partitions",
                str(PARTITIONS),
                "--groups",
                "0",
                "--record-size",
                "1024",
                "--send-rate",
                str(PRODUCE_RATE),
                "--duration",
                f"{args.produce_mib * 1024 / PRODUCE_RATE:.1f}",
            )
            produce_cpu = cpu_s(pid) - before
            produced_gb = result["produced_mb"] / 1000
            topic = f"catchup-{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, topic, PARTITIONS)
            fill(bootstrap, topic, args.catchup_mib)
            time.sleep(3)  # the last uploads
            partitions = list(range(PARTITIONS))
            wanted = records_in(bootstrap, topic, partitions)
            restart_broker(cdir)
            pid = broker_pid(cdir)
            time.sleep(2)  # start-up work is not catch-up work
            before = cpu_s(pid)
            catchup_mb_s = sparse_catchup_mb_s(bootstrap, topic, partitions, wanted)
            catchup_cpu = cpu_s(pid) - before
            catchup_gb = wanted * 1024 / 1e9
        finally:
            cluster_down(cdir)
    return {
        "produce_cpu_s_per_gb": produce_cpu / produced_gb,
        "produce_mb_s": result["produce_mb_s"],
        "catchup_cpu_s_per_gb": catchup_cpu / catchup_gb,
        "catchup_mb_s": catchup_mb_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--produce-mib", type=int, default=600)
    ap.add_argument("--catchup-mib", type=int, default=384)
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    rounds = [one_round(args) for _ in range(args.rounds)]
    medians = {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]}
    print(json.dumps({"medians": medians, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
