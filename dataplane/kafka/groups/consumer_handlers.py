"""Wire handlers of the KIP-848 group APIs: ConsumerGroupHeartbeat (68, v0-1) and
ConsumerGroupDescribe (69, v0), in Kafka's JSON format (the message classes of
`dataplane/formats/consumer_group_messages.py`, since kafka-python does not ship them,
registered here with the codec), translating to :class:`ConsumerGroupCoordinator` calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from dataplane.formats.consumer_group_messages import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import add_api_message
from dataplane.kafka.security.authorizer import supported_operation_codes

from .consumer_coordinator import ConsumerGroupCoordinator, HeartbeatParams
from .consumer_state import Partitions

Handler = Callable[[Any, Any], Awaitable[Any]]


add_api_message(ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse)
add_api_message(ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse)

_HbAssignment = ConsumerGroupHeartbeatResponse.Assignment
_HbTopic = ConsumerGroupHeartbeatResponse.Assignment.TopicPartitions
_DGroup = ConsumerGroupDescribeResponse.DescribedGroup
_DMember = ConsumerGroupDescribeResponse.DescribedGroup.Member
_DAssignment = ConsumerGroupDescribeResponse.DescribedGroup.Member.Assignment
_DTopic = ConsumerGroupDescribeResponse.DescribedGroup.Member.Assignment.TopicPartitions
MAX_OWNED_PARTITIONS = 100_000


def _owned(topic_partitions: list[Any] | None) -> Partitions | None:
    if topic_partitions is None:
        return None
    out: Partitions = {}
    total = 0
    for tp in topic_partitions:
        parts = list(tp.partitions or [])
        total += len(parts)
        if total > MAX_OWNED_PARTITIONS:
            raise ValueError("too many owned partitions")
        out.setdefault(str(tp.topic_id), set()).update(parts)
    return out


class ConsumerGroupHandlers:
    """Handlers of ConsumerGroupHeartbeat and ConsumerGroupDescribe.

    Args:
        coordinator: the broker's consumer group coordinator.
        group_error: ``(group id) -> error code`` (invalid id, NOT_COORDINATOR), as for the
            classic group APIs.
        topic_name: ``topic id -> name`` (ConsumerGroupDescribe names the topics).
    """

    def __init__(
        self,
        coordinator: ConsumerGroupCoordinator,
        group_error: Callable[[str | None], int],
        topic_name: Callable[[str], str | None],
    ) -> None:
        self._coordinator = coordinator
        self._group_error = group_error
        self._topic_name = topic_name

    def registrations(self) -> list[tuple[type, int, int, Handler]]:
        """``(request class, min version, max version, handler)`` for the wire server."""
        return [
            (ConsumerGroupHeartbeatRequest, 0, 1, self.heartbeat),
            (ConsumerGroupDescribeRequest, 0, 0, self.describe),
        ]

    async def heartbeat(self, request: Any, ctx: Any) -> Any:
        """ConsumerGroupHeartbeat v0-1 (v1: SubscribedTopicRegex)."""
        version = ctx.api_version
        response = ConsumerGroupHeartbeatResponse[version]
        error = self._group_error(request.group_id)
        if error != KafkaError.NONE:
            return response(
                throttle_time_ms=0, error_code=error, member_epoch=0, heartbeat_interval_ms=0
            )
        try:
            owned = _owned(request.topic_partitions)
        except ValueError as exc:
            return response(
                throttle_time_ms=0,
                error_code=KafkaError.INVALID_REQUEST,
                error_message=str(exc),
                member_epoch=0,
                heartbeat_interval_ms=0,
            )
        peer = getattr(ctx, "peer", None)
        names = request.subscribed_topic_names
        result = await self._coordinator.heartbeat(
            HeartbeatParams(
                group_id=request.group_id,
                member_id=request.member_id or "",
                member_epoch=request.member_epoch,
                instance_id=request.instance_id,
                rack_id=request.rack_id,
                rebalance_timeout_ms=request.rebalance_timeout_ms,
                subscribed_topic_names=None if names is None else tuple(names),
                subscribed_topic_regex=request.subscribed_topic_regex if version >= 1 else None,
                server_assignor=request.server_assignor,
                owned=owned,
                client_id=ctx.client_id or "",
                client_host=f"/{peer[0]}" if peer else "",
                api_version=version,
            )
        )
        assignment = None
        if result.assignment is not None:
            assignment = _HbAssignment(
                topic_partitions=[
                    _HbTopic(topic_id=uuid.UUID(t), partitions=sorted(ps))
                    for t, ps in sorted(result.assignment.items())
                ]
            )
        return response(
            throttle_time_ms=0,
            error_code=result.error_code,
            error_message=result.error_message,
            member_id=result.member_id,
            member_epoch=result.member_epoch if result.error_code == KafkaError.NONE else 0,
            heartbeat_interval_ms=result.heartbeat_interval_ms,
            assignment=assignment,
        )

    def _assignment(self, parts: Partitions) -> Any:
        return _DAssignment(
            topic_partitions=[
                _DTopic(
                    topic_id=uuid.UUID(t),
                    topic_name=self._topic_name(t) or "",
                    partitions=sorted(ps),
                )
                for t, ps in sorted(parts.items())
            ]
        )

    async def describe(self, request: Any, ctx: Any) -> Any:
        """ConsumerGroupDescribe v0."""
        include_ops = bool(request.include_authorized_operations)
        groups = []
        for group_id in request.group_ids or []:
            groups.append(self._describe_one(group_id, include_ops))
        return ConsumerGroupDescribeResponse[ctx.api_version](throttle_time_ms=0, groups=groups)

    def _describe_one(self, group_id: str, include_ops: bool) -> Any:
        def failed(code: int, message: str | None) -> Any:
            return _DGroup(
                error_code=code,
                error_message=message,
                group_id=group_id,
                group_state="",
                group_epoch=0,
                assignment_epoch=0,
                assignor_name="",
                members=[],
            )

        error = self._group_error(group_id)
        if error != KafkaError.NONE:
            return failed(error, None)
        group = self._coordinator.group(group_id)
        if group is None:
            return failed(KafkaError.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
        members = [
            _DMember(
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                member_epoch=m.member_epoch,
                client_id=m.client_id,
                client_host=m.client_host,
                subscribed_topic_names=list(m.subscribed_topic_names),
                subscribed_topic_regex=m.subscribed_topic_regex,
                assignment=self._assignment(m.assigned),
                target_assignment=self._assignment(group.target.get(m.member_id, {})),
            )
            for m in group.members.values()
        ]
        return _DGroup(
            error_code=KafkaError.NONE,
            group_id=group_id,
            group_state=group.state().value,
            group_epoch=group.group_epoch,
            assignment_epoch=group.assignment_epoch,
            assignor_name=group.assignor_name or self._coordinator.assignor_names[0],
            members=members,
            authorized_operations=sum(1 << c for c in supported_operation_codes("GROUP"))
            if include_ops
            else -(2**31),
        )
