"""KIP-848 on the wire: ConsumerGroupHeartbeat / ConsumerGroupDescribe through kafka-python's
codec both ways, and the classic group APIs beside consumer groups (ListGroups types filter,
OffsetCommit/OffsetFetch v9 member epochs, JoinGroup / DeleteGroups of a consumer group)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from kafka.protocol.admin import DeleteGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer import JoinGroupRequest, OffsetCommitRequest, OffsetFetchRequest

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import decode_request, supported_versions
from dataplane.kafka.groups.consumer_coordinator import ConsumerGroupCoordinator, TopicInfo
from dataplane.kafka.groups.consumer_handlers import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
)
from dataplane.kafka.groups.coordinator import GroupCoordinator
from dataplane.kafka.groups.handlers import GroupHandlers
from dataplane.kafka.groups.offsets import InMemoryOffsetStore
from tests.unit.test_group_handlers import Ctx, call

TOPIC_ID = "3f2504e0-4f89-41d3-9a0c-0305e82c3301"
CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
CommitPartition = CommitTopic.OffsetCommitRequestPartition
FetchGroup = OffsetFetchRequest.OffsetFetchRequestGroup
FetchGroupTopic = FetchGroup.OffsetFetchRequestTopics
HbTopic = ConsumerGroupHeartbeatRequest.TopicPartitions


class Store(InMemoryOffsetStore):
    """Offsets plus the consumer groups' state."""

    def __init__(self) -> None:
        super().__init__()
        self.states: dict[str, str] = {}

    def load_group_state(self, group_id):
        raw = self.states.get(group_id)
        return json.loads(raw) if raw else None

    async def save_group_state(self, group_id, snapshot):
        state = snapshot()
        if state is None:
            self.states.pop(group_id, None)
        else:
            self.states[group_id] = json.dumps(state)


def make() -> tuple[GroupHandlers, dict[int, Any]]:
    config = GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0)
    classic = GroupCoordinator(config)
    store = Store()
    topics = {"orders": TopicInfo(TOPIC_ID, 3)}
    consumer = ConsumerGroupCoordinator(
        config, store, classic, topics.get, lambda: list(topics), lambda _id: "orders"
    )
    handlers = GroupHandlers(classic, store, lambda _g: True, consumer_groups=consumer)
    by_key = {cls.API_KEY: handler for cls, _lo, _hi, handler in handlers.registrations()}
    return handlers, by_key


def heartbeat(version: int = 1, **kw: Any) -> Any:
    fields: dict[str, Any] = dict(
        group_id="cg",
        member_id="m1",
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=["orders"],
        topic_partitions=[],
    )
    fields.update(kw)
    return ConsumerGroupHeartbeatRequest[version](**fields)


def test_the_codec_decodes_the_new_apis():
    assert supported_versions(68) == (0, 1)
    assert supported_versions(69) == (0, 0)
    # a truncated heartbeat is a malformed request, not a crash
    body = bytes(heartbeat().encode())
    header = (68).to_bytes(2, "big") + (1).to_bytes(2, "big") + (7).to_bytes(4, "big")
    frame = header + (-1).to_bytes(2, "big", signed=True) + b"\x00" + body[:5]
    try:
        decode_request(frame)
    except Exception as exc:  # noqa: BLE001 - the codec's one error type
        assert type(exc).__name__ == "MalformedRequestError"


def test_heartbeat_and_describe_on_the_wire():
    async def scenario():
        _, by_key = make()
        joined = await call(by_key[68], heartbeat())
        assert joined.error_code == 0 and joined.member_id == "m1" and joined.member_epoch == 1
        assert joined.heartbeat_interval_ms == 5000
        parts = joined.assignment.topic_partitions
        assert [(str(t.topic_id), sorted(t.partitions)) for t in parts] == [(TOPIC_ID, [0, 1, 2])]
        # a heartbeat without changes carries no assignment
        again = await call(
            by_key[68],
            heartbeat(
                member_epoch=1,
                rebalance_timeout_ms=-1,
                subscribed_topic_names=None,
                topic_partitions=None,
            ),
        )
        assert again.error_code == 0 and again.assignment is None
        described = await call(
            by_key[69],
            ConsumerGroupDescribeRequest[0](
                group_ids=["cg", "none"], include_authorized_operations=True
            ),
        )
        cg, none = described.groups
        assert (cg.group_state, cg.group_epoch, cg.assignor_name) == ("Stable", 1, "uniform")
        member = cg.members[0]
        assert member.member_id == "m1" and member.subscribed_topic_names == ["orders"]
        assert [t.topic_name for t in member.assignment.topic_partitions] == ["orders"]
        assert none.error_code == KafkaError.GROUP_ID_NOT_FOUND
        fenced = await call(
            by_key[68],
            heartbeat(
                member_epoch=7,
                topic_partitions=[HbTopic(topic_id=uuid.UUID(TOPIC_ID), partitions=[0])],
            ),
        )
        assert fenced.error_code == KafkaError.FENCED_MEMBER_EPOCH and fenced.error_message

    asyncio.run(scenario())


