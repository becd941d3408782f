"""What the slow seconds of produce latency at partial load are made of, old tree against new.

    python benchmarks/produce_tail_bench.py --tree old=/path/to/old --tree new=/path/to/new
        [--runs 3] [--rate 30000] [--duration 30] [--groups 1] [--no-upload]
        [--perf-args NAME="--producer-processes 1"] [--store-dir NAME=/dev/shm/store]

Each run (trees interleaved: old, new, new, old, old, new, ...): a fresh
`automqctl cluster up --brokers 1` started from the tree (PYTHONPATH), `automqctl perf
--partitions 6 --record-size 1024 --send-rate RATE --groups G` (acks=all, idempotent) from the
same tree, with `produce_trace/sitecustomize.py` loaded into the broker and the load
generator. Per run it prints the client's produce p50/p99/p999 and worst one-second p99 and,
from the broker's trace, the produce request's time in the broker (dispatch to answer), the
WAL append-to-ack latency, fdatasync times, the event loop's lateness (5 ms timer), a plain
thread's wake-up lateness in the broker and in the load generator's processes that measure
(its producer and consumer processes, or its one process in trees before they were split;
CPU and GIL contention),
and the share of seconds with an upload running. `--no-upload` turns the broker's uploads
off (the WAL must hold the run: keep RATE x DURATION under ~400 MB) to see what they cost.
`--store-dir NAME=PATH` runs that tree's clusters with `cluster up --store-dir` (a fresh
directory under PATH per run, deleted afterwards): the object store's data on another
device than the WAL. A tree may be given twice under two names (same code, two
configurations). Medians per tree as JSON at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRACE_DIR = Path(__file__).resolve().parent / "produce_trace"


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))]


def _events(path: Path) -> list[list]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(
    broker: list[list], perf_lag: list[list], parent_lag: list[list] | None = None
) -> dict:
    """Figures of one run from the traces (pure). `perf_lag`: the processes of the load
    generator that take the timestamps (its children, or the one process of an old tree);
    `parent_lag`: perf's main process when it has children."""
    produce = [e for e in broker if e[0] == "req" and e[1] == 0]
    t0 = min(e[2] for e in produce)
    t1 = max(e[3] for e in produce)

    def within(t: float) -> bool:
        return t0 <= t <= t1

    upload_s = 0.0
    for e in broker:
        if e[0] == "up":
            upload_s += max(0.0, min(e[2], t1) - max(e[1], t0))
    wal = [e[2] * 1000 for e in broker if e[0] == "wal" and within(e[1])]
    fsync = [(e[2] - e[1]) * 1000 for e in broker if e[0] == "fs" and within(e[1])]
    loop = [e[2] for e in broker if e[0] == "loop" and within(e[1])]
    lag = [e[2] * 1000 for e in broker if e[0] == "lag" and within(e[1])]
    perf = [e[2] * 1000 for e in perf_lag if e[0] == "lag"]
    served = [(e[3] - e[2]) * 1000 for e in produce]
    return {
        "broker_produce_p50_ms": _pct(served, 0.5),
        "broker_produce_p99_ms": _pct(served, 0.99),
        "broker_produce_p999_ms": _pct(served, 0.999),
        "wal_ack_p50_ms": _pct(wal, 0.5),
        "wal_ack_p99_ms": _pct(wal, 0.99),
        "wal_ack_p999_ms": _pct(wal, 0.999),
        "fsyncs_per_s": len(fsync) / max(t1 - t0, 1e-9),
        "fsync_p99_ms": _pct(fsync, 0.99),
        "fsync_max_ms": max(fsync, default=float("nan")),
        "loop_lateness_p99_ms": _pct(loop, 0.99),
        "broker_thread_lag_p99_ms": _pct(lag, 0.99),
        "broker_thread_lag_max_ms": max(lag, default=float("nan")),
        "perf_thread_lag_p99_ms": _pct(perf, 0.99),
        "perf_thread_lag_max_ms": max(perf, default=float("nan")),
        "perf_parent_thread_lag_max_ms": max(
            (e[2] * 1000 for e in parent_lag or [] if e[0] == "lag"), default=float("nan")
        ),
        "upload_busy_share": upload_s / max(t1 - t0, 1e-9),
    }


