"""Produce latency of erasure-coded partitions through a stock Kafka client (issue #14).

One `automqctl cluster up --brokers 6` and, in the same run:
(a) raw disk baseline: write a record-sized block + fsync to a file in the cluster directory
    (the disk the shard stores and WALs use), p50/p99;
(b) a leader topic (1 partition; WAL = a file on the same disk): confluent-kafka, acks=all,
    one message at a time (each waits for its ack), p50/p99;
(c) the same on an erasure topic (RS(4,2), `automq.partition.mode=erasure`), all 6 brokers
    healthy;
(d) the erasure topic with 2 of the 6 brokers (not the one the client writes to) paused
    with SIGSTOP for the whole case;
(e) the erasure topic with 2 brokers "slow": paused in turns (each of the 2 is stopped for
    `--slow-pause-ms` of every 2 x that, alternately, so at any time one of them is stopped).
(f) the erasure topic with 2 brokers' shard stores slow: every write to them delayed by
    `--slow-ms` (the brokers are restarted once with `INJECT_DELAY_ENV` set; the
    delay is switched on over HTTP for the case only).
(c), (e) and (f) alternate in blocks of `--block` records through one producer (the cycles
go through every order of the three), so the shared machine's noise falls on all alike.
Medians over --reps of each case's p50/p99; ratios against (a) and (c) of the same run.

Example::

    python benchmarks/erasure_produce_bench.py --records 300 --reps 3 --record-bytes 1024
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from cli.local_cluster import LocalCluster  # noqa: E402
from dataplane.erasure.store_client import ShardStoreClient  # noqa: E402
from dataplane.erasure.store_server import INJECT_DELAY_ENV  # noqa: E402
from tests.e2e.ledger import automqctl, create_topic  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(latencies_ms: list[float]) -> dict:
    return {"p50": percentile(latencies_ms, 0.5), "p99": percentile(latencies_ms, 0.99)}


def raw_fsync(directory: Path, record_bytes: int, records: int) -> dict:
    path = directory / "raw-fsync.bin"
    block = os.urandom(record_bytes)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    out = []
    try:
        for _ in range(records):
            began = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            out.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(fd)
        path.unlink()
    return summary(out)


class OneAtATime:
    """A confluent-kafka producer (acks=all) sending one record at a time, each waiting for
    its ack; `send(n)` returns the n latencies in ms."""

    def __init__(self, bootstrap: str, topic: str, record_bytes: int):
        self.topic = topic
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "linger.ms": 0,
                "enable.idempotence": False,
            }
        )
        self.value = os.urandom(record_bytes)
        self.errors: list[str] = []
        for _ in range(5):  # warm up: connections, metadata
            self.producer.produce(topic, value=self.value, partition=0)
            self.producer.flush(30)

    def send(self, records: int) -> list[float]:
        out: list[float] = []
        for _ in range(records):
            began = time.perf_counter()
            self.producer.produce(
                self.topic,
                value=self.value,
                partition=0,
                on_delivery=lambda err, _msg: self.errors.append(str(err)) if err else None,
            )
            self.producer.flush(30)
            out.append((time.perf_counter() - began) * 1000)
        if self.errors:
            raise RuntimeError(f"{len(self.errors)} produce errors, e.g. {self.errors[0]}")
        return out


def produce_one_at_a_time(bootstrap: str, topic: str, record_bytes: int, records: int) -> dict:
    return summary(OneAtATime(bootstrap, topic, record_bytes).send(records))


def interleaved(
    bootstrap: str,
    topic: str,
    record_bytes: int,
    records: int,
    block: int,
    modes: dict[str, Callable[[], contextlib.AbstractContextManager]],
) -> dict[str, dict]:
    """The erasure topic in each mode (a context manager making it so), alternating in
    blocks of `block` records through one producer and changing the order each cycle, so
    the machine's noise falls on all modes alike; a summary per mode."""
    producer = OneAtATime(bootstrap, topic, record_bytes)
    names = list(modes)
    # every order in turn: each mode follows each other mode equally often, so what a
    # block leaves behind does not fall on one mode more than on another
    orders = list(itertools.permutations(names))
    latencies: dict[str, list[float]] = {name: [] for name in names}
    for cycle in range(-(-records // block)):
        for name in orders[cycle % len(orders)]:
            with modes[name]():
                latencies[name] += producer.send(block)
            time.sleep(0.2)  # slowed brokers catch up between blocks
    return {name: summary(values) for name, values in latencies.items()}


class DelayedStores:
    """Two brokers' shard stores with an injected write delay, switched on while entered.
    The brokers are restarted once with `INJECT_DELAY_ENV` in their environment (a
    benchmark-only hook of the shard store; the delay starts switched off)."""

    def __init__(self, cluster: LocalCluster, nodes: list[int], delay_ms: int):
        self.clients: list[ShardStoreClient] = []
        self.delay_ms = delay_ms
        for node in nodes:
            name = f"broker-{node}"
            config_path = cluster.dir / name / "broker.json"
            log_path = cluster.log_path(name)
            seen = log_path.read_text(errors="replace").count("shard store on")
            if not cluster.stop(name):
                raise RuntimeError(f"{name} did not stop")
            config = json.loads(config_path.read_text())
            # a fixed port: a broker fenced while paused re-execs itself with this config
            # (and its environment), and its store must stay where this benchmark talks to it
            config.setdefault("erasure", {})["shard_store_port"] = _free_port()
            config_path.write_text(json.dumps(config))
            os.environ[INJECT_DELAY_ENV] = str(delay_ms)  # the spawned broker inherits it
            try:
                cluster._spawn(
                    name, [sys.executable, "-m", "dataplane.broker", "--config", str(config_path)]
                )
            finally:
                del os.environ[INJECT_DELAY_ENV]
            deadline = time.monotonic() + 60
            while True:
                lines = [
                    line
                    for line in log_path.read_text(errors="replace").splitlines()
                    if "shard store on" in line
                ]
                if len(lines) > seen:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not start its shard store")
                time.sleep(0.2)
            address = lines[-1].rsplit("shard store on ", 1)[1].strip()
            secret = config.get("controller_api_secret")
            self.clients.append(ShardStoreClient(address, timeout_ms=10_000, secret=secret))

    @contextlib.contextmanager
    def slow(self) -> Iterator[None]:
        try:
            for client in self.clients:
                if client.set_injected_delay(True) != self.delay_ms:
                    raise RuntimeError(f"{client.address} did not switch its delay on")
            yield
        finally:
            errors = []
            for client in self.clients:  # every one, even if one fails
                try:
                    client.set_injected_delay(False)
                except Exception as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)
            if errors:
                raise errors[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serving_broker(bootstrap: str, topic: str) -> int:
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[0].leader


class PausedInTurns:
    """Stops pid a, then b, alternately, each for pause_ms; at any time one is stopped."""

    def __init__(self, pids: list[int], pause_ms: int):
        self.pids = pids
        self.pause_s = pause_ms / 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            pid = self.pids[i % len(self.pids)]
            os.kill(pid, signal.SIGSTOP)
            self._stop.wait(self.pause_s)
            os.kill(pid, signal.SIGCONT)
            i += 1

    def __enter__(self) -> PausedInTurns:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--slow-pause-ms", type=int, default=50)
    parser.add_argument(
        "--slow-ms", type=int, default=50, help="injected write delay of the 2 slow shard stores"
    )
    parser.add_argument(
        "--block", type=int, default=25, help="records per healthy / slow block (interleaved)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="where the cluster lives")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="erasure-produce-", dir=args.dir))
    cluster_dir = base / "cluster"
    up = automqctl(
        "cluster",
        "up",
        "--format",
        "json",
        "--brokers",
        "6",
        "--wal-capacity-mib",
        "64",
        cluster_dir=cluster_dir,
    )
    if up.returncode != 0:
        automqctl("cluster", "down", cluster_dir=cluster_dir)
        print(up.stderr + up.stdout, file=sys.stderr)
        return 1
    results: dict[str, list[dict]] = {
        k: []
        for k in (
            "raw_fsync",
            "leader",
            "erasure",
            "erasure_2_paused",
            "erasure_2_slow",
            "erasure_2_delayed",
        )
    }
    pids: list[int] = []
    try:
        bootstrap = json.loads(up.stdout)["bootstrap_servers"]
        create_topic(bootstrap, "leader-topic", 1)
        create_topic(bootstrap, "erasure-topic", 1, configs={"automq.partition.mode": "erasure"})
        writer = serving_broker(bootstrap, "erasure-topic")
        others = [n for n in range(1, 7) if n != writer][-2:]
        cluster = LocalCluster(cluster_dir)
        delayed = DelayedStores(cluster, others, args.slow_ms)
        pids = [cluster.running(f"broker-{n}") for n in others]
        assert all(pids), pids
        OneAtATime(bootstrap, "erasure-topic", args.record_bytes).send(50)  # all stores known
        time.sleep(2)
        for _ in range(args.reps):
            results["raw_fsync"].append(raw_fsync(cluster_dir, args.record_bytes, args.records))
            results["leader"].append(
                produce_one_at_a_time(bootstrap, "leader-topic", args.record_bytes, args.records)
            )
            by_mode = interleaved(
                bootstrap,
                "erasure-topic",
                args.record_bytes,
                args.records,
                args.block,
                {
                    "erasure": contextlib.nullcontext,
                    "erasure_2_slow": lambda: PausedInTurns(pids, args.slow_pause_ms),
                    "erasure_2_delayed": delayed.slow,
                },
            )
            healthy, slowed = by_mode["erasure"], by_mode["erasure_2_slow"]
            results["erasure_2_delayed"].append(by_mode["erasure_2_delayed"])
            results["erasure"].append(healthy)
            results["erasure_2_slow"].append(slowed)
            time.sleep(1)
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                results["erasure_2_paused"].append(
                    produce_one_at_a_time(
                        bootstrap, "erasure-topic", args.record_bytes, args.records
                    )
                )
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            time.sleep(2)  # the paused brokers catch up (they may have been fenced)
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, TypeError):
                pass
        automqctl("cluster", "down", cluster_dir=cluster_dir)
        subprocess.run(["rm", "-rf", str(base)], check=False)
    med = {
        case: {q: round(statistics.median(r[q] for r in runs), 2) for q in ("p50", "p99")}
        for case, runs in results.items()
    }
    healthy = med["erasure"]["p99"]
    report = {
        "record_bytes": args.record_bytes,
        "records": args.records,
        "reps": args.reps,
        "writer_broker": writer,
        "paused_brokers": others,
        "median_ms": med,
        "p99_ratio_vs_raw_fsync": {
            c: round(m["p99"] / med["raw_fsync"]["p99"], 2) for c, m in med.items()
        },
        "runs_p99_vs_healthy": {
            case: [
                round(run["p99"] / healthy_run["p99"], 2)
                for run, healthy_run in zip(results[case], results["erasure"], strict=True)
            ]
            for case in ("erasure_2_slow", "erasure_2_delayed")
        },
        "p99_ratio_vs_erasure_healthy": {
            c: round(med[c]["p99"] / healthy, 2)
            for c in ("erasure_2_paused", "erasure_2_slow", "erasure_2_delayed", "leader")
        },
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
