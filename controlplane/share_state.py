"""Durable share-partition state (KIP-932) in the replicated KV, fenced by partition leadership.

Kafka keeps share-partition state in `__share_group_state`, written by the share coordinator
for the partition's leader. Here the leader writes it itself: one KV entry per share-partition
(`share-state/<group>/<topic id>/<partition>`, the JSON of
`dataplane/kafka/share/partition_state.py` `snapshot()`), accepted only from the partition's
current leader at its current leader epoch. A partition move or a WAL failover bumps the
leader epoch, so a previous leader can no longer overwrite what the new one wrote; the new
leader loads with `load=True`, a read through the log that sees every write the controller
accepted before it. DeleteGroups of a share group deletes its entries (by its coordinator);
a leader still holding one of them loaded stores with `must_exist`, refused once deleted, so
it reloads a fresh state instead of bringing the deleted one back.

AlterShareGroupOffsets (by the group's coordinator, fenced by its coordinator slot) replaces
a state with a new start offset and nothing in flight, at a higher state epoch (the
`state_epoch` field of the stored JSON; absent = 0, as in entries stored before it
existed). A leader's write names the state epoch it loaded and is refused when the stored
one differs, so a leader holding the state from before the alter cannot overwrite it: it
reloads (and an idle one reloads when its metadata image shows another state epoch).

No I/O here.
"""

from __future__ import annotations

import json
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from controlplane import records as r
from controlplane.coordinators import slot_of
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import require_active_broker
from controlplane.image import MetadataImage
from controlplane.requests import REQUEST_TYPES

#: KV key prefix of share-partition states
SHARE_STATE_KEY_PREFIX = "share-state/"


class PutShareStateRequest(BaseModel):
    """A partition's leader stores (`value`) or only reads (`load`) the durable state of one
    share-partition; fenced by the partition's leadership (node and leader epoch). The
    answer holds the stored value (linearizable: the command passed through the log). Kept
    here rather than in requests.py (at its size limit); registered below."""

    model_config = ConfigDict(extra="forbid")
    command: ClassVar[str] = "put_share_state"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    group_id: str = Field(min_length=1, max_length=255)
    topic_id: str = Field(min_length=1, max_length=64)
    partition: int = Field(ge=0)
    leader_epoch: int = Field(ge=0)
    load: bool = False
    value: str | None = Field(default=None, max_length=500_000)
    # the state was stored before (this leader loaded or first stored it): refused when it
    # is gone, i.e. the group was deleted meanwhile (a stale leader cannot bring it back)
    must_exist: bool = False
    # the state epoch of the state this leader loaded: refused if the stored one differs
    # (the coordinator altered the offsets meanwhile)
    state_epoch: int = Field(default=0, ge=0)


class DeleteShareGroupStateRequest(BaseModel):
    """The group's coordinator deletes every stored share-partition state of a share group
    (DeleteGroups of an empty share group), or only those of `topic_ids`
    (DeleteShareGroupOffsets); fenced by the group's coordinator slot."""

    model_config = ConfigDict(extra="forbid")
    command: ClassVar[str] = "delete_share_group_state"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    group_id: str = Field(min_length=1, max_length=255)
    coordinator_epoch: int = Field(ge=0)
    topic_ids: list[str] | None = Field(default=None, max_length=10_000)


class AlteredShareState(BaseModel):
    """The new state of one share-partition (a snapshot JSON document without its state
    epoch: the controller sets it)."""

    model_config = ConfigDict(extra="forbid")
    topic_id: str = Field(min_length=1, max_length=64)
    partition: int = Field(ge=0)
    value: str = Field(min_length=2, max_length=10_000)


class AlterShareGroupStateRequest(BaseModel):
    """The group's coordinator replaces share-partition states of a share group
    (AlterShareGroupOffsets of an empty group), each at its stored state epoch + 1; fenced
    by the group's coordinator slot. All or nothing."""

    model_config = ConfigDict(extra="forbid")
    command: ClassVar[str] = "alter_share_group_state"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    group_id: str = Field(min_length=1, max_length=255)
    coordinator_epoch: int = Field(ge=0)
    states: list[AlteredShareState] = Field(min_length=1, max_length=10_000)


REQUEST_TYPES.update(
    {
        PutShareStateRequest.command: PutShareStateRequest,  # type: ignore[dict-item]
        DeleteShareGroupStateRequest.command: DeleteShareGroupStateRequest,  # type: ignore[dict-item]
        AlterShareGroupStateRequest.command: AlterShareGroupStateRequest,  # type: ignore[dict-item]
    }
)


def state_epoch_of(value: str | None) -> int:
    """The state epoch of a stored state (0 when it has none: stored before alters existed,
    or never altered; 0 too when unreadable, which its leader reports at its load)."""
    if value is None or '"state_epoch"' not in value:  # the common case: no JSON parse
        return 0
    try:
        return int(json.loads(value).get("state_epoch", 0))
    except (ValueError, TypeError, AttributeError):
        return 0


def share_state_key(group_id: str, topic_id: str, partition: int) -> str:
    """The KV key of one share-partition's state."""
    return f"{SHARE_STATE_KEY_PREFIX}{group_id}/{topic_id}/{partition}"