def test_classic_apis_beside_a_consumer_group():
    async def scenario():
        handlers, by_key = make()
        joined = await call(by_key[68], heartbeat())
        epoch = joined.member_epoch

        def commit(member_epoch: int, version: int = 9) -> Any:
            return OffsetCommitRequest[version](
                group_id="cg",
                generation_id_or_member_epoch=member_epoch,
                member_id="m1",
                group_instance_id=None,
                topics=[
                    CommitTopic(
                        name="orders",
                        partitions=[
                            CommitPartition(
                                partition_index=0, committed_offset=5, committed_metadata=""
                            )
                        ],
                    )
                ],
            )

        ok = await call(handlers.offset_commit, commit(epoch))
        assert ok.topics[0].partitions[0].error_code == 0
        stale = await call(handlers.offset_commit, commit(epoch - 1))
        assert stale.topics[0].partitions[0].error_code == KafkaError.STALE_MEMBER_EPOCH
        fetch = OffsetFetchRequest[9](
            groups=[FetchGroup(group_id="cg", member_id="m1", member_epoch=epoch + 5, topics=None)],
            require_stable=False,
        )
        assert (await call(handlers.offset_fetch, fetch)).groups[
            0
        ].error_code == KafkaError.STALE_MEMBER_EPOCH
        fetch = OffsetFetchRequest[9](
            groups=[FetchGroup(group_id="cg", member_id="m1", member_epoch=epoch, topics=None)],
            require_stable=False,
        )
        fetched = (await call(handlers.offset_fetch, fetch)).groups[0]
        assert fetched.error_code == 0 and fetched.topics[0].partitions[0].committed_offset == 5
        listed = await call(
            handlers.list_groups, ListGroupsRequest[5](states_filter=[], types_filter=["consumer"])
        )
        assert [(g.group_id, g.group_type, g.group_state) for g in listed.groups] == [
            ("cg", "consumer", "Stable")
        ]
        listed = await call(
            handlers.list_groups, ListGroupsRequest[5](states_filter=[], types_filter=["classic"])
        )
        assert listed.groups == []
        # a classic member may not join a consumer group with members; it may not be deleted
        join = JoinGroupRequest[9](
            group_id="cg",
            session_timeout_ms=10_000,
            rebalance_timeout_ms=10_000,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[],
            reason=None,
        )
        refused = await call(handlers.join_group, join, Ctx(9))
        assert refused.error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        deleted = await call(handlers.delete_groups, DeleteGroupsRequest[2](groups_names=["cg"]))
        assert deleted.results[0].error_code == KafkaError.NON_EMPTY_GROUP
        # once the member left, the empty consumer group can be deleted
        left = await call(
            by_key[68],
            heartbeat(
                member_epoch=-1,
                rebalance_timeout_ms=-1,
                subscribed_topic_names=None,
                topic_partitions=None,
            ),
        )
        assert left.error_code == 0
        deleted = await call(handlers.delete_groups, DeleteGroupsRequest[2](groups_names=["cg"]))
        assert deleted.results[0].error_code == 0

    asyncio.run(scenario())


def test_the_zone_router_forwards_the_new_apis_like_the_classic_ones():
    from dataplane.zonerouter.coordinator_proxy import GROUP_REQUESTS, coordinator_key

    assert ConsumerGroupHeartbeatRequest in GROUP_REQUESTS
    assert ConsumerGroupDescribeRequest in GROUP_REQUESTS
    assert coordinator_key(heartbeat(group_id="x")) == (0, "x")
    one = ConsumerGroupDescribeRequest[0](group_ids=["y"], include_authorized_operations=False)
    assert coordinator_key(one) == (0, "y")
    two = ConsumerGroupDescribeRequest[0](group_ids=["y", "z"], include_authorized_operations=False)
    assert coordinator_key(two) is None  # several coordinators: answered where it arrives


