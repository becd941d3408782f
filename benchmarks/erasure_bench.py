"""Erasure-coded partitions (issue #14): the codec and the shard stores, produce through a
Kafka client, and sealing, each against its baseline of the same run.

    python benchmarks/erasure_bench.py stores [--record-kib 16] [--records 300] [--reps 3]
                                              [--slow-ms 50] [--block 25] [--codec-mib 32] [--dir D]
    python benchmarks/erasure_bench.py produce [--records 300] [--reps 3] [--record-bytes 1024]
                                               [--slow-pause-ms 50] [--slow-ms 50] [--block 25] [--dir D]
    python benchmarks/erasure_bench.py seal [--mib 32] [--batch-kib 64] [--reps 3]

stores (no cluster):
(a) codec: MB/s of raw zfec encode/decode against the project's path (ErasureWriter.shards:
    encode + framing with CRC32C; the reader's path: frame checks + decode + payload CRC);
(b) bytes stored per byte produced: what the six stores' logs grew by over a healthy
    warm-up block;
(c) sequential append latency of the embedded writer to 6 shard-store processes on
    127.0.0.1, healthy, with 2 stores slowed by an injected write delay, and with 2 paused
    (SIGSTOP); the three interleaved in blocks of --block appends on the same stores, so
    the shared disk's noise falls on all three alike; p50/p99 and each run's p99 ratio to
    healthy, medians over --reps (each rep: fresh stores).
produce (`automqctl cluster up --brokers 6`, benchmarks/_harness.py):
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
seal (the controller in process, 6 shard-store processes, an embedded SeaweedFS), per
repetition on a fresh erasure topic (RS(4,2)):
1. `--mib` MiB of Kafka record batches (`--batch-kib` each) are written with the embedded
   producer to the 6 stores;
2. once the read and seal delays have passed, the broker's `ErasureSealer` seals them
   (timed: fill + range reads of the 6 stores over HTTP + decode + batch patching + object
   build + prepare + PUT + commit + drops), and the time of its PUT alone is taken from
   inside the seal;
3. the very bytes of the sealed object are PUT again under another key (the baseline).
Figures (medians over `--reps`): sealed MB/s of record bytes, raw PUT MB/s of the object,
their ratio, and the PUT's share of the seal.
JSON on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import zfec  # noqa: E402
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from benchmarks._harness import emit, percentile, running_cluster  # noqa: E402
from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.erasure_placement import erasure_settings  # noqa: E402
from controlplane.inprocess import InProcessController  # noqa: E402
from dataplane.broker.metadata import MetadataFollower  # noqa: E402
from dataplane.config import SealConfig  # noqa: E402
from dataplane.erasure.codec import ErasureCodec  # noqa: E402
from dataplane.erasure.embedded import EmbeddedErasureProducer  # noqa: E402
from dataplane.erasure.holes import classify  # noqa: E402
from dataplane.erasure.shard_format import payload_checksum  # noqa: E402
from dataplane.erasure.store import used_log_bytes  # noqa: E402
from dataplane.erasure.store_client import ShardStoreClient  # noqa: E402
from dataplane.erasure.store_server import INJECT_DELAY_ENV  # noqa: E402
from dataplane.erasure.writer import ErasureWriter  # noqa: E402
from dataplane.kafka.erasure_partition import ErasurePartition  # noqa: E402
from dataplane.kafka.erasure_seal import ErasureSealer  # noqa: E402
from dataplane.objectstore import ObjectStorage  # noqa: E402
from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402
from tests.support.ledger import create_topic  # noqa: E402

MB = 1_000_000

# ---------------------------------------------------------------- stores


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes / MB / seconds


def codec_speed(record_bytes: int, total_bytes: int) -> dict:
    codec = ErasureCodec(4, 2)
    encoder, decoder = zfec.Encoder(4, 6), zfec.Decoder(4, 6)
    payload = os.urandom(record_bytes)
    n = max(1, total_bytes // record_bytes)
    size = codec.block_length(record_bytes)
    blocks = tuple(payload.ljust(size * 4, b"\0")[i * size : (i + 1) * size] for i in range(4))
    began = time.perf_counter()
    for _ in range(n):
        raw = encoder.encode(blocks)
    raw_encode = _mbps(n * record_bytes, time.perf_counter() - began)
    with ErasureWriter([None] * 6, 1, writer_id=1) as writer:  # type: ignore[list-item]
        began = time.perf_counter()
        for _ in range(n):
            frames = writer.shards(123, payload)
        ours_encode = _mbps(n * record_bytes, time.perf_counter() - began)
    use = (2, 3, 4, 5)  # two data blocks lost: parity must be used
    raw_blocks = tuple(raw[i] for i in use)
    began = time.perf_counter()
    for _ in range(n):
        decoder.decode(raw_blocks, use)
    raw_decode = _mbps(n * record_bytes, time.perf_counter() - began)
    began = time.perf_counter()
    for _ in range(n):
        shards = [classify(frames[i], 1, 123, i).shard for i in use]
        out = codec.decode([(s.shard_index, s.block) for s in shards], record_bytes)  # type: ignore[union-attr]
        assert payload_checksum(out) == shards[0].payload_crc  # type: ignore[union-attr]
    ours_decode = _mbps(n * record_bytes, time.perf_counter() - began)
    return {
        "record_bytes": record_bytes,
        "raw_encode_mbps": round(raw_encode, 1),
        "encode_mbps": round(ours_encode, 1),
        "raw_decode_mbps": round(raw_decode, 1),
        "decode_mbps": round(ours_decode, 1),
        "frame_bytes_per_payload_byte": round(sum(len(f) for f in frames) / record_bytes, 4),
    }


def _start(data_dir: Path, delay_ms: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "dataplane.erasure.store_server", "--data-dir", str(data_dir)]
    cmd += ["--inject-delay-ms", str(delay_ms), "--inject-delay-off"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("LISTENING "):
        proc.kill()
        proc.wait()
        raise RuntimeError("shard store did not start")
    return proc, f"127.0.0.1:{line.split()[1]}"


SLOW = (1, 4)  # the two stores made slow or paused
MODES = ("healthy", "slow", "paused")


class _Stores:
    """Six store processes; `set_mode` makes stores SLOW slow (injected delay, switched over
    HTTP), paused (SIGSTOP) or healthy."""

    def __init__(self, root: Path, slow_ms: int):
        self.procs: list[subprocess.Popen] = []
        self.slow_ms = slow_ms
        addresses = []
        try:
            for i in range(6):
                proc, address = _start(root / f"store-{i}", slow_ms)
                self.procs.append(proc)
                addresses.append(address)
        except BaseException:
            self.close()  # the ones started
            raise
        self.addresses = addresses
        self.root = root
        self._control = [ShardStoreClient(a, timeout_ms=10_000) for a in addresses]

    def set_mode(self, mode: str) -> None:
        for i in SLOW:
            proc = self.procs[i]
            if mode == "paused":
                proc.send_signal(signal.SIGSTOP)
                continue
            proc.send_signal(signal.SIGCONT)
            wanted = self.slow_ms if mode == "slow" else 0
            if self._control[i].set_injected_delay(mode == "slow") != wanted:
                raise RuntimeError(f"store {i} did not switch its delay")

    def stored_bytes(self) -> int:
        # the records' bytes (each log also holds zeroed room past its end)
        return sum(used_log_bytes(self.root / f"store-{i}") for i in range(6))

    def close(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stdout:
                proc.stdout.close()


def _settle(writer: ErasureWriter, stores: _Stores) -> None:
    """Between blocks: heal, wait until no shard of the last block is in flight and no
    store is in back-off, so each block starts as the first would."""
    stores.set_mode("healthy")
    deadline = time.monotonic() + 30
    while not writer.idle():
        if time.monotonic() > deadline:
            raise RuntimeError("the writer did not settle")
        time.sleep(0.01)
    time.sleep(0.1)  # writes a paused store took while stopped land before the next block


def produce_latency(root: Path, record_bytes: int, records: int, slow_ms: int, block: int) -> dict:
    """Sequential appends of the embedded writer; healthy, slow (2 stores delayed by
    `slow_ms`) and paused (2 stores SIGSTOPped) interleaved in blocks of `block` appends on
    the same six stores (the order rotates each cycle), so the disk's and machine's noise
    falls on the three alike (the cycles go through every order of the three). Bytes stored
    per byte produced: a healthy warm-up block."""
    stores = _Stores(root, slow_ms)
    try:
        clients = [ShardStoreClient(a, timeout_ms=2_000) for a in stores.addresses]
        payload = os.urandom(record_bytes)
        latencies: dict[str, list[float]] = {mode: [] for mode in MODES}
        with ErasureWriter(clients, 1) as writer:
            before = stores.stored_bytes()
            for _ in range(block):  # warm-up: connections, files; also the bytes stored
                writer.append(payload)
            _settle(writer, stores)
            stored_per_produced = (stores.stored_bytes() - before) / (block * record_bytes)
            # every order in turn: each mode follows each other equally often
            orders = list(itertools.permutations(MODES))
            for cycle in range(-(-records // block)):
                for mode in orders[cycle % len(orders)]:
                    stores.set_mode(mode)
                    try:
                        for _ in range(block):
                            began = time.perf_counter()
                            writer.append(payload)
                            latencies[mode].append((time.perf_counter() - began) * 1000)
                    finally:
                        _settle(writer, stores)
        out: dict = {"stored_per_produced": stored_per_produced, "latencies_ms": latencies}
        for mode in MODES:
            out[mode] = {
                "p50_ms": percentile(latencies[mode], 0.5),
                "p99_ms": percentile(latencies[mode], 0.99),
            }
        for mode in ("slow", "paused"):
            out[mode]["p99_vs_healthy"] = out[mode]["p99_ms"] / out["healthy"]["p99_ms"]
        return out
    finally:
        stores.close()


def stores(args: argparse.Namespace) -> dict:
    """The stores mode: codec speed, bytes stored, append latency (see the module doc)."""
    record_bytes = args.record_kib * 1024
    summary: dict = {"codec": codec_speed(record_bytes, args.codec_mib * 1024 * 1024)}
    with tempfile.TemporaryDirectory(prefix="erasure-bench-", dir=args.dir) as tmp:
        runs = [
            produce_latency(
                Path(tmp) / f"rep{r}", record_bytes, args.records, args.slow_ms, args.block
            )
            for r in range(args.reps)
        ]
    summary["stored_per_produced"] = round(
        statistics.median(run["stored_per_produced"] for run in runs), 3
    )
    for mode in MODES:
        summary[mode] = {
            key: round(statistics.median(run[mode][key] for run in runs), 3)
            for key in runs[0][mode]
        }
    pooled = {mode: [x for run in runs for x in run["latencies_ms"][mode]] for mode in MODES}
    pooled_p99 = {mode: percentile(pooled[mode], 0.99) for mode in MODES}
    summary["pooled"] = {
        mode: {
            "samples": len(pooled[mode]),
            "p99_ms": round(pooled_p99[mode], 3),
            "p999_ms": round(percentile(pooled[mode], 0.999), 3),
            "p99_vs_healthy": round(pooled_p99[mode] / pooled_p99["healthy"], 3),
        }
        for mode in MODES
    }
    summary["runs_p99_vs_healthy"] = {
        mode: [round(run[mode]["p99_vs_healthy"], 2) for run in runs] for mode in ("slow", "paused")
    }
    return summary


# ---------------------------------------------------------------- produce


def latency_summary(latencies_ms: list[float]) -> dict:
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
    return latency_summary(out)


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
    return latency_summary(OneAtATime(bootstrap, topic, record_bytes).send(records))


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
    return {name: latency_summary(values) for name, values in latencies.items()}


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


def resume(pids: list[int]) -> None:
    """SIGCONT to every pid (those that still run)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(pid, signal.SIGCONT)


