"""Kafka requests as tests and the CPU benchmarks build them (kafka-python's classes), and
the record sets the answer encoders' tests put in answers."""

from __future__ import annotations

import random
import uuid

from kafka.protocol.consumer import FetchRequest

from dataplane.formats.record_batch import RecordChunks

NIL_TOPIC_ID = uuid.UUID(int=0)


def fetch_request(
    topic: str,
    offsets: dict[int, int],
    version: int = 12,
    *,
    topic_id: uuid.UUID | None = NIL_TOPIC_ID,
    max_wait_ms: int = 0,
    min_bytes: int = 0,
    max_bytes: int = 1 << 20,
    partition_max_bytes: int = 1 << 20,
    isolation_level: int = 0,
    current_leader_epoch: int = -1,
    rack_id: str = "",
) -> FetchRequest:
    """A sessionless FetchRequest of `version` for one topic: from `offsets[p]` of each
    partition p (in the dict's order)."""
    parts = [
        FetchRequest.FetchTopic.FetchPartition(
            partition=partition,
            current_leader_epoch=current_leader_epoch,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=partition_max_bytes,
        )
        for partition, offset in offsets.items()
    ]
    return FetchRequest[version](
        replica_id=-1,
        max_wait_ms=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=[FetchRequest.FetchTopic(topic=topic, topic_id=topic_id, partitions=parts)],
        forgotten_topics_data=[],
        rack_id=rack_id,
    )


def random_record_set(rng: random.Random):
    """A partition's records as an answer may carry them: None, empty, bytes, a view with a
    length at a varint boundary, a bytearray, or `RecordChunks`."""
    kind = rng.randrange(6)
    if kind == 0:
        return None
    if kind == 1:
        return b""
    if kind == 2:
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    if kind == 3:
        return memoryview(b"\x07" * rng.choice([1, 126, 127, 128, 16_383, 16_384, 70_000]))
    if kind == 4:
        return bytearray(b"\x09" * rng.randint(1, 50))
    return RecordChunks([b"\x01" * rng.randint(1, 200), memoryview(b"\x02" * 20_000), b"\x03"])
