"""GroupHandlers with real kafka-python requests of every supported version.

Requests are encoded and decoded with kafka-python (so they are what a client
sends), responses are encoded and decoded again (so they are what a client reads).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import kafka.errors as kafka_errors
import pytest
from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    ListGroupsRequest,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.coordinator import GroupCoordinator
from dataplane.kafka.groups.handlers import GroupHandlers
from dataplane.kafka.groups.offsets import CommittedOffset, InMemoryOffsetStore

T = TypeVar("T")

SUBSCRIPTION = ConsumerProtocolSubscription(version=0, topics=["t"], user_data=b"")
SUBSCRIPTION_BYTES = bytes(SUBSCRIPTION.encode())
ASSIGNMENT_BYTES = bytes(ConsumerProtocolAssignment(0, [("t", [0, 1])], b"").encode())

JoinProtocol = JoinGroupRequest.JoinGroupRequestProtocol
SyncAssignment = SyncGroupRequest.SyncGroupRequestAssignment
LeaveIdentity = LeaveGroupRequest.MemberIdentity
CommitTopic = OffsetCommitRequest.OffsetCommitRequestTopic
CommitPartition = OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition
FetchTopic = OffsetFetchRequest.OffsetFetchRequestTopic
FetchGroup = OffsetFetchRequest.OffsetFetchRequestGroup
FetchGroupTopic = OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics


@dataclass
class Ctx:
    """The wire server's request context as the handlers see it."""

    api_version: int
    client_id: str | None = "test-client"
    peer: tuple[str, int] = ("10.0.0.7", 50_000)