def produce(args: argparse.Namespace) -> dict:
    """The produce mode: a 6-broker cluster, leader and erasure topics (see the module doc)."""
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
    with contextlib.ExitStack() as cleanup:
        base = cleanup.enter_context(
            tempfile.TemporaryDirectory(prefix="erasure-produce-", dir=args.dir)
        )
        cluster_dir, status = cleanup.enter_context(
            running_cluster(Path(base) / "cluster", brokers=6, up_args=("--wal-capacity-mib", "64"))
        )
        cleanup.callback(resume, pids)  # before the cluster goes down
        bootstrap = status["bootstrap_servers"]
        create_topic(bootstrap, "leader-topic", 1)
        create_topic(bootstrap, "erasure-topic", 1, configs={"automq.partition.mode": "erasure"})
        writer = serving_broker(bootstrap, "erasure-topic")
        others = [n for n in range(1, 7) if n != writer][-2:]
        cluster = LocalCluster(cluster_dir)
        delayed = DelayedStores(cluster, others, args.slow_ms)
        pids += [cluster.running(f"broker-{n}") for n in others]
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
    return report


# ---------------------------------------------------------------- seal

CONFIGS = {
    "automq.partition.mode": "erasure",
    "automq.erasure.read.delay.ms": "100",
    "automq.erasure.seal.delay.ms": "100",
}


