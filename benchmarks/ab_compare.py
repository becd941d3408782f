"""A/B: the produce and catch-up benchmarks of two source trees, interleaved in one run.

    python benchmarks/ab_compare.py --old /path/to/old/checkout --new . --rounds 2

Each round runs, for each tree (the order alternates between rounds, so drift on a shared
machine hits both): `automqctl cluster up` + `automqctl perf` saturated with 1 KiB and with
64 KiB records + `cluster down --purge`, then `benchmarks/catchup_bench.py --runs 1` (its
engine/raw-GET ratio is measured against raw GETs in the same run). Every command runs with
the tree's own code (PYTHONPATH). Prints the medians per tree and new/old ratios as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PERF_RUNS = {  # name -> perf arguments (the documented saturated runs)
    "produce_1k_mb_s": ["--record-size", "1024", "--send-rate", "100000"],
    "produce_64k_mb_s": ["--record-size", "65536", "--send-rate", "5000"],
}
COMMAND_TIMEOUT_S = 900


def _run(tree: Path, args: list[str], env_extra: dict[str, str] | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), **(env_extra or {})}
    out = subprocess.run(
        [sys.executable, *args],
        cwd=tree,
        env=env,
        text=True,
        capture_output=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:4])} failed in {tree}: {out.stderr[-2000:]}")
    return out.stdout


def _last_json(text: str) -> dict:
    start = text.rfind("\n{")
    return json.loads(text[start + 1 if start >= 0 else text.index("{") :])


def perf_round(tree: Path, work: Path, duration_s: int) -> dict[str, float]:
    cluster_dir = work / "cluster"
    _run(tree, ["-m", "cli.main", "cluster", "up", "--dir", str(cluster_dir)])
    results: dict[str, float] = {}
    try:
        for name, extra in PERF_RUNS.items():
            summary = work / f"{name}.json"
            _run(
                tree,
                [
                    "-m",
                    "cli.main",
                    "perf",
                    "--dir",
                    str(cluster_dir),
                    "--partitions",
                    "6",
                    "--duration",
                    str(duration_s),
                    "--topic-prefix",
                    name.replace("_", "-"),
                    "--summary-file",
                    str(summary),
                    *extra,
                ],
            )
            data = json.loads(summary.read_text())
            results[name] = data["produce_mb_s"]
            results[name.replace("mb_s", "p99_ms")] = data["produce_p99_ms"]
    finally:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "cli.main",
                "cluster",
                "down",
                "--purge",
                "--dir",
                str(cluster_dir),
            ],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},
            capture_output=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    return results


def catchup_round(tree: Path, streams: int) -> dict[str, float]:
    out = _run(
        tree,
        [
            "benchmarks/catchup_bench.py",
            "--streams",
            str(streams),
            "--backlog-kib",
            "512",
            "--runs",
            "1",
        ],
    )
    data = _last_json(out)
    return {
        "catchup_engine_mb_s": data["engine_mb_per_s_median"],
        "catchup_raw_get_mb_s": data["raw_get_mb_per_s_median"],
        "catchup_ratio_engine_to_raw": data["ratio_engine_to_raw"],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True)
    p.add_argument("--new", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--perf-duration-s", type=int, default=20)
    p.add_argument("--catchup-streams", type=int, default=1000)
    a = p.parse_args()
    trees = {"old": a.old.resolve(), "new": a.new.resolve()}
    samples: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            order = ["old", "new"] if r % 2 == 0 else ["new", "old"]
            for label in order:
                work = Path(tmp) / f"{label}-{r}"
                work.mkdir()
                got = perf_round(trees[label], work, a.perf_duration_s)
                got.update(catchup_round(trees[label], a.catchup_streams))
                for k, v in got.items():
                    samples[label].setdefault(k, []).append(v)
                print(json.dumps({"round": r, "tree": label, **got}), flush=True)
    medians = {
        label: {k: round(statistics.median(v), 2) for k, v in s.items()}
        for label, s in samples.items()
    }
    ratios = {
        k: round(medians["new"][k] / medians["old"][k], 3)
        for k in medians["new"]
        if medians["old"].get(k)
    }
    print(json.dumps({"medians": medians, "new_over_old": ratios, "samples": samples}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
