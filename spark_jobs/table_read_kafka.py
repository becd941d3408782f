"""Kafka-client reading of offset ranges into a DataFrame of Spark's Kafka-source schema:
the table sync job's stand-in while the `automq` source (spark_jobs/topic_source, which
reads committed objects straight from the buckets) is not installed.

Each Spark task reads one (partition, start, end) range with a librdkafka consumer
(read_committed, no group commits) from the brokers; the driver's job config carries the
bootstrap servers, the client's security settings come from the environment
(AUTOMQ_TABLE_KAFKA_CONFIG, JSON; never argv).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
import uuid

KAFKA_CONFIG_ENV = "AUTOMQ_TABLE_KAFKA_CONFIG"
SPLIT_OFFSETS = 200_000  # offsets one task reads at most
IDLE_TIMEOUT_S = 60.0  # a range that yields nothing for this long fails its task
SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


def read_range(bootstrap: str, topic: str, partition: int, start: int, end: int):
    """The records of offsets [start, end) of one partition (read_committed), as tuples of
    the Kafka-source schema; RuntimeError naming the range when it stalls."""
    from confluent_kafka import Consumer, TopicPartition

    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": f"automq-table-sync-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "fetch.max.bytes": 16 * 1024 * 1024,
    }
    conf.update(json.loads(os.environ.get(KAFKA_CONFIG_ENV) or "{}"))
    consumer = Consumer(conf)
    consumer.assign([TopicPartition(topic, partition, start)])
    out = []
    last_progress = time.monotonic()
    try:
        while True:
            position = consumer.position([TopicPartition(topic, partition)])[0].offset
            if position >= end:
                break
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                if time.monotonic() - last_progress > IDLE_TIMEOUT_S:
                    raise RuntimeError(
                        f"{topic}-{partition}: no records between {position} and {end} for "
                        f"{IDLE_TIMEOUT_S:.0f}s"
                    )
                continue
            last_progress = time.monotonic()
            if msg.offset() >= end:
                break
            kind, stamp = msg.timestamp()
            out.append(
                (
                    msg.key(),
                    msg.value(),
                    topic,
                    partition,
                    msg.offset(),
                    dt.datetime.fromtimestamp(stamp / 1000, tz=dt.UTC),
                    max(kind - 1, 0),  # librdkafka: 1 create time, 2 log append
                    [(k, v) for k, v in (msg.headers() or [])],
                )
            )
    finally:
        consumer.close()
    return out


def read_offsets(spark, bootstrap: str, topic: str, starts: dict, ends: dict):
    """A DataFrame of the records of [starts[p], ends[p]) of every partition."""
    ranges = []
    for partition, start in sorted(starts.items()):
        for lo in range(start, ends[partition], SPLIT_OFFSETS):
            ranges.append((partition, lo, min(lo + SPLIT_OFFSETS, ends[partition])))
    rdd = spark.sparkContext.parallelize(ranges, max(len(ranges), 1)).flatMap(
        lambda r: read_range(bootstrap, topic, r[0], r[1], r[2])
    )
    return spark.createDataFrame(rdd, SCHEMA)