def run(factory: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """Run a test coroutine on a fresh loop, bounded by ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(bounded())


def make(
    is_coordinator: Callable[[str], bool] = lambda _g: True,
) -> tuple[GroupCoordinator, InMemoryOffsetStore, GroupHandlers]:
    counter = itertools.count(1)
    coord = GroupCoordinator(
        GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=10),
        member_id_factory=lambda prefix: f"{prefix}-{next(counter)}",
    )
    store = InMemoryOffsetStore()
    return coord, store, GroupHandlers(coord, store, is_coordinator)


async def call(
    handler: Callable[[Any, Any], Awaitable[Any]], request: Any, ctx: Ctx | None = None
) -> Any:
    """Send ``request`` through kafka-python's codec both ways around ``handler``."""
    version = request.version
    wire_request = type(request).decode(bytes(request.encode()), version=version)
    response = await handler(wire_request, ctx or Ctx(version))
    assert response.version == version
    assert response.API_KEY == request.API_KEY
    return type(response).decode(bytes(response.encode()), version=version)


def join_request(version: int, member_id: str = "", group_id: str = "grp", **overrides: Any) -> Any:
    fields: dict[str, Any] = dict(
        group_id=group_id,
        session_timeout_ms=10_000,
        rebalance_timeout_ms=10_000,
        member_id=member_id,
        group_instance_id=None,
        protocol_type="consumer",
        protocols=[JoinProtocol(name="range", metadata=SUBSCRIPTION)],
        reason=None,
    )
    fields.update(overrides)
    return JoinGroupRequest[version](**fields)


async def join(
    handlers: GroupHandlers, version: int, group_id: str = "grp", **overrides: Any
) -> Any:
    """JoinGroup as a client does it (v4+: MEMBER_ID_REQUIRED round trip, for dynamic
    members only: a static member gets its id at once, as in Kafka)."""
    response = await call(
        handlers.join_group, join_request(version, group_id=group_id, **overrides)
    )
    if version >= 4 and overrides.get("group_instance_id") is None:
        assert response.error_code == KafkaError.MEMBER_ID_REQUIRED
        assert response.member_id and response.generation_id == -1
        response = await call(
            handlers.join_group,
            join_request(version, response.member_id, group_id=group_id, **overrides),
        )
    assert response.error_code == KafkaError.NONE
    return response


def commit_request(
    version: int, generation: int, member_id: str, offset: int, group_id: str = "grp"
) -> Any:
    partition = CommitPartition(
        partition_index=0,
        committed_offset=offset,
        committed_leader_epoch=7,
        commit_timestamp=-1,
        committed_metadata="meta",
    )
    return OffsetCommitRequest[version](
        group_id=group_id,
        generation_id_or_member_epoch=generation,
        member_id=member_id,
        group_instance_id=None,
        retention_time_ms=-1,
        topics=[CommitTopic(name="t", partitions=[partition])],
    )


def fetch_request(version: int, group_id: str = "grp", partitions: list[int] | None = None) -> Any:
    partitions = [0, 1] if partitions is None else partitions
    if version >= 8:
        return OffsetFetchRequest[version](
            groups=[
                FetchGroup(
                    group_id=group_id,
                    topics=[FetchGroupTopic(name="t", partition_indexes=partitions)],
                )
            ],
            require_stable=False,
        )
    return OffsetFetchRequest[version](
        group_id=group_id,
        topics=[FetchTopic(name="t", partition_indexes=partitions)],
        require_stable=False,
    )


def fetched(response: Any, version: int) -> tuple[int, dict[tuple[str, int], Any]]:
    """(group error, partition -> response partition) of a single-group OffsetFetch response."""
    if version >= 8:
        (group,) = response.groups
        return group.error_code, {
            (t.name, p.partition_index): p for t in group.topics for p in t.partitions
        }
    error = response.error_code if version >= 2 else KafkaError.NONE
    return error, {(t.name, p.partition_index): p for t in response.topics for p in t.partitions}


# ---------------------------------------------------------------------- static checks


def test_error_codes_match_kafka() -> None:
    expected = {
        "OFFSET_METADATA_TOO_LARGE": kafka_errors.OffsetMetadataTooLargeError,
        "COORDINATOR_LOAD_IN_PROGRESS": kafka_errors.CoordinatorLoadInProgressError,
        "COORDINATOR_NOT_AVAILABLE": kafka_errors.CoordinatorNotAvailableError,
        "NOT_COORDINATOR": kafka_errors.NotCoordinatorError,
        "ILLEGAL_GENERATION": kafka_errors.IllegalGenerationError,
        "INCONSISTENT_GROUP_PROTOCOL": kafka_errors.InconsistentGroupProtocolError,
        "INVALID_GROUP_ID": kafka_errors.InvalidGroupIdError,
        "UNKNOWN_MEMBER_ID": kafka_errors.UnknownMemberIdError,
        "INVALID_SESSION_TIMEOUT": kafka_errors.InvalidSessionTimeoutError,
        "REBALANCE_IN_PROGRESS": kafka_errors.RebalanceInProgressError,
        "INVALID_COMMIT_OFFSET_SIZE": kafka_errors.InvalidCommitOffsetSizeError,
        "UNSUPPORTED_VERSION": kafka_errors.UnsupportedVersionError,
        "INVALID_REQUEST": kafka_errors.InvalidRequestError,
        "NON_EMPTY_GROUP": kafka_errors.NonEmptyGroupError,
        "GROUP_ID_NOT_FOUND": kafka_errors.GroupIdNotFoundError,
        "MEMBER_ID_REQUIRED": kafka_errors.MemberIdRequiredError,
        "GROUP_MAX_SIZE_REACHED": kafka_errors.GroupMaxSizeReachedError,
        "FENCED_INSTANCE_ID": kafka_errors.FencedInstanceIdError,
        "UNKNOWN_SERVER_ERROR": kafka_errors.UnknownError,
    }
    for name, cls in expected.items():
        assert KafkaError[name] == cls.errno, name
    assert KafkaError.NONE == 0


def test_registrations_cover_supported_versions() -> None:
    _coord, _store, handlers = make()
    registrations = handlers.registrations()
    by_class = {cls: (lo, hi) for cls, lo, hi, _h in registrations}
    assert by_class == {
        JoinGroupRequest: (0, 9),
        SyncGroupRequest: (0, 5),
        HeartbeatRequest: (0, 4),
        LeaveGroupRequest: (0, 5),
        OffsetCommitRequest: (0, 9),
        OffsetFetchRequest: (0, 9),
        ListGroupsRequest: (0, 5),
        DescribeGroupsRequest: (0, 6),
        DeleteGroupsRequest: (0, 2),
        OffsetDeleteRequest: (0, 0),
    }
    for cls, lo, hi, handler in registrations:
        assert 0 <= lo <= hi <= cls.max_version, cls.name
        assert inspect.iscoroutinefunction(handler)
        assert list(inspect.signature(handler).parameters) == ["request", "ctx"]


# ---------------------------------------------------------------------- full flow per version


@pytest.mark.parametrize("level", range(10))
def test_single_member_lifecycle_at_every_version(level: int) -> None:
    """JoinGroup v<level> with the matching version of every other group API."""
    jv, sv, hv, lv = level, min(level, 5), min(level, 4), min(level, 5)
    cv, fv, listv, dv, delv = (
        min(level, 9),
        min(level, 9),
        min(level, 5),
        min(level, 6),
        min(level, 2),
    )

    async def scenario() -> None:
        coord, store, handlers = make()
        joined = await join(handlers, jv)
        member_id = joined.member_id
        assert member_id.startswith("test-client-")
        assert (joined.generation_id, joined.leader, joined.protocol_name) == (
            1,
            member_id,
            "range",
        )
        if jv >= 7:
            assert joined.protocol_type == "consumer"
        assert [(m.member_id, bytes(m.metadata)) for m in joined.members] == [
            (member_id, SUBSCRIPTION_BYTES)
        ]
        assert ConsumerProtocolSubscription.decode(joined.members[0].metadata).topics == ["t"]

        sync = SyncGroupRequest[sv](
            group_id="grp",
            generation_id=1,
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocol_name="range",
            assignments=[SyncAssignment(member_id=member_id, assignment=ASSIGNMENT_BYTES)],
        )
        synced = await call(handlers.sync_group, sync)
        assert synced.error_code == KafkaError.NONE and bytes(synced.assignment) == ASSIGNMENT_BYTES
        if sv >= 5:
            assert (synced.protocol_type, synced.protocol_name) == ("consumer", "range")

        beat = HeartbeatRequest[hv](
            group_id="grp", generation_id=1, member_id=member_id, group_instance_id=None
        )
        assert (await call(handlers.heartbeat, beat)).error_code == KafkaError.NONE

        committed = await call(handlers.offset_commit, commit_request(cv, 1, member_id, 42))
        [[commit_error]] = [[p.error_code for p in t.partitions] for t in committed.topics]
        # v0 carries no generation: a "simple" commit, refused while the group has members.
        assert commit_error == (KafkaError.UNKNOWN_MEMBER_ID if cv == 0 else KafkaError.NONE)

        error, partitions = fetched(await call(handlers.offset_fetch, fetch_request(fv)), fv)
        assert error == KafkaError.NONE
        if cv > 0:
            p0 = partitions[("t", 0)]
            assert (p0.committed_offset, p0.metadata, p0.error_code) == (
                42,
                "meta",
                KafkaError.NONE,
            )
            if fv >= 5:
                assert p0.committed_leader_epoch == (7 if cv >= 6 else -1)
        assert partitions[("t", 1)].committed_offset == -1
        assert partitions[("t", 1)].metadata == ""

        described = await call(
            handlers.describe_groups,
            DescribeGroupsRequest[dv](groups=["grp"], include_authorized_operations=False),
        )
        (group,) = described.groups
        assert (group.error_code, group.group_id, group.group_state) == (
            KafkaError.NONE,
            "grp",
            "Stable",
        )
        assert (group.protocol_type, group.protocol_data) == ("consumer", "range")
        (member,) = group.members
        assert (member.member_id, member.client_id, member.client_host) == (
            member_id,
            "test-client",
            "/10.0.0.7",
        )
        assert bytes(member.member_metadata) == SUBSCRIPTION_BYTES
        assert bytes(member.member_assignment) == ASSIGNMENT_BYTES

        listed = await call(
            handlers.list_groups, ListGroupsRequest[listv](states_filter=[], types_filter=[])
        )
        assert listed.error_code == KafkaError.NONE
        assert [(g.group_id, g.protocol_type) for g in listed.groups] == [("grp", "consumer")]
        if listv >= 4:
            assert listed.groups[0].group_state == "Stable"
        if listv >= 5:
            assert listed.groups[0].group_type == "classic"

        if lv >= 3:
            leave = LeaveGroupRequest[lv](
                group_id="grp",
                members=[LeaveIdentity(member_id=member_id, group_instance_id=None, reason="bye")],
            )
        else:
            leave = LeaveGroupRequest[lv](group_id="grp", member_id=member_id)
        left = await call(handlers.leave_group, leave)
        assert left.error_code == KafkaError.NONE
        if lv >= 3:
            assert [(m.member_id, m.error_code) for m in left.members] == [
                (member_id, KafkaError.NONE)
            ]

        # The group is Empty now: a simple commit (any version) is accepted.
        simple = await call(handlers.offset_commit, commit_request(cv, -1, "", 43))
        assert simple.topics[0].partitions[0].error_code == KafkaError.NONE
        _error, partitions = fetched(await call(handlers.offset_fetch, fetch_request(fv)), fv)
        assert partitions[("t", 0)].committed_offset == 43

        deleted = await call(
            handlers.delete_groups, DeleteGroupsRequest[delv](groups_names=["grp"])
        )
        assert [(r.group_id, r.error_code) for r in deleted.results] == [("grp", KafkaError.NONE)]
        _error, partitions = fetched(await call(handlers.offset_fetch, fetch_request(fv)), fv)
        assert partitions[("t", 0)].committed_offset == -1
        coord.close()

    run(scenario)


@pytest.mark.parametrize("version", [3, 5, 9])
def test_two_members_leader_gets_all_metadata_and_followers_their_assignment(version: int) -> None:
    async def scenario() -> None:
        coord, _store, handlers = make()
        first, second = await asyncio.gather(join(handlers, version), join(handlers, version))
        leader, follower = (first, second) if first.leader == first.member_id else (second, first)
        assert leader.leader == follower.leader == leader.member_id
        assert sorted(m.member_id for m in leader.members) == sorted(
            [first.member_id, second.member_id]
        )
        assert follower.members == []
        sv = min(version, 5)

        def sync(member: Any, assignments: list[Any]) -> Any:
            return SyncGroupRequest[sv](
                group_id="grp",
                generation_id=member.generation_id,
                member_id=member.member_id,
                group_instance_id=None,
                protocol_type=None,
                protocol_name=None,
                assignments=assignments,
            )

        waiting = asyncio.ensure_future(call(handlers.sync_group, sync(follower, [])))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        leader_sync = await call(
            handlers.sync_group,
            sync(
                leader,
                [
                    SyncAssignment(member_id=leader.member_id, assignment=b"L"),
                    SyncAssignment(member_id=follower.member_id, assignment=b"F"),
                ],
            ),
        )
        follower_sync = await waiting
        assert (leader_sync.error_code, bytes(leader_sync.assignment)) == (KafkaError.NONE, b"L")
        assert (follower_sync.error_code, bytes(follower_sync.assignment)) == (
            KafkaError.NONE,
            b"F",
        )
        coord.close()

    run(scenario)


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize("level", [0, 3, 4, 9])
def test_not_coordinator_for_every_api(level: int) -> None:
    async def scenario() -> None:
        coord, store, handlers = make(is_coordinator=lambda g: g != "elsewhere")
        jv, sv, hv, lv = level, min(level, 5), min(level, 4), min(level, 5)
        cv, fv, dv, delv = level, level, min(level, 6), min(level, 2)
        joined = await call(handlers.join_group, join_request(jv, group_id="elsewhere"))
        assert joined.error_code == KafkaError.NOT_COORDINATOR and joined.generation_id == -1
        assert joined.protocol_name == ("" if jv < 7 else None)
        sync = SyncGroupRequest[sv](
            group_id="elsewhere",
            generation_id=1,
            member_id="m",
            group_instance_id=None,
            assignments=[],
        )
        assert (await call(handlers.sync_group, sync)).error_code == KafkaError.NOT_COORDINATOR
        beat = HeartbeatRequest[hv](
            group_id="elsewhere", generation_id=1, member_id="m", group_instance_id=None
        )
        assert (await call(handlers.heartbeat, beat)).error_code == KafkaError.NOT_COORDINATOR
        if lv >= 3:
            leave = LeaveGroupRequest[lv](
                group_id="elsewhere", members=[LeaveIdentity(member_id="m", group_instance_id=None)]
            )
        else:
            leave = LeaveGroupRequest[lv](group_id="elsewhere", member_id="m")
        assert (await call(handlers.leave_group, leave)).error_code == KafkaError.NOT_COORDINATOR
        committed = await call(
            handlers.offset_commit, commit_request(cv, 1, "m", 5, group_id="elsewhere")
        )
        assert committed.topics[0].partitions[0].error_code == KafkaError.NOT_COORDINATOR
        fetch = await call(handlers.offset_fetch, fetch_request(fv, group_id="elsewhere"))
        if fv < 2:  # no top-level error yet: every partition carries it
            assert {p.error_code for t in fetch.topics for p in t.partitions} == {
                KafkaError.NOT_COORDINATOR
            }
        else:
            assert fetched(fetch, fv)[0] == KafkaError.NOT_COORDINATOR
        described = await call(
            handlers.describe_groups, DescribeGroupsRequest[dv](groups=["elsewhere"])
        )
        assert described.groups[0].error_code == KafkaError.NOT_COORDINATOR
        deleted = await call(
            handlers.delete_groups, DeleteGroupsRequest[delv](groups_names=["elsewhere"])
        )
        assert deleted.results[0].error_code == KafkaError.NOT_COORDINATOR
        assert store.commit_calls == 0 and len(coord) == 0
        coord.close()

    run(scenario)


def test_invalid_group_id_for_membership_apis_only() -> None:
    async def scenario() -> None:
        coord, _store, handlers = make()
        assert (
            await call(handlers.join_group, join_request(5, group_id=""))
        ).error_code == KafkaError.INVALID_GROUP_ID
        beat = HeartbeatRequest[2](group_id="", generation_id=1, member_id="m")
        assert (await call(handlers.heartbeat, beat)).error_code == KafkaError.INVALID_GROUP_ID
        # The empty group id is legal for offsets (Kafka's backwards-compatibility rule).
        committed = await call(handlers.offset_commit, commit_request(2, -1, "", 5, group_id=""))
        assert committed.topics[0].partitions[0].error_code == KafkaError.NONE
        error, partitions = fetched(
            await call(handlers.offset_fetch, fetch_request(3, group_id="")), 3
        )
        assert error == KafkaError.NONE and partitions[("t", 0)].committed_offset == 5
        coord.close()

    run(scenario)


def test_join_errors_encode_for_old_and_new_versions() -> None:
    async def scenario() -> None:
        coord, _store, handlers = make()
        for version in range(10):
            response = await call(handlers.join_group, join_request(version, session_timeout_ms=1))
            assert response.error_code == KafkaError.INVALID_SESSION_TIMEOUT
            assert response.protocol_name == ("" if version < 7 else None)
            assert response.leader == "" and response.members == []
        coord.close()

    run(scenario)


def test_leave_unknown_members() -> None:
    async def scenario() -> None:
        coord, _store, handlers = make()
        joined = await join(handlers, 3)
        v1 = await call(
            handlers.leave_group, LeaveGroupRequest[1](group_id="grp", member_id="ghost")
        )
        assert v1.error_code == KafkaError.UNKNOWN_MEMBER_ID
        batch = LeaveGroupRequest[4](
            group_id="grp",
            members=[
                LeaveIdentity(member_id="ghost", group_instance_id=None),
                LeaveIdentity(member_id=joined.member_id, group_instance_id=None),
            ],
        )
        v4 = await call(handlers.leave_group, batch)
        assert v4.error_code == KafkaError.NONE
        assert [(m.member_id, m.error_code) for m in v4.members] == [
            ("ghost", KafkaError.UNKNOWN_MEMBER_ID),
            (joined.member_id, KafkaError.NONE),
        ]
        missing = await call(
            handlers.leave_group, LeaveGroupRequest[0](group_id="nope", member_id="m")
        )
        assert missing.error_code == KafkaError.UNKNOWN_MEMBER_ID
        coord.close()

    run(scenario)


# ---------------------------------------------------------------------- offsets


def test_offset_fetch_all_topics_and_batched_groups() -> None:
    async def scenario() -> None:
        coord, store, handlers = make(is_coordinator=lambda g: g != "far")
        await store.commit(
            "a",
            {("t", 1): CommittedOffset(11, 2, "x", 1), ("s", 0): CommittedOffset(5, -1, None, 1)},
        )
        await store.commit("b", {("t", 0): CommittedOffset(7, -1, "", 1)})
        # v2-v7: null topics means every committed partition.
        v7 = await call(
            handlers.offset_fetch,
            OffsetFetchRequest[7](group_id="a", topics=None, require_stable=True),
        )
        assert v7.error_code == KafkaError.NONE
        assert [
            (
                t.name,
                [
                    (p.partition_index, p.committed_offset, p.committed_leader_epoch, p.metadata)
                    for p in t.partitions
                ],
            )
            for t in v7.topics
        ] == [
            ("s", [(0, 5, -1, "")]),
            ("t", [(1, 11, 2, "x")]),
        ]
        # v8+: several groups at once, mixing null and explicit topics and a foreign group.
        request = OffsetFetchRequest[8](
            groups=[
                FetchGroup(group_id="a", topics=None),
                FetchGroup(
                    group_id="b", topics=[FetchGroupTopic(name="t", partition_indexes=[0, 3])]
                ),
                FetchGroup(group_id="far", topics=None),
                FetchGroup(
                    group_id="new", topics=[FetchGroupTopic(name="t", partition_indexes=[0])]
                ),
            ],
            require_stable=False,
        )
        v8 = await call(handlers.offset_fetch, request)
        summary = {
            g.group_id: (
                g.error_code,
                {
                    (t.name, p.partition_index): p.committed_offset
                    for t in g.topics
                    for p in t.partitions
                },
            )
            for g in v8.groups
        }
        assert summary == {
            "a": (KafkaError.NONE, {("s", 0): 5, ("t", 1): 11}),
            "b": (KafkaError.NONE, {("t", 0): 7, ("t", 3): -1}),
            "far": (KafkaError.NOT_COORDINATOR, {}),
            "new": (KafkaError.NONE, {("t", 0): -1}),
        }
        coord.close()

    run(scenario)


def test_offset_commit_v1_keeps_client_timestamp_and_metadata_limit() -> None:
    async def scenario() -> None:
        coord, store, handlers = make()
        partitions = [
            CommitPartition(
                partition_index=0,
                committed_offset=3,
                commit_timestamp=1234,
                committed_metadata=None,
            ),
            CommitPartition(
                partition_index=1,
                committed_offset=4,
                commit_timestamp=-1,
                committed_metadata="m" * 5000,
            ),
        ]
        request = OffsetCommitRequest[1](
            group_id="grp",
            generation_id_or_member_epoch=-1,
            member_id="",
            topics=[CommitTopic(name="t", partitions=partitions)],
        )
        response = await call(handlers.offset_commit, request)
        assert [p.error_code for p in response.topics[0].partitions] == [
            KafkaError.NONE,
            KafkaError.OFFSET_METADATA_TOO_LARGE,
        ]
        stored = store.snapshot()["grp"]
        assert stored == {("t", 0): CommittedOffset(3, -1, "", 1234)}
        coord.close()

    run(scenario)


def test_offset_commit_generation_checks_through_the_wire() -> None:
    async def scenario() -> None:
        coord, _store, handlers = make()
        joined = await join(handlers, 5)  # CompletingRebalance until it syncs
        codes = []
        for generation, member in [
            (1, joined.member_id),
            (2, joined.member_id),
            (1, "ghost"),
            (-1, ""),
        ]:
            response = await call(handlers.offset_commit, commit_request(8, generation, member, 1))
            codes.append(response.topics[0].partitions[0].error_code)
        assert codes == [
            KafkaError.REBALANCE_IN_PROGRESS,
            KafkaError.ILLEGAL_GENERATION,
            KafkaError.UNKNOWN_MEMBER_ID,
            KafkaError.UNKNOWN_MEMBER_ID,
        ]
        unknown_group = await call(
            handlers.offset_commit, commit_request(9, 3, "m", 1, group_id="other")
        )
        assert unknown_group.topics[0].partitions[0].error_code == KafkaError.ILLEGAL_GENERATION
        coord.close()

    run(scenario)


# ---------------------------------------------------------------------- admin APIs


def test_list_groups_filters_and_offset_only_groups() -> None:
    async def scenario() -> None:
        coord, store, handlers = make(is_coordinator=lambda g: not g.startswith("far"))
        await join(handlers, 5, group_id="active")
        await store.commit("parked", {("t", 0): CommittedOffset(1)})
        await store.commit("far-away", {("t", 0): CommittedOffset(1)})
        everything = await call(handlers.list_groups, ListGroupsRequest[3]())
        assert sorted((g.group_id, g.protocol_type) for g in everything.groups) == [
            ("active", "consumer"),
            ("parked", ""),
        ]
        stable_only = await call(
            handlers.list_groups, ListGroupsRequest[4](states_filter=["completingrebalance"])
        )
        assert [g.group_id for g in stable_only.groups] == ["active"]
        empty_only = await call(handlers.list_groups, ListGroupsRequest[4](states_filter=["Empty"]))
        assert [(g.group_id, g.group_state) for g in empty_only.groups] == [("parked", "Empty")]
        classic = await call(
            handlers.list_groups, ListGroupsRequest[5](states_filter=[], types_filter=["Classic"])
        )
        assert len(classic.groups) == 2 and {g.group_type for g in classic.groups} == {"classic"}
        consumer_type = await call(
            handlers.list_groups, ListGroupsRequest[5](states_filter=[], types_filter=["consumer"])
        )
        assert consumer_type.groups == []
        coord.close()

    run(scenario)


def test_describe_unknown_and_offset_only_groups() -> None:
    async def scenario() -> None:
        coord, store, handlers = make()
        await store.commit("parked", {("t", 0): CommittedOffset(1)})
        v5 = await call(
            handlers.describe_groups,
            DescribeGroupsRequest[5](
                groups=["missing", "parked"], include_authorized_operations=True
            ),
        )
        assert [(g.group_id, g.error_code, g.group_state, g.members) for g in v5.groups] == [
            ("missing", KafkaError.NONE, "Dead", []),
            ("parked", KafkaError.NONE, "Empty", []),
        ]
        assert v5.groups[1].authorized_operations == {3, 6, 8}
        v6 = await call(
            handlers.describe_groups,
            DescribeGroupsRequest[6](groups=["missing"], include_authorized_operations=False),
        )
        assert v6.groups[0].error_code == KafkaError.GROUP_ID_NOT_FOUND
        assert v6.groups[0].error_message == "Group missing not found."
        assert v6.groups[0].authorized_operations is None
        # Not Stable: no metadata or assignment yet.
        joined = await join(handlers, 4, group_id="busy")
        v0 = await call(handlers.describe_groups, DescribeGroupsRequest[0](groups=["busy"]))
        (group,) = v0.groups
        assert (group.group_state, group.protocol_data) == ("CompletingRebalance", "")
        assert [
            (m.member_id, bytes(m.member_metadata), bytes(m.member_assignment))
            for m in group.members
        ] == [(joined.member_id, b"", b"")]
        coord.close()

    run(scenario)


def test_delete_groups_rules_over_the_wire() -> None:
    async def scenario() -> None:
        coord, store, handlers = make()
        await join(handlers, 2, group_id="busy")
        await store.commit("parked", {("t", 0): CommittedOffset(1)})
        response = await call(
            handlers.delete_groups,
            DeleteGroupsRequest[1](groups_names=["busy", "parked", "missing", "parked"]),
        )
        assert [(r.group_id, r.error_code) for r in response.results] == [
            ("busy", KafkaError.NON_EMPTY_GROUP),
            ("parked", KafkaError.NONE),
            ("missing", KafkaError.GROUP_ID_NOT_FOUND),
        ]
        assert await store.list_groups() == []
        coord.close()

    run(scenario)


def test_static_member_over_the_wire() -> None:
    async def scenario() -> None:
        coord, _store, handlers = make()
        first = await join(handlers, 5, group_instance_id="pod-0")
        assert first.members[0].group_instance_id == "pod-0"
        replacement = await join(handlers, 5, group_instance_id="pod-0")
        assert replacement.generation_id == 2
        beat = HeartbeatRequest[3](
            group_id="grp", generation_id=2, member_id=first.member_id, group_instance_id="pod-0"
        )
        assert (await call(handlers.heartbeat, beat)).error_code == KafkaError.FENCED_INSTANCE_ID
        leave = LeaveGroupRequest[3](
            group_id="grp", members=[LeaveIdentity(member_id="", group_instance_id="pod-0")]
        )
        left = await call(handlers.leave_group, leave)
        assert [(m.group_instance_id, m.error_code) for m in left.members] == [
            ("pod-0", KafkaError.NONE)
        ]
        coord.close()

    run(scenario)
