"""Partition reassignment and controlled shutdown (pure decisions on the image).

A move copies no data: the partition record gets the new leader and leader epoch + 1; the
old leader sees it, uploads what its WAL holds for the stream and closes the stream; the new
leader opens the stream with the new epoch. `reassign_partitions` also keeps the last plan in
the KV (`reassignment/last`) so `automqctl reassign status` can show its progress.
"""

from __future__ import annotations

import json

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import require_active_broker
from controlplane.image import MetadataImage
from controlplane.placement import evacuate, move_record
from controlplane.requests import (
    ControlledShutdownRequest,
    ControlledShutdownResponse,
    ReassignPartitionsRequest,
)

LAST_REASSIGNMENT_KEY = "reassignment/last"


def reassign_partitions(image: MetadataImage, req: ReassignPartitionsRequest, now_ms: int):
    """Validate the whole plan first (a bad entry changes nothing), then move."""
    seen: set[tuple[str, int]] = set()
    recs: list = []
    unchanged = 0
    for move in req.moves:
        key = (move.topic, move.partition)
        if key in seen:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST,
                f"{move.topic}-{move.partition} appears twice in the plan",
            )
        seen.add(key)
        topic = image.topic_by_name(move.topic)
        if topic is None:
            raise ControllerError(ErrorCode.UNKNOWN_TOPIC, f"topic {move.topic!r} does not exist")
        partition = topic.partitions.get(move.partition)
        if partition is None:
            raise ControllerError(
                ErrorCode.INVALID_PARTITIONS,
                f"topic {move.topic!r} has no partition {move.partition} "
                f"(it has {len(topic.partitions)})",
            )
        if partition.erasure_coded:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST,
                f"{move.topic}-{move.partition} is erasure-coded: it has no leader to move",
            )
        broker = image.brokers.get(move.node_id)
        if broker is None:
            raise ControllerError(
                ErrorCode.UNKNOWN_NODE, f"broker {move.node_id} is not registered"
            )
        if not broker.active:
            state = "shutting down" if broker.shutting_down else f"fenced ({broker.fence_reason})"
            raise ControllerError(
                ErrorCode.NODE_FENCED, f"broker {move.node_id} cannot take partitions: {state}"
            )
        if partition.leader_node_id == move.node_id:
            unchanged += 1
            continue
        recs.append(move_record(topic, partition, move.node_id))
    plan = {"started_ms": now_ms, "moves": [m.model_dump() for m in req.moves]}
    recs.append(r.KVRecord(key=LAST_REASSIGNMENT_KEY, value=json.dumps(plan, sort_keys=True)))
    return recs, {"moved": len(recs) - 1, "unchanged": unchanged}


def controlled_shutdown(image: MetadataImage, req: ControlledShutdownRequest, now_ms: int):
    """The broker stops taking partitions and its partitions move to other brokers (same
    AZ first). It then closes its streams and fences itself; the new leaders open them."""
    broker = require_active_broker(image, req.node_id, req.node_epoch)
    recs: list = []
    if not broker.shutting_down:
        recs.append(r.BrokerShuttingDownRecord(node_id=req.node_id, node_epoch=req.node_epoch))
    moves = evacuate(image, req.node_id)
    recs += moves
    remaining = sum(
        1
        for t in image.topics.values()
        for p in t.partitions.values()
        if p.leader_node_id == req.node_id
    ) - len(moves)
    return recs, ControlledShutdownResponse(moved=len(moves), remaining=remaining)
