"""Partition unavailability during controlled shutdown and crash failover, with real clients.

    python benchmarks/elastic_bench.py [--rounds 3] [--partitions 12] [--rate 50]
                                       [--session-timeout-ms 6000] [--base-port N]

Starts its own cluster (`automqctl cluster up`, 3 brokers) in a temporary directory. An
idempotent confluent-kafka producer writes to every partition at `rate` msgs/s and records
every acknowledgement. Each round:

- graceful: `automqctl broker stop N` (controlled shutdown), then `broker start N`;
- crash: `automqctl broker kill N` (kill -9) and the broker stays down until its partitions
  took writes again elsewhere (WAL failover by another broker), then `broker start N`.

For each partition the stopped broker led, unavailability = the longest gap between two
consecutive acks around the event, minus the send interval. Reported per event kind:
mean, median and max over partitions and rounds; for crashes also the time from the kill
to the first ack of each partition. At the end the whole topic is read back: every acked
message exactly once. JSON on stdout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._harness import emit, running_cluster  # noqa: E402
from tests.support.ledger import AckLedger, automqctl, create_topic, leaders  # noqa: E402


def _summary(values: list[float]) -> dict:
    if not values:
        return {}
    return {
        "mean_s": round(statistics.mean(values), 3),
        "median_s": round(statistics.median(values), 3),
        "max_s": round(max(values), 3),
        "samples": len(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rate", type=float, default=50.0, help="msgs/s per partition")
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument(
        "--base-port",
        type=int,
        default=None,
        help="first of the cluster's ports (default: free ports)",
    )
    args = parser.parse_args()
    ports = ("--base-port", str(args.base_port)) if args.base_port else ()
    results: dict[str, list[float]] = {"graceful": [], "crash": [], "crash_writable_again": []}
    up_args = (*ports, "--session-timeout-ms", str(args.session_timeout_ms))
    with running_cluster(brokers=3, up_args=up_args) as (d, status):
        bootstrap = status["bootstrap_servers"]
        topic = f"bench-{int(time.time())}"
        create_topic(bootstrap, topic, args.partitions)
        ledger = AckLedger(bootstrap, topic, args.partitions, args.rate).start()
        time.sleep(3)
        for round_ in range(args.rounds):
            for kind in ("graceful", "crash"):
                led = leaders(bootstrap, topic)
                node = max((1, 2, 3), key=lambda n: sum(1 for v in led.values() if v == n))
                moved = {p for p, leader in led.items() if leader == node}
                before = time.monotonic()
                verb = "stop" if kind == "graceful" else "kill"
                out = automqctl("broker", verb, str(node), cluster_dir=d)
                event = time.monotonic() if kind == "crash" else before
                assert out.returncode == 0, out.stderr
                ledger.wait_writable(moved, time.monotonic(), 60, raise_on_timeout=False)
                time.sleep(1)
                gaps = ledger.unavailability_s(moved, before - 2)
                results[kind] += list(gaps.values())
                if kind == "crash":
                    results["crash_writable_again"] += list(
                        ledger.writable_again_s(moved, event).values()
                    )
                print(
                    f"round {round_} {kind} broker {node}: {len(moved)} partitions, "
                    f"unavailability {sorted(round(g, 2) for g in gaps.values())}",
                    file=sys.stderr,
                )
                assert automqctl("broker", "start", str(node), cluster_dir=d).returncode == 0
                time.sleep(3)
        ledger.stop()
        report = ledger.verify()
    emit(
        {
            "rounds": args.rounds,
            "partitions": args.partitions,
            "rate_per_partition": args.rate,
            "session_timeout_ms": args.session_timeout_ms,
            "graceful_unavailability": _summary(results["graceful"]),
            "crash_unavailability": _summary(results["crash"]),
            "crash_kill_to_first_ack": _summary(results["crash_writable_again"]),
            "acked": report.acked,
            "missing": len(report.missing),
            "duplicated": len(report.duplicated),
            "failed_sends": report.failed_sends,
        }
    )
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
