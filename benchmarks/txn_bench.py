"""Transaction cost with confluent-kafka against `automqctl cluster up` (3 brokers).

Per round: 10 records over 3 partitions, either in one transaction (begin, produce,
commit_transaction) or with an idempotent producer (produce, flush) as the baseline, measured
in the same cluster, alternating. Prints medians and p99 of the round latency as JSON.

Run: python benchmarks/txn_bench.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from benchmarks._harness import emit, running_cluster  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    with running_cluster(brokers=3) as (_cluster_dir, status):
        bootstrap = status["bootstrap_servers"]
        topic = f"bench-{uuid.uuid4().hex[:6]}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
        time.sleep(2)
        txp = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"b-{topic}", "linger.ms": 0}
        )
        txp.init_transactions(30)
        idp = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
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
    emit(
        {
            "transaction_commit_p50_ms": statistics.median(txn_ms),
            "transaction_commit_p99_ms": pct(txn_ms, 0.99),
            "idempotent_flush_p50_ms": statistics.median(idem_ms),
            "idempotent_flush_p99_ms": pct(idem_ms, 0.99),
            "ratio_of_medians": statistics.median(txn_ms) / statistics.median(idem_ms),
        }
    )


if __name__ == "__main__":
    main()
