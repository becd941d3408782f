"""Object-storage failover with real clients: detection time, ack gaps, upload backlog.

    python benchmarks/bucket_failover_bench.py [--rounds 2] [--partitions 4] [--rate 50]

Starts its own cluster (`automqctl cluster up --brokers 2 --upload-interval-s 1`, two
embedded stores) in a temporary directory. An idempotent confluent-kafka producer
(acks=all) writes to every partition at `rate` msgs/s and records every ack. Each round:

- baseline: the longest ack gap per partition over 10 s of steady load (same run);
- fault: SIGSTOP of the main store's process; detection = time until the leader is in
  failover mode; first object in bucket 1 = time until the metadata holds one; the longest
  ack gap from the SIGSTOP to 5 s after the switch; the upload backlog at the switch (the
  brokers' summed un-uploaded WAL bytes and their largest upload lag);
- heal: SIGCONT, then `automqctl failover --bucket 0` under load; the longest ack gap
  around that manual switch (from the command to 5 s after it).

Medians over rounds; at the end the whole topic is read back (every ack exactly once).
JSON on stdout.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._harness import emit, running_cluster  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from tests.support.ledger import AckLedger, automqctl, create_topic  # noqa: E402


def leader_status(d: Path) -> dict:
    config = LocalCluster(d).load()
    addresses = config.quorum_config().api_addresses()
    client = ControllerClient(
        addresses, timeout_s=5, request_timeout_s=5, api_secret=config.api_secret
    )
    for address in addresses:
        try:
            status = client.status(address)
        except Exception:
            continue
        if status.get("raft", {}).get("state") == "leader":
            return status
    return {}


def objects_in(status: dict, bucket_id: int) -> int:
    for b in status.get("bucket_failover", {}).get("buckets", []):
        if b["bucket_id"] == bucket_id:
            return b["objects"]
    return 0


def wait(d: Path, predicate, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = leader_status(d)
        if status and predicate(status):
            return status
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout_s}s")


def backlog_until_failover(d: Path, timeout_s: float) -> tuple[int, float]:
    """Wait for failover mode; the brokers' summed WAL bytes not uploaded yet and their
    largest upload lag as last seen before the switch (the backlog the switch inherits)."""
    deadline = time.monotonic() + timeout_s
    backlog, lag = 0, 0.0
    while time.monotonic() < deadline:
        status = leader_status(d)
        if status and status["bucket_failover"]["mode"] == "failover":
            return backlog, lag
        if status:
            backlog = sum(b["wal_used_bytes"] or 0 for b in status["brokers"])
            lag = max((b["upload_lag_s"] or 0 for b in status["brokers"]), default=0.0)
        time.sleep(0.2)
    raise SystemExit(f"no failover within {timeout_s}s")


def max_gap(ledger: AckLedger, partitions: int, start_s: float, end_s: float) -> float:
    """Longest gap between consecutive acks of any partition within [start, end]."""
    worst = 0.0
    for p in range(partitions):
        times = sorted(a.acked_s for a in ledger.snapshot() if a.partition == p)
        inside = [t for t in times if start_s <= t <= end_s]
        before = [t for t in times if t < start_s][-1:]
        seq = before + inside
        worst = max(worst, max((b - a for a, b in zip(seq, seq[1:])), default=end_s - start_s))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--rate", type=float, default=50.0)
    args = ap.parse_args()
    rounds: list[dict] = []
    up_args = ("--upload-interval-s", "1")
    with running_cluster(brokers=2, up_args=up_args) as (d, st):
        main_pid = 0
        try:
            main_pid = next(s["pid"] for s in st["object_stores"] if s["name"] == "main")
            create_topic(st["bootstrap_servers"], "failover-bench", args.partitions)
            ledger = AckLedger(
                st["bootstrap_servers"], "failover-bench", args.partitions, args.rate
            ).start()
            try:
                for _ in range(args.rounds):
                    t = time.monotonic()
                    time.sleep(10)
                    baseline = max_gap(ledger, args.partitions, t, time.monotonic())
                    in_failover = objects_in(leader_status(d), 1)
                    frozen = time.monotonic()
                    os.kill(main_pid, signal.SIGSTOP)
                    try:
                        backlog, lag = backlog_until_failover(d, 60)
                        detection = time.monotonic() - frozen
                        wait(d, lambda s, n=in_failover: objects_in(s, 1) > n, 30)
                        first_object = time.monotonic() - frozen
                        time.sleep(5)
                        fault_gap = max_gap(ledger, args.partitions, frozen, time.monotonic())
                    finally:
                        os.kill(main_pid, signal.SIGCONT)
                    time.sleep(3)
                    switch = time.monotonic()
                    out = automqctl("failover", "--bucket", "0", cluster_dir=d)
                    if out.returncode != 0:
                        raise SystemExit(out.stderr)
                    time.sleep(5)
                    switch_gap = max_gap(ledger, args.partitions, switch, time.monotonic())
                    rounds.append(
                        {
                            "detection_s": round(detection, 2),
                            "first_failover_object_s": round(first_object, 2),
                            "baseline_max_ack_gap_s": round(baseline, 3),
                            "fault_max_ack_gap_s": round(fault_gap, 3),
                            "manual_switch_max_ack_gap_s": round(switch_gap, 3),
                            "wal_backlog_bytes_at_switch": backlog,
                            "upload_lag_s_at_switch": round(lag, 2),
                        }
                    )
            finally:
                ledger.stop()
            report = ledger.verify()
        finally:
            if main_pid:  # before the cluster goes down
                try:
                    os.kill(main_pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    medians["fault_gap_vs_baseline"] = round(
        medians["fault_max_ack_gap_s"] / max(medians["baseline_max_ack_gap_s"], 1e-3), 2
    )
    emit(
        {
            "rounds": rounds,
            "median": medians,
            "acked": report.acked,
            "missing": len(report.missing),
            "duplicated": len(report.duplicated),
            "ok": report.ok,
        }
    )


if __name__ == "__main__":
    main()
