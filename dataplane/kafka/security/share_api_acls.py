"""ACL rules of the share-group APIs (KIP-932): ShareGroupHeartbeat and ShareFetch /
ShareAcknowledge need READ on the group (GROUP_AUTHORIZATION_FAILED) and ShareFetch /
ShareAcknowledge READ on every topic they name (TOPIC_AUTHORIZATION_FAILED for the whole
request: its topics are named by id); ShareGroupDescribe and DescribeSharePartitions need
DESCRIBE on the group. DescribeShareGroupOffsets needs DESCRIBE on each group
(GROUP_AUTHORIZATION_FAILED for that group) and on the topics it names
(TOPIC_AUTHORIZATION_FAILED for that group; a request naming no topics gets only the topics
the principal may describe); DeleteShareGroupOffsets needs DELETE on the group and READ on
every topic it names, as in Kafka. AlterShareGroupOffsets needs READ on the group
(GROUP_AUTHORIZATION_FAILED for the request) and READ on each topic it names
(TOPIC_AUTHORIZATION_FAILED for that topic's partitions; the others are altered), as in
Kafka."""

from __future__ import annotations

from typing import Any

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.security.acl_checks import AclChecks, Handler, Policy
from dataplane.kafka.share.protocol import (
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsResponse,
    DescribeSharePartitionsResponse,
    ShareAcknowledgeResponse,
    ShareFetchResponse,
    ShareGroupDescribeResponse,
    ShareGroupHeartbeatResponse,
)


