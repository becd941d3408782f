"""The one harness every cluster benchmark uses: a cluster up and always down, the physical
baselines measured in the same run, CPU seconds by kind of process, CPU hogs, medians, JSON.

- `running_cluster(dir, brokers=N, ...)`: `automqctl cluster up --dir DIR --brokers N ...`,
  yields its status; `cluster down` in `finally`, even when the benchmark fails.
- Baselines (the "limit" printed beside a figure): `disk_write_fdatasync_mb_s` (1 MiB
  blocks, as fast as the disk takes them), `disk_fdatasync_latency_ms` (64 KiB writes +
  fdatasync paced at a byte rate: p50/p99/p999, the limit of a produce round trip at that
  rate), `raw_get_mb_s` (4 MiB ranged GETs of the committed objects from the same store),
  `raw_copy_mb_s` (whole-object GET + PUT).
- CPU: `cluster_cpu_s` (the cluster's processes by kind: broker, seaweedfs = the object
  store, controllers), `children_cpu_s` (the load generator when it runs as a child),
  `perf()` runs `automqctl perf` and adds `cpu_s_per_gb` by kind and `cores_busy`.
- `cpu_hogs(n)`: `n` busy-loop processes beside the cluster, always stopped (by pid), so a
  "busy machine" figure comes from the same run as the quiet one.
- `BrokerTimeline(dir)`: a per-second timeline of the broker while a step runs (its loop
  lag, GC pauses by generation, WAL appends, uploads, trims, server-side produce time, log
  lines; its CPU and the machine's), from `/metrics?name[]=...` (only the named
  families are rendered: ~1 ms of the broker's time, not the whole page's ~15 ms),
  /proc and the broker's log; `timeline_beside_perf` lines it up with perf's seconds.
- `medians(rounds)` and `emit(result)`: medians of every numeric figure over rounds, JSON
  on stdout.
Import it as `from benchmarks._harness import ...` (each script puts the repository root on
sys.path first). Not thread-safe unless a function says so: benchmarks call it from one thread.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import boto3  # noqa: E402
from botocore.config import Config as BotoConfig  # noqa: E402
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from cli.local_cluster import LocalCluster  # noqa: E402
from cli.top_metrics import (  # noqa: E402
    bucket_delta,
    by_label,
    counter_delta,
    histogram_buckets,
    histogram_quantile,
    parse_prometheus_text,
    series_sum,
)
from controlplane.client import ControllerClient  # noqa: E402
from dataplane.objectstore import BucketURI, object_key  # noqa: E402
from tests.support.ledger import create_topic  # noqa: E402

MIB = 1024 * 1024
RANGE_BYTES = 4 * MIB
TICK = os.sysconf("SC_CLK_TCK")
DISK_SECONDS = 5.0
DISK_LATENCY_BLOCK_BYTES = 64 * 1024


# ---------------------------------------------------------------- the cluster


def cli_env(cluster_dir: Path, tree: Path = ROOT) -> dict[str, str]:
    """The environment of an `automqctl` child acting on `cluster_dir` with `tree`'s code."""
    return {**os.environ, "AUTOMQ_CLUSTER_DIR": str(cluster_dir), "PYTHONPATH": str(tree)}


def automqctl(cluster_dir: Path, *args: str, timeout_s: float = 600) -> dict:
    """`automqctl ARGS --format json` on `cluster_dir`: its JSON answer; exits on failure."""
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *args, "--format", "json"],
        env=cli_env(cluster_dir),
        text=True,
        capture_output=True,
        timeout=timeout_s,
        cwd=ROOT,
    )
    if out.returncode != 0:
        raise SystemExit(f"automqctl {' '.join(args)} failed: {out.stderr.strip()[-500:]}")
    return json.loads(out.stdout)


def cluster_down(cluster_dir: Path) -> None:
    """`automqctl cluster down` of a benchmark's cluster (best effort: the run is over)."""
    subprocess.run(
        [sys.executable, "-m", "cli.main", "cluster", "down"],
        env=cli_env(cluster_dir),
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )


