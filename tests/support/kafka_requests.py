"""Kafka requests as tests and the CPU benchmarks build them (kafka-python's classes)."""

from __future__ import annotations

import uuid

from kafka.protocol.consumer import FetchRequest

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
