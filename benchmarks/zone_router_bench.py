"""Zone router (issue #19): cross-AZ bytes, WAL bytes per produced byte, and the end-to-end
latency of consumers served by a proxy against consumers in the partition leader's AZ.

One `cluster up` (3 brokers in az1..az3); a 6-partition topic; in each AZ one
confluent-kafka producer (`client.id=...&automq_az=azN`) sending `--record-bytes` records
at `--rate` records/s (spread over the partitions) for `--duration` s, each carrying its
send time; in each AZ one consumer (assign, all partitions) measuring send → receive per
record, split by whether the partition's leader is in the consumer's AZ (served by the
main) or not (served by the consumer's proxy). Prints one JSON document, with
`automqctl cost --format json` in it.

Example::

    python benchmarks/zone_router_bench.py --duration 20 --rate 300 --record-bytes 1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from benchmarks._harness import emit, running_cluster  # noqa: E402
from tests.support.ledger import automqctl, create_topic, leaders  # noqa: E402

AZS = ("az1", "az2", "az3")
PARTITIONS = 6


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=300.0, help="records/s per producer")
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--upload-interval-s", type=float, default=5.0)
    ap.add_argument(
        "--warmup-s",
        type=float,
        default=2.0,
        help="consumers fetch this long before the producers start (a proxy polls a main "
        "for a partition from its first fetch on; a main routes its own AZ's produce "
        "through its RouterChannel only for partitions a proxy reads)",
    )
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="zone-bench-") as tmp:
        cluster_dir = Path(tmp) / "cluster"
        up_args = ("--upload-interval-s", str(args.upload_interval_s))
        with running_cluster(cluster_dir, brokers=3, up_args=up_args) as (_, status):
            brokers = {b["node_id"]: b for b in status["brokers"]}
            boot = {az: next(b["address"] for b in brokers.values() if b["az"] == az) for az in AZS}
            topic = "zone-bench"
            create_topic(status["bootstrap_servers"], topic, PARTITIONS)
            real = leaders(status["bootstrap_servers"], topic)
            latencies: dict[str, dict[str, list[float]]] = {
                az: {"leader_az": [], "proxy": []} for az in AZS
            }
            stop = threading.Event()
            consumers_ready = threading.Barrier(len(AZS) + 1)

            def consume(az: str) -> None:
                c = Consumer(
                    {
                        "bootstrap.servers": boot[az],
                        "client.id": f"bench&automq_az={az}",
                        "group.id": f"bench-{az}",
                        "enable.auto.commit": False,
                        "fetch.wait.max.ms": 50,
                    }
                )
                c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
                consumers_ready.wait()
                try:
                    while not stop.is_set():
                        msg = c.poll(0.1)
                        if msg is None or msg.error() is not None:
                            continue
                        sent = struct.unpack(">d", msg.value()[:8])[0]
                        kind = (
                            "leader_az" if brokers[real[msg.partition()]]["az"] == az else "proxy"
                        )
                        latencies[az][kind].append((time.time() - sent) * 1000)
                finally:
                    c.close()

            threads = [threading.Thread(target=consume, args=(az,), daemon=True) for az in AZS]
            for t in threads:
                t.start()
            consumers_ready.wait()
            time.sleep(args.warmup_s)
            producers = {
                az: Producer(
                    {
                        "bootstrap.servers": boot[az],
                        "client.id": f"bench&automq_az={az}",
                        "linger.ms": 5,
                        "enable.idempotence": True,
                    }
                )
                for az in AZS
            }
            pad = b"x" * max(args.record_bytes - 8, 0)
            interval = 1.0 / args.rate
            end = time.monotonic() + args.duration
            n = 0
            next_send = time.monotonic()
            while time.monotonic() < end:
                for p in producers.values():
                    p.produce(topic, struct.pack(">d", time.time()) + pad, partition=n % PARTITIONS)
                    p.poll(0)
                n += 1
                next_send += interval
                time.sleep(max(0.0, next_send - time.monotonic()))
            for p in producers.values():
                p.flush(60)
            time.sleep(args.upload_interval_s + 3)  # proxies see data after the mains' upload
            stop.set()
            for t in threads:
                t.join(10)
            time.sleep(2)  # one more heartbeat with the counters
            cost = json.loads(automqctl("cost", "--format", "json", cluster_dir=cluster_dir).stdout)
            lat = {
                kind: [v for az in AZS for v in latencies[az][kind]]
                for kind in ("leader_az", "proxy")
            }
            result = {
                "args": vars(args),
                "records_sent": n * len(AZS),
                "records_consumed_per_kind": {k: len(v) for k, v in lat.items()},
                "latency_ms": {
                    k: {
                        "p50": round(_pct(v, 0.5), 1),
                        "p99": round(_pct(v, 0.99), 1),
                        "mean": round(statistics.fmean(v), 1) if v else None,
                    }
                    for k, v in lat.items()
                },
                "cost": cost,
            }
            emit(result)


if __name__ == "__main__":
    main()
