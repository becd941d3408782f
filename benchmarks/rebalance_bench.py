"""Rebalance time of a KIP-848 consumer group against a classic group, in the same run.

`automqctl cluster up` (3 brokers); a producer writes to a 6-partition topic all along. Per
round and per protocol (alternating): 3 confluent-kafka members of a fresh group read the
topic until each has records, then a 4th member subscribes; the figure is the time from its
`subscribe()` to its first record (it subscribes at a random moment 0-6 s after the others
read, so that it meets their heartbeats at any phase, as a real join does). Both protocols run with their defaults (classic: the
client's `heartbeat.interval.ms` 3 s, eager `range,roundrobin`; consumer: the broker's
`group.consumer.heartbeat.interval.ms` 5 s, the `uniform` assignor). The limit beside them:
a consumer that `assign()`s a partition itself (no group) until its first record.

Run: python benchmarks/rebalance_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from benchmarks._harness import emit, medians, progress, running_cluster  # noqa: E402
from tests.support.cluster import create_topic  # noqa: E402

PARTITIONS = 6
MEMBERS = 3
TIMEOUT_S = 120.0
JOIN_PHASE_S = 6.0  # longer than both protocols' heartbeat intervals (3 s, 5 s)


class Writer(threading.Thread):
    """Writes to every partition, ~`rate_per_s` records a second, until stopped."""

    def __init__(self, bootstrap: str, topic: str, rate_per_s: int = 300) -> None:
        super().__init__(daemon=True)
        self.stopped = threading.Event()
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._topic, self._rate = topic, rate_per_s

    def run(self) -> None:
        i = 0
        while not self.stopped.is_set():
            self._producer.produce(self._topic, value=b"x" * 100, partition=i % PARTITIONS)
            self._producer.poll(0)
            i += 1
            time.sleep(1 / self._rate)
        self._producer.flush(30)


def _conf(bootstrap: str, group: str, protocol: str) -> dict:
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "latest",
        "enable.auto.commit": True,
        "fetch.wait.max.ms": 100,
    }
    if protocol == "consumer":
        conf["group.protocol"] = "consumer"
    return conf


def _member(conf: dict, topic: str, first: threading.Event, stop: threading.Event) -> None:
    consumer = Consumer(conf)
    consumer.subscribe([topic])
    try:
        while not stop.is_set():
            msg = consumer.poll(0.2)
            if msg is not None and not msg.error():
                first.set()
    finally:
        consumer.close()


def join_to_first_record_s(bootstrap: str, topic: str, protocol: str) -> float:
    """One round: 3 members reading, then the 4th member's subscribe -> first record."""
    group = f"rb-{protocol}-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    firsts = [threading.Event() for _ in range(MEMBERS)]
    threads = [
        threading.Thread(target=_member, args=(_conf(bootstrap, group, protocol), topic, f, stop))
        for f in firsts
    ]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        for f in firsts:
            if not f.wait(max(0.0, deadline - time.monotonic())):
                raise SystemExit(f"{protocol}: the first {MEMBERS} members read nothing")
        # the members read right after a heartbeat of theirs: joining at once would always
        # meet them a whole interval before their next one; a real join comes at any phase
        time.sleep(random.uniform(0.0, JOIN_PHASE_S))
        consumer = Consumer(_conf(bootstrap, group, protocol))
        try:
            start = time.monotonic()
            consumer.subscribe([topic])
            while time.monotonic() - start < TIMEOUT_S:
                msg = consumer.poll(0.05)
                if msg is not None and not msg.error():
                    return time.monotonic() - start
            raise SystemExit(f"{protocol}: the new member read nothing in {TIMEOUT_S}s")
        finally:
            consumer.close()
    finally:
        stop.set()
        for t in threads:
            t.join(60)


def assign_to_first_record_s(bootstrap: str, topic: str) -> float:
    """The limit: no group, the partition assigned by the client itself."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "unused", "fetch.wait.max.ms": 100}
    )
    try:
        start = time.monotonic()
        consumer.assign([TopicPartition(topic, 0, -1)])  # the end: the next record written
        while time.monotonic() - start < TIMEOUT_S:
            msg = consumer.poll(0.05)
            if msg is not None and not msg.error():
                return time.monotonic() - start
        raise SystemExit("the assigned consumer read nothing")
    finally:
        consumer.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seed", type=int, default=848)
    args = ap.parse_args()
    random.seed(args.seed)
    with running_cluster(brokers=3) as (_cluster_dir, status):
        bootstrap = status["bootstrap_servers"]
        topic = f"rebalance-{uuid.uuid4().hex[:6]}"
        create_topic(bootstrap, topic, PARTITIONS)
        writer = Writer(bootstrap, topic)
        writer.start()
        rounds = []
        try:
            for _ in range(args.rounds):
                row = {
                    "consumer_protocol_join_to_first_record_s": join_to_first_record_s(
                        bootstrap, topic, "consumer"
                    ),
                    "classic_join_to_first_record_s": join_to_first_record_s(
                        bootstrap, topic, "classic"
                    ),
                    "limit_assign_to_first_record_s": assign_to_first_record_s(bootstrap, topic),
                }
                progress(row)
                rounds.append(row)
        finally:
            writer.stopped.set()
            writer.join(60)
    emit({"rounds": len(rounds), "medians": medians(rounds), "all": rounds})


if __name__ == "__main__":
    main()
