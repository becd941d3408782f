"""Zone router (issues #19, #32): cross-AZ bytes, WAL bytes per produced byte, proxied vs
direct produce latency and remote vs local end-to-end latency, at 1 KiB and 100 B records.

One `cluster up` (3 brokers in az1..az3) per round; per record size a 6-partition topic,
one confluent-kafka producer in az1 (`client.id=...&automq_az=az1`, linger.ms=5,
idempotent) sending `--rate` records/s for `--duration` s, each carrying its send time,
and one consumer per AZ (assign, all partitions). Produce latency (send -> delivery
report) is split into direct (the partition's main is in az1) and proxied (another AZ:
RouterChannel + zone route); end-to-end latency (send -> receive) into local (the
consumer is in the main's AZ) and remote (served by the consumer's proxy, snapshot reads),
and for remote also ack -> receive (how long after the producer's ack a record is
readable in another AZ).
The counters (`automqctl cost --format json`) are taken before and after each phase:
the load (client cross-AZ record bytes, the brokers' own cross-AZ bytes per record byte,
WAL data bytes per produced byte, the Kafka comparison) and an idle window with the
consumers still polling (the brokers' cross-AZ bytes per second per broker pair). The
same-run physical limits: write+fdatasync latency on the WAL's disk and the object
store's small PUT latency (the RouterChannel's floor). Prints one JSON document (medians
over `--rounds`).

Example::

    python benchmarks/zone_router_bench.py --duration 20 --rate 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import struct
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from benchmarks._harness import (  # noqa: E402
    automqctl,
    disk_fdatasync_latency_ms,
    emit,
    medians,
    percentile,
    progress,
    running_cluster,
    s3_of,
)
from tests.support.cluster import create_topic, leaders  # noqa: E402

AZS = ("az1", "az2", "az3")
PRODUCER_AZ = "az1"
PARTITIONS = 6
HEARTBEAT_WAIT_S = 3.0  # the counters reach the controller with the brokers' heartbeats
SIZES = (1024, 100)
HEADER = struct.Struct(">dI")  # send time, sequence number: the start of every record


# of the brokers' cross-AZ bytes: the snapshot polls' and the zone routes' (per broker in
# `automqctl status`, summed here)
API_KEYS = tuple(
    f"broker_cross_az_{api}_{what}"
    for api in ("snapshot", "route")
    for what in ("bytes", "round_trips")
)


def _cost(cluster_dir: Path) -> dict:
    """`automqctl cost`, plus the brokers' cross-AZ bytes and round trips per API."""
    out = automqctl(cluster_dir, "cost")
    brokers = automqctl(cluster_dir, "cluster", "status")["brokers"]
    for key in API_KEYS:
        out[key] = sum((b.get("zone_traffic") or {}).get(key, 0) for b in brokers)
    return out