def test_the_new_apis_check_group_acls():
    """With ACLs on, a principal without READ on the group gets GROUP_AUTHORIZATION_FAILED
    from ConsumerGroupHeartbeat, without DESCRIBE a denied entry from ConsumerGroupDescribe;
    the group's ACL lets the request through."""
    from controlplane.image import MetadataImage
    from controlplane.records import AclBinding
    from dataplane.kafka.registry import ApiRegistry, RequestContext
    from dataplane.kafka.security.authorizer import Authorizer
    from dataplane.kafka.security.enforcement import AclEnforcer

    image = MetadataImage(
        acls={
            "a": AclBinding(
                resource_type="GROUP",
                resource_name="open",
                principal="User:alice",
                operation="READ",
                permission="ALLOW",
            )
        }
    )
    _, by_key = make()
    registry = ApiRegistry()
    registry.register(ConsumerGroupHeartbeatRequest, 0, 1, by_key[68])
    registry.register(ConsumerGroupDescribeRequest, 0, 0, by_key[69])
    AclEnforcer(Authorizer(["User:admin"]), lambda: image).install(registry)

    def ctx(key: int, version: int) -> RequestContext:
        return RequestContext(
            api_key=key,
            api_version=version,
            correlation_id=1,
            client_id="unit",
            peer=("127.0.0.1", 1),
            extras={"principal": "User:alice"},
        )

    async def scenario():
        hb = registry.get(68).handler
        denied = await hb(heartbeat(group_id="closed"), ctx(68, 1))
        assert denied.error_code == KafkaError.GROUP_AUTHORIZATION_FAILED
        allowed = await hb(heartbeat(group_id="open"), ctx(68, 1))
        assert allowed.error_code == 0
        describe = registry.get(69).handler
        request = ConsumerGroupDescribeRequest[0](
            group_ids=["open", "closed"], include_authorized_operations=False
        )
        answer = await describe(request, ctx(69, 0))
        codes = {g.group_id: g.error_code for g in answer.groups}
        assert codes == {"open": 0, "closed": KafkaError.GROUP_AUTHORIZATION_FAILED}

    asyncio.run(scenario())


def test_v1_heartbeat_without_a_member_id_is_refused_v0_gets_one():
    """Kafka 4 (KIP-1082): from ConsumerGroupHeartbeat v1 the client generates its member id;
    an empty one is INVALID_REQUEST and creates no group. v0 still gets one from the broker."""

    async def scenario():
        handlers, by_key = make()
        refused = await call(by_key[68], heartbeat(version=1, member_id=""))
        assert refused.error_code == KafkaError.INVALID_REQUEST
        assert refused.error_message == "MemberId can't be empty."
        listed = await call(
            handlers.list_groups, ListGroupsRequest[5](states_filter=[], types_filter=[])
        )
        assert listed.groups == []
        joined = await call(by_key[68], heartbeat(version=0, member_id=""))
        assert joined.error_code == 0 and joined.member_id and joined.member_epoch == 1

    asyncio.run(scenario())


def test_describe_groups_of_a_consumer_group_answers_as_kafka_4():
    """Kafka 4's classic DescribeGroups of a KIP-848 group: v6 GROUP_ID_NOT_FOUND "Group X is
    not a classic group." (state Dead), older versions Dead with no error - even when the
    group has committed offsets (which an unknown group with offsets answers Empty)."""

    async def scenario():
        handlers, by_key = make()
        joined = await call(by_key[68], heartbeat())
        assert joined.error_code == 0
        commit = OffsetCommitRequest[9](
            group_id="cg",
            generation_id_or_member_epoch=joined.member_epoch,
            member_id="m1",
            group_instance_id=None,
            topics=[
                CommitTopic(
                    name="orders",
                    partitions=[
                        CommitPartition(
                            partition_index=0, committed_offset=3, committed_metadata=""
                        )
                    ],
                )
            ],
        )
        assert (await call(handlers.offset_commit, commit)).topics[0].partitions[0].error_code == 0
        for version, error, message in (
            (5, KafkaError.NONE, None),
            (6, KafkaError.GROUP_ID_NOT_FOUND, "Group cg is not a classic group."),
        ):
            got = await call(handlers.describe_groups, _describe_groups(version, ["cg"]))
            entry = got.groups[0]
            assert (entry.error_code, entry.group_state, entry.members) == (error, "Dead", [])
            assert entry.protocol_type == ""
            if version >= 6:
                assert entry.error_message == message

    asyncio.run(scenario())


def _describe_groups(version: int, groups: list[str]) -> Any:
    from kafka.protocol.admin import DescribeGroupsRequest

    return DescribeGroupsRequest[version](groups=groups, include_authorized_operations=False)
