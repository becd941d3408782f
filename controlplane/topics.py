"""Topics and partitions: creation with balanced leaders, deletion, partition growth."""

from __future__ import annotations

import re

from controlplane import records as r
from controlplane import share_state, topic_configs
from controlplane.erasure_placement import erasure_settings, place_shard_stores
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from controlplane.placement import spread_leaders
from controlplane.requests import (
    AlterTopicConfigsRequest,
    AlterTopicConfigsResponse,
    CreatePartitionsRequest,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
)
from controlplane.streams import delete_stream_records

_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def validate_topic_name(name: str) -> None:
    """Kafka's rules: letters, digits, '.', '_', '-'; at most 249; not '.' or '..'."""
    if not _TOPIC_NAME.match(name) or name in (".", ".."):
        raise ControllerError(
            ErrorCode.INVALID_TOPIC_NAME,
            f"invalid topic name {name!r}: use 1-249 of [a-zA-Z0-9._-]",
        )


def _leader_choices(image: MetadataImage, count: int, topic_id: str) -> list[int]:
    """Leaders for `count` new partitions of `topic_id`, spread over the active brokers."""
    leaders = spread_leaders(image, count, topic_id)
    if not leaders:
        raise ControllerError(ErrorCode.NOT_ENOUGH_BROKERS, "no unfenced broker to lead partitions")
    return leaders


def _partition_records(
    image: MetadataImage,
    topic_id: str,
    name: str,
    first: int,
    count: int,
    configs: dict[str, str],
) -> list:
    recs: list = []
    next_stream = image.next_stream_id
    erasure = erasure_settings(configs)
    if erasure is None:
        kind = r.PartitionKind.LEADER
        leaders = _leader_choices(image, count, topic_id)
        stores: list[list[int]] = [[] for _ in range(count)]
    else:  # leaderless: every broker serves it, these keep its shards
        kind = r.PartitionKind.ERASURE
        leaders = [r.NO_LEADER] * count
        stores = place_shard_stores(image, first, count, erasure)
    for i, leader in enumerate(leaders):
        partition = first + i
        stream_id = next_stream + i
        recs.append(
            r.CreateStreamRecord(
                stream_id=stream_id,
                tags={"topic": name, "topic_id": topic_id, "partition": str(partition)},
            )
        )
        recs.append(
            r.PartitionRecord(
                topic_id=topic_id,
                partition=partition,
                kind=kind,
                leader_node_id=leader,
                leader_epoch=0,
                stream_id=stream_id,
                shard_stores=stores[i],
            )
        )
    return recs


def create_topic(image: MetadataImage, req: CreateTopicRequest, now_ms: int):
    validate_topic_name(req.name)
    if req.topic_id is None:
        raise ControllerError(ErrorCode.INVALID_REQUEST, "topic_id must be assigned by the API")
    if req.name in image.topic_ids_by_name:
        raise ControllerError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {req.name!r} already exists")
    configs = topic_configs.validate_new_topic_configs(req.configs)
    recs: list = [r.TopicRecord(topic_id=req.topic_id, name=req.name, configs=configs)]
    recs += _partition_records(image, req.topic_id, req.name, 0, req.partitions, configs)
    return recs, CreateTopicResponse(
        topic_id=req.topic_id, name=req.name, partitions=req.partitions
    )


def delete_topic(image: MetadataImage, req: DeleteTopicRequest, now_ms: int):
    topic = image.topic_by_name(req.name)
    if topic is None:
        raise ControllerError(ErrorCode.UNKNOWN_TOPIC, f"topic {req.name!r} does not exist")
    stream_ids = [p.stream_id for p in topic.partitions.values() if p.stream_id in image.streams]
    recs: list = delete_stream_records(image, sorted(stream_ids), now_ms)
    recs.append(r.RemoveTopicRecord(topic_id=topic.topic_id))
    recs += share_state.forget_topic_records(image, topic.topic_id)  # share groups' state
    return recs, {"topic_id": topic.topic_id}


def create_partitions(image: MetadataImage, req: CreatePartitionsRequest, now_ms: int):
    topic = image.topic_by_name(req.name)
    if topic is None:
        raise ControllerError(ErrorCode.UNKNOWN_TOPIC, f"topic {req.name!r} does not exist")
    current = len(topic.partitions)
    if req.total_count <= current:
        raise ControllerError(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {req.name!r} has {current} partitions; the new count "
            f"{req.total_count} must be greater",
        )
    recs = _partition_records(
        image, topic.topic_id, topic.name, current, req.total_count - current, topic.configs
    )
    return recs, {"partitions": req.total_count}


def alter_topic_configs(image: MetadataImage, req: AlterTopicConfigsRequest, now_ms: int):
    """Set/delete/append/subtract a topic's configs in one step: the topic record is
    written again with the whole new config map (partitions are untouched), or nothing is
    written when any entry is refused or nothing changes."""
    topic = image.topic_by_name(req.name)
    if topic is None:
        raise ControllerError(ErrorCode.UNKNOWN_TOPIC, f"topic {req.name!r} does not exist")
    configs = topic_configs.apply_ops(
        topic.configs, ((o.key, o.op, o.value) for o in req.ops), req.replace
    )
    if configs == topic.configs:
        return [], AlterTopicConfigsResponse(
            topic_id=topic.topic_id, configs=configs, metadata_offset=image.offset
        )
    # the record is the command's first, so it lands right after the image's last record
    return [r.TopicRecord(topic_id=topic.topic_id, name=topic.name, configs=configs)], (
        AlterTopicConfigsResponse(
            topic_id=topic.topic_id, configs=configs, metadata_offset=image.offset + 1
        )
    )
