"""ShareGroupDescribe (KIP-932) and the share-group view `automqctl group describe` shows:
members and their assignments from the coordinator, and the share-partitions this broker
leads (start offset, end offset, in-flight records by state).

Pure functions of the coordinator, the share-partitions and the metadata image.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import response_class

from .coordinator import ASSIGNOR_NAME, ShareGroupCoordinator
from .partitions import SharePartitions
from .protocol import DescribeSharePartitionsResponse, ShareGroupDescribeResponse

#: what a share group may do (Kafka's AclOperation codes: READ 3, DESCRIBE 8, DELETE 6)
_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


def describe_groups(
    req: Any,
    coordinator: ShareGroupCoordinator,
    coordinates: Callable[[str], bool],
    image: Any,
    partitions: SharePartitions,
) -> Any:
    """The ShareGroupDescribe v1 answer for `req.group_ids`."""
    R = ShareGroupDescribeResponse
    G = R.DescribedGroup
    M = G.Member
    described = []
    for group_id in req.group_ids or []:
        if not group_id:
            described.append(_error(group_id, KafkaError.INVALID_GROUP_ID, "empty group id"))
            continue
        if not coordinates(group_id):
            described.append(_error(group_id, KafkaError.NOT_COORDINATOR, None))
            continue
        group = coordinator.group(group_id)
        if group is None:
            described.append(
                _error(group_id, KafkaError.GROUP_ID_NOT_FOUND, f"no share group {group_id!r}")
            )
            continue
        members = []
        for m in group.members.values():
            tps = []
            for tid, ps in m.assignment.items():
                topic = image.topics.get(tid)
                tps.append(
                    M.Assignment.TopicPartitions(
                        topic_id=uuid.UUID(tid),
                        topic_name=topic.name if topic is not None else "",
                        partitions=list(ps),
                    )
                )
            members.append(
                M(
                    member_id=m.member_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=list(m.subscribed),
                    assignment=M.Assignment(topic_partitions=tps),
                )
            )
        described.append(
            G(
                error_code=KafkaError.NONE,
                group_id=group_id,
                group_state=group.state,
                group_epoch=group.group_epoch,
                assignment_epoch=group.group_epoch,
                assignor_name=ASSIGNOR_NAME,
                members=members,
                authorized_operations=_AUTHORIZED_OPERATIONS
                if req.include_authorized_operations
                else -(2**31),
            )
        )
    return R(version=1, throttle_time_ms=0, groups=described)


def _error(group_id: str, error: KafkaError, message: str | None) -> Any:
    G = ShareGroupDescribeResponse.DescribedGroup
    return G(
        error_code=error,
        error_message=message,
        group_id=group_id,
        group_state="Dead",
        group_epoch=-1,
        assignment_epoch=-1,
        assignor_name="",
        members=[],
    )


def list_groups_with_share(inner: Callable, coordinator: ShareGroupCoordinator, coordinates):
    """ListGroups `inner` (classic and consumer groups) plus the share groups coordinated
    here (type and protocol type "share"), under the request's state and type filters."""

    async def list_groups(req: Any, ctx: Any) -> Any:
        resp = await inner(req, ctx)
        version = ctx.api_version
        states = {s.lower() for s in (req.states_filter or [])} if version >= 4 else set()
        types = {t.lower() for t in (req.types_filter or [])} if version >= 5 else set()
        if types and "share" not in types:
            return resp
        listed = type(resp).ListedGroup
        for group in coordinator.groups():
            if not coordinates(group.group_id):
                continue
            if states and group.state.lower() not in states:
                continue
            fields = {"group_id": group.group_id, "protocol_type": "share"}
            if version >= 4:
                fields["group_state"] = group.state
            if version >= 5:
                fields["group_type"] = "share"
            resp.groups.append(listed(**fields))
        return resp

    return list_groups


def describe_share_partitions(partitions: SharePartitions, image: Any, group_id: str) -> Any:
    """The DescribeSharePartitions answer: `group_id`'s share-partitions loaded here."""
    R = DescribeSharePartitionsResponse
    out = []
    for sp in partitions.loaded():
        gid, tid, partition = sp.key
        if gid != group_id:
            continue
        topic = image.topics.get(tid)
        counts = sp.state.in_flight()
        out.append(
            R.SharePartition(
                topic_id=uuid.UUID(tid),
                topic_name=topic.name if topic is not None else "",
                partition=partition,
                leader_epoch=sp.leader_epoch,
                start_offset=sp.state.start_offset,
                end_offset=sp.state.end_offset,
                available=counts.get("AVAILABLE", 0),
                acquired=counts.get("ACQUIRED", 0),
                acknowledged=counts.get("ACKNOWLEDGED", 0),
                archived=counts.get("ARCHIVED", 0),
            )
        )
    return R(version=0, throttle_time_ms=0, partitions=out)


#: JoinGroup (classic) and ConsumerGroupHeartbeat (KIP-848): the error for a share group's id
OTHER_GROUP_JOINS = {11: KafkaError.INCONSISTENT_GROUP_PROTOCOL, 68: KafkaError.GROUP_ID_NOT_FOUND}


def refuse_share_group_ids(inner: Callable, coordinator: ShareGroupCoordinator):
    """JoinGroup / ConsumerGroupHeartbeat `inner`, refused for the id of a share group with
    members (its type cannot change while it has them)."""

    async def refuse(req: Any, ctx: Any) -> Any:
        group = coordinator.group(getattr(req, "group_id", "") or "")
        if group is None or not group.members:
            return await inner(req, ctx)
        error = OTHER_GROUP_JOINS[ctx.api_key]
        fields: dict[str, Any] = {"error_code": error}
        if ctx.api_key == 11:  # JoinGroup: the client reads these even on an error
            fields.update(generation_id=-1, leader="", member_id="", members=[])
        else:
            fields.update(
                error_message=f"group {group.group_id!r} is a share group",
                member_epoch=-1,
                heartbeat_interval_ms=0,
            )
        return response_class(ctx.api_key)[ctx.api_version](throttle_time_ms=0, **fields)

    return refuse


DESCRIBE_GROUPS_KEY = 15


def describe_share_groups_as_not_classic(inner: Callable, coordinator: ShareGroupCoordinator):
    """DescribeGroups `inner` (classic), with a share group's entry as Kafka 4 answers it:
    v6 GROUP_ID_NOT_FOUND "Group X is not a classic group.", older versions state Dead with
    no error (ShareGroupDescribe describes it)."""

    async def describe(req: Any, ctx: Any) -> Any:
        resp = await inner(req, ctx)
        for entry in resp.groups or []:
            if entry.group_state not in ("Dead", "") or coordinator.group(entry.group_id) is None:
                continue  # a classic group of that id (or none at all)
            entry.group_state = "Dead"
            if ctx.api_version >= 6:
                entry.error_code = KafkaError.GROUP_ID_NOT_FOUND
                entry.error_message = f"Group {entry.group_id} is not a classic group."
        return resp

    return describe