class ShareApiAcls:
    """Checks the share-group APIs' groups and topics (see the module docstring)."""

    def __init__(self, checks: AclChecks) -> None:
        self.checks = checks

    def policies(self) -> dict[int, Policy]:
        """The rule of each API key these rules cover."""
        return {
            76: self.heartbeat,
            77: self.describe,
            78: self.share_fetch,
            79: self.share_acknowledge,
            90: self.describe_offsets,
            91: self.alter_offsets,
            92: self.delete_offsets,
            602: self.describe_partitions,
        }

    async def heartbeat(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """ShareGroupHeartbeat: READ on the group."""
        if self.checks.allowed(ctx, "READ", "GROUP", req.group_id or ""):
            return await handler(req, ctx)
        return ShareGroupHeartbeatResponse(
            version=1,
            throttle_time_ms=0,
            error_code=KafkaError.GROUP_AUTHORIZATION_FAILED,
            error_message="not authorized",
            member_epoch=-1,
            heartbeat_interval_ms=0,
        )

    async def describe(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """ShareGroupDescribe: DESCRIBE on each group."""
        G = ShareGroupDescribeResponse.DescribedGroup
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="group_ids",
            resource=lambda g: ("GROUP", g),
            operation="DESCRIBE",
            denied_entry=lambda g, code: G(
                error_code=code,
                group_id=g,
                group_state="",
                group_epoch=-1,
                assignment_epoch=-1,
                assignor_name="",
                members=[],
            ),
            answer="groups",
        )

    def _denied(self, req: Any, ctx: Any) -> KafkaError | None:
        if not self.checks.allowed(ctx, "READ", "GROUP", req.group_id or ""):
            return KafkaError.GROUP_AUTHORIZATION_FAILED
        image = self.checks.image_fn()
        for t in req.topics or []:
            topic = image.topics.get(str(t.topic_id))
            if topic is not None and not self.checks.allowed(ctx, "READ", "TOPIC", topic.name):
                return KafkaError.TOPIC_AUTHORIZATION_FAILED
        return None

    async def share_fetch(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """ShareFetch: READ on the group and on its topics."""
        error = self._denied(req, ctx)
        if error is None:
            return await handler(req, ctx)
        return ShareFetchResponse(
            version=1,
            throttle_time_ms=0,
            error_code=error,
            error_message="not authorized",
            acquisition_lock_timeout_ms=0,
            responses=[],
            node_endpoints=[],
        )

    async def share_acknowledge(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """ShareAcknowledge: READ on the group and on its topics."""
        error = self._denied(req, ctx)
        if error is None:
            return await handler(req, ctx)
        return ShareAcknowledgeResponse(
            version=1,
            throttle_time_ms=0,
            error_code=error,
            error_message="not authorized",
            responses=[],
            node_endpoints=[],
        )

    async def describe_partitions(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """DescribeSharePartitions: DESCRIBE on the group."""
        if self.checks.allowed(ctx, "DESCRIBE", "GROUP", req.group_id):
            return await handler(req, ctx)
        return DescribeSharePartitionsResponse(version=0, throttle_time_ms=0, partitions=[])

    def _describe_offsets_denial(self, ctx: Any, group: Any) -> KafkaError | None:
        if not self.checks.allowed(ctx, "DESCRIBE", "GROUP", group.group_id or ""):
            return KafkaError.GROUP_AUTHORIZATION_FAILED
        for t in group.topics or []:
            if not self.checks.allowed(ctx, "DESCRIBE", "TOPIC", t.topic_name or ""):
                return KafkaError.TOPIC_AUTHORIZATION_FAILED
        return None

    async def describe_offsets(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """DescribeShareGroupOffsets: DESCRIBE on each group and on the topics it names."""
        G = DescribeShareGroupOffsetsResponse.DescribeShareGroupOffsetsResponseGroup
        allowed, denied = [], []
        for group in req.groups or []:
            error = self._describe_offsets_denial(ctx, group)
            if error is None:
                allowed.append(group)
            else:
                denied.append(
                    G(group_id=group.group_id, topics=[], error_code=error, error_message=None)
                )
        req.groups = allowed
        response = (
            await handler(req, ctx)
            if allowed
            else DescribeShareGroupOffsetsResponse(version=0, throttle_time_ms=0, groups=[])
        )
        for group in response.groups:  # a request naming no topics: only describable ones
            group.topics = [
                t
                for t in group.topics or []
                if self.checks.allowed(ctx, "DESCRIBE", "TOPIC", t.topic_name or "")
            ]
        response.groups.extend(denied)
        return response

    async def delete_offsets(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """DeleteShareGroupOffsets: DELETE on the group, READ on every topic it names."""
        error = None
        if not self.checks.allowed(ctx, "DELETE", "GROUP", req.group_id or ""):
            error = KafkaError.GROUP_AUTHORIZATION_FAILED
        elif any(
            not self.checks.allowed(ctx, "READ", "TOPIC", t.topic_name or "")
            for t in req.topics or []
        ):
            error = KafkaError.TOPIC_AUTHORIZATION_FAILED
        if error is None:
            return await handler(req, ctx)
        return DeleteShareGroupOffsetsResponse(
            version=0,
            throttle_time_ms=0,
            error_code=error,
            error_message="not authorized",
            responses=[],
        )

    async def alter_offsets(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """AlterShareGroupOffsets: READ on the group, READ on each topic it names (the
        partitions of a topic without it get TOPIC_AUTHORIZATION_FAILED)."""
        if not self.checks.allowed(ctx, "READ", "GROUP", req.group_id or ""):
            return AlterShareGroupOffsetsResponse(
                version=0,
                throttle_time_ms=0,
                error_code=KafkaError.GROUP_AUTHORIZATION_FAILED,
                error_message="not authorized",
                responses=[],
            )
        T = AlterShareGroupOffsetsResponse.AlterShareGroupOffsetsResponseTopic
        P = T.AlterShareGroupOffsetsResponsePartition
        allowed, denied = [], []
        for topic in req.topics or []:
            if self.checks.allowed(ctx, "READ", "TOPIC", topic.topic_name or ""):
                allowed.append(topic)
                continue
            partitions = [
                P(
                    partition_index=p.partition_index,
                    error_code=KafkaError.TOPIC_AUTHORIZATION_FAILED,
                    error_message="not authorized",
                )
                for p in topic.partitions or []
            ]
            denied.append(T(topic_name=topic.topic_name, topic_id=None, partitions=partitions))
        req.topics = allowed
        response = await handler(req, ctx)
        if response.error_code == KafkaError.NONE:
            response.responses.extend(denied)
        return response