@contextlib.contextmanager
def running_cluster(
    cluster_dir: Path | None = None, *, brokers: int = 1, up_args: tuple[str, ...] = ()
) -> Iterator[tuple[Path, dict]]:
    """`cluster up --brokers N UP_ARGS` in `cluster_dir` (default: a new temporary directory,
    deleted afterwards): yields (its directory, its status); always `cluster down` after."""
    with contextlib.ExitStack() as cleanup:
        if cluster_dir is None:
            tmp = cleanup.enter_context(tempfile.TemporaryDirectory(prefix="bench-"))
            cluster_dir = Path(tmp) / "cluster"
        # registered before `up`: a failed or interrupted start-up is torn down too
        cleanup.callback(cluster_down, cluster_dir)
        status = automqctl(
            cluster_dir, "cluster", "up", "--brokers", str(brokers), *up_args, timeout_s=300
        )
        yield cluster_dir, status


def broker_pid(cluster_dir: Path, index: int = 0) -> int:
    """The pid of the cluster's `index`-th broker."""
    return int(automqctl(cluster_dir, "cluster", "status")["brokers"][index]["pid"])


def restart_broker(cluster_dir: Path, tree: Path = ROOT, node: int = 1) -> None:
    """Restart broker `node` (nothing cached), with its code from `tree` (default: this one)."""
    for verb in ("stop", "start"):
        out = subprocess.run(
            [sys.executable, "-m", "cli.main", "broker", verb, str(node)],
            env=cli_env(cluster_dir, tree),
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=180,
        )
        if out.returncode != 0:
            raise SystemExit(f"broker {verb} from {tree} failed: {out.stderr.strip()[-300:]}")


def committed_objects(cluster_dir: Path) -> list[tuple[int, int]]:
    """(object id, size in bytes) of every committed object in the controller's image."""
    config = LocalCluster(cluster_dir).load()
    client = ControllerClient(config.quorum_config().api_addresses(), api_secret=config.api_secret)
    raw = client.leader_get("/v1/image")
    image = json.loads(raw) if isinstance(raw, str) else raw
    out = []
    for oid in [*image["stream_set_objects"], *image["stream_objects"]]:
        meta = image["objects"].get(str(oid))
        if meta and meta["state"] == "committed":
            out.append((int(oid), meta["size_bytes"]))
    return out


# ---------------------------------------------------------------- producing and reading


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
        raise SystemExit("fill: records not delivered")


def produce_paced(bootstrap: str, topic: str, mib: int, seconds: float) -> int:
    """`mib` MiB of 1 KiB records spread evenly over `seconds` (many small uploads): the count."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    count = mib * MIB // 1024
    value = os.urandom(1024)
    started = time.monotonic()
    for i in range(count):
        producer.produce(topic, value=value, key=str(i).encode())
        if i % 1000 == 0:
            producer.poll(0)
            lag = started + seconds * i / count - time.monotonic()
            if lag > 0:
                time.sleep(lag)
    if producer.flush(120) != 0:
        raise SystemExit("produce: records not delivered")
    return count


def records_in(bootstrap: str, topic: str, partitions: list[int]) -> int:
    """How many records the partitions hold (high watermark minus log start)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex})
    try:
        total = 0
        for p in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            total += high - low
        return total
    finally:
        consumer.close()


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


def consume_count(bootstrap: str, topic: str, partitions: int, expected: int) -> int:
    """Records read back from offset 0 of every partition (stops at `expected` or 120 s)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen = 0
    deadline = time.monotonic() + 120
    while seen < expected and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            if not msg.error():
                seen += 1
    consumer.close()
    return seen


# A consumer set up for a catch-up: librdkafka sends a broker its next Fetch only while its
# prefetched-message queue is below queued.max.messages.kbytes (64 MiB by default), and
# parses each answer before it sends the next, so with the defaults one 48 MB answer nearly
# fills the queue and the client waits for the application instead of fetching
# (docs/benchmarks.md: 212 -> 350-390 MB/s against the same broker).
PREFETCHING_CONSUMER = {
    "queued.max.messages.kbytes": 1024 * 1024,
    "queued.min.messages": 10_000_000,
    "fetch.max.bytes": 128 * MIB,
    "max.partition.fetch.bytes": 16 * MIB,
}


def sparse_catchup_mb_s(
    bootstrap: str, topic: str, partitions: list[int], records: int, prefetching: bool = False
) -> float:
    """One consumer reads `partitions` from offset 0 to their end: MB/s of record values.
    `prefetching`: with PREFETCHING_CONSUMER's settings over the defaults here."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": uuid.uuid4().hex,
            "enable.auto.commit": False,
            "fetch.max.bytes": 64 * MIB,
            "max.partition.fetch.bytes": 8 * MIB,
            **(PREFETCHING_CONSUMER if prefetching else {}),
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    seen = size = 0
    started = None
    deadline = time.monotonic() + 300
    while seen < records and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            if msg.error():
                continue
            if started is None:
                started = time.monotonic()
            seen += 1
            size += len(msg.value() or b"")
    elapsed = time.monotonic() - (started or time.monotonic())
    consumer.close()
    if seen < records:
        raise SystemExit(f"catch-up read {seen} of {records} records")
    return size / max(elapsed, 1e-6) / 1e6


