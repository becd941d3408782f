"""Offset commit/fetch rules (OffsetManager) and the in-memory OffsetStore."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.coordinator import GroupCoordinator
from dataplane.kafka.groups.offsets import (
    CommittedOffset,
    InMemoryOffsetStore,
    OffsetManager,
    OffsetStore,
    OffsetStoreError,
    store_error_code,
)
from dataplane.kafka.groups.state import GroupState, JoinGroupParams

T = TypeVar("T")
NOW_MS = 1_700_000_000_000


def run(factory: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
    """Run a test coroutine on a fresh loop, bounded by ``timeout`` seconds."""

    async def bounded() -> T:
        return await asyncio.wait_for(factory(), timeout)

    return asyncio.run(bounded())


def setup() -> tuple[GroupCoordinator, InMemoryOffsetStore, OffsetManager]:
    counter = itertools.count(1)
    coord = GroupCoordinator(
        GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0, group_min_session_timeout_ms=10),
        member_id_factory=lambda prefix: f"{prefix}-{next(counter)}",
    )
    store = InMemoryOffsetStore()
    return (
        coord,
        store,
        OffsetManager(coord, store, offset_metadata_max_bytes=16, wall_clock_ms=lambda: NOW_MS),
    )


def join_params(member_id: str = "", client_id: str = "c") -> JoinGroupParams:
    return JoinGroupParams(
        group_id="g",
        member_id=member_id,
        group_instance_id=None,
        client_id=client_id,
        client_host="/127.0.0.1",
        session_timeout_ms=10_000,
        rebalance_timeout_ms=5_000,
        protocol_type="consumer",
        protocols=(("range", b""),),
        require_known_member_id=False,
    )


def one(
    offset: int, metadata: str | None = None, epoch: int = -1
) -> dict[tuple[str, int], CommittedOffset]:
    return {("t", 0): CommittedOffset(offset, epoch, metadata)}


def test_in_memory_store_satisfies_protocol() -> None:
    assert isinstance(InMemoryOffsetStore(), OffsetStore)


def test_simple_commit_to_unknown_or_empty_group_is_allowed() -> None:
    async def scenario() -> None:
        coord, store, offsets = setup()
        assert await offsets.commit_offsets("g", -1, "", None, one(10, "m", 3)) == {
            ("t", 0): KafkaError.NONE
        }
        err, fetched = await offsets.fetch_offsets("g", [("t", 0), ("t", 1)])
        assert err == KafkaError.NONE
        assert fetched[("t", 0)] == CommittedOffset(10, 3, "m", NOW_MS)
        assert fetched[("t", 1)] == CommittedOffset(-1, -1, "", -1)  # never committed
        # A group that had members and is Empty again accepts simple commits too.
        joined = await coord.join_group(join_params())
        await coord.leave_group("g", [(joined.member_id, None)])
        assert coord.group_state("g") is GroupState.EMPTY
        assert await offsets.commit_offsets("g", -1, "", None, one(11)) == {
            ("t", 0): KafkaError.NONE
        }
        # Generation -1 wins over a stale member id while the group is Empty (as Kafka).
        assert await offsets.commit_offsets("g", -1, joined.member_id, None, one(11)) == {
            ("t", 0): KafkaError.NONE
        }
        assert (await offsets.fetch_offsets("g", [("t", 0)]))[1][("t", 0)].offset == 11
        coord.close()

    run(scenario)


def test_commit_validation_against_group_membership() -> None:
    async def scenario() -> None:
        coord, store, offsets = setup()
        # Unknown group with a generation: the committer is stale.
        assert await offsets.commit_offsets("g", 3, "m", None, one(1)) == {
            ("t", 0): KafkaError.ILLEGAL_GENERATION
        }
        ra, rb = await asyncio.gather(
            coord.join_group(join_params(client_id="a")),
            coord.join_group(join_params(client_id="b")),
        )
        a, b = ra.member_id, rb.member_id
        # CompletingRebalance: members with the right generation must wait.
        assert await offsets.commit_offsets("g", 1, a, None, one(1)) == {
            ("t", 0): KafkaError.REBALANCE_IN_PROGRESS
        }
        await asyncio.gather(
            coord.sync_group("g", 1, a, assignments={}), coord.sync_group("g", 1, b)
        )
        assert coord.group_state("g") is GroupState.STABLE
        assert await offsets.commit_offsets("g", 1, a, None, one(5)) == {("t", 0): KafkaError.NONE}
        assert await offsets.commit_offsets("g", 0, a, None, one(6)) == {
            ("t", 0): KafkaError.ILLEGAL_GENERATION
        }
        assert await offsets.commit_offsets("g", 1, "ghost", None, one(6)) == {
            ("t", 0): KafkaError.UNKNOWN_MEMBER_ID
        }
        # A "simple" commit to a group with members is refused.
        assert await offsets.commit_offsets("g", -1, "", None, one(6)) == {
            ("t", 0): KafkaError.UNKNOWN_MEMBER_ID
        }
        # PreparingRebalance: the current generation may still commit (as Kafka).
        await coord.leave_group("g", [(b, None)])
        assert coord.group_state("g") is GroupState.PREPARING_REBALANCE
        assert await offsets.commit_offsets("g", 1, a, None, one(7)) == {("t", 0): KafkaError.NONE}
        assert (await offsets.fetch_offsets("g", [("t", 0)]))[1][("t", 0)].offset == 7
        assert store.commit_calls == 2  # rejected commits never reached the store
        coord.close()

    run(scenario)


def test_metadata_too_large_rejects_only_that_partition() -> None:
    async def scenario() -> None:
        coord, store, offsets = setup()
        request = {
            ("t", 0): CommittedOffset(1, -1, "x" * 16),
            ("t", 1): CommittedOffset(2, -1, "x" * 17),
            ("u", 0): CommittedOffset(3, -1, None),
        }
        result = await offsets.commit_offsets("g", -1, "", None, request)
        assert result == {
            ("t", 0): KafkaError.NONE,
            ("t", 1): KafkaError.OFFSET_METADATA_TOO_LARGE,
            ("u", 0): KafkaError.NONE,
        }
        err, everything = await offsets.fetch_offsets("g", None)
        assert err == KafkaError.NONE
        assert sorted(everything) == [("t", 0), ("u", 0)]
        assert everything[("u", 0)].metadata == ""  # null metadata reads back as ""
        coord.close()

    run(scenario)


def test_explicit_commit_timestamp_is_kept() -> None:
    async def scenario() -> None:
        coord, store, offsets = setup()
        await offsets.commit_offsets(
            "g", -1, "", None, {("t", 0): CommittedOffset(1, -1, "", 1234)}
        )
        assert store.snapshot()["g"][("t", 0)].commit_timestamp_ms == 1234
        coord.close()

    run(scenario)


class FailingStore(InMemoryOffsetStore):
    """A store whose every call raises ``exc``."""

    def __init__(self, exc: Exception) -> None:
        super().__init__()
        self.exc = exc

    async def commit(self, group_id: str, offsets: dict[Any, CommittedOffset]) -> None:
        raise self.exc

    async def fetch(self, group_id: str, partitions: Any) -> dict[Any, CommittedOffset]:
        raise self.exc

    async def delete_group(self, group_id: str) -> None:
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (OffsetStoreError("kv not leader", KafkaError.NOT_COORDINATOR), KafkaError.NOT_COORDINATOR),
        (TimeoutError(), KafkaError.COORDINATOR_NOT_AVAILABLE),
        (ConnectionResetError(), KafkaError.COORDINATOR_NOT_AVAILABLE),
        (RuntimeError("bug"), KafkaError.UNKNOWN_SERVER_ERROR),
    ],
)
def test_store_failures_map_to_kafka_errors(exc: Exception, code: int) -> None:
    assert store_error_code(exc) == code

    async def scenario() -> None:
        coord = GroupCoordinator(GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0))
        offsets = OffsetManager(coord, FailingStore(exc))
        assert await offsets.commit_offsets("g", -1, "", None, one(1)) == {("t", 0): code}
        assert await offsets.fetch_offsets("g", None) == (code, {})
        assert await offsets.delete_groups(["g"]) == {"g": code}
        assert coord.group_state("g") is None  # the Dead placeholder is gone
        coord.close()

    run(scenario)


def test_delete_groups_rules() -> None:
    async def scenario() -> None:
        coord, store, offsets = setup()
        await offsets.commit_offsets("offsets-only", -1, "", None, one(1))
        joined = await coord.join_group(join_params())
        assert joined.error_code == KafkaError.NONE
        result = await offsets.delete_groups(["g", "offsets-only", "missing", "offsets-only"])
        assert result == {
            "g": KafkaError.NON_EMPTY_GROUP,
            "offsets-only": KafkaError.NONE,
            "missing": KafkaError.GROUP_ID_NOT_FOUND,
        }
        assert await store.list_groups() == []
        assert coord.group_state("missing") is None
        # Once the last member left, the (Empty) group can be deleted with its offsets.
        await coord.sync_group("g", 1, joined.member_id, assignments={})
        assert await offsets.commit_offsets("g", 1, joined.member_id, None, one(9)) == {
            ("t", 0): KafkaError.NONE
        }
        await coord.leave_group("g", [(joined.member_id, None)])
        assert await offsets.delete_groups(["g"]) == {"g": KafkaError.NONE}
        assert coord.group_state("g") is None
        assert (await offsets.fetch_offsets("g", [("t", 0)]))[1][("t", 0)].offset == -1
        # An Empty group without offsets (only in the coordinator) is deletable as well.
        again = await coord.join_group(join_params())
        await coord.leave_group("g", [(again.member_id, None)])
        assert await offsets.delete_groups(["g"]) == {"g": KafkaError.NONE}
        coord.close()

    run(scenario)


def test_joins_are_refused_while_a_group_is_being_deleted() -> None:
    async def scenario() -> None:
        coord, store, offsets = setup()
        await offsets.commit_offsets("g", -1, "", None, one(1))
        gate = asyncio.Event()

        class SlowStore(InMemoryOffsetStore):
            async def delete_group(self, group_id: str) -> None:
                await gate.wait()
                await store.delete_group(group_id)

            async def fetch(self, group_id: str, partitions: Any) -> dict[Any, CommittedOffset]:
                return await store.fetch(group_id, partitions)

        slow = OffsetManager(coord, SlowStore())
        deleting = asyncio.ensure_future(slow.delete_groups(["g"]))
        await asyncio.sleep(0.01)
        assert coord.group_state("g") is GroupState.DEAD
        assert (
            await coord.join_group(join_params())
        ).error_code == KafkaError.COORDINATOR_NOT_AVAILABLE
        assert await slow.commit_offsets("g", -1, "", None, one(2)) == {
            ("t", 0): KafkaError.COORDINATOR_NOT_AVAILABLE
        }
        gate.set()
        assert await deleting == {"g": KafkaError.NONE}
        assert (await coord.join_group(join_params())).error_code == KafkaError.NONE
        coord.close()

    run(scenario)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["g1", "g2"]),
            st.sampled_from(["t", "u"]),
            st.integers(0, 2),
            st.integers(-1, 10**12),
            st.one_of(st.none(), st.text(max_size=20)),
        ),
        max_size=25,
    )
)
def test_fetch_returns_last_accepted_commit(
    commits: list[tuple[str, str, int, int, str | None]],
) -> None:
    """Model check: fetch sees the last commit whose metadata fit, -1 elsewhere."""

    async def scenario() -> None:
        coord, store, offsets = setup()
        model: dict[tuple[str, str, int], tuple[int, str]] = {}
        for group, topic, partition, offset, metadata in commits:
            result = await offsets.commit_offsets(
                group, -1, "", None, {(topic, partition): CommittedOffset(offset, -1, metadata)}
            )
            fits = len(metadata or "") <= 16
            assert result == {
                (topic, partition): KafkaError.NONE
                if fits
                else KafkaError.OFFSET_METADATA_TOO_LARGE
            }
            if fits:
                model[(group, topic, partition)] = (offset, metadata or "")
        for group in ("g1", "g2"):
            wanted = [(t, p) for t in ("t", "u") for p in range(3)]
            err, fetched = await offsets.fetch_offsets(group, wanted)
            assert err == KafkaError.NONE
            for tp in wanted:
                expected = model.get((group, *tp), (-1, ""))
                assert (fetched[tp].offset, fetched[tp].metadata) == expected
            err, everything = await offsets.fetch_offsets(group, None)
            assert sorted(everything) == sorted((t, p) for (g, t, p) in model if g == group)
        assert sorted(await store.list_groups()) == sorted({g for g, _, _ in model})
        coord.close()

    run(scenario)


def test_concurrent_commits_of_one_group_reach_the_store_one_at_a_time() -> None:
    """A read-modify-write store (one document per group, slow write) loses no commit."""

    class DocumentStore(InMemoryOffsetStore):
        def __init__(self) -> None:
            super().__init__()
            self.active = 0
            self.max_active = 0

        async def commit(self, group_id: str, offsets: dict[Any, CommittedOffset]) -> None:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            document = dict(await self.fetch(group_id, None))  # read
            await asyncio.sleep(0.005)  # the replicated write takes a while
            document.update(offsets)  # modify
            self._groups[group_id] = document  # write: the whole document replaces the old one
            self.active -= 1

    async def scenario() -> None:
        coord = GroupCoordinator(GroupCoordinatorConfig(group_initial_rebalance_delay_ms=0))
        store = DocumentStore()
        offsets = OffsetManager(coord, store)
        results = await asyncio.gather(
            *(
                offsets.commit_offsets(g, -1, "", None, {("t", p): CommittedOffset(p)})
                for g in ("a", "b")
                for p in range(8)
            )
        )
        assert all(r == {tp: KafkaError.NONE for tp in r} for r in results)
        for group in ("a", "b"):
            _err, stored = await offsets.fetch_offsets(group, None)
            assert {tp: o.offset for tp, o in stored.items()} == {("t", p): p for p in range(8)}
        assert store.max_active == 2  # one per group: groups still commit in parallel
        assert len(offsets._locks) == 0  # no lock left behind
        coord.close()

    run(scenario)


def test_consumer_subscription_topics_parses_and_refuses_garbage():
    from dataplane.kafka.groups.state import consumer_subscription_topics

    def subscription(*topics: str, version: int = 1) -> bytes:
        out = version.to_bytes(2, "big") + len(topics).to_bytes(4, "big")
        for t in topics:
            out += len(t).to_bytes(2, "big") + t.encode()
        return out + b"\x00\x00\x00\x00"  # user data, owned partitions... follow

    assert consumer_subscription_topics(subscription("a", "bb")) == {"a", "bb"}
    assert consumer_subscription_topics(subscription()) == set()
    for garbage in (b"", b"\x00\x01", subscription("abc")[:9], b"\x00\x00\xff\xff\xff\xff"):
        assert consumer_subscription_topics(garbage) is None
