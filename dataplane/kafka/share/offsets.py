"""DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91) and DeleteShareGroupOffsets (92)
of KIP-932 share groups, at the group's coordinator.

A share group's "offset" on a partition is its share-partition start offset (SPSO), kept in
the share-partition's durable state in the controller KV (`controlplane/share_state.py`,
written by the partition's leader once an acknowledgement is stored).

* Describe reads the states from this broker's metadata image (the KV is part of it): the
  stored start of each partition asked for (or of every partition with a stored state when
  the request names no topics), -1 for a partition the group never read (Kafka's answer for
  an uninitialized share-partition), and the partition's current leader epoch.
* Delete, for an empty share group only (NON_EMPTY_GROUP otherwise, as Kafka), deletes the
  stored states of the named topics through the controller, fenced by the group's
  coordinator slot; the next read of those partitions starts afresh
  (`share.auto.offset.reset`). A leader holding one of them loaded finds out at its next
  write (`must_exist`, as for DeleteGroups of a share group).
* Alter, for an empty share group only (NON_EMPTY_GROUP otherwise), replaces the stored
  state of each named partition by one starting at the given offset with nothing in flight,
  through the controller (one command, all or nothing, fenced by the coordinator slot), at
  the state's state epoch + 1: a leader holding the old state loaded cannot write it back
  (its writes name the state epoch it loaded) and an idle one reloads when its metadata
  image shows the new state epoch (`partitions.py`). An unknown topic or partition is
  UNKNOWN_TOPIC_OR_PARTITION for that partition, a negative offset INVALID_REQUEST; the
  others are altered.

A group id that is no share group (unknown, or a classic or consumer group) is
GROUP_ID_NOT_FOUND. Runs on the event loop; the controller call goes to the I/O pool.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from controlplane.coordinators import slot_of
from controlplane.share_state import SHARE_STATE_KEY_PREFIX, share_state_key
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.api_context import BrokerApiContext

from .coordinator import ShareGroupCoordinator
from .partition_state import SharePartitionState
from .partitions import SharePartitions
from .protocol import (
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsResponse,
)
from .store import ShareStateError

#: the start offset Kafka reports for a partition the group never read
UNINITIALIZED_OFFSET = -1
MAX_GROUPS_PER_REQUEST = 1_000
MAX_PARTITIONS_PER_REQUEST = 100_000
_ZERO_UUID = uuid.UUID(int=0)

_DGroup = DescribeShareGroupOffsetsResponse.DescribeShareGroupOffsetsResponseGroup
_DTopic = _DGroup.DescribeShareGroupOffsetsResponseTopic
_DPartition = _DTopic.DescribeShareGroupOffsetsResponsePartition
_XTopic = DeleteShareGroupOffsetsResponse.DeleteShareGroupOffsetsResponseTopic
_ATopic = AlterShareGroupOffsetsResponse.AlterShareGroupOffsetsResponseTopic
_APartition = _ATopic.AlterShareGroupOffsetsResponsePartition


def stored_start(image: Any, group_id: str, topic_id: str, partition: int) -> int:
    """The stored share-partition start offset, UNINITIALIZED_OFFSET if there is none (or it
    is unreadable: the leader reloads what it can and reports it at its next write)."""
    raw = image.kv.get(share_state_key(group_id, topic_id, partition))
    if raw is None:
        return UNINITIALIZED_OFFSET
    try:
        return int(json.loads(raw)["start"])
    except (ValueError, KeyError, TypeError):
        return UNINITIALIZED_OFFSET


def stored_partitions(image: Any, group_id: str) -> dict[str, list[int]]:
    """topic id -> the partitions with a stored state of the group."""
    prefix = f"{SHARE_STATE_KEY_PREFIX}{group_id}/"
    out: dict[str, list[int]] = {}
    for key in image.kv:
        if not key.startswith(prefix):
            continue
        topic_id, _, partition = key[len(prefix) :].rpartition("/")
        if partition.isdigit():
            out.setdefault(topic_id, []).append(int(partition))
    return {t: sorted(ps) for t, ps in out.items()}


class ShareGroupOffsets:
    """The handlers of DescribeShareGroupOffsets, AlterShareGroupOffsets and
    DeleteShareGroupOffsets (see the module docstring). Event loop only.

    Args:
        broker: the broker's context (metadata image, node id, I/O pool).
        coordinator: the share groups' membership.
        partitions: the share-partitions loaded here (and their store).
        coordinates: ``group id -> bool``: this broker is the group's coordinator.
    """

    def __init__(
        self,
        broker: BrokerApiContext,
        coordinator: ShareGroupCoordinator,
        partitions: SharePartitions,
        coordinates: Any,
    ) -> None:
        self.broker = broker
        self.coordinator = coordinator
        self.partitions = partitions
        self.coordinates = coordinates

    def _group_error(self, image: Any, group_id: str) -> tuple[KafkaError, str | None]:
        if not group_id:
            return KafkaError.INVALID_REQUEST, "GroupId can't be empty."
        if not self.coordinates(group_id):
            return KafkaError.NOT_COORDINATOR, None
        known = self.coordinator.group(group_id) is not None or bool(
            stored_partitions(image, group_id)
        )
        if not known:
            return KafkaError.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a share group."
        return KafkaError.NONE, None

    # ------------------------------------------------------------------ describe

    async def describe_offsets(self, req: Any, ctx: Any) -> Any:
        """DescribeShareGroupOffsets v0."""
        image = self.broker.image_fn()
        groups = list(req.groups or [])
        if len(groups) > MAX_GROUPS_PER_REQUEST or (
            sum(len(t.partitions or []) for g in groups for t in g.topics or [])
            > MAX_PARTITIONS_PER_REQUEST
        ):
            return DescribeShareGroupOffsetsResponse(
                version=0,
                throttle_time_ms=0,
                groups=[
                    _DGroup(
                        group_id=g.group_id or "",
                        topics=[],
                        error_code=KafkaError.INVALID_REQUEST,
                        error_message="too many groups or partitions in one request",
                    )
                    for g in groups[:MAX_GROUPS_PER_REQUEST]
                ],
            )
        return DescribeShareGroupOffsetsResponse(
            version=0,
            throttle_time_ms=0,
            groups=[self._describe_group(image, g.group_id or "", g.topics) for g in groups],
        )

    def _describe_group(self, image: Any, group_id: str, topics: list | None) -> Any:
        error, message = self._group_error(image, group_id)
        if error != KafkaError.NONE:
            return _DGroup(group_id=group_id, topics=[], error_code=error, error_message=message)
        if topics is None:
            wanted = []
            for topic_id, partitions in sorted(stored_partitions(image, group_id).items()):
                topic = image.topics.get(topic_id)
                if topic is not None:  # a deleted topic's states go with it
                    wanted.append((topic.name, partitions))
        else:
            wanted = [(t.topic_name or "", list(t.partitions or [])) for t in topics]
        return _DGroup(
            group_id=group_id,
            topics=[self._describe_topic(image, group_id, n, ps) for n, ps in wanted],
            error_code=KafkaError.NONE,
        )

    def _describe_topic(self, image: Any, group_id: str, name: str, partitions: list) -> Any:
        topic = image.topic_by_name(name)
        out = []
        for p in partitions:
            part = topic.partitions.get(p) if topic is not None else None
            if part is None:
                out.append(
                    _DPartition(
                        partition_index=p,
                        start_offset=UNINITIALIZED_OFFSET,
                        leader_epoch=-1,
                        error_code=KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                        error_message=f"no partition {name}-{p}",
                    )
                )
                continue
            out.append(
                _DPartition(
                    partition_index=p,
                    start_offset=stored_start(image, group_id, topic.topic_id, p),
                    leader_epoch=part.leader_epoch,
                    error_code=KafkaError.NONE,
                )
            )
        return _DTopic(topic_name=name, topic_id=_topic_uuid(topic), partitions=out)

    def _coordinator_epoch(self, image: Any, group_id: str) -> int | None:
        """The epoch of the group's coordinator slot if this broker owns it, else None."""
        slot = slot_of(image, group_id)
        owner = image.coordinator_slots.get(slot) if slot is not None else None
        if owner is None or owner.node_id != self.broker.me.node_id:
            return None
        return owner.epoch

    def _empty_group_epoch(
        self, image: Any, group_id: str, count: int, what: str
    ) -> tuple[KafkaError, str | None, int]:
        """Alter's and Delete's checks, in this order: the group (`_group_error`), the
        request's size (`count` `what`s), an empty group, this broker owning the group's
        coordinator slot. (NONE, None, the slot's epoch) when the request may go on, else
        (the error, its message, -1)."""
        error, message = self._group_error(image, group_id)
        if error != KafkaError.NONE:
            return error, message, -1
        if count > MAX_PARTITIONS_PER_REQUEST:
            return KafkaError.INVALID_REQUEST, f"too many {what} in one request", -1
        group = self.coordinator.group(group_id)
        if group is not None and group.members:
            return KafkaError.NON_EMPTY_GROUP, f"Share group {group_id} is not empty.", -1
        coordinator_epoch = self._coordinator_epoch(image, group_id)
        if coordinator_epoch is None:
            return KafkaError.NOT_COORDINATOR, None, -1
        return KafkaError.NONE, None, coordinator_epoch

    async def _write_group(
        self,
        write: Callable[[str, int, Any], int],
        group_id: str,
        coordinator_epoch: int,
        changes: Any,
        topic_ids: set[str],
    ) -> tuple[KafkaError, str] | None:
        """`write(group_id, coordinator_epoch, changes)` (the store's alter_group or
        delete_group) on the I/O pool unless there are no changes; then the share-partitions
        of `topic_ids` loaded here are dropped (their leaders reload). The store's refusal
        (error, message), or None."""
        if not changes:
            return None
        try:
            await self.broker.run_io(write, group_id, coordinator_epoch, changes)
        except ShareStateError as exc:
            return exc.error, str(exc)
        self.partitions.drop_group(group_id, topic_ids)
        return None

    # ------------------------------------------------------------------ alter

    async def alter_offsets(self, req: Any, ctx: Any) -> Any:
        """AlterShareGroupOffsets v0."""
        image = self.broker.image_fn()
        group_id = req.group_id or ""
        error, message, coordinator_epoch = self._empty_group_epoch(
            image, group_id, sum(len(t.partitions or []) for t in req.topics or []), "partitions"
        )
        if error != KafkaError.NONE:
            return _group_answer(AlterShareGroupOffsetsResponse, error, message)
        # (topic name, topic or None, {partition: (error, message) or start offset})
        plan: list[tuple[str, Any, dict[int, Any]]] = []
        states: list[tuple[str, int, dict]] = []
        for t in req.topics or []:
            name = t.topic_name or ""
            topic = image.topic_by_name(name)
            outcome: dict[int, Any] = {}
            for p in t.partitions or []:
                index, start = p.partition_index, p.start_offset
                if topic is None or topic.partitions.get(index) is None:
                    outcome[index] = (
                        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                        f"no partition {name}-{index}",
                    )
                elif start < 0:
                    outcome[index] = (KafkaError.INVALID_REQUEST, f"start offset {start} < 0")
                else:
                    outcome[index] = start
                    states.append((topic.topic_id, index, SharePartitionState(start).snapshot()))
            plan.append((name, topic, outcome))
        failed = await self._write_group(
            self.partitions.store.alter_group,
            group_id,
            coordinator_epoch,
            states,
            {t for t, _, _ in states},
        )
        return _group_answer(
            AlterShareGroupOffsetsResponse,
            KafkaError.NONE,
            None,
            [_altered_topic(n, t, o, failed) for n, t, o in plan],
        )

    # ------------------------------------------------------------------ delete

    async def delete_offsets(self, req: Any, ctx: Any) -> Any:
        """DeleteShareGroupOffsets v0."""
        image = self.broker.image_fn()
        group_id = req.group_id or ""
        names = list(dict.fromkeys(t.topic_name or "" for t in req.topics or []))
        error, message, coordinator_epoch = self._empty_group_epoch(
            image, group_id, len(names), "topics"
        )
        if error != KafkaError.NONE:
            return _group_answer(DeleteShareGroupOffsetsResponse, error, message)
        topics = {n: image.topic_by_name(n) for n in names}
        ids = sorted({t.topic_id for t in topics.values() if t is not None})
        failed = await self._write_group(
            self.partitions.store.delete_group, group_id, coordinator_epoch, ids, set(ids)
        )
        results = []
        for name, topic in topics.items():
            if topic is None:
                code, text = KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name}"
            else:
                code, text = failed or (KafkaError.NONE, None)
            results.append(
                _XTopic(
                    topic_name=name,
                    topic_id=_topic_uuid(topic),
                    error_code=code,
                    error_message=text,
                )
            )
        return _group_answer(DeleteShareGroupOffsetsResponse, KafkaError.NONE, None, results)


def _topic_uuid(topic: Any) -> uuid.UUID:
    """The topic's id as a UUID, the zero UUID for an unknown topic (None)."""
    return uuid.UUID(topic.topic_id) if topic is not None else _ZERO_UUID


def _group_answer(
    response_type: type, error: KafkaError, message: str | None, topics: list | None = None
) -> Any:
    """An AlterShareGroupOffsets or DeleteShareGroupOffsets (`response_type`) v0 answer."""
    return response_type(
        version=0,
        throttle_time_ms=0,
        error_code=error,
        error_message=message,
        responses=topics or [],
    )


def _altered_topic(
    name: str, topic: Any, outcome: dict[int, Any], failed: tuple[KafkaError, str] | None
) -> Any:
    """One topic of an AlterShareGroupOffsets answer: each partition's refusal, or the
    controller's failure (`failed`), or success."""
    partitions = []
    for index, result in outcome.items():
        if isinstance(result, tuple):
            code, text = result
        else:
            code, text = failed or (KafkaError.NONE, None)
        partitions.append(_APartition(partition_index=index, error_code=code, error_message=text))
    return _ATopic(
        topic_name=name,
        topic_id=_topic_uuid(topic),
        partitions=partitions,
    )