def _delta(after: dict, before: dict) -> dict:
    return {
        k: v - before.get(k, 0)
        for k, v in after.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def _ms(values: list[float], q: float) -> float | None:
    got = percentile(values, q)
    return None if got is None else round(got, 1)


def _per_api(load: dict, duration_s: float, pairs: int) -> dict:
    """The snapshot polls' share of the brokers' cross-AZ bytes; per API its round trips
    per second per broker pair (over the load window, `duration_s`) and bytes per round
    trip."""
    total = load["broker_cross_az_bytes"]
    out = {
        "snapshot_share_of_broker_cross_az": round(
            load["broker_cross_az_snapshot_bytes"] / total, 3
        )
        if total
        else None
    }
    for api in ("snapshot", "route"):
        trips = load[f"broker_cross_az_{api}_round_trips"]
        out[f"{api}_round_trips_per_s_per_pair"] = round(trips / duration_s / pairs, 1)
        out[f"{api}_bytes_per_round_trip"] = (
            round(load[f"broker_cross_az_{api}_bytes"] / trips, 1) if trips else None
        )
    return out


def put_latency_ms(cluster_dir: Path, size_bytes: int, count: int = 100) -> dict:
    """Sequential PUTs of `size_bytes` to the cluster's store (then deleted): the floor of
    a RouterChannel write in this run."""
    s3, bucket = s3_of(cluster_dir)
    body = b"x" * size_bytes
    samples = []
    keys = []
    for _ in range(count):
        key = f"bench-put/{uuid.uuid4().hex}"
        t0 = time.perf_counter()
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        samples.append((time.perf_counter() - t0) * 1000)
        keys.append(key)
    for key in keys:
        s3.delete_object(Bucket=bucket, Key=key)
    return {"p50_ms": _ms(samples, 0.5), "p99_ms": _ms(samples, 0.99)}


def run_size(cluster_dir: Path, status: dict, args, record_bytes: int) -> dict:
    """One record size: the load, then the idle window; its figures."""
    brokers = {b["node_id"]: b for b in status["brokers"]}
    boot = {az: next(b["address"] for b in brokers.values() if b["az"] == az) for az in AZS}
    topic = f"zone-bench-{record_bytes}-{uuid.uuid4().hex[:4]}"
    create_topic(status["bootstrap_servers"], topic, PARTITIONS)
    leader_az = {
        p: brokers[n]["az"] for p, n in leaders(status["bootstrap_servers"], topic).items()
    }
    e2e: dict[str, list[float]] = {"local": [], "remote": []}
    # (receive time, sequence number) of each record at a remote consumer; ack time by seq
    remote_at: list[tuple[float, int]] = []
    acked_at: dict[int, float] = {}
    produce: dict[str, list[float]] = {"direct": [], "proxied": []}
    received = [0]
    lock = threading.Lock()
    stop = threading.Event()
    ready = threading.Barrier(len(AZS) + 1)

    def consume(az: str) -> None:
        c = Consumer(
            {
                "bootstrap.servers": boot[az],
                "client.id": f"bench&automq_az={az}",
                "group.id": f"bench-{az}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
            }
        )
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        ready.wait()
        try:
            while not stop.is_set():
                msg = c.poll(0.1)
                if msg is None or msg.error() is not None:
                    continue
                now = time.time()
                sent, seq = HEADER.unpack(msg.value()[: HEADER.size])
                kind = "local" if leader_az[msg.partition()] == az else "remote"
                with lock:
                    e2e[kind].append((now - sent) * 1000)
                    received[0] += 1
                    if kind == "remote":
                        remote_at.append((now, seq))
        finally:
            c.close()

    threads = [threading.Thread(target=consume, args=(az,), daemon=True) for az in AZS]
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(args.warmup_s)
    producer = Producer(
        {
            "bootstrap.servers": boot[PRODUCER_AZ],
            "client.id": f"bench&automq_az={PRODUCER_AZ}",
            "linger.ms": 5,
            "enable.idempotence": True,
        }
    )

    def delivered(err, msg) -> None:
        if err is None:
            now = time.time()
            sent, seq = HEADER.unpack(msg.value()[: HEADER.size])
            acked_at[seq] = now
            kind = "direct" if leader_az[msg.partition()] == PRODUCER_AZ else "proxied"
            produce[kind].append((now - sent) * 1000)

    time.sleep(HEARTBEAT_WAIT_S)
    before = _cost(cluster_dir)
    load_started = time.monotonic()
    pad = b"x" * max(record_bytes - HEADER.size, 0)
    interval = 1.0 / args.rate
    end = time.monotonic() + args.duration
    sent = 0
    next_send = time.monotonic()
    while time.monotonic() < end:
        producer.produce(
            topic, HEADER.pack(time.time(), sent) + pad, partition=sent % PARTITIONS,
            on_delivery=delivered,
        )  # fmt: skip
        producer.poll(0)
        sent += 1
        next_send += interval
        time.sleep(max(0.0, next_send - time.monotonic()))
    producer.flush(60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and received[0] < sent * len(AZS):
        time.sleep(0.1)
    time.sleep(HEARTBEAT_WAIT_S)
    load = _delta(_cost(cluster_dir), before)
    load_s = time.monotonic() - load_started  # sending, draining, the last heartbeat
    # idle: nothing produced, the consumers still long-polling their brokers
    idle_before = _cost(cluster_dir)
    time.sleep(args.idle_s)
    idle = _delta(_cost(cluster_dir), idle_before)
    stop.set()
    for t in threads:
        t.join(10)
    after_ack = [(at - acked_at[seq]) * 1000 for at, seq in remote_at if seq in acked_at]
    record = load["produced_bytes"] + load["consumed_bytes"]
    pairs = len(AZS) * (len(AZS) - 1)  # (proxy, main) pairs of brokers in different AZs
    row = {
        "record_bytes": record_bytes,
        "records_sent": sent,
        "records_received": received[0],
        "client_cross_az_bytes": load["cross_az_bytes"],
        "broker_cross_az_bytes": load["broker_cross_az_bytes"],
        "broker_cross_az_per_record_byte": round(load["broker_cross_az_bytes"] / record, 5)
        if record
        else None,
        # what the brokers' cross-AZ bytes are made of (the snapshot polls' share, the
        # round trips per second per broker pair and their bytes, the zone routes')
        **_per_api(load, load_s, pairs),
        "wal_bytes_per_produced_byte": round(load["wal_data_bytes"] / load["produced_bytes"], 3)
        if load["produced_bytes"]
        else None,
        "produce_direct_p99_ms": _ms(produce["direct"], 0.99),
        "produce_proxied_p99_ms": _ms(produce["proxied"], 0.99),
        "produce_direct_p50_ms": _ms(produce["direct"], 0.5),
        "produce_proxied_p50_ms": _ms(produce["proxied"], 0.5),
        "e2e_local_p99_ms": _ms(e2e["local"], 0.99),
        "e2e_remote_p99_ms": _ms(e2e["remote"], 0.99),
        "e2e_local_p50_ms": _ms(e2e["local"], 0.5),
        "remote_after_ack_p50_ms": _ms(after_ack, 0.5),
        "remote_after_ack_p99_ms": _ms(after_ack, 0.99),
        "e2e_remote_p50_ms": _ms(e2e["remote"], 0.5),
        "idle_broker_cross_az_bytes_per_s_per_pair": round(
            idle["broker_cross_az_bytes"] / args.idle_s / pairs, 1
        ),
        "cost_cross_az_usd": load["cross_az_cost_usd"],
        "kafka_cross_az_bytes": load["kafka_cross_az_bytes"],
        "kafka_cross_az_cost_usd": load["kafka_cross_az_cost_usd"],
        "cost_vs_kafka": round(load["cross_az_cost_usd"] / load["kafka_cross_az_cost_usd"], 4)
        if load["kafka_cross_az_cost_usd"]
        else None,
    }
    for key in ("direct", "proxied"):
        row[f"produce_{key}_count"] = len(produce[key])
    if row["produce_direct_p99_ms"] and row["produce_proxied_p99_ms"]:
        row["produce_proxied_over_direct_p99"] = round(
            row["produce_proxied_p99_ms"] / row["produce_direct_p99_ms"], 2
        )
    if row["e2e_local_p99_ms"] and row["e2e_remote_p99_ms"]:
        row["e2e_remote_over_local_p99"] = round(
            row["e2e_remote_p99_ms"] / row["e2e_local_p99_ms"], 2
        )
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s of the producer")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--upload-interval-s", type=float, default=5.0)
    ap.add_argument("--idle-s", type=float, default=10.0)
    ap.add_argument("--warmup-s", type=float, default=1.0)
    args = ap.parse_args()

    rows: dict[int, list[dict]] = {size: [] for size in SIZES}
    limits: list[dict] = []
    for _ in range(args.rounds):
        up_args = ("--upload-interval-s", str(args.upload_interval_s))
        with running_cluster(brokers=3, up_args=up_args) as (cluster_dir, status):
            for size in SIZES:
                row = run_size(cluster_dir, status, args, size)
                progress(row)
                rows[size].append(row)
            disk = disk_fdatasync_latency_ms(cluster_dir, args.rate * 1024, seconds=5)
            put = put_latency_ms(cluster_dir, 5 * 1024)
            limit = {
                "fdatasync_p50_ms": disk["p50_ms"],
                "fdatasync_p99_ms": disk["p99_ms"],
                "store_put_5k_p50_ms": put["p50_ms"],
                "store_put_5k_p99_ms": put["p99_ms"],
            }
            progress(limit)
            limits.append(limit)
    emit(
        {
            "args": vars(args),
            "medians": {str(size): medians(rows[size]) for size in SIZES},
            "physical_limit_medians": medians(limits),
            "rounds": {str(size): rows[size] for size in SIZES},
        }
    )


if __name__ == "__main__":
    main()
