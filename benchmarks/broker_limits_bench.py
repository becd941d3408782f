"""One broker against the machine's limits (issue #16), every baseline measured in the same run.

    python benchmarks/broker_limits_bench.py [--rounds 1] [--saturated-s 20] [--half-s 60]
                                             [--catchup-mib 512] [--only-catchup]
                                             [--catchup-load-mib 768] [--catchup-load-s 60]
                                             [--only-catchup-load] [--only-produce]
                                             [--store-dir PATH]

Per round, on a fresh `automqctl cluster up --brokers 1` (3 controllers, SeaweedFS, the load
generator: all on this machine):
1. baseline disk: write + fdatasync of 1 MiB blocks into the cluster's directory (the
   filesystem the WAL is on), `DISK_SECONDS` long;
2. `automqctl perf --partitions 6` saturated (acks=all, idempotent) with 1 KiB and with
   64 KiB records: MB/s, and the 64 KiB figure as a ratio of the disk baseline; with each
   the CPU seconds per GB produced of SeaweedFS, the broker, the controllers and the load
   generator, and the MB/s those allow when the machine's cores do nothing else
   (`*_cpu_ceiling_mb_s`) or only the object store's work (`*_object_store_ceiling_mb_s`);
3. half load: 1 KiB records at half the saturated record rate, one consumer group, `half-s`
   seconds: produce p99/p999, the worst one-second produce p99, end-to-end p99;
4. catch-up: `catchup-mib` MiB into a second topic, the broker restarted (nothing cached),
   one confluent-kafka consumer reads everything from offset 0; baseline: raw boto3 4 MiB
   ranged GETs of every committed object from the same store right before the restart and
   again right after the catch-up; the ratio is against the faster of the two. Then the
   broker is restarted again and the same consumer, with a prefetch window that does not
   stall it (`PREFETCHING_CONSUMER`: librdkafka's 64 MiB default queue nearly fills with
   one answer), reads it all again (`catchup_prefetching_*`).
5. catch-up under load (the issue's "produce p99 rising at most 2x while it runs"):
   `catchup-load-mib` MiB into a third topic, the broker restarted (that topic's data is in
   no cache), then `catchup-load-s` seconds of the half-load produce (1 KiB records at the
   half-load rate, one tailing group) and, `catchup-load-delay-s` after it starts, one
   confluent-kafka consumer reading the old topic from offset 0 to its end. From perf's
   per-interval histograms (`perf --summary-intervals`): the produce p99 of the seconds
   inside the catch-up against the p99 of the same run's seconds before it (the first
   second left out), and their ratio; also the p99 of the seconds after it (a backlog the
   catch-up left in the producer shows there) and of all seconds outside it.
   `--catchup-load-mib 0` leaves the step out.
With `--only-catchup` a round runs step 4 alone (the raw-GET baseline and the catch-up, so
their ratio still comes from one run); with `--only-catchup-load` step 5 alone; with
`--only-produce` steps 1-3.
`--store-dir PATH` starts each round's cluster with `cluster up --store-dir` (a fresh
directory under PATH, deleted afterwards): the object store's data on another device than
the WAL, as a remote store would be. Prints the medians over rounds and the ratios as JSON
(each round's figures too).
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
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from benchmarks.compaction_bench import automqctl, cluster_down, committed_objects  # noqa: E402
from benchmarks.compaction_catchup_bench import (  # noqa: E402
    raw_get_mb_s,
    records_in,
    restart_broker,
    sparse_catchup_mb_s,
)
from cli.perf_histogram import LatencyHistogram  # noqa: E402
from tests.e2e.ledger import create_topic  # noqa: E402

MIB = 1024 * 1024
DISK_SECONDS = 5.0
CATCHUP_PARTITIONS = 6
TICK = os.sysconf("SC_CLK_TCK")


def cluster_cpu_s(cluster_dir: Path) -> dict[str, float]:
    """CPU seconds of the processes whose command line names the cluster's directory."""
    out: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if str(cluster_dir) not in cmd:
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        # by program, not by path: a cluster directory may be named "broker-..."
        program = cmd.split(" --", 1)[0]
        kind = (
            "seaweedfs"
            if "weed" in program
            else "broker"
            if "dataplane.broker" in program
            else "controllers"
            if "controlplane.server" in program
            else "other"
        )
        out[kind] = out.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / TICK
    return out


