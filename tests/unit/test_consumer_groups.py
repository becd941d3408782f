"""KIP-848 consumer groups: assignors, reconciliation (revoke before assign), fencing, static
members, regex subscriptions, metadata changes, durability and Kafka's error codes, on
`ConsumerGroupCoordinator` with an in-memory store and topic table."""

from __future__ import annotations

import asyncio
import json

import pytest

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.assignors import range_assign, uniform_assign
from dataplane.kafka.groups.consumer_coordinator import (
    ConsumerGroupCoordinator,
    HeartbeatParams,
    TopicInfo,
    check_regex,
)
from dataplane.kafka.groups.consumer_state import ConsumerGroupState, MemberState
from dataplane.kafka.groups.state import GroupState

T1, T2 = "00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"


class Store:
    """The group documents' state entries, as JSON text (what the KV keeps)."""

    def __init__(self) -> None:
        self.docs: dict[str, str] = {}
        self.writes = 0

    def load_group_state(self, group_id):
        raw = self.docs.get(group_id)
        return json.loads(raw) if raw else None

    async def save_group_state(self, group_id, snapshot):
        await asyncio.sleep(0)
        state = snapshot()
        self.writes += 1
        if state is None:
            self.docs.pop(group_id, None)
        else:
            self.docs[group_id] = json.dumps(state)


class Classic:
    """The classic coordinator as the consumer coordinator sees it."""

    def __init__(self, states=None) -> None:
        self.states: dict[str, GroupState] = dict(states or {})

    def group_state(self, group_id):
        return self.states.get(group_id)

    def unload_groups(self, predicate):
        for gid in [g for g in self.states if predicate(g)]:
            del self.states[gid]


class World:
    def __init__(self, store=None, classic=None, **config) -> None:
        self.topics = {"orders": TopicInfo(T1, 6), "payments": TopicInfo(T2, 2)}
        self.store = store or Store()
        self.classic = classic or Classic()
        self.coordinator = ConsumerGroupCoordinator(
            GroupCoordinatorConfig(**config),
            self.store,
            self.classic,
            self.topics.get,
            lambda: list(self.topics),
        )

    async def hb(self, member_id="a", epoch=0, group="g", **kw):
        if epoch == 0:
            kw.setdefault("rebalance_timeout_ms", 30_000)
            kw.setdefault("owned", {})
            if "subscribed_topic_regex" not in kw:
                kw.setdefault("subscribed_topic_names", ("orders",))
        return await self.coordinator.heartbeat(
            HeartbeatParams(group_id=group, member_id=member_id, member_epoch=epoch, **kw)
        )


def run(coro):
    return asyncio.run(coro)


def count(parts) -> int:
    return sum(len(p) for p in (parts or {}).values())


# ---------------------------------------------------------------- assignors


def test_uniform_is_balanced_and_sticky():
    subs = {"a": {T1}, "b": {T1}, "c": {T1}}
    first = uniform_assign(subs, {T1: 6}, {})
    assert sorted(count(first[m]) for m in subs) == [2, 2, 2]
    # a 4th member: the others keep what they can, only the surplus moves
    subs["d"] = {T1}
    second = uniform_assign(subs, {T1: 6}, first)
    assert sorted(count(second[m]) for m in subs) == [1, 1, 2, 2]
    for m in "abc":
        assert second[m][T1] <= first[m][T1]
    owners = [p for m in subs for p in second[m].get(T1, ())]
    assert sorted(owners) == list(range(6))


def test_uniform_respects_heterogeneous_subscriptions():
    result = uniform_assign({"a": {T1, T2}, "b": {T2}}, {T1: 4, T2: 2}, {})
    assert result["b"].get(T1) is None
    assert count(result["a"]) + count(result["b"]) == 6


def test_range_gives_contiguous_ranges_per_topic():
    result = range_assign({"a": {T1, T2}, "b": {T1, T2}}, {T1: 5, T2: 2}, {})
    assert result["a"] == {T1: {0, 1, 2}, T2: {0}}
    assert result["b"] == {T1: {3, 4}, T2: {1}}


