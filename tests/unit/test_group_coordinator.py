"""GroupCoordinator state machine, driven on a real asyncio loop with short timers."""

from __future__ import annotations

import asyncio
import itertools
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.coordinator import GroupCoordinator
from dataplane.kafka.groups.state import (
    Group,
    GroupState,
    IllegalStateTransition,
    JoinGroupParams,
    JoinGroupResult,
    Member,
)

T = TypeVar("T")

PROTOCOLS = (("range", b"meta-range"), ("roundrobin", b"meta-rr"))


class _VirtualTimeSelector(selectors.DefaultSelector):
    """Polls without blocking; a wait for the next timer advances the loop's virtual clock."""

    def __init__(self) -> None:
        super().__init__()
        self.now_s = 0.0

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0 if timeout is not None else None)
        if not ready and timeout is not None and timeout > 0:
            self.now_s += timeout  # nothing to do before the next timer: jump to it
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only while it is idle.

    The coordinator's timers (``loop.call_at``) and the tests' ``asyncio.sleep`` then fire in
    the order of their deadlines whatever the machine's load: on a real clock a loop stalled
    for 100 ms by other processes let a 100 ms session expire between two 40 ms heartbeats.
    Only for code without threads or I/O (the coordinator is pure asyncio).
    """

    def __init__(self) -> None:
        self._virtual_selector = _VirtualTimeSelector()
        super().__init__(self._virtual_selector)

    def time(self) -> float:
        return self._virtual_selector.now_s


def run(factory: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """Run a test coroutine on a fresh virtual-time loop, bounded by ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(factory(), timeout)

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(bounded())


def make_coordinator(**overrides: Any) -> GroupCoordinator:
    """A coordinator with fast timers and predictable member ids (``<prefix>-<n>``)."""
    settings: dict[str, Any] = dict(
        group_initial_rebalance_delay_ms=0,
        group_min_session_timeout_ms=10,
        group_max_session_timeout_ms=60_000,
    )
    settings.update(overrides)
    counter = itertools.count(1)
    return GroupCoordinator(
        GroupCoordinatorConfig(**settings),
        member_id_factory=lambda prefix: f"{prefix}-{next(counter)}",
    )


def params(
    group_id: str = "g",
    member_id: str = "",
    *,
    client_id: str = "client",
    protocols: tuple[tuple[str, bytes], ...] = PROTOCOLS,
    protocol_type: str = "consumer",
    session_timeout_ms: int = 10_000,
    rebalance_timeout_ms: int = 5_000,
    require_known_member_id: bool = False,
    group_instance_id: str | None = None,
) -> JoinGroupParams:
    """A JoinGroup request with defaults suitable for the tests."""
    return JoinGroupParams(
        group_id=group_id,
        member_id=member_id,
        group_instance_id=group_instance_id,
        client_id=client_id,
        client_host="/127.0.0.1",
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=rebalance_timeout_ms,
        protocol_type=protocol_type,
        protocols=protocols,
        require_known_member_id=require_known_member_id,
    )


async def form_group(
    coord: GroupCoordinator, n: int, group_id: str = "g", **kwargs: Any
) -> list[JoinGroupResult]:
    """``n`` new members join concurrently and complete SyncGroup; returns the join results."""
    results = await asyncio.gather(
        *(coord.join_group(params(group_id, client_id=f"c{i}", **kwargs)) for i in range(n))
    )
    assert {r.error_code for r in results} == {KafkaError.NONE}
    assert len({r.generation_id for r in results}) == 1
    leader = results[0].leader_id
    assignments = {r.member_id: f"assign-{r.member_id}".encode() for r in results}
    syncs = await asyncio.gather(
        *(
            coord.sync_group(
                group_id,
                r.generation_id,
                r.member_id,
                assignments=assignments if r.member_id == leader else None,
            )
            for r in results
        )
    )
    assert [s.error_code for s in syncs] == [KafkaError.NONE] * n
    assert coord.group_state(group_id) is GroupState.STABLE
    return results