def own_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children (and theirs: perf's workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def disk_write_fdatasync_mb_s(directory: Path, seconds: float = DISK_SECONDS) -> float:
    """write + fdatasync of 1 MiB blocks, sequentially, into a new file: the disk's speed for
    what a WAL does, on the filesystem the cluster uses."""
    block = os.urandom(MIB)
    path = directory / f"disk-baseline-{uuid.uuid4().hex[:6]}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    written = 0
    try:
        started = time.monotonic()
        while time.monotonic() - started < seconds and written < 8 * 1024 * MIB:
            os.write(fd, block)
            os.fdatasync(fd)
            written += MIB
        elapsed = time.monotonic() - started
    finally:
        os.close(fd)
        path.unlink()
    return written / elapsed / 1e6


def fill(bootstrap: str, topic: str, mib: int) -> None:
    """`mib` MiB of 1 KiB records as fast as the broker takes them (acks=all)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    value = os.urandom(1024)
    for i in range(mib * 1024):
        while True:
            try:
                producer.produce(topic, value=value, key=str(i).encode())
                break
            except BufferError:  # the local queue is full: wait for deliveries
                producer.poll(0.05)
    if producer.flush(300) != 0:
        raise SystemExit("catch-up fill: records not delivered")


def filled_topic(
    bootstrap: str, partitions: int, mib: int, prefix: str = "catchup"
) -> tuple[str, list[int], int]:
    """A new topic of `partitions` holding `mib` MiB of 1 KiB records, uploaded: (its name,
    its partitions, how many records they hold)."""
    topic = f"{prefix}-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions)
    fill(bootstrap, topic, mib)
    time.sleep(3)  # the last uploads
    indexes = list(range(partitions))
    return topic, indexes, records_in(bootstrap, topic, indexes)


def perf_command(cluster_dir: Path, summary: Path, *args: str) -> tuple[list[str], dict]:
    """argv and environment of `automqctl perf` writing its JSON summary to `summary`."""
    env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "cli.main", "perf", "--summary-file", str(summary), *args]
    return argv, env


def perf(cluster_dir: Path, *args: str) -> dict:
    """`automqctl perf` with its JSON summary (written to a file: the console has the table),
    plus `cpu_s_per_gb`: the CPU seconds per GB produced of each kind of process over the
    run (SeaweedFS, the broker, the controllers, the load generator: perf and its workers,
    start-up included) and `cores_busy`, their sum per second of the run."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        argv, env = perf_command(cluster_dir, Path(f.name), *args)
        cluster_before, children_before = cluster_cpu_s(cluster_dir), children_cpu_s()
        started = time.monotonic()
        out = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
        wall_s = time.monotonic() - started
        if out.returncode != 0:
            raise SystemExit(f"perf {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
        cpu = {
            kind: spent - cluster_before.get(kind, 0.0)
            for kind, spent in cluster_cpu_s(cluster_dir).items()
        }
        cpu["load_generator"] = children_cpu_s() - children_before
        summary = json.loads(Path(f.name).read_text())
    gb = summary["produce_mb_s"] * summary.get("duration_s", 0) / 1000
    if gb > 0:
        summary["cpu_s_per_gb"] = {k: round(v / gb, 2) for k, v in sorted(cpu.items())}
    summary["cores_busy"] = round(sum(cpu.values()) / wall_s, 2)
    return summary


def cpu_ceiling(sat: dict, prefix: str) -> dict:
    """What a saturated run's CPU split allows on this machine's cores: MB/s if every core
    did nothing but this work, and the same if the object store were the only process."""
    split = sat.get("cpu_s_per_gb")
    if not split:
        return {}
    cores = os.cpu_count() or 1
    figures = {f"{prefix}_cpu_s_per_gb_{k}": v for k, v in split.items()}
    figures[f"{prefix}_cores_busy"] = sat["cores_busy"]
    figures[f"{prefix}_cpu_ceiling_mb_s"] = round(cores / sum(split.values()) * 1000, 1)
    if split.get("seaweedfs"):
        figures[f"{prefix}_object_store_ceiling_mb_s"] = round(cores / split["seaweedfs"] * 1000, 1)
    return figures


def one_round(args: argparse.Namespace) -> dict:
    with contextlib.ExitStack() as cleanup:
        tmp = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="broker-limits-"))
        cdir = Path(tmp) / "cluster"
        store_args: list[str] = []
        if args.store_dir:
            # a directory of its own per round (--store-dir refuses one holding a store)
            own = tempfile.mkdtemp(prefix="broker-limits-", dir=args.store_dir)
            cleanup.callback(shutil.rmtree, own, ignore_errors=True)
            store_args = ["--store-dir", own]
        status = automqctl(cdir, "cluster", "up", "--brokers", "1", *store_args, timeout_s=300)
        cleanup.callback(cluster_down, cdir)  # runs before the directories go
        bootstrap = status["bootstrap_servers"]
        figures: dict = {"load_average_1m_before": os.getloadavg()[0]}
        if not (args.only_catchup or args.only_catchup_load):
            figures.update(produce_figures(cdir, args))
        if not (args.only_catchup_load or args.only_produce):
            figures.update(catchup_figures(cdir, bootstrap, args))
        if args.catchup_load_mib > 0 and not (args.only_catchup or args.only_produce):
            figures.update(catchup_under_load(cdir, bootstrap, args))
        figures["load_average_1m_after"] = os.getloadavg()[0]
    return figures


