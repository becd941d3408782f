"""Metadata quorum benchmark: commit latency and throughput with 3 voters, leader failover.

    python benchmarks/quorum_bench.py [--commits 2000] [--threads 8] [--seconds 10] [--failovers 3]

Each commit is a real request through the controller HTTP API (client -> leader -> Raft
replication to a majority -> apply -> response). Prints a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration.quorum_harness import QuorumHarness  # noqa: E402


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bench_latency(q: QuorumHarness, commits: int) -> dict:
    lat = []
    for i in range(commits):
        t = time.perf_counter()
        q.client.call("put_kv", {"key": f"lat-{i}", "value": "x" * 64})
        lat.append((time.perf_counter() - t) * 1000)
    return {
        "commits": commits,
        "p50_ms": round(percentile(lat, 50), 2),
        "p99_ms": round(percentile(lat, 99), 2),
        "max_ms": round(max(lat), 2),
    }


def bench_throughput(q: QuorumHarness, threads: int, seconds: float) -> dict:
    counts = [0] * threads
    deadline = time.monotonic() + seconds

    def worker(w: int) -> None:
        from controlplane.client import ControllerClient

        client = ControllerClient(q.client.addresses)
        i = 0
        while time.monotonic() < deadline and i < 1_000_000:
            client.call("put_kv", {"key": f"tp-{w}-{i}", "value": "x" * 64})
            i += 1
        counts[w] = i

    ts = [threading.Thread(target=worker, args=(w,)) for w in range(threads)]
    start = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    elapsed = time.monotonic() - start
    return {
        "threads": threads,
        "seconds": round(elapsed, 2),
        "commits": sum(counts),
        "commits_per_s": round(sum(counts) / elapsed, 1),
    }


def bench_failover(q: QuorumHarness, rounds: int) -> dict:
    elected, writable = [], []
    for _ in range(rounds):
        old = q.leader()
        t0 = time.monotonic()
        q.kill(old)
        q.leader(timeout_s=30, exclude=old)
        elected.append(time.monotonic() - t0)
        q.client.call("put_kv", {"key": "after-failover", "value": str(t0)}, timeout_s=30)
        writable.append(time.monotonic() - t0)
        q.start(old)
        time.sleep(2)  # let it rejoin before the next round
    return {
        "rounds": rounds,
        "new_leader_s_median": round(statistics.median(elected), 2),
        "writable_again_s_median": round(statistics.median(writable), 2),
        "writable_again_s_max": round(max(writable), 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--failovers", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, QuorumHarness(Path(tmp) / "q") as q:
        q.leader()
        result = {
            "voters": 3,
            "latency": bench_latency(q, args.commits),
            "throughput": bench_throughput(q, args.threads, args.seconds),
            "failover": bench_failover(q, args.failovers),
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
