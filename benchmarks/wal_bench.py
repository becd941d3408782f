"""FileWAL throughput against a plain write+fdatasync loop on the same disk.

For each batch size B, in the same run and directory:

(a) plain: sequential ``os.pwrite`` of B bytes followed by ``os.fdatasync``, in a
    loop, into a preallocated file;
(b) FileWAL: ``--appenders`` threads append ``--record-bytes`` records, each
    keeping enough appends outstanding that group commit forms batches of about
    B bytes (``max_batch_bytes`` = B).

Each pair is repeated ``--reps`` times (plain and WAL alternate); the medians
are reported: MB/s of both, the ratio WAL/plain (payload bytes only, so record
headers count against the WAL), p50/p99 append latency, the observed mean batch
size. The JSON summary goes to stdout (and to ``--json-out`` if given).

Example::

    python benchmarks/wal_bench.py --dir . --batch-kib 64 256 1024 --total-mib 64 --reps 5

``--loop-mb-s R`` measures the acknowledgement path instead (issue #28): an asyncio loop
appends ``--record-bytes`` records at R MB/s, ``--loop-group`` at a time (a produce request's
partitions), and times each group from its appends until the loop resumes after the last
ack (`LoopHandoff` when the tree has it, else ``asyncio.wrap_future``), ``--loop-s`` seconds
quiet, then as long with ``--hogs`` CPU hogs: p50/p99/p999 of both and the busy/quiet p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

# after PYTHONPATH: `PYTHONPATH=TREE` measures TREE's WAL (an A/B against another checkout)
sys.path.append(str(Path(__file__).resolve().parents[1]))

from dataplane.config import FileWALConfig  # noqa: E402
from dataplane.s3stream.wal import FileWAL  # noqa: E402
from dataplane.s3stream.wal.format import RECORD_HEADER_SIZE_BYTES  # noqa: E402

try:  # the loop handoff (2026-11-29); a tree from before has none
    from dataplane.runtime import LoopHandoff  # noqa: E402
except ImportError:
    LoopHandoff = None

MIB = 1024 * 1024


def plain_loop(path: Path, batch_bytes: int, total_bytes: int) -> dict:
    """Sequential pwrite(batch) + fdatasync until ``total_bytes`` are written."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.posix_fallocate(fd, 0, total_bytes + batch_bytes)
        os.fsync(fd)
        buf = os.urandom(batch_bytes)
        batches = math.ceil(total_bytes / batch_bytes)
        latencies: list[float] = []
        start = time.perf_counter()
        for i in range(batches):
            t0 = time.perf_counter()
            os.pwrite(fd, buf, i * batch_bytes)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    written = batches * batch_bytes
    return {
        "mb_per_s": written / elapsed / 1e6,
        "seconds": elapsed,
        "fsyncs": batches,
        "p50_ms": _percentile(latencies, 50) * 1e3,
        "p99_ms": _percentile(latencies, 99) * 1e3,
    }