def catchup_figures(cdir: Path, bootstrap: str, args: argparse.Namespace) -> dict:
    """Step 4: raw 4 MiB GETs against a catch-up read of a cold topic."""
    topic, partitions, wanted = filled_topic(bootstrap, CATCHUP_PARTITIONS, args.catchup_mib)
    objects = committed_objects(cdir)
    raw_before = raw_get_mb_s(cdir, objects)
    restart_broker(cdir)
    catchup = sparse_catchup_mb_s(bootstrap, topic, partitions, wanted)
    restart_broker(cdir)  # cold again
    prefetching = sparse_catchup_mb_s(bootstrap, topic, partitions, wanted, prefetching=True)
    raw_after = raw_get_mb_s(cdir, objects)
    # the store right after the fill is often slower (its own writes settling): the ratio
    # is against the faster of the two baselines
    raw = max(raw_before, raw_after)
    return {
        "raw_get_4mib_before_mb_s": raw_before,
        "raw_get_4mib_after_mb_s": raw_after,
        "raw_get_4mib_mb_s": raw,
        "catchup_mb_s": catchup,
        "catchup_to_raw_get": catchup / raw,
        # the same consumer with a prefetch window that does not stall it (PREFETCHING_CONSUMER)
        "catchup_prefetching_mb_s": prefetching,
        "catchup_prefetching_to_raw_get": prefetching / raw,
    }


def window_p99_ms(intervals: list[dict], inside) -> float | None:
    """The produce p99 over the perf intervals (`perf --summary-intervals`) that `inside`
    accepts, from their merged histograms (pure)."""
    merged = LatencyHistogram()
    for row in intervals:
        if inside(row):
            merged.merge({int(k): n for k, n in row["produce_counts"].items()})
    return merged.percentile(99)


def split_windows(
    intervals: list[dict], interval_s: float, started: float, ended: float
) -> tuple[list[dict], list[dict]]:
    """perf's intervals (the first left out: connections warm up in it) wholly inside the
    wall-clock window [started, ended], and those wholly outside it (pure)."""
    during, outside = [], []
    for row in intervals[1:]:
        end = row["end_unix_s"]
        if end - interval_s >= started and end <= ended:
            during.append(row)
        elif end <= started or end - interval_s >= ended:
            outside.append(row)
    return during, outside