async def settle(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait (bounded) until ``predicate()`` holds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


# ---------------------------------------------------------------------- join + sync


def test_three_members_join_one_generation_and_sync_distributes_assignments() -> None:
    async def scenario() -> None:
        coord = make_coordinator(group_initial_rebalance_delay_ms=100)
        protocols = [
            (("range", b"r0"), ("roundrobin", b"rr0")),
            (("roundrobin", b"rr1"), ("range", b"r1")),
            (("range", b"r2"), ("sticky", b"s2")),
        ]
        joins = [
            asyncio.ensure_future(
                coord.join_group(params(client_id=f"c{i}", protocols=protocols[i]))
            )
            for i in range(3)
        ]
        results = await asyncio.gather(*joins)
        assert [r.error_code for r in results] == [KafkaError.NONE] * 3
        assert {r.generation_id for r in results} == {1}
        # "range" is the only protocol all three support.
        assert {r.protocol_name for r in results} == {"range"}
        assert {r.protocol_type for r in results} == {"consumer"}
        ids = [r.member_id for r in results]
        assert ids == ["c0-1", "c1-2", "c2-3"]
        leader = results[0]
        assert {r.leader_id for r in results} == {"c0-1"}
        # The leader sees every member's metadata for the selected protocol, followers nothing.
        assert [(m.member_id, m.metadata) for m in leader.members] == [
            ("c0-1", b"r0"),
            ("c1-2", b"r1"),
            ("c2-3", b"r2"),
        ]
        assert results[1].members == () and results[2].members == ()
        assert coord.group_state("g") is GroupState.COMPLETING_REBALANCE

        # Followers sync first and wait for the leader.
        follower_syncs = [asyncio.ensure_future(coord.sync_group("g", 1, mid)) for mid in ids[1:]]
        await asyncio.sleep(0.02)
        assert not any(f.done() for f in follower_syncs)
        leader_sync = await coord.sync_group(
            "g", 1, ids[0], assignments={mid: f"A{i}".encode() for i, mid in enumerate(ids)}
        )
        followers = await asyncio.gather(*follower_syncs)
        assert leader_sync.error_code == KafkaError.NONE and leader_sync.assignment == b"A0"
        assert [(f.error_code, f.assignment) for f in followers] == [(0, b"A1"), (0, b"A2")]
        assert leader_sync.protocol_name == "range" and leader_sync.protocol_type == "consumer"
        assert coord.group_state("g") is GroupState.STABLE

        summary = coord.describe_group("g")
        assert summary is not None and summary.state is GroupState.STABLE
        assert summary.protocol_name == "range" and summary.leader_id == ids[0]
        assert [(m.member_id, m.metadata, m.assignment) for m in summary.members] == [
            (ids[0], b"r0", b"A0"),
            (ids[1], b"r1", b"A1"),
            (ids[2], b"r2", b"A2"),
        ]
        for mid in ids:
            assert await coord.heartbeat("g", 1, mid) == KafkaError.NONE
        coord.close()

    run(scenario)


def test_protocol_selection_by_votes_ties_follow_leader_preference() -> None:
    group = Group("g")

    def member(mid: str, names: list[str]) -> Member:
        return Member(mid, None, "c", "h", 10, 10, "consumer", tuple((n, b"") for n in names))

    group.add(member("a", ["x", "y"]))
    group.add(member("b", ["y", "x"]))
    assert group.select_protocol() == "x"  # 1-1 tie, the leader prefers x
    group.add(member("c", ["y", "x"]))
    assert group.select_protocol() == "y"  # 2 votes to 1
    group.add(member("d", ["z"]))
    assert group.candidate_protocols() == set()
    with pytest.raises(ValueError):
        group.select_protocol()


def test_illegal_transition_is_refused() -> None:
    group = Group("g")
    with pytest.raises(IllegalStateTransition):
        group.transition_to(GroupState.STABLE)
    group.transition_to(GroupState.PREPARING_REBALANCE)
    group.transition_to(GroupState.COMPLETING_REBALANCE)
    group.transition_to(GroupState.STABLE)
    assert group.state is GroupState.STABLE


def test_initial_rebalance_delay_waits_for_more_members() -> None:
    async def scenario() -> None:
        delay_ms = 150
        coord = make_coordinator(group_initial_rebalance_delay_ms=delay_ms)
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.ensure_future(coord.join_group(params(client_id="a")))
        await asyncio.sleep(0.05)
        assert not first.done()
        assert coord.group_state("g") is GroupState.PREPARING_REBALANCE
        second = await coord.join_group(params(client_id="b"))
        elapsed_ms = (loop.time() - start) * 1000
        a = await first
        # One generation with both, and the group waited at least the configured delay.
        assert a.generation_id == second.generation_id == 1
        assert len(a.members) == 2
        assert elapsed_ms >= delay_ms * 0.9
        coord.close()

    run(scenario)


def test_initial_delay_is_extended_while_members_keep_arriving() -> None:
    async def scenario() -> None:
        # delay 200 ms: joins at 0, 100 and 300 ms.  Without the extension the first
        # generation would close at 200 ms with two members.
        coord = make_coordinator(group_initial_rebalance_delay_ms=200)
        first = asyncio.ensure_future(coord.join_group(params(client_id="a")))
        await asyncio.sleep(0.1)
        second = asyncio.ensure_future(coord.join_group(params(client_id="b")))
        await asyncio.sleep(0.2)
        third = await coord.join_group(params(client_id="c"))
        results = [await first, await second, third]
        assert [r.generation_id for r in results] == [1, 1, 1]
        assert len(results[0].members) == 3
        coord.close()

    run(scenario)


def test_rebalance_waits_for_members_told_member_id_required() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        (a,) = await form_group(coord, 1)
        pending = await coord.join_group(params(client_id="b", require_known_member_id=True))
        assert pending.error_code == KafkaError.MEMBER_ID_REQUIRED
        rejoin_a = asyncio.ensure_future(coord.join_group(params(member_id=a.member_id)))
        await asyncio.sleep(0.05)
        assert not rejoin_a.done()  # b holds a member id and is expected back
        b = await coord.join_group(
            params(member_id=pending.member_id, require_known_member_id=True)
        )
        a2 = await rejoin_a
        assert a2.generation_id == b.generation_id == 2
        assert [m.member_id for m in a2.members] == [a.member_id, pending.member_id]
        coord.close()

    run(scenario)


def test_initial_delay_is_bounded_by_rebalance_timeout() -> None:
    async def scenario() -> None:
        # Members keep arriving every 40 ms; the delay (60 ms) would be extended forever
        # but the rebalance timeout (200 ms) caps the whole join phase.
        coord = make_coordinator(group_initial_rebalance_delay_ms=60)
        loop = asyncio.get_running_loop()
        start = loop.time()
        first = asyncio.ensure_future(
            coord.join_group(params(client_id="m0", rebalance_timeout_ms=200))
        )
        joiners = [first]
        for i in range(1, 30):
            await asyncio.sleep(0.04)
            if first.done():
                break
            joiners.append(
                asyncio.ensure_future(
                    coord.join_group(params(client_id=f"m{i}", rebalance_timeout_ms=200))
                )
            )
        result = await first
        elapsed_ms = (loop.time() - start) * 1000
        assert result.error_code == KafkaError.NONE and result.generation_id == 1
        assert elapsed_ms < 200 + 60 + 400  # bounded (generous margin for a loaded machine)
        assert len(joiners) < 30
        coord.close()
        await asyncio.gather(*joiners)

    run(scenario)


def test_member_id_required_flow() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        first = await coord.join_group(
            params(require_known_member_id=True, session_timeout_ms=10_000)
        )
        assert first.error_code == KafkaError.MEMBER_ID_REQUIRED
        assert first.member_id == "client-1" and first.generation_id == -1
        assert coord.group_state("g") is GroupState.EMPTY  # no rebalance before the rejoin
        # A made-up member id is refused.
        bogus = await coord.join_group(params(member_id="nobody", require_known_member_id=True))
        assert bogus.error_code == KafkaError.UNKNOWN_MEMBER_ID
        joined = await coord.join_group(
            params(member_id=first.member_id, require_known_member_id=True)
        )
        assert joined.error_code == KafkaError.NONE
        assert joined.member_id == first.member_id and joined.leader_id == first.member_id
        assert joined.generation_id == 1
        coord.close()

    run(scenario)


def test_pending_member_expires_after_session_timeout() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        first = await coord.join_group(params(require_known_member_id=True, session_timeout_ms=50))
        assert first.error_code == KafkaError.MEMBER_ID_REQUIRED
        await asyncio.sleep(0.15)
        late = await coord.join_group(
            params(member_id=first.member_id, require_known_member_id=True)
        )
        assert late.error_code == KafkaError.UNKNOWN_MEMBER_ID
        coord.close()

    run(scenario)


def test_join_validation_errors() -> None:
    async def scenario() -> None:
        coord = make_coordinator(group_max_size=2)
        assert (
            await coord.join_group(params(group_id=""))
        ).error_code == KafkaError.INVALID_GROUP_ID
        assert (
            await coord.join_group(params(session_timeout_ms=5))
        ).error_code == KafkaError.INVALID_SESSION_TIMEOUT
        assert (
            await coord.join_group(params(session_timeout_ms=60_001))
        ).error_code == KafkaError.INVALID_SESSION_TIMEOUT
        assert (
            await coord.join_group(params(protocols=()))
        ).error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        assert (
            await coord.join_group(params(protocol_type=""))
        ).error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        huge = (("range", b"x" * (coord.config.max_member_metadata_bytes + 1)),)
        assert (
            await coord.join_group(params(protocols=huge))
        ).error_code == KafkaError.INVALID_REQUEST
        # Known member id for a group that does not exist.
        assert (
            await coord.join_group(params(group_id="nope", member_id="m"))
        ).error_code == KafkaError.UNKNOWN_MEMBER_ID

        await form_group(coord, 2)
        # Different protocol type, no common protocol, full group.
        other = await coord.join_group(params(protocol_type="connect"))
        assert other.error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        disjoint = await coord.join_group(params(protocols=(("sticky", b""),)))
        assert disjoint.error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        full = await coord.join_group(params())
        assert full.error_code == KafkaError.GROUP_MAX_SIZE_REACHED
        assert coord.group_state("g") is GroupState.STABLE  # refused joins trigger nothing
        coord.close()

    run(scenario)


def test_max_groups_evicts_empty_groups_only() -> None:
    async def scenario() -> None:
        coord = make_coordinator(max_groups=2)
        a = await coord.join_group(params("a"))
        assert a.error_code == KafkaError.NONE
        await coord.join_group(params("b"))
        # Both groups have members: a third group is refused (retriable error).
        refused = await coord.join_group(params("c"))
        assert refused.error_code == KafkaError.COORDINATOR_NOT_AVAILABLE
        assert coord.group_state("c") is None
        leave = await coord.leave_group("a", [(a.member_id, None)])
        assert leave.members[0].error_code == KafkaError.NONE
        await settle(lambda: coord.group_state("a") is GroupState.EMPTY)
        admitted = await coord.join_group(params("c"))
        assert admitted.error_code == KafkaError.NONE
        assert coord.group_state("a") is None  # the Empty group made room
        assert len(coord) == 2
        coord.close()

    run(scenario)


# ---------------------------------------------------------------------- rebalances


def test_leave_triggers_rebalance_and_remaining_members_get_new_generation() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        results = await form_group(coord, 3)
        a, b, c = (r.member_id for r in results)
        leave = await coord.leave_group("g", [(c, None)])
        assert (
            leave.error_code == KafkaError.NONE and leave.members[0].error_code == KafkaError.NONE
        )
        assert coord.group_state("g") is GroupState.PREPARING_REBALANCE
        # Remaining members learn about it through their heartbeat.
        assert await coord.heartbeat("g", 1, a) == KafkaError.REBALANCE_IN_PROGRESS
        assert await coord.heartbeat("g", 1, b) == KafkaError.REBALANCE_IN_PROGRESS
        assert await coord.heartbeat("g", 1, c) == KafkaError.UNKNOWN_MEMBER_ID
        ra, rb = await asyncio.gather(
            coord.join_group(params(member_id=a)), coord.join_group(params(member_id=b))
        )
        assert ra.generation_id == rb.generation_id == 2
        assert ra.leader_id == a and [m.member_id for m in ra.members] == [a, b]
        # Old generation is now illegal.
        assert await coord.heartbeat("g", 1, a) == KafkaError.ILLEGAL_GENERATION
        assert (
            await coord.heartbeat("g", 2, a) == KafkaError.NONE
        )  # CompletingRebalance: plain heartbeat
        coord.close()

    run(scenario)


def test_leader_leaving_hands_leadership_to_next_member() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        results = await form_group(coord, 3)
        a, b, c = (r.member_id for r in results)
        await coord.leave_group("g", [(a, None)])
        rb, rc = await asyncio.gather(
            coord.join_group(params(member_id=b)), coord.join_group(params(member_id=c))
        )
        assert rb.leader_id == rc.leader_id == b
        assert len(rb.members) == 2 and rc.members == ()
        coord.close()

    run(scenario)


def test_last_member_leaving_empties_the_group() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        (only,) = await form_group(coord, 1)
        result = await coord.leave_group("g", [(only.member_id, None), ("ghost", None)])
        assert [m.error_code for m in result.members] == [
            KafkaError.NONE,
            KafkaError.UNKNOWN_MEMBER_ID,
        ]
        assert coord.group_state("g") is GroupState.EMPTY
        summary = coord.describe_group("g")
        assert summary is not None and summary.members == () and summary.generation_id == 2
        assert summary.protocol_type == "consumer"
        assert await coord.heartbeat("g", 2, only.member_id) == KafkaError.UNKNOWN_MEMBER_ID
        coord.close()

    run(scenario)


def test_session_timeout_expires_silent_member() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        a, b = (
            r.member_id
            for r in await form_group(coord, 2, session_timeout_ms=150, rebalance_timeout_ms=2_000)
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3.0
        seen = KafkaError.NONE
        # a heartbeats every 30 ms, b stays silent; bounded loop.
        while loop.time() < deadline:
            seen = await coord.heartbeat("g", 1, a)
            if seen != KafkaError.NONE:
                break
            await asyncio.sleep(0.03)
        assert seen == KafkaError.REBALANCE_IN_PROGRESS
        assert await coord.heartbeat("g", 1, b) == KafkaError.UNKNOWN_MEMBER_ID
        rejoin = await coord.join_group(params(member_id=a, session_timeout_ms=150))
        assert rejoin.generation_id == 2 and [m.member_id for m in rejoin.members] == [a]
        coord.close()

    run(scenario)


def test_heartbeats_keep_member_alive_past_session_timeout() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        (member,) = await form_group(coord, 1, session_timeout_ms=100)
        for _ in range(10):  # 10 x 40 ms = four session timeouts
            assert await coord.heartbeat("g", 1, member.member_id) == KafkaError.NONE
            await asyncio.sleep(0.04)
        assert coord.group_state("g") is GroupState.STABLE
        await asyncio.sleep(0.3)
        assert coord.group_state("g") is GroupState.EMPTY  # silence expires it
        coord.close()

    run(scenario)


def test_member_not_rejoining_within_rebalance_timeout_is_removed() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        a, b = (r.member_id for r in await form_group(coord, 2, rebalance_timeout_ms=200))
        loop = asyncio.get_running_loop()
        start = loop.time()
        # The leader rejoining triggers a rebalance; b never rejoins (it keeps heartbeating).
        join_a = asyncio.ensure_future(
            coord.join_group(params(member_id=a, rebalance_timeout_ms=200))
        )
        await asyncio.sleep(0.05)
        assert await coord.heartbeat("g", 1, b) == KafkaError.REBALANCE_IN_PROGRESS
        result = await join_a
        assert (loop.time() - start) >= 0.18
        assert result.generation_id == 2 and [m.member_id for m in result.members] == [a]
        assert await coord.heartbeat("g", 1, b) == KafkaError.UNKNOWN_MEMBER_ID
        coord.close()

    run(scenario)


def test_new_member_during_completing_rebalance_sends_waiting_followers_back() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        r1, r2 = await asyncio.gather(
            coord.join_group(params(client_id="a")), coord.join_group(params(client_id="b"))
        )
        assert coord.group_state("g") is GroupState.COMPLETING_REBALANCE
        follower = r2 if r1.leader_id == r1.member_id else r1
        waiting = asyncio.ensure_future(
            coord.sync_group("g", follower.generation_id, follower.member_id)
        )
        await asyncio.sleep(0.02)
        newcomer = asyncio.ensure_future(coord.join_group(params(client_id="c")))
        synced = await waiting
        assert synced.error_code == KafkaError.REBALANCE_IN_PROGRESS
        assert coord.group_state("g") is GroupState.PREPARING_REBALANCE
        # Everybody rejoins -> generation 2 with three members.
        again = await asyncio.gather(
            coord.join_group(params(member_id=r1.member_id)),
            coord.join_group(params(member_id=r2.member_id)),
        )
        c = await newcomer
        assert {r.generation_id for r in (*again, c)} == {2}
        coord.close()

    run(scenario)


def test_sync_errors() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        (m,) = await form_group(coord, 1)
        mid = m.member_id
        assert (await coord.sync_group("g", 1, "ghost")).error_code == KafkaError.UNKNOWN_MEMBER_ID
        assert (await coord.sync_group("g", 7, mid)).error_code == KafkaError.ILLEGAL_GENERATION
        assert (await coord.sync_group("nope", 1, mid)).error_code == KafkaError.UNKNOWN_MEMBER_ID
        assert (
            await coord.sync_group("g", 1, mid, protocol_type="connect")
        ).error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        assert (
            await coord.sync_group("g", 1, mid, protocol_name="sticky")
        ).error_code == KafkaError.INCONSISTENT_GROUP_PROTOCOL
        # Stable: a repeated SyncGroup returns the stored assignment.
        again = await coord.sync_group("g", 1, mid, protocol_type="consumer", protocol_name="range")
        assert again.error_code == KafkaError.NONE and again.assignment == f"assign-{mid}".encode()
        # PreparingRebalance: REBALANCE_IN_PROGRESS.
        pending = asyncio.ensure_future(coord.join_group(params(client_id="late")))
        await asyncio.sleep(0.01)
        assert (await coord.sync_group("g", 1, mid)).error_code == KafkaError.REBALANCE_IN_PROGRESS
        coord.close()
        assert (await pending).error_code == KafkaError.NOT_COORDINATOR

    run(scenario)


def test_member_that_never_syncs_is_removed_after_rebalance_timeout() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        ra, rb = await asyncio.gather(
            coord.join_group(params(client_id="a", rebalance_timeout_ms=150)),
            coord.join_group(params(client_id="b", rebalance_timeout_ms=150)),
        )
        leader = ra if ra.leader_id == ra.member_id else rb
        follower = rb if leader is ra else ra
        synced = await coord.sync_group(
            "g", 1, leader.member_id, assignments={leader.member_id: b"x"}
        )
        assert synced.error_code == KafkaError.NONE
        # The follower neither syncs nor heartbeats; the sync deadline removes it.
        await settle(lambda: coord.group_state("g") is GroupState.PREPARING_REBALANCE)
        assert await coord.heartbeat("g", 1, follower.member_id) == KafkaError.UNKNOWN_MEMBER_ID
        coord.close()

    run(scenario)


def test_rejoin_with_same_metadata_in_completing_rebalance_returns_current_generation() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        ra, rb = await asyncio.gather(
            coord.join_group(params(client_id="a")), coord.join_group(params(client_id="b"))
        )
        follower = rb if ra.leader_id == ra.member_id else ra
        again = await coord.join_group(params(member_id=follower.member_id))
        assert (
            again.error_code == KafkaError.NONE and again.generation_id == 1 and again.members == ()
        )
        assert coord.group_state("g") is GroupState.COMPLETING_REBALANCE
        leader_again = await coord.join_group(params(member_id=ra.leader_id))
        assert leader_again.generation_id == 1 and len(leader_again.members) == 2
        coord.close()

    run(scenario)


def test_oversized_assignment_is_refused_and_group_rebalances() -> None:
    async def scenario() -> None:
        coord = make_coordinator(max_assignment_bytes=8)
        (r,) = [await coord.join_group(params())]
        result = await coord.sync_group("g", 1, r.member_id, assignments={r.member_id: b"x" * 9})
        assert result.error_code == KafkaError.INVALID_REQUEST
        assert coord.group_state("g") is GroupState.PREPARING_REBALANCE
        coord.close()

    run(scenario)


# ---------------------------------------------------------------------- static members


def test_static_member_replacement_fences_old_incarnation() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        old = await coord.join_group(params(group_instance_id="host-1", client_id="app"))
        assert old.error_code == KafkaError.NONE and old.member_id.startswith("host-1-")
        assert (
            await coord.sync_group("g", 1, old.member_id, "host-1", assignments={})
        ).error_code == KafkaError.NONE
        new = await coord.join_group(params(group_instance_id="host-1", client_id="app"))
        # Kafka's static rejoin: the same generation, no rebalance; the leader skips the
        # assignment (KIP-814)
        assert new.error_code == KafkaError.NONE and new.generation_id == 1
        assert new.member_id != old.member_id and new.skip_assignment
        assert [m.member_id for m in new.members] == [new.member_id]
        assert [m.group_instance_id for m in new.members] == ["host-1"]
        assert coord.group_state("g") is GroupState.STABLE
        assert (
            await coord.heartbeat("g", 1, old.member_id, "host-1") == KafkaError.FENCED_INSTANCE_ID
        )
        assert (
            coord.validate_offset_commit("g", 1, old.member_id, "host-1")
            == KafkaError.FENCED_INSTANCE_ID
        )
        # Leave by instance id alone.
        left = await coord.leave_group("g", [("", "host-1")])
        assert left.members[0].error_code == KafkaError.NONE
        assert coord.group_state("g") is GroupState.EMPTY
        unknown = await coord.leave_group("g", [("", "host-1")])
        assert unknown.members[0].error_code == KafkaError.UNKNOWN_MEMBER_ID
        coord.close()

    run(scenario)


def test_leave_with_mismatched_instance_id_is_fenced() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        r = await coord.join_group(params(group_instance_id="i1"))
        result = await coord.leave_group("g", [("someone-else", "i1")])
        assert result.members[0].error_code == KafkaError.FENCED_INSTANCE_ID
        assert coord.group_state("g") is GroupState.COMPLETING_REBALANCE
        assert (await coord.leave_group("g", [(r.member_id, "i1")])).members[
            0
        ].error_code == KafkaError.NONE
        coord.close()

    run(scenario)


# ---------------------------------------------------------------------- lifecycle


def test_close_answers_pending_requests_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        coord = make_coordinator(group_initial_rebalance_delay_ms=5_000)
        pending = asyncio.ensure_future(coord.join_group(params()))
        await asyncio.sleep(0.01)
        coord.close()
        assert (await pending).error_code == KafkaError.NOT_COORDINATOR
        assert (await coord.join_group(params())).error_code == KafkaError.COORDINATOR_NOT_AVAILABLE
        assert await coord.heartbeat("g", 1, "x") == KafkaError.COORDINATOR_NOT_AVAILABLE
        assert len(coord) == 0

    run(scenario)


def test_unload_groups_drops_only_matching_groups() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        a = await coord.join_group(params("a"))
        await coord.join_group(params("b"))
        assert coord.unload_groups(lambda gid: gid == "a") == 1
        assert coord.group_state("a") is None and coord.group_state("b") is not None
        assert await coord.heartbeat("a", 1, a.member_id) == KafkaError.UNKNOWN_MEMBER_ID
        coord.close()

    run(scenario)


def test_cancelled_join_does_not_block_the_rebalance() -> None:
    async def scenario() -> None:
        coord = make_coordinator()
        a, b, _c = (r.member_id for r in await form_group(coord, 3, rebalance_timeout_ms=150))
        # a and b rejoin, c does not: the join phase waits for the rebalance timeout.
        join_a = asyncio.ensure_future(
            coord.join_group(params(member_id=a, rebalance_timeout_ms=150))
        )
        join_b = asyncio.ensure_future(
            coord.join_group(params(member_id=b, rebalance_timeout_ms=150))
        )
        await asyncio.sleep(0.02)
        assert not join_a.done() and not join_b.done()
        join_b.cancel()  # b's connection went away while its JoinGroup was parked
        result = await join_a
        assert result.error_code == KafkaError.NONE and result.generation_id == 2
        # b no longer counts as having rejoined, so it is dropped with c.
        assert [m.member_id for m in result.members] == [a]
        coord.close()

    run(scenario)


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        GroupCoordinatorConfig(group_initial_rebalance_delay_ms=-1)
    with pytest.raises(ValueError):
        GroupCoordinatorConfig(group_min_session_timeout_ms=10, group_max_session_timeout_ms=5)
    with pytest.raises(ValueError):
        GroupCoordinatorConfig(group_max_size=0)