def wal_run(
    path: Path, batch_bytes: int, total_bytes: int, record_bytes: int, appenders: int
) -> dict:
    """Concurrent appenders against a FileWAL whose group commit batches ~``batch_bytes``."""
    record_total = record_bytes + RECORD_HEADER_SIZE_BYTES
    records = math.ceil(total_bytes / record_bytes)
    per_thread = math.ceil(records / appenders)
    # outstanding appends per thread: four batches' worth over all threads keeps the queue full
    window = max(1, math.ceil(4 * batch_bytes / (record_total * appenders)))
    config = FileWALConfig(
        max_record_bytes=record_bytes,
        # whole records: B of payload plus their headers
        max_batch_bytes=max(1, math.ceil(batch_bytes / record_bytes)) * record_total,
        max_queue_bytes=max(4 * batch_bytes, 2 * window * appenders * record_total),
    )
    # room for every record, the padding records that align batches (<= 4 KiB + 24 B per
    # batch; batches of one record in the worst case) and slack; a multiple of 4 KiB
    data_bytes = per_thread * appenders * record_total
    capacity = (
        data_bytes + per_thread * appenders * (config.align_bytes + 24) + 2 * config.max_batch_bytes
    )
    capacity = -(-capacity // 4096) * 4096
    wal = FileWAL.open(path, 1, 1, capacity_bytes=capacity, config=config)
    payload = os.urandom(record_bytes)
    latencies: list[list[float]] = [[] for _ in range(appenders)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(appenders + 1)

    def appender(tid: int) -> None:
        out = latencies[tid]
        pending: deque = deque()

        def wait_oldest() -> None:
            t0, future = pending.popleft()
            future.result(timeout=120)
            # the done-callback may still be running right after result() returns
            done_at = getattr(future, "done_at", None)
            out.append((done_at if done_at is not None else time.perf_counter()) - t0)

        def stamp(future) -> None:
            future.done_at = time.perf_counter()

        try:
            barrier.wait()
            for _ in range(per_thread):
                future = wal.append(payload)
                t0 = time.perf_counter()
                future.add_done_callback(stamp)
                pending.append((t0, future))
                if len(pending) >= window:
                    wait_oldest()
            while pending:
                wait_oldest()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=appender, args=(t,)) for t in range(appenders)]
    try:
        for t in threads:
            t.start()
        fsyncs0, batches0 = wal.fsync_count, wal.batch_count
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        fsyncs = wal.fsync_count - fsyncs0
        batches = wal.batch_count - batches0
    finally:
        wal.close()
        path.unlink(missing_ok=True)
    if errors:
        raise errors[0]
    all_latencies = [x for per in latencies for x in per]
    payload_bytes = per_thread * appenders * record_bytes
    return {
        "mb_per_s": payload_bytes / elapsed / 1e6,
        "disk_mb_per_s": per_thread * appenders * record_total / elapsed / 1e6,
        "seconds": elapsed,
        "fsyncs": fsyncs,
        "appends": per_thread * appenders,
        "mean_batch_bytes": per_thread * appenders * record_total / max(1, batches),
        "p50_ms": _percentile(all_latencies, 50) * 1e3,
        "p99_ms": _percentile(all_latencies, 99) * 1e3,
    }


async def _loop_phase(wal: FileWAL, mb_s: float, record_bytes: int, group: int, seconds: float):
    """Groups of appends at `mb_s` from this loop for `seconds`; ms from each group's appends
    until the loop resumed after its last ack. The WAL is trimmed as it goes."""
    loop = asyncio.get_running_loop()
    handoff = LoopHandoff.of(loop) if LoopHandoff is not None else None
    body = os.urandom(record_bytes)
    interval_s = group * record_bytes / (mb_s * 1e6)
    latencies_ms: list[float] = []
    end = loop.time() + seconds

    async def one_group() -> None:
        started = time.perf_counter()
        for future in [wal.append(body) for _ in range(group)]:
            if not future.done():
                await (handoff.wrap_future(future) if handoff else asyncio.wrap_future(future))
        latencies_ms.append((time.perf_counter() - started) * 1000)

    async def trim_behind() -> None:  # as the broker's uploader does: off the appending path
        while loop.time() < end:
            await asyncio.to_thread(wal.trim, wal.end_offset)
            await asyncio.sleep(0.5)

    tasks = [asyncio.ensure_future(trim_behind())]
    due = loop.time()
    while loop.time() < end:
        tasks.append(asyncio.ensure_future(one_group()))
        due += interval_s
        await asyncio.sleep(max(0.0, due - loop.time()))
    await asyncio.gather(*tasks)
    return {
        "groups": len(latencies_ms),
        **{f"p{q}_ms": round(_percentile(latencies_ms, q), 2) for q in (50, 99, 99.9)},
    }


def loop_run(work: Path, args: argparse.Namespace) -> dict:
    """The acknowledgement path, quiet then with `args.hogs` CPU hogs (module docstring)."""
    from benchmarks._harness import cpu_hogs

    wal = FileWAL.open(work / "loop-wal", 1, 1, capacity_bytes=256 * MIB)
    try:
        phase = (wal, args.loop_mb_s, args.record_bytes, args.loop_group)
        asyncio.run(_loop_phase(*phase, 2.0))  # warm-up
        quiet = asyncio.run(_loop_phase(*phase, args.loop_s))
        with cpu_hogs(args.hogs):
            busy = asyncio.run(_loop_phase(*phase, args.loop_s))
    finally:
        wal.close()
    return {
        "loop_mb_s": args.loop_mb_s,
        "handoff": LoopHandoff is not None,
        "quiet": quiet,
        "busy": busy,
        "hogs": args.hogs,
        "busy_to_quiet_p99": round(busy["p99_ms"] / quiet["p99_ms"], 2),
        "load_average_1m": os.getloadavg()[0],
    }