def test_regex_check_refuses_non_re2_constructs():
    assert check_regex("orders-.*") is None
    for bad in ("(a)\\1", "a(?=b)", "(?<!x)y", "a++", "(", "x" * 2000):
        assert check_regex(bad) is not None, bad


# ---------------------------------------------------------------- reconciliation


def test_revoke_before_assign():
    async def scenario():
        w = World()
        a = await w.hb("a")
        assert a.error_code == 0 and a.member_epoch == 1 and count(a.assignment) == 6
        b = await w.hb("b")
        # b may not get a partition a still owns: nothing yet
        assert b.error_code == 0 and count(b.assignment) == 0
        # it waits for released partitions: told to come back sooner than the group interval
        assert (a.heartbeat_interval_ms, b.heartbeat_interval_ms) == (5000, 500)
        group = w.coordinator.loaded("g")
        assert group.state() is ConsumerGroupState.RECONCILING
        # a learns what to revoke; it stays at its epoch until it has
        a2 = await w.hb("a", 1, owned={T1: set(range(6))})
        assert a2.member_epoch == 1 and count(a2.assignment) == 3
        assert group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
        b2 = await w.hb("b", b.member_epoch, owned={})
        assert count(b2.assignment or {}) == 0
        # a reports the revocation: new epoch, and then b gets the released partitions
        kept = a2.assignment[T1]
        a3 = await w.hb("a", 1, owned={T1: kept})
        assert a3.member_epoch == 2
        b3 = await w.hb("b", b2.member_epoch, owned={})
        assert b3.member_epoch == 2 and b3.assignment[T1] == set(range(6)) - kept
        assert b3.heartbeat_interval_ms == 5000
        assert group.state() is ConsumerGroupState.STABLE

    run(scenario())


def test_fencing_and_error_codes():
    async def scenario():
        w = World()
        a = await w.hb("a")
        assert (await w.hb("a", a.member_epoch + 1, owned={})).error_code == (
            KafkaError.FENCED_MEMBER_EPOCH
        )
        assert (await w.hb("zz", 1)).error_code == KafkaError.UNKNOWN_MEMBER_ID
        assert (await w.hb("a", 1, group="nope")).error_code == KafkaError.GROUP_ID_NOT_FOUND
        assert (await w.hb("a", -5)).error_code == KafkaError.INVALID_REQUEST
        assert (await w.hb("", 3)).error_code == KafkaError.INVALID_REQUEST
        assert (
            await w.hb("a", 0, rebalance_timeout_ms=-1)
        ).error_code == KafkaError.INVALID_REQUEST
        assert (await w.hb("a", 0, owned={T1: {1}})).error_code == KafkaError.INVALID_REQUEST
        assert (await w.hb("a", 0, instance_id="")).error_code == KafkaError.INVALID_REQUEST
        assert (await w.hb("c", 0, server_assignor="sticky")).error_code == (
            KafkaError.UNSUPPORTED_ASSIGNOR
        )
        assert (await w.hb("c", 0, subscribed_topic_regex="(x)\\1")).error_code == (
            KafkaError.INVALID_REGULAR_EXPRESSION
        )
        # the previous epoch with a subset of the partitions is accepted (lost response)
        b = await w.hb("b")
        a2 = await w.hb("a", a.member_epoch, owned={T1: set(range(6))})
        await w.hb("a", a2.member_epoch, owned={T1: a2.assignment[T1]})
        group = w.coordinator.loaded("g")
        prev = group.members["a"].previous_member_epoch
        ok = await w.hb("a", prev, owned={T1: set(a2.assignment[T1])})
        assert ok.error_code == 0
        assert b.error_code == 0

    run(scenario())


def test_leave_and_session_expiry():
    async def scenario():
        w = World(consumer_session_timeout_ms=200)
        await w.hb("a")
        b = await w.hb("b")
        assert (await w.hb("b", b.member_epoch, owned=None)).error_code == 0
        left = await w.hb("b", -1)
        assert left.error_code == 0 and left.member_epoch == -1
        group = w.coordinator.loaded("g")
        assert set(group.members) == {"a"}
        assert (await w.hb("b", -1)).error_code == KafkaError.UNKNOWN_MEMBER_ID
        for _ in range(100):  # a stops heartbeating: fenced after its session timeout
            if not group.members:
                break
            await asyncio.sleep(0.02)
        assert not group.members and group.state() is ConsumerGroupState.EMPTY
        await asyncio.sleep(0.05)
        assert json.loads(w.store.docs["g"])["members"] == []

    run(scenario())