def catchup_under_load(cdir: Path, bootstrap: str, args: argparse.Namespace) -> dict:
    """Step 5: produce p99 while one consumer catches up from a cold topic, against the same
    run's seconds without the catch-up."""
    topic, partitions, wanted = filled_topic(
        bootstrap, CATCHUP_PARTITIONS, args.catchup_load_mib, prefix="old"
    )
    restart_broker(cdir)  # nothing of the old topic cached
    rate = args.half_rate or 45000
    with tempfile.TemporaryDirectory(prefix="catchup-load-") as tmp:
        summary_path = Path(tmp) / "perf.json"
        argv, env = perf_command(
            cdir,
            summary_path,
            "--summary-intervals",
            "--partitions",
            "6",
            "--groups",
            "1",
            "--duration",
            str(args.catchup_load_s),
            "--record-size",
            "1024",
            "--send-rate",
            f"{rate:.0f}",
        )
        with open(Path(tmp) / "perf.log", "w") as log:
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            try:
                time.sleep(args.catchup_load_delay_s)
                started = time.time()
                catchup = sparse_catchup_mb_s(bootstrap, topic, partitions, wanted)
                ended = time.time()
                code = proc.wait(timeout=args.catchup_load_s + 600)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        if code != 0:
            tail = (Path(tmp) / "perf.log").read_text()[-500:]
            raise SystemExit(f"perf under catch-up failed: {tail}")
        summary = json.loads(summary_path.read_text())
    intervals = summary["intervals"]
    during, outside = split_windows(intervals, 1.0, started, ended)
    if not during or not any(row["end_unix_s"] <= started for row in outside):
        raise SystemExit(
            f"catch-up under load: {len(during)} seconds inside the catch-up and "
            f"{len(outside)} outside (none before it?); change --catchup-load-s / --catchup-load-delay-s / "
            "--catchup-load-mib"
        )
    p99_during = window_p99_ms(during, lambda _row: True)
    p99_outside = window_p99_ms(outside, lambda _row: True)
    p99_before = window_p99_ms(outside, lambda row: row["end_unix_s"] <= started)
    p99_after = window_p99_ms(outside, lambda row: row["end_unix_s"] > started)

    def rtt(rows: list[dict]) -> float | None:
        values = sorted(r["broker_rtt_p99_ms"] for r in rows if r["broker_rtt_p99_ms"])
        return values[len(values) // 2] if values else None

    return {
        "catchup_load_records_s": rate,
        "catchup_load_mb_s": catchup,
        "catchup_load_s": ended - started,
        "catchup_load_seconds_during": len(during),
        "catchup_load_seconds_outside": len(outside),
        "catchup_load_outlasted_produce": ended > intervals[-1]["end_unix_s"],
        "catchup_load_produce_p99_during_ms": p99_during,
        "catchup_load_produce_p99_outside_ms": p99_outside,
        "catchup_load_produce_p99_before_ms": p99_before,
        "catchup_load_produce_p99_after_ms": p99_after,
        # the figure: p99 during the catch-up against the seconds before it
        "catchup_load_p99_ratio": p99_during / p99_before if p99_before else None,
        "catchup_load_p99_ratio_to_outside": p99_during / p99_outside,
        "catchup_load_produce_p99_whole_run_ms": summary["produce_p99_ms"],
        "catchup_load_e2e_p99_ms": summary["e2e_p99_ms"],
        "catchup_load_broker_rtt_p99_during_ms": rtt(during),
        "catchup_load_broker_rtt_p99_outside_ms": rtt(outside),
    }


def produce_figures(cdir: Path, args: argparse.Namespace) -> dict:
    """Steps 1-3: the disk baseline, saturated produce, half load."""
    disk = disk_write_fdatasync_mb_s(cdir)
    common = ["--partitions", "6", "--groups", "0", "--duration", str(args.saturated_s)]
    sat_1k = perf(cdir, *common, "--record-size", "1024", "--send-rate", "300000")
    sat_64k = perf(cdir, *common, "--record-size", "65536", "--send-rate", "20000")
    # half of this run's saturation, or a fixed rate (to compare trees at the same load)
    half_rate = args.half_rate or sat_1k["produce_mb_s"] * 1e6 / 1024 / 2
    half = perf(
        cdir,
        "--partitions",
        "6",
        "--groups",
        "1",
        "--duration",
        str(args.half_s),
        "--record-size",
        "1024",
        "--send-rate",
        f"{half_rate:.0f}",
    )
    return {
        "disk_write_fdatasync_1mib_mb_s": disk,
        "produce_1k_saturated_mb_s": sat_1k["produce_mb_s"],
        "produce_64k_saturated_mb_s": sat_64k["produce_mb_s"],
        "produce_64k_to_disk": sat_64k["produce_mb_s"] / disk,
        **cpu_ceiling(sat_1k, "produce_1k"),
        **cpu_ceiling(sat_64k, "produce_64k"),
        "half_load_records_s": half_rate,
        "half_produce_p99_ms": half["produce_p99_ms"],
        "half_produce_p999_ms": half["produce_p999_ms"],
        "half_max_interval_produce_p99_ms": half["max_interval_produce_p99_ms"],
        "half_e2e_p99_ms": half["e2e_p99_ms"],
        # librdkafka's request round trips (measured in C; perf reports them since 06adb07)
        "half_broker_rtt_p99_ms": half.get("broker_rtt_p99_ms"),
        "half_max_interval_broker_rtt_p99_ms": half.get("max_interval_broker_rtt_p99_ms"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--saturated-s", type=float, default=20)
    ap.add_argument("--half-s", type=float, default=60)
    ap.add_argument("--catchup-mib", type=int, default=512)
    ap.add_argument(
        "--half-rate",
        type=float,
        default=0,
        help="records/s of the half-load step (default: half of the saturated 1 KiB rate)",
    )
    ap.add_argument(
        "--only-catchup", action="store_true", help="the raw-GET baseline and catch-up only"
    )
    ap.add_argument(
        "--catchup-load-mib", type=int, default=768, help="step 5's old topic (0: no step 5)"
    )
    ap.add_argument("--catchup-load-s", type=float, default=60, help="step 5's produce run")
    ap.add_argument(
        "--catchup-load-delay-s",
        type=float,
        default=20,
        help="step 5: seconds after perf is started that the catch-up begins",
    )
    ap.add_argument("--only-catchup-load", action="store_true", help="step 5 only")
    ap.add_argument(
        "--only-produce", action="store_true", help="steps 1-3 only (disk, saturated, half load)"
    )
    ap.add_argument(
        "--store-dir",
        type=Path,
        default=None,
        help="keep each round's object store under this directory (cluster up --store-dir), "
        "e.g. a tmpfs such as /dev/shm: another device than the WAL's",
    )
    args = ap.parse_args()
    rounds = [one_round(args) for _ in range(args.rounds)]
    medians = {
        k: round(statistics.median(r[k] for r in rounds), 3)
        for k in rounds[0]
        # an older perf reports no round trips; flags are not figures
        if all(r[k] is not None and not isinstance(r[k], bool) for r in rounds)
    }
    print(json.dumps({"medians": medians, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