# ---------------------------------------------------------------- baselines


def s3_of(cluster_dir: Path):
    """(a boto3 S3 client, the bucket name) of the cluster's first bucket."""
    bucket = LocalCluster(cluster_dir).load().buckets[0]
    uri = BucketURI.parse(bucket.uri)
    s3 = boto3.client(
        "s3",
        endpoint_url=uri.endpoint,
        aws_access_key_id=bucket.access_key,
        aws_secret_access_key=bucket.secret_key,
        config=BotoConfig(
            region_name=uri.region, s3={"addressing_style": "path"}, max_pool_connections=16
        ),
    )
    return s3, uri.bucket


def loopback_copy_cpu_s_per_gb(mib: int = 1024, chunk_bytes: int = 4 * MIB) -> dict[str, float]:
    """The kernel's own cost of moving bytes through a loopback TCP connection, measured now:
    CPU seconds per GB of the sending thread (`sendall` of `chunk_bytes` buffers) and of the
    receiving one (`recv_into` a reused buffer), each by its thread's CPU clock. A broker
    receives every produced byte and sends it on to the object store once, and receives
    every byte it serves in a catch-up from the store and sends it to the consumer once:
    these two are the floor of its CPU per GB on this machine, whatever its code does."""
    total = mib * MIB
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    spent: dict[str, float] = {}

    def receive() -> None:
        conn, _ = listener.accept()
        with conn:
            view = memoryview(bytearray(chunk_bytes))
            got = 0
            started = time.thread_time()
            while got < total:
                n = conn.recv_into(view)
                if not n:
                    break
                got += n
            spent["recv"] = time.thread_time() - started

    receiver = threading.Thread(target=receive, name="loopback-recv")
    receiver.start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            chunk = memoryview(bytearray(chunk_bytes))
            started = time.thread_time()
            for _ in range(total // chunk_bytes):
                conn.sendall(chunk)
            spent["send"] = time.thread_time() - started
    finally:
        receiver.join(60)
        listener.close()
    gb = total / 1e9
    return {f"loopback_{k}_cpu_s_per_gb": round(v / gb, 3) for k, v in sorted(spent.items())}


def raw_get_mb_s(cluster_dir: Path, objects: list[tuple[int, int]]) -> float:
    """Every object read with 4 MiB ranged GETs, 8 threads: the store's speed in this run."""
    s3, bucket = s3_of(cluster_dir)
    ranges = [
        (oid, start, min(start + RANGE_BYTES, size) - 1)
        for oid, size in objects
        for start in range(0, size, RANGE_BYTES)
    ]

    def get(item: tuple[int, int, int]) -> int:
        oid, start, end = item
        body = s3.get_object(Bucket=bucket, Key=object_key(oid), Range=f"bytes={start}-{end}")
        return len(body["Body"].read())

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(get, ranges))
    return total / (time.monotonic() - started) / 1e6


def raw_copy_mb_s(cluster_dir: Path, objects: list[tuple[int, int]]) -> float:
    """Every object copied by whole-object GET + PUT under a scratch key (8 threads, the
    copies deleted afterwards): MB/s, the baseline of a compaction."""
    s3, bucket = s3_of(cluster_dir)

    def copy(item: tuple[int, int]) -> int:
        oid, _ = item
        data = s3.get_object(Bucket=bucket, Key=object_key(oid))["Body"].read()
        s3.put_object(Bucket=bucket, Key=f"bench-copy/{oid}", Body=data)
        return len(data)

    started = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        total = sum(pool.map(copy, objects))
    elapsed = time.monotonic() - started
    for oid, _ in objects:
        s3.delete_object(Bucket=bucket, Key=f"bench-copy/{oid}")
    return total / elapsed / 1e6


def disk_write_fdatasync_mb_s(directory: Path, seconds: float = DISK_SECONDS) -> float:
    """write + fdatasync of 1 MiB blocks, sequentially, into a new file: the disk's speed for
    what a WAL does, on the filesystem `directory` is on."""
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


