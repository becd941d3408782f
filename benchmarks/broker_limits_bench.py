"""One broker against the machine's limits (issue #16), every baseline measured in the same run.

    python benchmarks/broker_limits_bench.py [--rounds 1] [--saturated-s 20] [--half-s 60]
                                             [--catchup-mib 512] [--only-catchup]

Per round, on a fresh `automqctl cluster up --brokers 1` (3 controllers, SeaweedFS, the load
generator: all on this machine):
1. baseline disk: write + fdatasync of 1 MiB blocks into the cluster's directory (the
   filesystem the WAL is on), `DISK_SECONDS` long;
2. `automqctl perf --partitions 6` saturated (acks=all, idempotent) with 1 KiB and with
   64 KiB records: MB/s, and the 64 KiB figure as a ratio of the disk baseline;
3. half load: 1 KiB records at half the saturated record rate, one consumer group, `half-s`
   seconds: produce p99/p999, the worst one-second produce p99, end-to-end p99;
4. catch-up: `catchup-mib` MiB into a second topic, the broker restarted (nothing cached),
   one confluent-kafka consumer reads everything from offset 0; baseline: raw boto3 4 MiB
   ranged GETs of every committed object from the same store right before the restart and
   again right after the catch-up; the ratio is against the faster of the two.
With `--only-catchup` a round runs step 4 alone (the raw-GET baseline and the catch-up, so
their ratio still comes from one run). Prints the medians over rounds and the ratios as
JSON (each round's figures too).
"""

from __future__ import annotations

import argparse
import json
import os
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
from tests.e2e.ledger import create_topic  # noqa: E402

MIB = 1024 * 1024
DISK_SECONDS = 5.0
CATCHUP_PARTITIONS = 6


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


def perf(cluster_dir: Path, *args: str) -> dict:
    """`automqctl perf` with its JSON summary (written to a file: the console has the table)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "PYTHONPATH": str(ROOT)}
        out = subprocess.run(
            [sys.executable, "-m", "cli.main", "perf", "--summary-file", f.name, *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if out.returncode != 0:
            raise SystemExit(f"perf {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
        return json.loads(Path(f.name).read_text())


def one_round(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="broker-limits-") as tmp:
        cdir = Path(tmp) / "cluster"
        status = automqctl(cdir, "cluster", "up", "--brokers", "1", timeout_s=300)
        bootstrap = status["bootstrap_servers"]
        try:
            figures: dict = {}
            if not args.only_catchup:
                figures = produce_figures(cdir, args)
            topic = f"catchup-{uuid.uuid4().hex[:6]}"
            create_topic(bootstrap, topic, CATCHUP_PARTITIONS)
            fill(bootstrap, topic, args.catchup_mib)
            time.sleep(3)  # the last uploads
            partitions = list(range(CATCHUP_PARTITIONS))
            wanted = records_in(bootstrap, topic, partitions)
            objects = committed_objects(cdir)
            raw_before = raw_get_mb_s(cdir, objects)
            restart_broker(cdir)
            catchup = sparse_catchup_mb_s(bootstrap, topic, partitions, wanted)
            raw_after = raw_get_mb_s(cdir, objects)
        finally:
            cluster_down(cdir)
    # the store right after the fill is often slower (its own writes settling): the ratio
    # is against the faster of the two baselines
    raw = max(raw_before, raw_after)
    return {
        **figures,
        "raw_get_4mib_before_mb_s": raw_before,
        "raw_get_4mib_after_mb_s": raw_after,
        "raw_get_4mib_mb_s": raw,
        "catchup_mb_s": catchup,
        "catchup_to_raw_get": catchup / raw,
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
    args = ap.parse_args()
    rounds = [one_round(args) for _ in range(args.rounds)]
    medians = {
        k: round(statistics.median(r[k] for r in rounds), 3)
        for k in rounds[0]
        if all(r[k] is not None for r in rounds)  # an older perf reports no round trips
    }
    print(json.dumps({"medians": medians, "rounds": rounds}, indent=2))


if __name__ == "__main__":
    main()