def test_static_member_restart_keeps_its_assignment():
    async def scenario():
        w = World()
        a = await w.hb("a1", instance_id="host-a")
        b = await w.hb("b1", instance_id="host-b")
        a2 = await w.hb("a1", a.member_epoch, owned={T1: set(range(6))})
        await w.hb("a1", a2.member_epoch, owned={T1: a2.assignment[T1]})
        b2 = await w.hb("b1", b.member_epoch, owned={})
        group = w.coordinator.loaded("g")
        epoch = group.group_epoch
        mine = set(group.members["a1"].assigned[T1])
        # another process with the same instance id while a1 holds it
        assert (
            await w.hb("a9", instance_id="host-a")
        ).error_code == KafkaError.UNRELEASED_INSTANCE_ID
        # a1 leaves temporarily (-2) and comes back with a new member id: same partitions,
        # no new group epoch, nobody else touched
        assert (await w.hb("a1", -2, instance_id="host-a")).member_epoch == -2
        back = await w.hb("a2", instance_id="host-a")
        assert back.error_code == 0 and back.assignment[T1] == mine
        assert group.group_epoch == epoch and "a1" not in group.members
        assert (
            await w.hb("a1", 3, instance_id="host-a")
        ).error_code == KafkaError.FENCED_INSTANCE_ID
        assert b2.error_code == 0

    run(scenario())


def test_static_pair_hands_over_only_once_the_owner_reports_its_revocation():
    """The heartbeat sequence of issue #31's e2e trace (librdkafka 2.16, two static members,
    4 partitions): b joins first and gets all 4; a joins (epoch 2, nothing yet: b still owns
    them). b's heartbeats carry no owned partitions while its application has not polled
    (librdkafka applies assignments in poll()): Kafka then counts b as still owning what it
    must revoke, so b stays at epoch 1 and a gets nothing, however long it lasts; the new
    assignment is sent to b once, then omitted until it changes or a full request comes.
    When b reports its partitions (the first ack, then the revocation) the handover
    completes: b moves to epoch 2 and a's next heartbeat gets the 2 released partitions."""

    async def scenario():
        w = World()
        w.topics["static"] = TopicInfo(T1, 4)
        static = {"subscribed_topic_names": ("static",), "rebalance_timeout_ms": 300_000}
        b = await w.hb("b1", instance_id="inst-b", **static)
        assert (b.member_epoch, b.assignment) == (1, {T1: {0, 1, 2, 3}})
        a = await w.hb("a1", instance_id="inst-a", **static)
        assert (a.member_epoch, a.assignment) == (2, {})
        group = w.coordinator.loaded("g")
        # b has not polled: its heartbeats carry owned=None
        b2 = await w.hb("b1", 1, owned=None)
        assert b2.member_epoch == 1 and count(b2.assignment) == 2
        kept = b2.assignment[T1]
        released = {0, 1, 2, 3} - kept
        for _ in range(3):
            assert (await w.hb("b1", 1, owned=None)).assignment is None  # unchanged: omitted
            a_full = await w.hb("a1", 2, instance_id="inst-a", owned={}, **static)
            assert (a_full.member_epoch, a_full.assignment) == (2, {})  # full: always sent
        assert group.members["b1"].state is MemberState.UNREVOKED_PARTITIONS
        assert group.members["a1"].state is MemberState.UNRELEASED_PARTITIONS
        assert group.group_epoch == 2 and group.state() is ConsumerGroupState.RECONCILING
        # b polls: it acknowledges the 4 partitions it was first given (still revoking) ...
        b3 = await w.hb("b1", 1, owned={T1: {0, 1, 2, 3}})
        assert (b3.member_epoch, b3.assignment) == (1, None)
        # ... then reports the revocation: epoch 2, and a gets what b released
        b4 = await w.hb("b1", 1, owned={T1: kept})
        assert (b4.member_epoch, b4.assignment) == (2, None)
        a2 = await w.hb("a1", 2, owned={})
        assert (a2.member_epoch, a2.assignment) == (2, {T1: released})
        assert group.state() is ConsumerGroupState.STABLE
        # a restarts within its session: -2, then a new member id at epoch 0 takes its place
        assert (await w.hb("a1", -2, instance_id="inst-a")).member_epoch == -2
        back = await w.hb("a2", instance_id="inst-a", **static)
        assert (back.error_code, back.member_epoch, back.assignment) == (0, 2, {T1: released})
        assert (await w.hb("b1", 2, owned={T1: kept})).assignment is None
        assert group.group_epoch == 2 and group.state() is ConsumerGroupState.STABLE

    run(scenario())