def _percentile(values: list[float], pct: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, math.ceil(pct / 100 * len(ordered)) - 1))
    return ordered[k]


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(tempfile.gettempdir()),
        help="directory on the disk under test (default: %(default)s)",
    )
    parser.add_argument(
        "--batch-kib", type=int, nargs="+", default=[64, 256, 1024], help="batch sizes B in KiB"
    )
    parser.add_argument(
        "--record-bytes",
        type=int,
        default=16384,
        help="WAL record body size (default: Kafka's default batch.size)",
    )
    parser.add_argument("--appenders", type=int, default=4, help="concurrent appender threads")
    parser.add_argument("--total-mib", type=int, default=64, help="bytes written per run, MiB")
    parser.add_argument("--reps", type=int, default=3, help="repetitions K (medians reported)")
    parser.add_argument("--json-out", type=Path, help="also write the JSON summary here")
    parser.add_argument("--loop-mb-s", type=float, default=0, help="acknowledgement-path mode")
    parser.add_argument("--loop-group", type=int, default=6, help="appends awaited together")
    parser.add_argument("--loop-s", type=float, default=10, help="seconds quiet, then busy")
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs of the busy half")
    args = parser.parse_args(argv)
    if args.loop_mb_s > 0:
        if not (args.loop_mb_s <= 1000 and 1 <= args.loop_group <= 64 and 0 < args.loop_s <= 600):
            parser.error("loop-mb-s <= 1000, loop-group 1..64, loop-s 0..600")
        with tempfile.TemporaryDirectory(prefix="wal-bench-", dir=args.dir) as tmp:
            print(json.dumps(loop_run(Path(tmp), args), indent=2))
        return 0
    if (
        not 1 <= args.reps <= 50
        or not 1 <= args.appenders <= 256
        or not 1 <= args.total_mib <= 16384
    ):
        parser.error("reps 1..50, appenders 1..256, total-mib 1..16384")
    total = args.total_mib * MIB
    results = []
    with tempfile.TemporaryDirectory(prefix="wal-bench-", dir=args.dir) as tmp:
        work = Path(tmp)
        for batch_kib in args.batch_kib:
            batch = batch_kib * 1024
            plain_runs, wal_runs = [], []
            for rep in range(args.reps):
                plain_runs.append(plain_loop(work / f"plain-{rep}", batch, total))
                wal_runs.append(
                    wal_run(work / f"wal-{rep}", batch, total, args.record_bytes, args.appenders)
                )
            plain_mb = _median(plain_runs, "mb_per_s")
            wal_mb = _median(wal_runs, "mb_per_s")
            row = {
                "batch_bytes": batch,
                "plain_mb_per_s": round(plain_mb, 1),
                "wal_mb_per_s": round(wal_mb, 1),
                "ratio": round(wal_mb / plain_mb, 3),
                "plain_fsync_p50_ms": round(_median(plain_runs, "p50_ms"), 3),
                "plain_fsync_p99_ms": round(_median(plain_runs, "p99_ms"), 3),
                "wal_append_p50_ms": round(_median(wal_runs, "p50_ms"), 3),
                "wal_append_p99_ms": round(_median(wal_runs, "p99_ms"), 3),
                "wal_mean_batch_bytes": round(_median(wal_runs, "mean_batch_bytes")),
                "wal_fsyncs_per_run": round(_median(wal_runs, "fsyncs")),
                "wal_appends_per_run": wal_runs[0]["appends"],
                "runs": {"plain": plain_runs, "wal": wal_runs},
            }
            results.append(row)
            print(
                f"B={batch_kib:>5} KiB  plain {plain_mb:8.1f} MB/s  wal {wal_mb:8.1f} MB/s  "
                f"ratio {row['ratio']:.2f}  append p50 {row['wal_append_p50_ms']:.2f} ms "
                f"p99 {row['wal_append_p99_ms']:.2f} ms  mean batch {row['wal_mean_batch_bytes'] / 1024:.0f} KiB",
                file=sys.stderr,
            )
    summary = {
        "dir": str(args.dir.resolve()),
        "total_bytes_per_run": total,
        "record_bytes": args.record_bytes,
        "appenders": args.appenders,
        "reps": args.reps,
        "goal": "wal_mb_per_s >= 0.7 * plain_mb_per_s",
        "goal_met": all(r["ratio"] >= 0.7 for r in results),
        "results": results,
    }
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