def put_share_state(image: MetadataImage, req: PutShareStateRequest, now_ms: int):
    """Store (or, `load`, only read) a share-partition's state: only the partition's leader
    at its current leader epoch may (NOT_PARTITION_LEADER otherwise)."""
    require_active_broker(image, req.node_id, req.node_epoch)
    topic = image.topics.get(req.topic_id)
    part = topic.partitions.get(req.partition) if topic is not None else None
    if part is None:
        raise ControllerError(
            ErrorCode.UNKNOWN_TOPIC, f"no partition {req.topic_id}/{req.partition}"
        )
    if part.leader_node_id != req.node_id or part.leader_epoch != req.leader_epoch:
        raise ControllerError(
            ErrorCode.NOT_PARTITION_LEADER,
            f"node {req.node_id} at leader epoch {req.leader_epoch} does not lead "
            f"{req.topic_id}/{req.partition} (node {part.leader_node_id} epoch "
            f"{part.leader_epoch} does)",
        )
    key = share_state_key(req.group_id, req.topic_id, req.partition)
    if req.load:
        return [], {"value": image.kv.get(key)}
    if req.must_exist and key not in image.kv:
        raise ControllerError(
            ErrorCode.NOT_PARTITION_LEADER,
            f"the share state of group {req.group_id!r} on {req.topic_id}/{req.partition} was "
            "deleted (the group was deleted): reload it",
        )
    stored_epoch = state_epoch_of(image.kv.get(key))
    if key in image.kv and stored_epoch != req.state_epoch:
        raise ControllerError(
            ErrorCode.NOT_PARTITION_LEADER,
            f"the share state of group {req.group_id!r} on {req.topic_id}/{req.partition} is "
            f"at state epoch {stored_epoch}, not {req.state_epoch} (its offsets were altered): "
            "reload it",
        )
    return [r.KVRecord(key=key, value=req.value)], {"value": req.value}


def _require_coordinator(
    image: MetadataImage, node_id: int, group_id: str, coordinator_epoch: int
) -> None:
    slot = slot_of(image, group_id)
    state = image.coordinator_slots.get(slot) if slot is not None else None
    if state is None or state.node_id != node_id or state.epoch != coordinator_epoch:
        raise ControllerError(
            ErrorCode.NOT_COORDINATOR,
            f"node {node_id} at coordinator epoch {coordinator_epoch} does not "
            f"coordinate group {group_id!r}",
        )


def delete_share_group_state(image: MetadataImage, req: DeleteShareGroupStateRequest, now_ms: int):
    """Delete every share-partition state of a share group (or of its `topic_ids` only):
    only the current owner of the group's coordinator slot, at the slot's epoch, may
    (NOT_COORDINATOR otherwise)."""
    require_active_broker(image, req.node_id, req.node_epoch)
    _require_coordinator(image, req.node_id, req.group_id, req.coordinator_epoch)
    prefix = f"{SHARE_STATE_KEY_PREFIX}{req.group_id}/"
    topics = None if req.topic_ids is None else set(req.topic_ids)
    records = [
        r.KVRecord(key=key, value=None)
        for key in image.kv
        if key.startswith(prefix)
        and (topics is None or key[len(prefix) :].rsplit("/", 1)[0] in topics)
    ]
    return records, {"deleted": len(records)}


def alter_share_group_state(image: MetadataImage, req: AlterShareGroupStateRequest, now_ms: int):
    """Replace share-partition states of a share group, each at its stored state epoch + 1
    (1 when none is stored): only the group's coordinator may (NOT_COORDINATOR); every
    partition must exist (UNKNOWN_TOPIC otherwise, nothing changed)."""
    require_active_broker(image, req.node_id, req.node_epoch)
    _require_coordinator(image, req.node_id, req.group_id, req.coordinator_epoch)
    records = []
    for altered in req.states:
        topic = image.topics.get(altered.topic_id)
        if topic is None or altered.partition not in topic.partitions:
            raise ControllerError(
                ErrorCode.UNKNOWN_TOPIC, f"no partition {altered.topic_id}/{altered.partition}"
            )
        try:
            doc = json.loads(altered.value)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise ControllerError(ErrorCode.INVALID_REQUEST, f"bad share state: {exc}") from exc
        key = share_state_key(req.group_id, altered.topic_id, altered.partition)
        doc["state_epoch"] = state_epoch_of(image.kv.get(key)) + 1
        records.append(r.KVRecord(key=key, value=json.dumps(doc, separators=(",", ":"))))
    return records, {"altered": len(records)}


def forget_topic_records(image: MetadataImage, topic_id: str) -> list:
    """Records removing every share-partition state of a deleted topic (any group)."""
    out = []
    for key in image.kv:
        if key.startswith(SHARE_STATE_KEY_PREFIX):
            parts = key[len(SHARE_STATE_KEY_PREFIX) :].rsplit("/", 2)
            if len(parts) == 3 and parts[1] == topic_id:
                out.append(r.KVRecord(key=key, value=None))
    return out
