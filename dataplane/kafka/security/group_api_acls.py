"""ACL rules of the consumer group APIs: FindCoordinator, JoinGroup / SyncGroup / Heartbeat /
LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups, ListGroups, DeleteGroups,
OffsetDelete, ConsumerGroupHeartbeat and ConsumerGroupDescribe (GROUP_AUTHORIZATION_FAILED for a denied group, TOPIC_AUTHORIZATION_FAILED for
a denied topic)."""

from __future__ import annotations

from typing import Any

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import response_class
from dataplane.kafka.security.acl_checks import DENIED, AclChecks, Handler, Policy


class GroupApiAcls:
    """Checks the group APIs' groups and topics (see the module docstring)."""

    def __init__(self, checks: AclChecks) -> None:
        self.checks = checks

    def policies(self) -> dict[int, Policy]:
        """The rule of each API key these rules cover."""
        return {
            10: self.find_coordinator,
            11: self.group_request,
            12: self.group_request,
            13: self.group_request,
            14: self.group_request,
            8: self.offset_commit,
            9: self.offset_fetch,
            15: self.describe_groups,
            16: self.list_groups,
            42: self.delete_groups,
            47: self.offset_delete,
            68: self.consumer_group_heartbeat,
            69: self.consumer_group_describe,
        }

    async def find_coordinator(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of FindCoordinator."""
        R = response_class(10)
        kind = "TRANSACTIONAL_ID" if int(getattr(req, "key_type", 0) or 0) == 1 else "GROUP"
        if ctx.api_version < 4:
            if self.checks.allowed(ctx, "DESCRIBE", kind, req.key):
                return await handler(req, ctx)
            return R[ctx.api_version](
                throttle_time_ms=0,
                error_code=DENIED[kind],
                error_message="not authorized",
                node_id=-1,
                host="",
                port=-1,
            )
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="coordinator_keys",
            resource=lambda key: (kind, key),
            operation="DESCRIBE",
            denied_entry=lambda key, code: R.Coordinator(
                key=key, node_id=-1, host="", port=-1, error_code=code, error_message=None
            ),
            answer="coordinators",
        )

    async def group_request(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """JoinGroup, SyncGroup, Heartbeat, LeaveGroup: READ on the group, else refused."""
        if self.checks.allowed(ctx, "READ", "GROUP", req.group_id):
            return await handler(req, ctx)
        fields: dict[str, Any] = {"error_code": KafkaError.GROUP_AUTHORIZATION_FAILED}
        if ctx.api_key == 11:  # JoinGroup: the client reads these even on an error
            fields.update(generation_id=-1, leader="", member_id="", members=[])
        return response_class(ctx.api_key)[ctx.api_version](**fields)

    async def consumer_group_heartbeat(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """ConsumerGroupHeartbeat (KIP-848): READ on the group, else refused."""
        if self.checks.allowed(ctx, "READ", "GROUP", req.group_id):
            return await handler(req, ctx)
        return response_class(68)[ctx.api_version](
            throttle_time_ms=0,
            error_code=KafkaError.GROUP_AUTHORIZATION_FAILED,
            member_epoch=0,
            heartbeat_interval_ms=0,
        )

    async def consumer_group_describe(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """ConsumerGroupDescribe (KIP-848): DESCRIBE on each group."""
        R = response_class(69)
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="group_ids",
            resource=lambda g: ("GROUP", g),
            operation="DESCRIBE",
            denied_entry=lambda g, code: R.DescribedGroup(
                error_code=code,
                group_id=g,
                group_state="",
                group_epoch=0,
                assignment_epoch=0,
                assignor_name="",
                members=[],
            ),
            answer="groups",
        )

    async def offset_commit(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of OffsetCommit."""
        R = response_class(8)

        def denied(t: Any, code: int) -> Any:
            return R.OffsetCommitResponseTopic(
                name=t.name,
                partitions=[
                    R.OffsetCommitResponseTopic.OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=code
                    )
                    for p in t.partitions
                ],
            )

        if not self.checks.allowed(ctx, "READ", "GROUP", req.group_id):
            return R[ctx.api_version](
                throttle_time_ms=0,
                topics=[denied(t, KafkaError.GROUP_AUTHORIZATION_FAILED) for t in req.topics],
            )
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="READ",
            denied_entry=denied,
            answer="topics",
        )

    async def offset_fetch(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of OffsetFetch."""
        R = response_class(9)
        if ctx.api_version < 8:
            if self.checks.allowed(ctx, "DESCRIBE", "GROUP", req.group_id):
                return await handler(req, ctx)
            return R[ctx.api_version](
                throttle_time_ms=0, topics=[], error_code=KafkaError.GROUP_AUTHORIZATION_FAILED
            )
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="groups",
            resource=lambda g: ("GROUP", g.group_id),
            operation="DESCRIBE",
            denied_entry=lambda g, code: R.OffsetFetchResponseGroup(
                group_id=g.group_id, topics=[], error_code=code
            ),
            answer="groups",
        )

    async def describe_groups(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of DescribeGroups (the authorized operations narrowed to the
        principal's)."""
        R = response_class(15)
        response = await self.checks.split(
            handler,
            req,
            ctx,
            items="groups",
            resource=lambda g: ("GROUP", g),
            operation="DESCRIBE",
            denied_entry=lambda g, code: R.DescribedGroup(
                error_code=code,
                group_id=g,
                group_state="",
                protocol_type="",
                protocol_data="",
                members=[],
            ),
            answer="groups",
        )
        for g in response.groups:
            if g.authorized_operations is not None:
                g.authorized_operations = self.checks.authorized_operations(
                    ctx, "GROUP", g.group_id
                )
        return response

    async def list_groups(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of ListGroups."""
        response = await handler(req, ctx)
        if not self.checks.allowed_cluster(ctx, "DESCRIBE"):
            response.groups = [
                g
                for g in response.groups
                if self.checks.allowed(ctx, "DESCRIBE", "GROUP", g.group_id)
            ]
        return response

    async def delete_groups(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of DeleteGroups."""
        R = response_class(42)
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="groups_names",
            resource=lambda g: ("GROUP", g),
            operation="DELETE",
            denied_entry=lambda g, code: R.DeletableGroupResult(group_id=g, error_code=code),
            answer="results",
        )

    async def offset_delete(self, handler: Handler, req: Any, ctx: Any) -> Any:
        """The ACL rule of OffsetDelete."""
        R = response_class(47)
        if not self.checks.allowed(ctx, "DELETE", "GROUP", req.group_id):
            return R[ctx.api_version](
                error_code=KafkaError.GROUP_AUTHORIZATION_FAILED, throttle_time_ms=0, topics=[]
            )
        return await self.checks.split(
            handler,
            req,
            ctx,
            items="topics",
            resource=lambda t: ("TOPIC", t.name),
            operation="READ",
            denied_entry=lambda t, code: R.OffsetDeleteResponseTopic(
                name=t.name,
                partitions=[
                    R.OffsetDeleteResponseTopic.OffsetDeleteResponsePartition(
                        partition_index=p.partition_index, error_code=code
                    )
                    for p in t.partitions
                ],
            ),
            answer="topics",
        )
