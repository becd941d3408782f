"""Where a catch-up's time goes: the broker's time per Fetch against the client's, per tree.

    python benchmarks/catchup_trace_bench.py --tree old=DIR --tree new=DIR [--runs 2]
                                             [--mib 256] [--catchups 3] [--prefetching]

Each tree is a source tree (e.g. a `git archive` of a commit); runs interleave the trees
(old, new, new, old, ...). Per run, on a fresh `automqctl cluster up --brokers 1` started from
the tree with `catchup_trace/sitecustomize.py` loaded into the broker: `mib` MiB of 1 KiB
records into 6 partitions, raw boto3 4 MiB ranged GETs of every object (the store's speed),
the broker restarted (nothing cached), then `catchups` times one confluent-kafka consumer
reads everything from offset 0 (as `broker_limits_bench.py` does), then the raw GETs again.
Reported per run: each catch-up's MB/s and the broker's and the consumer's CPU seconds; from
the trace: the broker's time per Fetch (handler start to answer; the 500 ms long polls at the
end of each catch-up left out), the client's time between an answer and its next Fetch,
the object-store GETs of data blocks (bytes, duration) and the most in flight at once.
JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the load generator and baselines come from this tree; only the cluster runs the tree measured
from benchmarks.broker_cpu_bench import cpu_s  # noqa: E402
from benchmarks.broker_limits_bench import filled_topic  # noqa: E402
from benchmarks.compaction_bench import committed_objects  # noqa: E402
from benchmarks.compaction_catchup_bench import (  # noqa: E402
    raw_get_mb_s,
    sparse_catchup_mb_s,
)

TRACE_DIR = ROOT / "benchmarks" / "catchup_trace"
PARTITIONS = 6
LONG_POLL_S = 0.49  # a Fetch that waited (almost) its whole max_wait: nothing to read


def cli(tree: Path, cdir: Path, env: dict, *args: str, timeout_s: float = 300) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env={**env, "AUTOMQ_CLUSTER_DIR": str(cdir)},
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if out.returncode != 0:
        raise SystemExit(f"automqctl {' '.join(args)} failed: {out.stderr.strip()[-400:]}")
    return out.stdout


def trace_summary(path: Path) -> dict:
    events = [json.loads(line) for line in path.read_text().splitlines() if line]
    fetches = sorted((e for e in events if e[0] == "fetch"), key=lambda e: e[1])
    served = [e for e in fetches if e[2] - e[1] < LONG_POLL_S]
    gaps = [
        b[1] - a[2]
        for a, b in zip(fetches, fetches[1:])
        if a[2] - a[1] < LONG_POLL_S and b[1] > a[2]
    ]
    gets = [e for e in events if e[0] == "get" and e[3] > 65536]  # data blocks, not indexes
    edges = sorted([(g[1], 1) for g in gets] + [(g[2], -1) for g in gets])
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    handler_ms = sorted((e[2] - e[1]) * 1e3 for e in served)
    writes = [e for e in events if e[0] == "write"]
    return {
        "fetches": len(served),
        "fetch_handler_ms_p50": statistics.median(handler_ms) if handler_ms else None,
        "fetch_handler_ms_p90": handler_ms[int(0.9 * (len(handler_ms) - 1))]
        if handler_ms
        else None,
        "client_gap_ms_p50": statistics.median(gaps) * 1e3 if gaps else None,
        # of that gap: the broker's socket writes of the answer the kernel did not take at once
        "answer_write_ms_p50": statistics.median((w[2] - w[1]) * 1e3 for w in writes)
        if writes
        else None,
        "answer_write_left_mib_p50": statistics.median(w[3] for w in writes) / 2**20
        if writes
        else None,
        "block_gets": len(gets),
        "block_get_mib_p50": statistics.median(g[3] for g in gets) / 2**20 if gets else None,
        "block_get_ms_p50": statistics.median((g[2] - g[1]) * 1e3 for g in gets) if gets else None,
        "block_gets_in_flight_max": most,
    }


def one_run(tree: Path, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="catchup-trace-") as tmp:
        cdir, traces = Path(tmp) / "cluster", Path(tmp) / "traces"
        traces.mkdir()
        env = {
            **os.environ,
            "PYTHONPATH": f"{tree}{os.pathsep}{TRACE_DIR}",
            "AUTOMQ_CATCHUP_TRACE_DIR": str(traces),
        }
        status = json.loads(
            cli(tree, cdir, env, "cluster", "up", "--brokers", "1", "--format", "json")
        )
        bootstrap = status["bootstrap_servers"]
        try:
            topic, partitions, wanted = filled_topic(bootstrap, PARTITIONS, args.mib)
            objects = committed_objects(cdir)
            raw_before = raw_get_mb_s(cdir, objects)
            cli(tree, cdir, env, "broker", "stop", "1")
            cli(tree, cdir, env, "broker", "start", "1")
            status = json.loads(cli(tree, cdir, env, "cluster", "status", "--format", "json"))
            pid = int(status["brokers"][0]["pid"])
            catchups = []
            for _ in range(args.catchups):
                own0, broker0 = resource.getrusage(resource.RUSAGE_SELF), cpu_s(pid)
                mb_s = sparse_catchup_mb_s(bootstrap, topic, partitions, wanted, args.prefetching)
                own1 = resource.getrusage(resource.RUSAGE_SELF)
                catchups.append(
                    {
                        "mb_s": mb_s,
                        "broker_cpu_s": cpu_s(pid) - broker0,
                        "consumer_cpu_s": own1.ru_utime
                        + own1.ru_stime
                        - own0.ru_utime
                        - own0.ru_stime,
                        "load_average": os.getloadavg()[0],
                    }
                )
            raw_after = raw_get_mb_s(cdir, objects)
            time.sleep(1.5)  # the tracer's last flush
            summary = trace_summary(traces / f"broker-{pid}.jsonl")
        finally:
            subprocess.run(
                [sys.executable, "-m", "cli.main", "cluster", "down"],
                env={**env, "AUTOMQ_CLUSTER_DIR": str(cdir)},
                cwd=tree,
                capture_output=True,
                timeout=120,
            )
    return {
        "raw_get_4mib_mb_s": [raw_before, raw_after],
        "catchups": catchups,
        **summary,
    }


def median_of(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", required=True, help="NAME=DIR")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--catchups", type=int, default=3)
    ap.add_argument(
        "--prefetching",
        action="store_true",
        help="the consumer with PREFETCHING_CONSUMER's settings (a prefetch window that "
        "does not stall it)",
    )
    args = ap.parse_args()
    trees = [(n, Path(d).resolve()) for n, d in (t.split("=", 1) for t in args.tree)]
    order = []
    for i in range(args.runs):
        order += trees if i % 2 == 0 else list(reversed(trees))
    results: dict[str, list] = {name: [] for name, _ in trees}
    for name, tree in order:
        run = one_run(tree, args)
        print(json.dumps({name: run}), file=sys.stderr, flush=True)
        results[name].append(run)
    medians = {}
    for name, runs in results.items():
        rates = [c["mb_s"] for r in runs for c in r["catchups"]]
        medians[name] = {
            "catchup_mb_s": statistics.median(rates),
            "broker_cpu_s_per_gb": statistics.median(
                c["broker_cpu_s"] / (args.mib * 1.048576 / 1000)
                for r in runs
                for c in r["catchups"]
            ),
            # a run whose tracer recorded nothing (it patches after the imports) is left out
            "fetch_handler_ms_p50": median_of(r["fetch_handler_ms_p50"] for r in runs),
            "client_gap_ms_p50": median_of(r["client_gap_ms_p50"] for r in runs),
            "raw_get_4mib_mb_s": statistics.median(max(r["raw_get_4mib_mb_s"]) for r in runs),
        }
    print(json.dumps({"medians": medians, "runs": results}, indent=2))


if __name__ == "__main__":
    main()
