"""One broker against the machine's limits (issues #16, #28), every baseline measured in the same run.

    python benchmarks/broker_limits_bench.py [--rounds 1] [--steps fixed,saturated,half,catchup,catchup-load,cpu]
        [--fixed-rate 10000] [--fixed-s 60] [--hogs 2] [--disk-s 10]
        [--saturated-s 20] [--saturated-warmup-s 15] [--half-s 60] [--half-rate 0]
        [--catchup-mib 512] [--catchup-load-mib 768] [--catchup-load-s 60] [--catchup-load-delay-s 20]
        [--cpu-rate 30000] [--cpu-mib 600] [--store-dir PATH]
        [--only-produce | --only-catchup | --only-catchup-load]

Per round, on a fresh `automqctl cluster up --brokers 1` (3 controllers, SeaweedFS, the load
generator: all on this machine; `benchmarks/_harness.py`), the steps in `--steps`:
fixed: the issue #28 target-1 step. The disk's 64 KiB write+fdatasync latency p50/p99/p999 at
   the step's byte rate in the cluster's directory (the WAL's filesystem), then `automqctl
   perf` at `fixed-rate` records/s of 1 KiB (6 partitions, acks=all, idempotent, one
   consumer group, `fixed-s` s): librdkafka's broker round trip p99 (and p999 / the broker's
   loop-lag and GC-pause p99 when perf reports them), produce p99 (librdkafka's own
   per-message latency), end-to-end p99, the worst one-second produce p99. Then the same
   again (disk latency too) with `hogs` busy-loop processes beside the cluster, and the
   busy/quiet ratio of the round-trip p99 (`--hogs 0` leaves the busy half out). Beside
   each half, every second of it (`fixed_seconds`, `busy_seconds`): perf's produce p99
   and librdkafka's round trip p99 next to what the broker did in that second
   (`BrokerTimeline`: loop lag, GC pauses by generation, WAL appends and fsyncs, the
   server-side Produce p99, uploads, the WAL's trims, the run and run-queue time of its
   event loop, WAL committer and uploader threads, the CPU of the broker and SeaweedFS, the
   machine's and the disk's busy share, log lines), the worst four seconds and the median
   second (`*_worst_seconds`, `*_median_second`).
saturated: write + fdatasync of 1 MiB blocks (the disk's MB/s), then perf saturated
   (acks=all, idempotent, no consumer) with 1 KiB and with 64 KiB records, each
   `saturated-warmup-s` + `saturated-s` long: MB/s, the 64 KiB figure against the disk, and
   the CPU seconds per GB of SeaweedFS, the broker, the controllers and the load generator
   over the whole run and over its steady part (`*_steady_cpu_s_per_gb_*`: after the
   warm-up, in which a fresh broker's log cache fills and its memory is touched for the
   first time), with the MB/s the whole run's allow on this machine's cores
   (`*_cpu_ceiling_mb_s`) or with only the object store's work (`*_object_store_ceiling_mb_s`).
   Beside the broker's CPU per GB, the floor measured in the same run: the kernel's CPU per
   GB of a loopback send plus a loopback receive (`produce_copy_floor_cpu_s_per_gb`; the
   catch-up step's `catchup_copy_floor_cpu_s_per_gb` likewise).
half: 1 KiB records at half the saturated record rate (or `--half-rate`), one consumer
   group, `half-s` s: round trip, produce p99/p999, worst second, end-to-end p99.
catchup: `catchup-mib` MiB into a new topic, the broker restarted (nothing cached), one
   confluent-kafka consumer reads it all from offset 0; then again, cold, with the
   prefetching consumer (`PREFETCHING_CONSUMER`). Baseline: raw boto3 4 MiB ranged GETs of
   every committed object from the same store before and after; ratios against the faster.
   The CPU seconds per GB served by kind (broker, seaweedfs, this process = the consumer or
   the GET client) of each read.
catchup-load: `catchup-load-mib` MiB into another topic, the broker restarted, then
   `catchup-load-s` s of the half-load produce and, `catchup-load-delay-s` in, one consumer
   reads the old topic to its end. From perf's per-second histograms: produce p99 inside
   the catch-up against the seconds before it (the first left out), and after/outside it.
cpu: `cpu-mib` MiB of 1 KiB records at `cpu-rate` records/s (a load every version of the
   code sustains, so the work is the same): the broker's CPU seconds per GB produced, the
   figure to compare two checkouts on a noisy machine (run each in turns).
`--only-produce` = fixed,saturated,half; `--only-catchup` = catchup; `--only-catchup-load` =
catchup-load. `--store-dir PATH` keeps each round's object store under PATH (`cluster up
--store-dir`, e.g. /dev/shm: another device than the WAL's). Prints JSON: the medians over
rounds, each figure beside its limit (`against_limits`), and each round's figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._harness import (  # noqa: E402
    BrokerTimeline,
    broker_pid,
    committed_objects,
    cpu_hogs,
    cpu_s,
    cpu_split,
    disk_fdatasync_latency_ms,
    disk_write_fdatasync_mb_s,
    emit,
    filled_topic,
    loopback_copy_cpu_s_per_gb,
    medians,
    perf,
    perf_command,
    progress,
    raw_get_mb_s,
    restart_broker,
    running_cluster,
    sparse_catchup_mb_s,
    timeline_beside_perf,
)
from cli.perf_histogram import LatencyHistogram  # noqa: E402

RECORD_BYTES = 1024
PARTITIONS = 6
STEPS = ("fixed", "saturated", "half", "catchup", "catchup-load", "cpu")
ONLY = {
    "only_produce": "fixed,saturated,half",
    "only_catchup": "catchup",
    "only_catchup_load": "catchup-load",
}
# The broker's own figures perf reports (librdkafka's round trips; the broker's event-loop
# lag and GC pauses once perf reads them from /metrics): passed through under the step's name.
PERF_BROKER_FIELDS = (
    "broker_rtt_p99_ms",
    # the run's round trips together: upper bounds from librdkafka's per-window percentiles
    "broker_rtt_p99_at_most_ms",
    "broker_rtt_p999_at_most_ms",
    "max_interval_broker_rtt_p99_ms",
    "broker_loop_lag_p99_ms",
    "broker_gc_pause_p99_ms",
    "broker_wal_append_p99_ms",
    # the shares that are not the broker's: the machine's wake-up lateness and librdkafka's
    # own queue before a request
    "machine_lag_p99_ms",
    "client_queue_p99_ms",
)
# (figure, the target, "<=" or ">=", the same run's physical limit beside it or None)
LIMITS = (
    ("fixed_broker_rtt_p99_ms", 5, "<=", "fixed_disk_64k_p99_ms"),
    ("fixed_broker_rtt_p999_at_most_ms", 15, "<=", "fixed_disk_64k_p999_ms"),
    ("fixed_produce_p99_ms", 10, "<=", "fixed_disk_64k_p99_ms"),
    ("fixed_e2e_p99_ms", 15, "<=", None),
    ("fixed_max_interval_produce_p99_ms", 25, "<=", None),
    ("busy_to_quiet_broker_rtt_p99", 3, "<=", "busy_to_quiet_disk_64k_p99"),
    ("half_broker_rtt_p99_ms", 15, "<=", None),
    ("half_produce_p99_ms", 25, "<=", None),
    ("half_e2e_p99_ms", 40, "<=", None),
    ("produce_64k_to_disk", None, ">=", "disk_write_fdatasync_1mib_mb_s"),
    # the broker's steady state against the targets; the whole run (a fresh broker's warm-up
    # in it) beside them
    ("produce_1k_steady_cpu_s_per_gb_broker", 1.4, "<=", "produce_copy_floor_cpu_s_per_gb"),
    ("produce_1k_cpu_s_per_gb_broker", None, "<=", None),
    ("produce_64k_steady_cpu_s_per_gb_broker", 1.0, "<=", "produce_copy_floor_cpu_s_per_gb"),
    ("produce_64k_cpu_s_per_gb_broker", None, "<=", None),
    ("catchup_prefetching_cpu_s_per_gb_broker", 0.5, "<=", "catchup_copy_floor_cpu_s_per_gb"),
    ("catchup_prefetching_to_raw_get", 0.45, ">=", "raw_get_4mib_mb_s"),
    ("catchup_load_p99_ratio", 1.5, "<=", None),
)


def perf_step(
    cdir: Path, prefix: str, rate: float, seconds: float, groups: int = 1, timeline: bool = False
) -> dict:
    """perf at `rate` records/s of 1 KiB into 6 partitions: the step's latency figures;
    with `timeline`, also every second of it beside the broker's (`BrokerTimeline`)."""
    with contextlib.ExitStack() as stack:
        seconds_of_broker = None
        if timeline:
            try:
                seconds_of_broker = stack.enter_context(BrokerTimeline(cdir))
            except (RuntimeError, OSError) as exc:  # the step's own figures stand
                print(f"no broker timeline: {exc}", file=sys.stderr)
        summary = perf(
            cdir,
            *(("--summary-intervals",) if timeline else ()),
            "--partitions",
            str(PARTITIONS),
            "--groups",
            str(groups),
            "--duration",
            str(seconds),
            "--record-size",
            str(RECORD_BYTES),
            "--send-rate",
            f"{rate:.0f}",
        )
    figures = {
        f"{prefix}_produce_mb_s": summary["produce_mb_s"],
        f"{prefix}_produce_p50_ms": summary["produce_p50_ms"],
        f"{prefix}_produce_p99_ms": summary["produce_p99_ms"],
        f"{prefix}_produce_p999_ms": summary["produce_p999_ms"],
        f"{prefix}_max_interval_produce_p99_ms": summary.get("max_interval_produce_p99_ms"),
        f"{prefix}_e2e_p99_ms": summary.get("e2e_p99_ms"),
        f"{prefix}_cores_busy": summary["cores_busy"],
    }
    # the named ones always (None until perf reports them), and any other broker figure perf adds
    names = [*PERF_BROKER_FIELDS, *(k for k in summary if k.startswith("broker_"))]
    figures.update(
        {
            f"{prefix}_{k}": summary.get(k)
            for k in names
            if not isinstance(summary.get(k), dict | list)
        }
    )
    for kind, spent in summary.get("cpu_s_per_gb", {}).items():
        figures[f"{prefix}_cpu_s_per_gb_{kind}"] = spent
    if seconds_of_broker is not None:
        rows = timeline_beside_perf(summary.get("intervals", [])[1:], seconds_of_broker.rows())
        figures.update(worst_seconds(rows, prefix))
    return figures