def test_regex_subscription_and_new_partitions():
    async def scenario():
        w = World()
        a = await w.hb("a", subscribed_topic_regex="pay.*")
        assert a.assignment == {T2: {0, 1}}
        w.topics["payments"] = TopicInfo(T2, 4)  # partitions added
        group = w.coordinator.loaded("g")
        epoch = group.group_epoch
        a2 = await w.hb("a", a.member_epoch, owned={T2: {0, 1}})
        assert group.group_epoch == epoch + 1 and a2.assignment == {T2: {0, 1, 2, 3}}

    run(scenario())


def test_state_is_durable_and_recovered_by_the_next_coordinator():
    async def scenario():
        store = Store()
        w = World(store)
        a = await w.hb("a")
        await w.hb("b")
        await w.hb("a", a.member_epoch, owned={T1: set(range(6))})
        before = w.coordinator.loaded("g").to_json()
        w.coordinator.close()
        w2 = World(store)  # the next coordinator of the slot
        group = w2.coordinator.group("g")
        assert group is not None and group.to_json() == before
        # members carry on with their epochs
        member_a = group.members["a"]
        ok = await w2.hb("a", member_a.member_epoch, owned={T1: set(member_a.assigned[T1])})
        assert ok.error_code == 0
        w2.coordinator.close()

    run(scenario())


def test_classic_groups_coexist():
    async def scenario():
        classic = Classic({"busy": GroupState.STABLE, "idle": GroupState.EMPTY})
        w = World(classic=classic)
        assert (await w.hb("a", group="busy")).error_code == KafkaError.GROUP_ID_NOT_FOUND
        converted = await w.hb("a", group="idle")
        assert converted.error_code == 0 and "idle" not in classic.states
        assert w.coordinator.state_of("idle") is not None
        assert w.coordinator.state_of("busy") is None

    run(scenario())


def test_offset_commit_and_fetch_check_member_epochs():
    async def scenario():
        w = World()
        a = await w.hb("a")
        c = w.coordinator
        assert c.validate_offset_commit("g", "a", a.member_epoch, 9) == KafkaError.NONE
        assert c.validate_offset_commit("g", "a", a.member_epoch - 1, 9) == (
            KafkaError.STALE_MEMBER_EPOCH
        )
        assert c.validate_offset_commit("g", "x", 1, 9) == KafkaError.UNKNOWN_MEMBER_ID
        assert (
            c.validate_offset_commit("g", "a", a.member_epoch, 8) == KafkaError.UNSUPPORTED_VERSION
        )
        assert c.validate_offset_commit("classic", "a", 1, 9) is None
        assert c.validate_offset_fetch("g", None, -1) == KafkaError.NONE
        assert c.validate_offset_fetch("g", "a", 99) == KafkaError.STALE_MEMBER_EPOCH
        assert c.validate_offset_fetch("g", "zz", 1) == KafkaError.UNKNOWN_MEMBER_ID

    run(scenario())


@pytest.mark.parametrize("epoch", [-3, -100, 2**31 - 1])
def test_malformed_heartbeats_never_crash(epoch):
    async def scenario():
        w = World()
        result = await w.hb("m", epoch, owned=None, subscribed_topic_names=None)
        assert result.error_code in (
            KafkaError.INVALID_REQUEST,
            KafkaError.GROUP_ID_NOT_FOUND,
        )

    run(scenario())
