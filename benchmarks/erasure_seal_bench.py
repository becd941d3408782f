"""Sealing speed of an erasure-coded partition (issue #14) against a raw PUT of the same bytes.

In one run, per repetition on a fresh erasure topic (RS(4,2)):
1. `--mib` MiB of Kafka record batches (`--batch-kib` each) are written with the embedded
   producer to 6 shard-store processes on 127.0.0.1 (their logs on this disk);
2. once the read and seal delays have passed, the broker's `ErasureSealer` seals them
   (timed: fill + range reads of the 6 stores over HTTP + decode + batch patching + object
   build + prepare + PUT into an embedded SeaweedFS + commit + drops), and the time of
   its PUT alone is taken from inside the seal;
3. the very bytes of the sealed object are PUT again under another key (the baseline).

Figures (medians over `--reps`): sealed MB/s of record bytes, raw PUT MB/s of the object,
their ratio, and the PUT's share of the seal. The controller runs in process.

    python benchmarks/erasure_seal_bench.py --mib 32 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.erasure_placement import erasure_settings  # noqa: E402
from controlplane.inprocess import InProcessController  # noqa: E402
from dataplane.broker.metadata import MetadataFollower  # noqa: E402
from dataplane.config import SealConfig  # noqa: E402
from dataplane.erasure.embedded import EmbeddedErasureProducer  # noqa: E402
from dataplane.erasure.store_client import ShardStoreClient  # noqa: E402
from dataplane.kafka.erasure_partition import ErasurePartition  # noqa: E402
from dataplane.kafka.erasure_seal import ErasureSealer  # noqa: E402
from dataplane.objectstore import ObjectStorage  # noqa: E402
from dataplane.objectstore.seaweed import EmbeddedSeaweed  # noqa: E402

MB = 1_000_000
CONFIGS = {
    "automq.partition.mode": "erasure",
    "automq.erasure.read.delay.ms": "100",
    "automq.erasure.seal.delay.ms": "100",
}


def _start_store(data_dir: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "dataplane.erasure.store_server", "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("LISTENING "):
        proc.kill()
        raise RuntimeError("shard store did not start")
    return proc, f"127.0.0.1:{line.split()[1]}"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=32, help="record bytes per repetition")
    ap.add_argument("--batch-kib", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="erasure-seal-bench-") as tmp:
        root = Path(tmp)
        try:
            addresses = {}
            for node in range(1, 7):
                proc, address = _start_store(root / f"store-{node}")
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
    print(json.dumps({"runs": runs, "median": summary}, indent=2))


if __name__ == "__main__":
    main()
