"""Shard-store log syncs on one disk: a growing file + fsync vs zero-filled room + fdatasync.

Six log files in one directory stand for six shard stores sharing a disk. A round appends one
shard-sized record (4 KiB + header, what a 16 KiB payload's shard is) to each file in
parallel, each followed by its sync, and ends when 4 have synced (as the erasure writer's
append); with --slow, files 1 and 4 sleep 50 ms before their append (the "2 slow stores"
case: their syncs land among the next rounds'). Modes:

- growing-fsync: append at the file's end, os.fsync (the store's log before this change)
- growing-fdatasync: the same with os.fdatasync (the file still grows: a journal commit)
- zeroed-fdatasync: append into room already written with zeros, os.fdatasync (the store now)

Modes are interleaved per repetition; figures are medians over repetitions of each run's
p50/p99. No shard store or HTTP is involved: this isolates the filesystem.

    python benchmarks/shard_log_sync_bench.py --rounds 1000 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

RECORD = os.urandom(4096 + 100)
MODES = ("growing-fsync", "growing-fdatasync", "zeroed-fdatasync")
SLOW_STORES = (1, 4)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(root: Path, mode: str, rounds: int, slow_ms: int) -> dict:
    room_bytes = (rounds + 10) * len(RECORD)
    fds = []
    for i in range(6):
        fd = os.open(root / f"{mode}-{i}.log", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        if mode == "zeroed-fdatasync":
            zeros = bytes(1 << 20)
            for pos in range(0, room_bytes, len(zeros)):
                os.pwrite(fd, zeros, pos)
            os.fsync(fd)
        fds.append(fd)
    sync = os.fsync if mode == "growing-fsync" else os.fdatasync
    ends = [0] * 6
    locks = [threading.Lock() for _ in range(6)]
    sync_ms: list[float] = []

    def append(i: int) -> None:
        if slow_ms and i in SLOW_STORES:
            time.sleep(slow_ms / 1000)
        with locks[i]:
            os.pwrite(fds[i], RECORD, ends[i])
            ends[i] += len(RECORD)
            began = time.perf_counter()
            sync(fds[i])
            sync_ms.append((time.perf_counter() - began) * 1000)

    round_ms = []
    stragglers: list[threading.Thread] = []
    try:
        with ThreadPoolExecutor(8) as pool:
            for _ in range(rounds):
                began = time.perf_counter()
                pending = set()
                for i in range(6):
                    if slow_ms and i in SLOW_STORES:  # a thread each: they overlap
                        t = threading.Thread(target=append, args=(i,))
                        t.start()
                        stragglers.append(t)
                    else:
                        pending.add(pool.submit(append, i))
                done = 0
                while done < 4 and pending:
                    finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                    done += len(finished)
                round_ms.append((time.perf_counter() - began) * 1000)
        for t in stragglers:
            t.join()
    finally:
        for fd in fds:
            os.close(fd)
    return {
        "round_p50_ms": _percentile(round_ms, 0.5),
        "round_p99_ms": _percentile(round_ms, 0.99),
        "sync_p50_ms": _percentile(sync_ms, 0.5),
        "sync_p99_ms": _percentile(sync_ms, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--slow-ms", type=int, default=50)
    parser.add_argument("--dir", default=None, help="where the logs go (default: a temp dir)")
    args = parser.parse_args()
    results: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="shard-log-sync-", dir=args.dir) as tmp:
        for rep in range(args.reps):
            order = MODES if rep % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                for slow in (False, True):
                    key = f"{mode}{' slow' if slow else ''}"
                    result = run(Path(tmp), mode, args.rounds, args.slow_ms if slow else 0)
                    results.setdefault(key, []).append(result)
    summary = {
        key: {k: round(statistics.median(r[k] for r in runs), 2) for k in runs[0]}
        for key, runs in results.items()
    }
    summary["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