def percentile(values: list[float], q: float) -> float | None:
    """The `q`-quantile (0..1) of `values` by rank (pure); None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def disk_fdatasync_latency_ms(
    directory: Path,
    byte_rate: float,
    seconds: float = 10.0,
    block_bytes: int = DISK_LATENCY_BLOCK_BYTES,
) -> dict[str, float | None]:
    """write + fdatasync of `block_bytes` blocks paced at `byte_rate` bytes/s into a new file
    in `directory` (the WAL's filesystem), `seconds` long: the latency of each write+sync as
    p50/p99/p999 in ms, the disk's own floor for a produce round trip at that byte rate."""
    block = os.urandom(block_bytes)
    path = directory / f"disk-latency-{uuid.uuid4().hex[:6]}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    gap_s = block_bytes / byte_rate
    samples: list[float] = []
    try:
        started = next_at = time.monotonic()
        while time.monotonic() - started < seconds:
            wait = next_at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            samples.append((time.perf_counter() - t0) * 1000)
            next_at += gap_s
            if len(samples) % 1024 == 0:  # a bounded file: the WAL is a ring too
                os.lseek(fd, 0, os.SEEK_SET)
    finally:
        os.close(fd)
        path.unlink()
    return {
        "p50_ms": percentile(samples, 0.5),
        "p99_ms": percentile(samples, 0.99),
        "p999_ms": percentile(samples, 0.999),
        "writes": len(samples),
    }


# ---------------------------------------------------------------- CPU accounting


def process_kind(cmdline: str) -> str:
    """The kind of a cluster process from its command line (pure): by program, not by path,
    as a cluster directory may be named "broker-..."."""
    program = cmdline.split(" --", 1)[0]
    if "weed" in program:
        return "seaweedfs"
    if "dataplane.broker" in program:
        return "broker"
    if "controlplane.server" in program:
        return "controllers"
    return "other"


def _stat_of(pid: int | str) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) of process `pid` from /proc (OSError once it
    has exited)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def cluster_cpu_s(cluster_dir: Path) -> dict[str, float]:
    """CPU seconds (user + system) of the processes whose command line names the cluster's
    directory, summed by `process_kind`."""
    out: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if str(cluster_dir) not in cmd:
                continue
            spent = _stat_of(pid)[1]
        except OSError:
            continue  # exited meanwhile
        kind = process_kind(cmd)
        out[kind] = out.get(kind, 0.0) + spent
    return out


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` (all its threads)."""
    return _stat_of(pid)[1]


def own_cpu_s() -> float:
    """CPU seconds of this process (a consumer or GET client running in it)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu_s() -> float:
    """CPU seconds of this process's finished children (and theirs: perf's workers)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cpu_split(cluster_dir: Path, work: Callable[[], object]) -> tuple[object, dict[str, float]]:
    """Run `work()` and return (its result, the CPU seconds it cost by kind: the cluster's
    processes, `this_process` and `load_generator` for finished children)."""
    before, own, children = cluster_cpu_s(cluster_dir), own_cpu_s(), children_cpu_s()
    result = work()
    after = cluster_cpu_s(cluster_dir)
    cpu = {k: v - before.get(k, 0.0) for k, v in after.items()}
    cpu["this_process"] = own_cpu_s() - own
    cpu["load_generator"] = children_cpu_s() - children
    return result, cpu


# ---------------------------------------------------------------- the load generator


def perf_command(
    cluster_dir: Path, summary: Path, *args: str, tree: Path = ROOT
) -> tuple[list[str], dict]:
    """argv and environment of `automqctl perf` writing its JSON summary to `summary`."""
    argv = [sys.executable, "-m", "cli.main", "perf", "--summary-file", str(summary), *args]
    return argv, cli_env(cluster_dir, tree)


def tree_cpu_s(root_pid: int) -> float:
    """CPU seconds of the live process `root_pid` and its live descendants (perf and its
    workers while they run)."""
    parents: dict[int, int] = {}
    spent: dict[int, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)], spent[int(pid)] = _stat_of(pid)
        except OSError:
            continue  # exited meanwhile
    total = 0.0
    for pid, cpu in spent.items():
        p = pid
        for _ in range(16):  # bounded: a process tree is shallow
            if p == root_pid:
                total += cpu
                break
            p = parents.get(p, 0)
            if p <= 1:
                break
    return total


class CpuSampler:
    """The cluster's CPU seconds by kind, and a load generator's process tree's, sampled
    every `every_s` on a thread of its own, with their wall-clock times: the CPU spent in
    any window of a run (`between`). Used as a context manager."""

    def __init__(self, cluster_dir: Path, root_pid: int, every_s: float = 0.5) -> None:
        self.cluster_dir, self.root_pid, self.every_s = cluster_dir, root_pid, every_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def _sample(self) -> None:
        cpu = cluster_cpu_s(self.cluster_dir)
        cpu["load_generator"] = tree_cpu_s(self.root_pid)
        self.samples.append((time.time(), cpu))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> CpuSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def at(self, t: float) -> dict[str, float]:
        """CPU seconds by kind at wall-clock time `t`, interpolated between samples."""
        samples = self.samples
        for (t0, a), (t1, b) in zip(samples, samples[1:], strict=False):
            if t0 <= t <= t1:
                f = (t - t0) / (t1 - t0) if t1 > t0 else 0.0
                return {k: a.get(k, 0.0) + f * (v - a.get(k, 0.0)) for k, v in b.items()}
        raise ValueError(f"no samples around {t}")

    def between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds by kind spent from `t0` to `t1` (wall-clock times)."""
        a, b = self.at(t0), self.at(t1)
        return {k: v - a.get(k, 0.0) for k, v in b.items()}


def steady_window(intervals: list[dict], after_s: float) -> tuple[float, float, float] | None:
    """(start, end, GB produced) of perf's whole intervals from `after_s` into the run to
    the last full-rate one (pure): a window that leaves out the broker's warm-up (its log
    cache's memory touched for the first time) and the producers' final flush."""
    rows = [r for r in intervals if r["t_s"] > after_s]
    if len(rows) < 3:
        return None
    rows = rows[:-1]  # the last interval may hold the end of the sends
    width = rows[1]["end_unix_s"] - rows[0]["end_unix_s"]
    start = rows[0]["end_unix_s"] - width
    gb = sum(r["produce_mb_s"] * width for r in rows) / 1000
    return start, rows[-1]["end_unix_s"], gb


def perf(
    cluster_dir: Path, *args: str, timeout_s: float = 900, steady_after_s: float | None = None
) -> dict:
    """`automqctl perf ARGS` with its JSON summary (written to a file: the console has the
    table), plus `cpu_s_per_gb`: the CPU seconds per GB produced of each kind of process over
    the run (SeaweedFS, the broker, the controllers, the load generator: perf and its
    workers, start-up included) and `cores_busy`, their sum per second of the run. With
    `steady_after_s`, also `steady_cpu_s_per_gb` and `steady_mb_s`: the same over perf's
    intervals from that many seconds into the run on (a broker's steady state: the first
    seconds of a fresh broker touch its log cache's memory for the first time, a one-off
    cost of up to ~0.4 s per GB of that memory)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        argv, env = perf_command(cluster_dir, Path(f.name), *args)
        if steady_after_s is not None:
            argv.append("--summary-intervals")
        cluster_before, children_before = cluster_cpu_s(cluster_dir), children_cpu_s()
        started = time.monotonic()
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with CpuSampler(cluster_dir, proc.pid) as sampler:
                _, stderr = proc.communicate(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
        wall_s = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"perf {' '.join(args)} failed: {stderr.strip()[-500:]}")
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
    intervals = summary.get("intervals", [])
    window = steady_window(intervals, steady_after_s) if steady_after_s is not None else None
    if window is not None and window[2] > 0:
        t0, t1, window_gb = window
        spent = sampler.between(t0, t1)
        summary["steady_cpu_s_per_gb"] = {
            k: round(v / window_gb, 2) for k, v in sorted(spent.items())
        }
        summary["steady_mb_s"] = round(window_gb * 1000 / (t1 - t0), 1)
        summary["steady_s"] = round(t1 - t0, 1)
    return summary


# ---------------------------------------------------------------- a busy machine


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[list[int]]:
    """`count` busy-loop processes (each wants one core) for the duration of the block:
    yields their pids; they are killed, by pid, when the block ends however it ends."""
    procs: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", "while True: pass"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait(30)


# ---------------------------------------------------------------- the broker's seconds

# the /metrics families the timeline reads (by sample name: `name[]` filters on those)
TIMELINE_SAMPLES = tuple(
    f"{family}{suffix}"
    for family, suffixes in (
        ("automq_event_loop_lag_seconds", ("_bucket", "_count")),
        ("automq_gc_pause_seconds", ("_bucket", "_count", "_sum")),
        ("automq_wal_append_latency_seconds", ("_bucket", "_count")),
        ("automq_request_latency_seconds", ("_bucket",)),
        ("automq_stream_uploads", ("_total",)),
        ("automq_stream_upload_latency_seconds", ("_sum",)),
        ("automq_object_store_requests", ("_total",)),
        ("automq_wal_fsyncs", ("_total",)),
        ("automq_wal_used_bytes", ("",)),
        ("automq_stream_wal_cache_bytes", ("",)),
    )
    for suffix in suffixes
)


def _metrics_url(cluster_dir: Path, index: int = 0) -> str:
    config = json.loads((cluster_dir / "cluster.json").read_text())
    port = config["brokers"][index]["metrics_port"]
    names = "&".join(f"name[]={n}" for n in TIMELINE_SAMPLES)
    return f"http://{config['host']}:{port}/metrics?{names}"


def _machine_busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of every core since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _broker_log_times(cluster_dir: Path, index: int = 0) -> list[tuple[float, str]]:
    """(Unix time, text) of each line of the broker's log (`asctime` lines only)."""
    out = []
    path = cluster_dir / "logs" / f"broker-{index + 1}.log"
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        try:
            at = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        except ValueError:
            continue
        out.append((at, line[24:200]))
    return out


class TimelineSample(NamedTuple):
    """One sample of `BrokerTimeline`: when (Unix s), the broker's /metrics families
    (TIMELINE_SAMPLES), its CPU seconds, the machine's (busy, total) jiffies, each broker
    thread's (run ns, run-queue wait ns), the disk's busy ms, the cluster's CPU s by kind."""

    at_s: float
    scrape: dict
    broker_cpu_s: float
    machine_jiffies: tuple[int, int]
    threads: dict[int, tuple[int, int]]
    disk_busy_ms: int
    cluster_cpu_s: dict[str, float]


class BrokerTimeline:
    """Samples broker `index` of `cluster_dir` once a second from its own thread while the
    block runs: `rows()` gives each second's figures (see `broker_second`). Used as a context
    manager from one thread; the sampler thread only appends to its own list."""

    def __init__(self, cluster_dir: Path, index: int = 0, interval_s: float = 1.0) -> None:
        self._dir, self._index, self._interval_s = cluster_dir, index, interval_s
        self._url = _metrics_url(cluster_dir, index)
        self._pid = _broker_process(cluster_dir, index)
        self._thread_names = _thread_names(self._pid)
        self._disk = _disk_of(cluster_dir)
        self._samples: list[TimelineSample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-timeline", daemon=True)

    def __enter__(self) -> BrokerTimeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        next_at = time.time()
        while not self._stop.is_set():
            try:
                with urllib.request.urlopen(self._url, timeout=2) as resp:
                    scrape = parse_prometheus_text(resp.read().decode(errors="replace"))
                cpu = cpu_s(self._pid)
            except (OSError, ValueError):
                scrape, cpu = None, 0.0
            if scrape is not None:
                self._samples.append(
                    TimelineSample(
                        time.time(),
                        scrape,
                        cpu,
                        _machine_busy_jiffies(),
                        _thread_schedstat(self._pid),
                        _disk_busy_ms(self._disk),
                        cluster_cpu_s(self._dir),
                    )
                )
            next_at += self._interval_s
            self._stop.wait(max(0.0, next_at - time.time()))

    def rows(self) -> list[dict]:
        """One row per pair of consecutive samples: `end_unix_s` and what the broker did in
        between (see `broker_second`); log lines from the broker's log by time."""
        logs = _broker_log_times(self._dir, self._index)
        out = []
        for before, after in zip(self._samples, self._samples[1:], strict=False):
            row = broker_second(before, after)
            row.update(threads_second(before.threads, after.threads, self._thread_names))
            row["log_lines"] = [t for at, t in logs if before.at_s <= at < after.at_s][:5]
            out.append(row)
        return out


def _broker_process(cluster_dir: Path, index: int) -> int:
    """The pid of the cluster's `index`-th broker, from /proc (no controller round trip:
    `cluster status` can time out on a loaded machine); RuntimeError if none runs."""
    config = f"{cluster_dir}/broker-{index + 1}/"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if process_kind(cmd) == "broker" and config in cmd:
            return int(pid)
    raise RuntimeError(f"no broker {index + 1} process of {cluster_dir}")


def _thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name of process `pid`, from one `py-spy dump`
    (the process stops for a few ms; before the measured step); {} without py-spy."""
    if shutil.which("py-spy") is None:
        return {}
    try:
        out = subprocess.run(
            ["py-spy", "dump", "--pid", str(pid), "--json"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return {int(t["os_thread_id"]): t["thread_name"] for t in json.loads(out.stdout)}
    except (OSError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired):
        return {}


def _thread_schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """Thread id -> (ns run on a CPU, ns waited on a run queue) of every thread of `pid`
    (/proc/PID/task/TID/schedstat)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            run_ns, wait_ns = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
        except (OSError, ValueError):
            continue
        out[int(tid)] = (int(run_ns), int(wait_ns))
    return out


def _disk_of(directory: Path) -> tuple[int, int]:
    """(major, minor) of the device `directory` is on."""
    dev = os.stat(directory).st_dev
    return os.major(dev), os.minor(dev)


def _disk_busy_ms(disk: tuple[int, int]) -> int:
    """Milliseconds the device has been doing I/O since boot (/proc/diskstats), 0 if unknown."""
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if (int(f[0]), int(f[1])) == disk:
            return int(f[12])
    return 0


# the threads whose run and run-queue wait every timeline row names (by name prefix)
TIMELINE_THREADS = {"loop": "kafka-server", "wal": "file-wal-committer", "uploader": "uploader"}


def threads_second(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], names: dict[int, str]
) -> dict:
    """The ms each named thread (TIMELINE_THREADS) ran and waited for a CPU between two
    samples, and the three threads that ran most (pure)."""
    ran = {t: (after[t][0] - before.get(t, (0, 0))[0]) / 1e6 for t in after}
    waited = {t: (after[t][1] - before.get(t, (0, 0))[1]) / 1e6 for t in after}
    row: dict = {}
    for key, prefix in TIMELINE_THREADS.items():
        tids = [t for t, n in names.items() if n.startswith(prefix) and t in after]
        if tids:
            row[f"{key}_thread_run_ms"] = round(sum(ran[t] for t in tids), 1)
            row[f"{key}_thread_runqueue_ms"] = round(sum(waited[t] for t in tids), 1)
    top = sorted(ran, key=ran.get, reverse=True)[:3]
    row["busiest_threads_ms"] = {names.get(t, str(t)): round(ran[t], 1) for t in top}
    return row


def _top_bucket_ms(buckets: dict[float, float]) -> float | None:
    """The upper bound (ms) of the highest bucket that observed anything (pure): the
    interval's max, to the bucket's precision; None without observations."""
    last, seen = None, 0.0
    for bound in sorted(buckets):
        if buckets[bound] > seen:
            last = bound
            seen = buckets[bound]
    if last is None:
        return None
    return None if math.isinf(last) else round(last * 1000, 2)


def broker_second(before: TimelineSample, after: TimelineSample) -> dict:
    """What a broker did between two timeline samples (pure): loop lag p99 / max (ms, the
    bucket bound), GC collections and their time by generation, the longest GC pause, WAL
    append p99 / max and fsyncs, the server-side Produce p99 / max, uploads finished and
    their time, object store requests by operation, the WAL's used bytes' change (a drop: a
    trim), the CPU share of the broker, SeaweedFS and the controllers, the machine's busy
    share and the disk's."""
    a, b = before.scrape, after.scrape
    dt = max(after.at_s - before.at_s, 1e-6)

    def hist(name: str, only: dict | None = None) -> dict[float, float]:
        return bucket_delta(histogram_buckets(a, name, only), histogram_buckets(b, name, only))

    def p99_ms(buckets: dict[float, float]) -> float | None:
        q = histogram_quantile(buckets, 0.99)
        return None if q is None else round(q * 1000, 2)

    def delta(name: str, match: dict | None = None) -> float:
        return counter_delta(series_sum(a, name, match), series_sum(b, name, match))

    lag, wal = hist("automq_event_loop_lag_seconds"), hist("automq_wal_append_latency_seconds")
    produce = hist("automq_request_latency_seconds", {"api": frozenset({"Produce"})})
    gc_counts, gc_ms = {}, {}
    for gen, n in by_label(b, "automq_gc_pause_seconds_count", "generation").items():
        gc_counts[gen] = n - by_label(a, "automq_gc_pause_seconds_count", "generation").get(gen, 0)
        gc_ms[gen] = round(
            (
                by_label(b, "automq_gc_pause_seconds_sum", "generation").get(gen, 0)
                - by_label(a, "automq_gc_pause_seconds_sum", "generation").get(gen, 0)
            )
            * 1000,
            2,
        )
    ops = by_label(b, "automq_object_store_requests_total", "op")
    ops_before = by_label(a, "automq_object_store_requests_total", "op")
    wal_used = (series_sum(b, "automq_wal_used_bytes") or 0) - (
        series_sum(a, "automq_wal_used_bytes") or 0
    )
    return {
        "end_unix_s": round(after.at_s, 3),
        "loop_lag_p99_ms": p99_ms(lag),
        "loop_lag_max_ms": _top_bucket_ms(lag),
        "gc_collections": {g: int(n) for g, n in gc_counts.items() if n},
        "gc_ms": {g: ms for g, ms in gc_ms.items() if ms},
        "gc_max_ms": _top_bucket_ms(hist("automq_gc_pause_seconds")),
        "wal_append_p99_ms": p99_ms(wal),
        "wal_append_max_ms": _top_bucket_ms(wal),
        "wal_fsyncs": int(delta("automq_wal_fsyncs_total")),
        "server_produce_p99_ms": p99_ms(produce),
        "server_produce_max_ms": _top_bucket_ms(produce),
        "uploads": int(delta("automq_stream_uploads_total")),
        "upload_s": round(delta("automq_stream_upload_latency_seconds_sum"), 3),
        "store_requests": {
            k: int(v - ops_before.get(k, 0)) for k, v in ops.items() if v - ops_before.get(k, 0)
        },
        "wal_used_mb_change": round(wal_used / 1e6, 1),
        "wal_cache_mb": round((series_sum(b, "automq_stream_wal_cache_bytes") or 0) / 1e6, 1),
        "broker_cpu_share": round((after.broker_cpu_s - before.broker_cpu_s) / dt, 2),
        **{
            f"{kind}_cpu_share": round(
                (after.cluster_cpu_s.get(kind, 0.0) - before.cluster_cpu_s.get(kind, 0.0)) / dt, 2
            )
            for kind in ("seaweedfs", "controllers")
        },
        "machine_busy_share": round(
            (after.machine_jiffies[0] - before.machine_jiffies[0])
            / max(after.machine_jiffies[1] - before.machine_jiffies[1], 1),
            2,
        ),
        "disk_busy_share": round((after.disk_busy_ms - before.disk_busy_ms) / 1000 / dt, 2),
    }


def timeline_beside_perf(intervals: list[dict], timeline: list[dict]) -> list[dict]:
    """perf's seconds (`--summary-intervals`) each beside the broker's timeline row that
    overlaps it most (the nearest end time; pure): produce p99, librdkafka's round trip
    p99 and the broker's figures in one row per second."""
    out = []
    for row in intervals:
        end = row["end_unix_s"]
        near = min(timeline, key=lambda r: abs(r["end_unix_s"] - end), default=None)
        merged = {
            "t_s": row["t_s"],
            "produce_p99_ms": None
            if row["produce_p99_ms"] is None
            else round(row["produce_p99_ms"], 1),
            "broker_rtt_p99_ms": row.get("broker_rtt_p99_ms"),
        }
        if near is not None and abs(near["end_unix_s"] - end) < 0.75:
            merged.update({k: v for k, v in near.items() if k != "end_unix_s"})
            merged["broker_offset_s"] = round(near["end_unix_s"] - end, 2)
        out.append(merged)
    return out


# ---------------------------------------------------------------- output


def medians(rounds: list[dict], digits: int = 3) -> dict:
    """The median over rounds of every figure that is a number in all of them (pure): flags
    and missing figures (an older perf reports fewer) are left out."""
    if not rounds:
        return {}
    return {
        k: round(statistics.median(r[k] for r in rounds), digits)
        for k in rounds[0]
        if all(isinstance(r.get(k), int | float) and not isinstance(r[k], bool) for r in rounds)
    }


def emit(result: dict) -> None:
    """The benchmark's result as indented JSON on stdout (progress goes to stderr)."""
    print(json.dumps(result, indent=2), flush=True)


def progress(row: dict) -> None:
    """One round's figures as a JSON line on stderr, while the benchmark goes on."""
    print(json.dumps(row), file=sys.stderr, flush=True)
