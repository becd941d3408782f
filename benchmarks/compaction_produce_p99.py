"""Produce latency while a compaction runs vs idle, on one cluster in one run.

    python benchmarks/compaction_produce_p99.py [--rounds 2] [--duration 30] [--rate 2000]

`automqctl cluster up` (2 brokers, 1 controller, uploads every 0.5 s) in a temporary
directory. Each round: `automqctl perf` (8 partitions, 1 KiB records, `rate` records/s,
acks=all) for `duration` s idle, then again for `duration` s with `automqctl compaction run
--master local[2]` started 3 s into it (many small objects exist by then: the cluster
uploads twice a second). Reported: produce p50/p99 of each phase, medians over rounds, and
the compaction results. Everything runs on the same machine, so Spark's JVM competes with
the brokers for the same cores (on a real deployment Spark runs elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.compaction_bench import automqctl, cluster_down  # noqa: E402


def perf(cdir: Path, work: Path, duration: float, rate: float, name: str) -> dict:
    summary = work / f"{name}.json"
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cdir), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "perf",
            "--partitions",
            "8",
            "--record-size",
            "1024",
            "--send-rate",
            str(rate),
            "--duration",
            str(duration),
            "--acks",
            "all",
            "--summary-file",
            str(summary),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=duration + 300,
    )
    if out.returncode != 0:
        raise SystemExit(f"perf failed: {out.stderr.strip()[-300:]}")
    return json.loads(summary.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--rate", type=float, default=2000)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="compaction-p99-") as tmp:
        work = Path(tmp)
        cdir = work / "cluster"
        try:
            automqctl(
                cdir,
                "cluster",
                "up",
                "--brokers",
                "2",
                "--controllers",
                "1",
                "--upload-interval-s",
                "0.5",
            )
            for i in range(args.rounds):
                idle = perf(cdir, work, args.duration, args.rate, f"idle-{i}")
                results: list[dict] = []

                def compact(results: list[dict] = results) -> None:
                    time.sleep(3)
                    results.append(automqctl(cdir, "compaction", "run", "--master", "local[2]"))

                t = threading.Thread(target=compact)
                t.start()
                busy = perf(cdir, work, args.duration, args.rate, f"busy-{i}")
                t.join()
                rows.append(
                    {
                        "idle_p50_ms": idle["produce_p50_ms"],
                        "idle_p99_ms": idle["produce_p99_ms"],
                        "compacting_p50_ms": busy["produce_p50_ms"],
                        "compacting_p99_ms": busy["produce_p99_ms"],
                        "compaction": {
                            k: results[0][k]
                            for k in ("committed", "objects_before", "objects_after", "duration_s")
                        },
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr)
        finally:
            cluster_down(cdir)

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 2)

    print(
        json.dumps(
            {
                "rounds": len(rows),
                "idle_p50_ms": med("idle_p50_ms"),
                "idle_p99_ms": med("idle_p99_ms"),
                "compacting_p50_ms": med("compacting_p50_ms"),
                "compacting_p99_ms": med("compacting_p99_ms"),
                "p99_ratio": round(
                    statistics.median(r["compacting_p99_ms"] / r["idle_p99_ms"] for r in rows), 2
                ),
                "per_round": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