class TimedPuts:
    """The object storage, recording the last PUT's bytes and duration."""

    def __init__(self, inner: ObjectStorage):
        self.inner = inner
        self.last: tuple[int, str, bytes, float] | None = None

    def put_object(self, bucket_id: int, key: str, data: bytes, *args, **kwargs):
        began = time.perf_counter()
        answer = self.inner.put_object(bucket_id, key, data, *args, **kwargs)
        self.last = (bucket_id, key, bytes(data), time.perf_counter() - began)
        return answer

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def one_rep(
    rep: int,
    controller: InProcessController,
    image_now,
    objects: TimedPuts,
    clients: dict[int, ShardStoreClient],
    mib: int,
    batch_kib: int,
) -> dict:
    topic = f"seal-bench-{rep}"
    controller.call("create_topic", {"name": topic, "partitions": 1, "configs": CONFIGS})
    state = image_now().topic_by_name(topic)
    p = state.partitions[0]
    value = os.urandom(1000)
    per_batch = max(1, batch_kib * 1024 // 1024)
    batches = max(1, mib * 1024 * 1024 // (per_batch * 1024))
    written = 0
    with EmbeddedErasureProducer(image_now, topic, 0, store_for=lambda n: clients[n]) as producer:
        with ThreadPoolExecutor(4) as pool:
            for _ in pool.map(lambda _: producer.send([(None, value)] * per_batch), range(batches)):
                written += per_batch * len(value)
    partition = ErasurePartition(
        state.topic_id,
        topic,
        0,
        p.stream_id,
        p.leader_epoch,
        [clients[n] for n in p.shard_stores],
        erasure_settings(state.configs),
        ThreadPoolExecutor(1),
    )
    sealer = ErasureSealer(
        1,
        lambda: image_now().brokers[1].node_epoch,
        image_now,
        controller,
        objects,  # type: ignore[arg-type]
        lambda *_: partition,
        SealConfig(max_object_bytes=(mib + 8) * 1024 * 1024),
    )
    try:
        time.sleep(0.3)  # past the read and seal delays
        began = time.perf_counter()
        sealed = sealer.seal(partition)
        seal_s = time.perf_counter() - began
        assert sealed == 1, "nothing sealed"
        assert objects.last is not None
        bucket_id, _, data, put_in_seal_s = objects.last
        stream = image_now().streams[p.stream_id]
        assert stream.end_offset > stream.start_offset
        began = time.perf_counter()
        objects.inner.put_object(bucket_id, f"raw-put-{rep}", data)
        raw_put_s = time.perf_counter() - began
    finally:
        sealer.stop()
        partition.close()
    return {
        "record_mib": round(written / 1024 / 1024, 1),
        "object_mib": round(len(data) / 1024 / 1024, 1),
        "seal_mbps": round(written / MB / seal_s, 1),
        "raw_put_mbps": round(len(data) / MB / raw_put_s, 1),
        "put_in_seal_mbps": round(len(data) / MB / put_in_seal_s, 1),
        "put_share_of_seal": round(put_in_seal_s / seal_s, 2),
    }


def seal(args: argparse.Namespace) -> dict:
    """The seal mode: ErasureSealer against a raw PUT of the same object (see the module doc)."""
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="erasure-seal-bench-") as tmp:
        root = Path(tmp)
        try:
            addresses = {}
            for node in range(1, 7):
                proc, address = _start(root / f"store-{node}", 0)
                procs.append(proc)
                addresses[node] = address
            clients = {n: ShardStoreClient(a, timeout_ms=10_000) for n, a in addresses.items()}
            with EmbeddedSeaweed(root / "s3") as seaweed:
                cfg = seaweed.config
                objects = ObjectStorage(
                    f"0@s3://{cfg.buckets[0]}?region=us-east-1&endpoint={cfg.endpoint}"
                    f"&accessKey={cfg.access_key}&secretKey={cfg.secret_key}"
                )
                controller = InProcessController()
                for node in range(1, 7):
                    epoch = controller.call(
                        "register_broker",
                        {
                            "node_id": node,
                            "az": f"az{node % 3}",
                            "host": "127.0.0.1",
                            "kafka_port": 9000 + node,
                            "incarnation_id": f"bench-{node}",
                            "shard_store_port": int(addresses[node].rsplit(":", 1)[1]),
                        },
                    )["node_epoch"]
                    controller.call("broker_heartbeat", {"node_id": node, "node_epoch": epoch})
                follower = MetadataFollower(controller)
                lock = threading.Lock()

                def image_now():
                    with lock:
                        while follower.poll_once():
                            pass
                        return follower.image

                # SeaweedFS allocates its volumes at the first PUT: not part of any figure
                objects.put_object(0, "warm-up", os.urandom(args.mib * 1024 * 1024))
                try:
                    runs = [
                        one_rep(
                            r,
                            controller,
                            image_now,
                            TimedPuts(objects),
                            clients,
                            args.mib,
                            args.batch_kib,
                        )
                        for r in range(args.reps)
                    ]
                finally:
                    objects.close()
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(timeout=10)
                if proc.stdout:
                    proc.stdout.close()
    summary = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    summary["seal_vs_raw_put"] = round(summary["seal_mbps"] / summary["raw_put_mbps"], 2)
    return {"runs": runs, "median": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = ap.add_subparsers(dest="mode", required=True)
    st = modes.add_parser("stores", help="codec speed, bytes stored, append latency to 6 stores")
    st.add_argument("--record-kib", type=int, default=16)
    st.add_argument("--records", type=int, default=300)
    st.add_argument("--reps", type=int, default=3)
    st.add_argument("--slow-ms", type=int, default=50)
    st.add_argument(
        "--block", type=int, default=25, help="appends per block of one mode (interleaved)"
    )
    st.add_argument("--codec-mib", type=int, default=32)
    st.add_argument(
        "--dir", default=None, help="where the stores keep their logs (default: a temp dir)"
    )
    pr = modes.add_parser("produce", help="produce latency through a Kafka client, 6 brokers")
    pr.add_argument("--records", type=int, default=300)
    pr.add_argument("--reps", type=int, default=3)
    pr.add_argument("--record-bytes", type=int, default=1024)
    pr.add_argument("--slow-pause-ms", type=int, default=50)
    pr.add_argument(
        "--slow-ms", type=int, default=50, help="injected write delay of the 2 slow shard stores"
    )
    pr.add_argument(
        "--block", type=int, default=25, help="records per healthy / slow block (interleaved)"
    )
    pr.add_argument("--dir", type=Path, default=None, help="where the cluster lives")
    se = modes.add_parser("seal", help="sealing MB/s against a raw PUT of the same object")
    se.add_argument("--mib", type=int, default=32, help="record bytes per repetition")
    se.add_argument("--batch-kib", type=int, default=64)
    se.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    emit({"stores": stores, "produce": produce, "seal": seal}[args.mode](args))


if __name__ == "__main__":
    main()