def worst_seconds(rows: list[dict], prefix: str, count: int = 4) -> dict:
    """The `count` seconds with the highest produce p99 (each beside what the broker did
    in it), the median second's figures, and every second (pure)."""
    measured = [r for r in rows if r.get("produce_p99_ms") is not None]
    if not measured:
        return {}
    worst = sorted(measured, key=lambda r: r["produce_p99_ms"], reverse=True)[:count]

    def median_of(key: str) -> float | None:
        values = sorted(r[key] for r in measured if isinstance(r.get(key), int | float))
        return values[len(values) // 2] if values else None

    keys = [k for k, v in measured[0].items() if isinstance(v, int | float) and k != "t_s"]
    return {
        f"{prefix}_worst_seconds": worst,
        f"{prefix}_median_second": {k: median_of(k) for k in keys},
        f"{prefix}_seconds": rows,
    }


def disk_latency_figures(cdir: Path, prefix: str, byte_rate: float, seconds: float) -> dict:
    disk = disk_fdatasync_latency_ms(cdir, byte_rate, seconds)
    return {f"{prefix}_disk_64k_{k}": v for k, v in disk.items()}


def fixed_figures(cdir: Path, args: argparse.Namespace) -> dict:
    """The fixed-rate step, quiet and with CPU hogs beside the cluster."""
    byte_rate = args.fixed_rate * RECORD_BYTES
    figures = {"fixed_records_s": args.fixed_rate, "fixed_byte_rate_mb_s": byte_rate / 1e6}
    figures.update(disk_latency_figures(cdir, "fixed", byte_rate, args.disk_s))
    figures.update(perf_step(cdir, "fixed", args.fixed_rate, args.fixed_s, timeline=True))
    if args.hogs > 0:
        with cpu_hogs(args.hogs):
            figures["busy_hogs"] = args.hogs
            figures["busy_load_average_1m"] = os.getloadavg()[0]
            figures.update(disk_latency_figures(cdir, "busy", byte_rate, args.disk_s))
            figures.update(perf_step(cdir, "busy", args.fixed_rate, args.fixed_s, timeline=True))
        for name, quiet, busy in (
            ("broker_rtt_p99", "fixed_broker_rtt_p99_ms", "busy_broker_rtt_p99_ms"),
            ("produce_p99", "fixed_produce_p99_ms", "busy_produce_p99_ms"),
            ("disk_64k_p99", "fixed_disk_64k_p99_ms", "busy_disk_64k_p99_ms"),
        ):
            if figures.get(quiet) and figures.get(busy) is not None:
                figures[f"busy_to_quiet_{name}"] = figures[busy] / figures[quiet]
    return figures


def cpu_ceiling(sat: dict, prefix: str) -> dict:
    """A saturated run's CPU split, over the whole run and in the broker's steady state (after
    `--saturated-warmup-s`), and what the whole run's allows on this machine's cores: MB/s if
    every core did nothing but this work, and the same if the object store were the only
    process."""
    split = sat.get("cpu_s_per_gb")
    if not split:
        return {}
    steady = sat.get("steady_cpu_s_per_gb", {})
    cores = os.cpu_count() or 1
    figures = {f"{prefix}_cpu_s_per_gb_{k}": v for k, v in split.items()}
    figures.update({f"{prefix}_steady_cpu_s_per_gb_{k}": v for k, v in steady.items()})
    if steady:
        figures[f"{prefix}_steady_mb_s"] = sat["steady_mb_s"]
        figures[f"{prefix}_steady_s"] = sat["steady_s"]
    figures[f"{prefix}_cores_busy"] = sat["cores_busy"]
    figures[f"{prefix}_cpu_ceiling_mb_s"] = round(cores / sum(split.values()) * 1000, 1)
    if split.get("seaweedfs"):
        figures[f"{prefix}_object_store_ceiling_mb_s"] = round(cores / split["seaweedfs"] * 1000, 1)
    return figures


def copy_floor(prefix: str) -> dict:
    """The kernel's loopback send and receive CPU per GB now (`loopback_copy_cpu_s_per_gb`)
    and their sum as `PREFIX_copy_floor_cpu_s_per_gb`: a produced byte is received from
    the client and sent to the object store, a caught-up byte received from the store and
    sent to the consumer, each once; no broker's code costs less per GB on this machine."""
    copies = loopback_copy_cpu_s_per_gb()
    return {**copies, f"{prefix}_copy_floor_cpu_s_per_gb": round(sum(copies.values()), 3)}


def saturated_figures(cdir: Path, args: argparse.Namespace) -> dict:
    """The disk's MB/s and saturated produce with 1 KiB and 64 KiB records."""
    disk = disk_write_fdatasync_mb_s(cdir)
    floor = copy_floor("produce")
    seconds = args.saturated_warmup_s + args.saturated_s
    common = ["--partitions", str(PARTITIONS), "--groups", "0", "--duration", str(seconds)]
    warm = args.saturated_warmup_s
    sat_1k = perf(
        cdir, *common, "--record-size", "1024", "--send-rate", "300000", steady_after_s=warm
    )
    sat_64k = perf(
        cdir, *common, "--record-size", "65536", "--send-rate", "20000", steady_after_s=warm
    )
    return {
        "disk_write_fdatasync_1mib_mb_s": disk,
        "produce_1k_saturated_mb_s": sat_1k["produce_mb_s"],
        "produce_64k_saturated_mb_s": sat_64k["produce_mb_s"],
        "produce_64k_to_disk": sat_64k["produce_mb_s"] / disk,
        **floor,
        **cpu_ceiling(sat_1k, "produce_1k"),
        **cpu_ceiling(sat_64k, "produce_64k"),
    }


def half_rate(args: argparse.Namespace, saturated_1k_mb_s: float | None) -> float:
    """Records/s of the half-load step: `--half-rate`, else half this round's saturated 1 KiB
    rate, else 45,000 (about half of what one broker took when the steps were written)."""
    if args.half_rate:
        return args.half_rate
    return saturated_1k_mb_s * 1e6 / RECORD_BYTES / 2 if saturated_1k_mb_s else 45000


def half_figures(cdir: Path, args: argparse.Namespace, saturated_1k_mb_s: float | None) -> dict:
    rate = half_rate(args, saturated_1k_mb_s)
    return {"half_load_records_s": rate, **perf_step(cdir, "half", rate, args.half_s)}


def per_gb(cpu: dict[str, float], gb: float, prefix: str) -> dict:
    """CPU seconds by kind divided by the GB moved, under `prefix` (pure)."""
    return {f"{prefix}_cpu_s_per_gb_{k}": round(v / gb, 3) for k, v in sorted(cpu.items()) if gb}


def catchup_figures(cdir: Path, bootstrap: str, args: argparse.Namespace) -> dict:
    """Raw 4 MiB GETs against catch-up reads of a cold topic, with their CPU by kind."""
    topic, partitions, wanted = filled_topic(bootstrap, PARTITIONS, args.catchup_mib)
    objects = committed_objects(cdir)
    stored_gb = sum(size for _, size in objects) / 1e9
    served_gb = wanted * RECORD_BYTES / 1e9
    raw_before = raw_get_mb_s(cdir, objects)
    figures: dict = {}
    for name, prefetching in (("catchup", False), ("catchup_prefetching", True)):
        restart_broker(cdir)  # cold
        time.sleep(2)  # start-up work is not catch-up work
        mb_s, cpu = cpu_split(
            cdir,
            lambda p=prefetching: sparse_catchup_mb_s(
                bootstrap, topic, partitions, wanted, prefetching=p
            ),
        )
        cpu.pop("load_generator", None)  # no child process in this step
        figures[f"{name}_mb_s"] = mb_s
        figures.update(per_gb(cpu, served_gb, name))
    raw_after, cpu = cpu_split(cdir, lambda: raw_get_mb_s(cdir, objects))
    cpu.pop("load_generator", None)
    figures.update(per_gb(cpu, stored_gb, "raw_get"))
    # the store right after the fill is often slower (its own writes settling): the ratio
    # is against the faster of the two baselines
    raw = max(raw_before, raw_after)
    return {
        **copy_floor("catchup"),
        "raw_get_4mib_before_mb_s": raw_before,
        "raw_get_4mib_after_mb_s": raw_after,
        "raw_get_4mib_mb_s": raw,
        **figures,
        "catchup_to_raw_get": figures["catchup_mb_s"] / raw,
        "catchup_prefetching_to_raw_get": figures["catchup_prefetching_mb_s"] / raw,
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


def perf_beside_catchup(
    cdir: Path, bootstrap: str, args: argparse.Namespace, old: tuple[str, list[int], int]
) -> tuple[dict, float, float, float]:
    """perf at the half-load rate with one catch-up of `old` started `catchup-load-delay-s`
    into it: (perf's summary with intervals, catch-up MB/s, its start and end, Unix time)."""
    with tempfile.TemporaryDirectory(prefix="catchup-load-") as tmp:
        summary_path = Path(tmp) / "perf.json"
        argv, env = perf_command(
            cdir,
            summary_path,
            "--summary-intervals",
            "--partitions",
            str(PARTITIONS),
            "--groups",
            "1",
            "--duration",
            str(args.catchup_load_s),
            "--record-size",
            str(RECORD_BYTES),
            "--send-rate",
            f"{catchup_load_rate(args):.0f}",
        )
        with open(Path(tmp) / "perf.log", "w") as log:
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            try:
                time.sleep(args.catchup_load_delay_s)
                started = time.time()
                catchup = sparse_catchup_mb_s(bootstrap, *old)
                ended = time.time()
                code = proc.wait(timeout=args.catchup_load_s + 600)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(30)
        if code != 0:
            tail = (Path(tmp) / "perf.log").read_text()[-500:]
            raise SystemExit(f"perf under catch-up failed: {tail}")
        return json.loads(summary_path.read_text()), catchup, started, ended


def catchup_load_rate(args: argparse.Namespace) -> float:
    """Records/s of the catch-up-load step's produce: `--half-rate`, else 45,000 (a fixed
    load, so rounds and checkouts compare)."""
    return args.half_rate or 45000


def catchup_under_load(cdir: Path, bootstrap: str, args: argparse.Namespace) -> dict:
    """Produce p99 while one consumer catches up from a cold topic, against the same run's
    seconds without the catch-up."""
    old = filled_topic(bootstrap, PARTITIONS, args.catchup_load_mib, prefix="old")
    restart_broker(cdir)  # nothing of the old topic cached
    summary, catchup, started, ended = perf_beside_catchup(cdir, bootstrap, args, old)
    intervals = summary["intervals"]
    during, outside = split_windows(intervals, 1.0, started, ended)
    if not during or not any(row["end_unix_s"] <= started for row in outside):
        # the round's other figures stand; this step's do not
        first_end = intervals[0]["end_unix_s"] if intervals else ended
        return {
            "catchup_load_error": f"{len(during)} seconds inside the catch-up and "
            f"{len(outside)} outside; the catch-up ran {started - first_end:+.1f} s to "
            f"{ended - first_end:+.1f} s from the end of perf's first second (perf starts its "
            "clock once its clients are connected: on a loaded machine that can be after the "
            "catch-up); change --catchup-load-delay-s / --catchup-load-mib / --catchup-load-s"
        }
    p99_during = window_p99_ms(during, lambda _row: True)
    p99_outside = window_p99_ms(outside, lambda _row: True)
    p99_before = window_p99_ms(outside, lambda row: row["end_unix_s"] <= started)
    p99_after = window_p99_ms(outside, lambda row: row["end_unix_s"] > started)

    def rtt(rows: list[dict]) -> float | None:
        values = sorted(r["broker_rtt_p99_ms"] for r in rows if r.get("broker_rtt_p99_ms"))
        return values[len(values) // 2] if values else None

    return {
        "catchup_load_records_s": catchup_load_rate(args),
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
        "catchup_load_p99_ratio_to_outside": p99_during / p99_outside if p99_outside else None,
        "catchup_load_produce_p99_whole_run_ms": summary["produce_p99_ms"],
        "catchup_load_e2e_p99_ms": summary["e2e_p99_ms"],
        "catchup_load_broker_rtt_p99_during_ms": rtt(during),
        "catchup_load_broker_rtt_p99_outside_ms": rtt(outside),
    }


def cpu_figures(cdir: Path, args: argparse.Namespace) -> dict:
    """The broker's CPU seconds per GB produced at a fixed rate (from its own /proc entry)."""
    pid = broker_pid(cdir)
    before = cpu_s(pid)
    result = perf(
        cdir,
        "--partitions",
        str(PARTITIONS),
        "--groups",
        "0",
        "--record-size",
        str(RECORD_BYTES),
        "--send-rate",
        str(args.cpu_rate),
        "--duration",
        f"{args.cpu_mib * 1024 / args.cpu_rate:.1f}",
    )
    spent = cpu_s(pid) - before
    return {
        "cpu_step_records_s": args.cpu_rate,
        "cpu_step_produce_mb_s": result["produce_mb_s"],
        "cpu_step_broker_cpu_s_per_gb": spent / (result["produced_mb"] / 1000),
    }


def one_round(args: argparse.Namespace) -> dict:
    with contextlib.ExitStack() as cleanup:
        up_args: tuple[str, ...] = ()
        if args.store_dir:
            # a directory of its own per round (--store-dir refuses one holding a store)
            own = tempfile.mkdtemp(prefix="broker-limits-", dir=args.store_dir)
            cleanup.callback(shutil.rmtree, own, ignore_errors=True)
            up_args = ("--store-dir", own)
        for setting in args.broker_config:
            up_args += ("--broker-config", setting)
        cdir, status = cleanup.enter_context(running_cluster(brokers=1, up_args=up_args))
        bootstrap = status["bootstrap_servers"]
        figures: dict = {"load_average_1m_before": os.getloadavg()[0]}
        steps = set(args.steps.split(","))
        if "fixed" in steps:
            figures.update(fixed_figures(cdir, args))
        if "saturated" in steps:
            figures.update(saturated_figures(cdir, args))
        if "half" in steps:
            figures.update(half_figures(cdir, args, figures.get("produce_1k_saturated_mb_s")))
        if "catchup" in steps:
            figures.update(catchup_figures(cdir, bootstrap, args))
        if "catchup-load" in steps and args.catchup_load_mib > 0:
            figures.update(catchup_under_load(cdir, bootstrap, args))
        if "cpu" in steps:
            figures.update(cpu_figures(cdir, args))
        figures["load_average_1m_after"] = os.getloadavg()[0]
    return figures


def against_limits(figures: dict) -> list[dict]:
    """Each measured figure of LIMITS beside the issue's target and the same run's physical
    limit (pure); figures the run did not measure are left out."""
    rows = []
    for name, target, sense, baseline in LIMITS:
        if figures.get(name) is None:
            continue
        row = {"figure": name, "value": round(figures[name], 3), "target": target}
        if target is not None:
            row["target_met"] = (
                figures[name] <= target if sense == "<=" else figures[name] >= target
            )
        if baseline and figures.get(baseline) is not None:
            row["same_run_limit"] = {baseline: round(figures[baseline], 3)}
        rows.append(row)
    return rows


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated of {STEPS}")
    ap.add_argument("--fixed-rate", type=float, default=10000, help="records/s of the fixed step")
    ap.add_argument("--fixed-s", type=float, default=60)
    ap.add_argument("--hogs", type=int, default=2, help="CPU hogs of the fixed step's busy half")
    ap.add_argument("--disk-s", type=float, default=10, help="the disk latency baseline's length")
    ap.add_argument("--saturated-s", type=float, default=20, help="the measured steady part")
    ap.add_argument(
        "--saturated-warmup-s",
        type=float,
        default=15,
        help="seconds of each saturated run before its steady part (a fresh broker's log "
        "cache fills: its memory is touched for the first time)",
    )
    ap.add_argument("--half-s", type=float, default=60)
    ap.add_argument(
        "--half-rate",
        type=float,
        default=0,
        help="records/s of the half-load steps (default: half of the saturated 1 KiB rate)",
    )
    ap.add_argument("--catchup-mib", type=int, default=512)
    ap.add_argument("--catchup-load-mib", type=int, default=768, help="0: no catch-up-load step")
    ap.add_argument("--catchup-load-s", type=float, default=60, help="its produce run")
    ap.add_argument(
        "--catchup-load-delay-s",
        type=float,
        default=20,
        help="seconds after perf is started that the catch-up begins",
    )
    ap.add_argument("--cpu-rate", type=int, default=30000, help="records/s of the cpu step")
    ap.add_argument("--cpu-mib", type=int, default=600, help="MiB the cpu step produces")
    for flag, steps in ONLY.items():
        ap.add_argument(
            f"--{flag.replace('_', '-')}", action="store_true", help=f"= --steps {steps}"
        )
    ap.add_argument(
        "--broker-config",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a broker setting for the round's cluster (cluster up --broker-config), e.g. "
        "network.egress_bytes_per_s=25000000; repeatable",
    )
    ap.add_argument(
        "--store-dir",
        type=Path,
        default=None,
        help="keep each round's object store under this directory (cluster up --store-dir), "
        "e.g. a tmpfs such as /dev/shm: another device than the WAL's",
    )
    args = ap.parse_args()
    for flag, steps in ONLY.items():
        if getattr(args, flag):
            args.steps = steps
    unknown = set(args.steps.split(",")) - set(STEPS)
    if unknown:
        ap.error(f"unknown steps {sorted(unknown)}: choose from {STEPS}")
    return args


def main() -> None:
    args = parse_args()
    rounds = []
    for _ in range(args.rounds):
        rounds.append(one_round(args))
        # every second of the steps is in the JSON at the end; the worst ones here
        progress({k: v for k, v in rounds[-1].items() if not k.endswith("_seconds")})
    middle = medians(rounds)
    emit({"medians": middle, "against_limits": against_limits(middle), "rounds": rounds})


if __name__ == "__main__":
    main()
