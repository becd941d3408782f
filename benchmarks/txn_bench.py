"""Transaction cost with confluent-kafka against `automqctl cluster up` (3 brokers).

Per round: 10 records over 3 partitions, either in one transaction (begin, produce,
commit_transaction) or with an idempotent producer (produce, flush) as the baseline, measured
in the same cluster, alternating. Prints medians and p99 of the round latency.

Run: python benchmarks/txn_bench.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic


def automqctl(cluster_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir)}
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=180,
    )


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="txn-bench-") as tmp:
        cluster_dir = Path(tmp) / "cluster"
        up = automqctl(cluster_dir, "cluster", "up", "--format", "json")
        if up.returncode != 0:
            sys.exit(up.stderr)
        try:
            bootstrap = json.loads(up.stdout)["bootstrap_servers"]
            topic = f"bench-{uuid.uuid4().hex[:6]}"
            admin = AdminClient({"bootstrap.servers": bootstrap})
            admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
            time.sleep(2)
            txp = Producer(
                {"bootstrap.servers": bootstrap, "transactional.id": f"b-{topic}", "linger.ms": 0}
            )
            txp.init_transactions(30)
            idp = Producer(
                {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0}
            )
            txn_ms, idem_ms = [], []
            for r in range(args.rounds + 10):  # 10 warm-up rounds
                t0 = time.perf_counter()
                txp.begin_transaction()
                for i in range(10):
                    txp.produce(topic, value=b"x" * 100, partition=i % 3)
                txp.commit_transaction(30)
                t1 = time.perf_counter()
                for i in range(10):
                    idp.produce(topic, value=b"x" * 100, partition=i % 3)
                idp.flush(30)
                t2 = time.perf_counter()
                if r >= 10:
                    txn_ms.append((t1 - t0) * 1000)
                    idem_ms.append((t2 - t1) * 1000)
            for name, vals in (("transaction (commit)", txn_ms), ("idempotent (flush)", idem_ms)):
                print(f"{name}: p50 {statistics.median(vals):.1f} ms, p99 {pct(vals, 0.99):.1f} ms")
            print(f"ratio of medians: {statistics.median(txn_ms) / statistics.median(idem_ms):.2f}")
        finally:
            automqctl(cluster_dir, "cluster", "down")


if __name__ == "__main__":
    main()