def one_run(name: str, tree: Path, args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    with (
        contextlib.ExitStack() as cleanup,
        tempfile.TemporaryDirectory(prefix="produce-tail-") as tmp,
    ):
        cdir, traces = Path(tmp) / "cluster", Path(tmp) / "traces"
        traces.mkdir()
        env = {
            **os.environ,
            "AUTOMQ_CLUSTER_DIR": str(cdir),
            "PYTHONPATH": f"{tree}{os.pathsep}{TRACE_DIR}",
            "AUTOMQ_PRODUCE_TRACE_DIR": str(traces),
        }
        if args.no_upload:
            env["AUTOMQ_PRODUCE_TRACE_NO_UPLOAD"] = "1"

        def cli(*cmd: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
            return subprocess.run(
                [sys.executable, "-m", "cli.main", *cmd],
                env=env,
                cwd=tree,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )

        store_args: list[str] = []
        store_dir = args.store_dir.get(name)
        if store_dir is not None:
            # a directory of its own per run (--store-dir refuses one holding a store);
            # deleted when the run ends, whatever happens
            own = tempfile.mkdtemp(prefix="produce-tail-", dir=store_dir)
            cleanup.callback(shutil.rmtree, own, ignore_errors=True)
            store_args = ["--store-dir", own]
        up = cli("cluster", "up", "--brokers", "1", *store_args, "--format", "json", timeout_s=300)
        if up.returncode != 0:
            raise SystemExit(f"cluster up failed: {up.stderr.strip()[-500:]}")
        try:
            time.sleep(8)  # the tracer attaches once the broker has started
            summary = Path(tmp) / "perf.json"
            cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = cli(
                "perf",
                *args.perf_args.get(name, []),
                "--partitions",
                "6",
                "--groups",
                str(args.groups),
                "--record-size",
                "1024",
                "--send-rate",
                str(args.rate),
                "--duration",
                str(args.duration),
                "--summary-file",
                str(summary),
                timeout_s=args.duration + 300,
            )
            if out.returncode != 0:
                raise SystemExit(f"perf failed: {out.stderr.strip()[-500:]}")
            # perf waits for its children: their CPU time is in this delta too
            cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            perf_cpu_s = (cpu_after.ru_utime + cpu_after.ru_stime) - (
                cpu_before.ru_utime + cpu_before.ru_stime
            )
            time.sleep(3)  # the tracer's last write
            client = json.loads(summary.read_text())
        finally:
            cli("cluster", "down", timeout_s=120)
        broker = [e for f in traces.glob("broker-*.jsonl") for e in _events(f)]
        children = [e for f in traces.glob("perf-child-*.jsonl") for e in _events(f)]
        parent = [
            e
            for f in traces.glob("perf-*.jsonl")
            if not f.name.startswith("perf-child-")
            for e in _events(f)
        ]
        # the lag that matters is that of the processes measuring: perf's children if it
        # has any (the new layout), else its one process
        perf_lag, parent_lag = (children, parent) if children else (parent, [])
        perf_processes = len(list(traces.glob("perf-*.jsonl")))
    return {
        "client_produce_p50_ms": client["produce_p50_ms"],
        "client_produce_p99_ms": client["produce_p99_ms"],
        "client_produce_p999_ms": client["produce_p999_ms"],
        "client_worst_second_p99_ms": client["max_interval_produce_p99_ms"],
        "produce_mb_s": client["produce_mb_s"],
        "client_e2e_p50_ms": client["e2e_p50_ms"] if args.groups else float("nan"),
        "client_e2e_p99_ms": client["e2e_p99_ms"] if args.groups else float("nan"),
        # librdkafka's request round trip to the broker, measured in C (median of ~1 s windows)
        "broker_rtt_p99_ms": client.get("broker_rtt_p99_ms") or float("nan"),
        "max_interval_broker_rtt_p99_ms": client.get("max_interval_broker_rtt_p99_ms")
        or float("nan"),
        "perf_processes_traced": perf_processes,
        "perf_cpu_s": perf_cpu_s,
        **summarize(broker, perf_lag, parent_lag),
        "load_average_1m_before": load_before,
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=PATH, twice")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=int, default=30000)
    ap.add_argument("--duration", type=float, default=30)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--no-upload", action="store_true")
    ap.add_argument(
        "--perf-args",
        action="append",
        default=[],
        help='NAME="ARGS": more `automqctl perf` options for that tree (e.g. a layout)',
    )
    ap.add_argument(
        "--store-dir",
        action="append",
        default=[],
        help="NAME=PATH: that tree's clusters keep the object store under PATH (cluster up "
        "--store-dir; e.g. a tmpfs such as /dev/shm as another device than the WAL's)",
    )
    args = ap.parse_args()
    args.store_dir = dict(a.split("=", 1) for a in args.store_dir)
    args.perf_args = {
        name: extra.split() for name, extra in (a.split("=", 1) for a in args.perf_args)
    }
    trees = [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)]
    results: dict[str, list[dict]] = {name: [] for name, _ in trees}
    for i in range(args.runs):
        order = trees if i % 2 == 0 else trees[::-1]
        for name, path in order:
            run = one_run(name, path, args)
            results[name].append(run)
            print(json.dumps({"tree": name, "run": i, **run}), flush=True)
    medians = {
        name: {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
        for name, runs in results.items()
    }
    print(json.dumps({"medians": medians}, indent=2))


if __name__ == "__main__":
    main()
