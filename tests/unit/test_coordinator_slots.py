"""Group coordinator slots: placement on the pure state machine (only a departed broker's
slots move, a returning broker gets a fair share, deterministic), the fenced offset writes,
the broker's offset store across slot moves, and FindCoordinator from the slot map."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from controlplane.coordinators import (
    group_coordinator,
    group_slot,
    java_string_hash,
    owned_slots,
    plan_slot_moves,
    slot_counts,
)
from controlplane.image import MetadataImage
from controlplane.inprocess import InProcessController
from controlplane.records import decode_record
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.offsets import CommittedOffset, OffsetStoreError
from tests.support.metadata_images import register_broker
from tests.unit.test_metadata_state_machine import NOW, err, ok

SLOTS = 50


def register(
    sm: MetadataStateMachine,
    node: int,
    az: str,
    incarnation: str | None = None,
    heartbeat: bool = True,
) -> int:
    return register_broker(
        sm, node, az, NOW, incarnation=incarnation, heartbeat=heartbeat, wal_uri=None
    )


def expire(sm: MetadataStateMachine, node: int) -> None:
    epoch = sm.image.brokers[node].node_epoch
    ok(sm.execute("lifecycle_tick", {"expired_brokers": [(node, epoch)]}, NOW))


def slot_map(sm: MetadataStateMachine) -> dict[int, tuple[int, int]]:
    return {s: (st.node_id, st.epoch) for s, st in sm.image.coordinator_slots.items()}


def counts(sm: MetadataStateMachine) -> dict[int, int]:
    return {n: c for n, c in slot_counts(sm.image).items() if c}


@pytest.fixture
def sm() -> MetadataStateMachine:
    """Brokers 1, 2, 3 in az1, az2, az3, all active."""
    machine = MetadataStateMachine(ControllerSettings(coordinator_slots=SLOTS))
    for node in (1, 2, 3):
        register(machine, node, f"az{node}")
    return machine


# ---------------------------------------------------------------- group -> slot


def test_group_slot_is_kafkas_abs_hashcode_modulo():
    # values of java.lang.String#hashCode
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert java_string_hash("\u00e9") == 233
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00  # UTF-16 surrogate pair
    assert group_slot("polygenelubricants", SLOTS) == 0  # Utils.abs(MIN_VALUE) == 0
    assert group_slot("hello", SLOTS) == 99162322 % SLOTS
    assert group_slot("my-group", SLOTS) == abs(java_string_hash("my-group")) % SLOTS
    assert all(0 <= group_slot(f"g{i}", SLOTS) < SLOTS for i in range(500))


# ---------------------------------------------------------------- placement


def test_slots_are_placed_when_brokers_become_active_and_spread_evenly():
    sm = MetadataStateMachine(ControllerSettings(coordinator_slots=SLOTS))
    register(sm, 1, "az1", heartbeat=False)
    assert sm.image.coordinator_slots == {}  # not active yet: nothing to place on
    ok(sm.execute("broker_heartbeat", {"node_id": 1, "node_epoch": 0}, NOW))
    assert sm.image.coordinator_slot_count == SLOTS
    assert counts(sm) == {1: SLOTS}
    before = slot_map(sm)
    register(sm, 2, "az2")
    assert counts(sm) == {1: 25, 2: 25}
    # only slots that went to the new broker changed, each with epoch + 1
    changed = {s for s in before if slot_map(sm)[s] != before[s]}
    assert {slot_map(sm)[s][0] for s in changed} == {2} and len(changed) == 25
    assert all(slot_map(sm)[s][1] == before[s][1] + 1 for s in changed)
    register(sm, 3, "az3")
    assert sorted(counts(sm).values()) == [16, 17, 17]
    assert plan_slot_moves(sm.image, SLOTS) == []  # balanced: nothing more to do


def test_a_fenced_brokers_slots_and_only_those_move_with_its_partitions(sm):
    ok(sm.execute("create_topic", {"name": "t", "partitions": 6, "topic_id": "tid"}, NOW))
    before = slot_map(sm)
    offset = sm.next_offset
    expire(sm, 3)
    after = slot_map(sm)
    moved = {s for s in before if after[s] != before[s]}
    assert moved == {s for s, (node, _) in before.items() if node == 3}
    assert all(after[s][0] in (1, 2) and after[s][1] == before[s][1] + 1 for s in moved)
    assert sorted(counts(sm).values()) in ([25, 25], [24, 26])
    assert abs(counts(sm)[1] - counts(sm)[2]) <= 1
    # in the same command (one Raft entry) as the fence and the partition moves
    types = [decode_record(t).type for t in sm.log[offset - sm.log_start_offset :]]
    assert types.index("fence_broker") < types.index("partition") < types.index("coordinator_slots")
    # a group of a moved slot is coordinated by its new owner on every image
    group = next(f"g{i}" for i in range(1000) if group_slot(f"g{i}", SLOTS) in moved)
    assert group_coordinator(sm.image, group) == after[group_slot(group, SLOTS)][0]


def test_a_returning_broker_gets_a_fair_share_moving_no_more_than_needed(sm):
    expire(sm, 3)
    before = slot_map(sm)
    epoch = register(sm, 3, "az3", incarnation="inc-3b", heartbeat=False)
    assert slot_map(sm) == before  # registered, not active yet: nothing moves
    ok(sm.execute("broker_heartbeat", {"node_id": 3, "node_epoch": epoch}, NOW))
    after = slot_map(sm)
    moved = {s for s in before if after[s] != before[s]}
    assert {after[s][0] for s in moved} == {3}
    assert len(moved) == counts(sm)[3] == 16  # 25/25 -> 17/17/16
    assert sorted(counts(sm).values()) == [16, 17, 17]


def test_a_broker_restarting_within_its_session_keeps_its_slots(sm):
    before = slot_map(sm)
    mine = next(s for s, (node, _) in before.items() if node == 2)
    group = next(f"g{i}" for i in range(1000) if group_slot(f"g{i}", SLOTS) == mine)
    epoch = register(sm, 2, "az2", incarnation="inc-2b", heartbeat=False)
    assert slot_map(sm) == before
    # its slots are unavailable (retriable) until the new process heartbeats
    assert group_coordinator(sm.image, group) is None
    ok(sm.execute("broker_heartbeat", {"node_id": 2, "node_epoch": epoch}, NOW))
    assert slot_map(sm) == before
    assert group_coordinator(sm.image, group) == 2


def test_controlled_shutdown_moves_slots_at_once_and_the_fence_moves_nothing_more(sm):
    ok(sm.execute("controlled_shutdown", {"node_id": 1, "node_epoch": 0}, NOW))
    assert 1 not in counts(sm) and sum(counts(sm).values()) == SLOTS
    after_shutdown = slot_map(sm)
    ok(sm.execute("fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "shutdown"}, NOW))
    assert slot_map(sm) == after_shutdown


def test_slots_wait_on_a_fenced_owner_while_no_broker_is_active(sm):
    for node in (1, 2, 3):
        expire(sm, node)
    assert sum(counts(sm).values()) == SLOTS  # nowhere to go: they stay
    assert all(group_coordinator(sm.image, f"g{i}") is None for i in range(100))
    register(sm, 2, "az2", incarnation="inc-2b")
    assert counts(sm) == {2: SLOTS}
    assert all(group_coordinator(sm.image, f"g{i}") == 2 for i in range(100))


def test_brokers_spread_by_count_with_ties_towards_the_emptier_az():
    sm = MetadataStateMachine(ControllerSettings(coordinator_slots=10))
    for node, az in ((1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "c")):
        register(sm, node, az)
    c = counts(sm)
    assert sorted(c.values()) == [2, 2, 2, 2, 2]
    expire(sm, 5)  # AZ c's 2 slots: one to each of the other AZs
    c = counts(sm)
    assert max(c.values()) - min(c.values()) <= 1
    by_az = Counter({"a": c.get(1, 0) + c.get(2, 0), "b": c.get(3, 0) + c.get(4, 0)})
    assert by_az == Counter({"a": 5, "b": 5})


def test_placement_is_deterministic_and_replays_to_the_same_image():
    def run() -> MetadataStateMachine:
        m = MetadataStateMachine(ControllerSettings(coordinator_slots=SLOTS))
        for node in (4, 1, 3, 2):
            register(m, node, f"az{node % 2}")
        expire(m, 3)
        ok(m.execute("controlled_shutdown", {"node_id": 4, "node_epoch": 0}, NOW))
        register(m, 3, "az1", incarnation="again")
        return m

    a, b = run(), run()
    assert a.image.fingerprint() == b.image.fingerprint()
    replica = MetadataImage()
    for item in a.read_log(-1, 100_000)["records"]:
        replica.apply(decode_record(item["record"]), item["offset"])
    assert replica.fingerprint() == a.image.fingerprint()
    assert replica.coordinator_slots == a.image.coordinator_slots


def test_the_slot_count_is_fixed_by_the_first_placement(sm):
    sm.settings = ControllerSettings(coordinator_slots=7)
    expire(sm, 3)
    assert sm.image.coordinator_slot_count == SLOTS
    assert sum(counts(sm).values()) == SLOTS


def test_the_lifecycle_tick_places_slots_of_an_image_that_has_none():
    """An image from before coordinator slots existed (brokers, no slots)."""
    sm = MetadataStateMachine(ControllerSettings(coordinator_slots=SLOTS))
    for node in (1, 2):
        sm.execute(
            "register_broker",
            {
                "node_id": node,
                "az": "az",
                "host": "h",
                "kafka_port": 1,
                "incarnation_id": f"i{node}",
            },
            NOW,
        )
    sm.image.coordinator_slots.clear()
    sm.image.coordinator_slot_count = 0
    for node in (1, 2):
        sm.image.brokers[node].fenced = False
    assert plan_slot_moves(sm.image, SLOTS)  # what the leader's lifecycle round checks
    ok(sm.execute("lifecycle_tick", {}, NOW))
    assert counts(sm) == {1: 25, 2: 25}
    offset = sm.next_offset
    ok(sm.execute("lifecycle_tick", {}, NOW))
    assert sm.next_offset == offset  # nothing to do: no record


# ---------------------------------------------------------------- fenced offset writes


def _group_on(sm: MetadataStateMachine, node: int) -> tuple[str, int]:
    slot = next(s for s, st in sm.image.coordinator_slots.items() if st.node_id == node)
    return next(f"g{i}" for i in range(2000) if group_slot(f"g{i}", SLOTS) == slot), slot


def test_only_the_slot_owner_at_its_epoch_may_write_a_groups_offsets(sm):
    group, slot = _group_on(sm, 3)
    epoch = sm.image.coordinator_slots[slot].epoch
    body = {"group_id": group, "value": "{}"}
    res = ok(
        sm.execute(
            "put_group_offsets",
            {**body, "node_id": 3, "node_epoch": 0, "coordinator_epoch": epoch},
            NOW,
        )
    )
    assert res == {"slot": slot, "coordinator_epoch": epoch}
    assert sm.image.kv[f"group-offsets/{group}"] == "{}"
    assert (
        err(
            sm.execute(
                "put_group_offsets",
                {**body, "node_id": 1, "node_epoch": 0, "coordinator_epoch": epoch},
                NOW,
            )
        )
        == "NOT_COORDINATOR"
    )
    assert (
        err(
            sm.execute(
                "put_group_offsets",
                {**body, "node_id": 3, "node_epoch": 0, "coordinator_epoch": epoch + 1},
                NOW,
            )
        )
        == "NOT_COORDINATOR"
    )
    ok(sm.execute("controlled_shutdown", {"node_id": 3, "node_epoch": 0}, NOW))
    new = sm.image.coordinator_slots[slot]
    # the old owner can no longer write (it may not know yet); the new one can
    assert (
        err(
            sm.execute(
                "put_group_offsets",
                {**body, "node_id": 3, "node_epoch": 0, "coordinator_epoch": epoch},
                NOW,
            )
        )
        == "NOT_COORDINATOR"
    )
    ok(
        sm.execute(
            "put_group_offsets",
            {
                **body,
                "value": None,
                "node_id": new.node_id,
                "node_epoch": 0,
                "coordinator_epoch": new.epoch,
            },
            NOW,
        )
    )
    assert f"group-offsets/{group}" not in sm.image.kv


def test_offset_store_follows_its_slot_and_reloads_after_a_move_back(sm):
    from dataplane.kafka.offset_store import KVOffsetStore

    group, slot = _group_on(sm, 3)
    controller = InProcessController(machine=sm)
    stores = {
        n: KVOffsetStore(
            controller, lambda: sm.image, n, lambda n=n: sm.image.brokers[n].node_epoch
        )
        for n in (1, 2, 3)
    }

    async def scenario() -> None:
        await stores[3].commit(group, {("t", 0): CommittedOffset(10)})
        with pytest.raises(OffsetStoreError) as exc:  # not the owner: refused locally
            await stores[1].commit(group, {("t", 0): CommittedOffset(99)})
        assert exc.value.error_code == KafkaError.NOT_COORDINATOR
        # broker 3 is fenced for good: its slots move, its writes are refused
        expire(sm, 3)
        new_owner = sm.image.coordinator_slots[slot].node_id
        assert (await stores[new_owner].fetch(group, None))[("t", 0)].offset == 10
        await stores[new_owner].commit(group, {("t", 1): CommittedOffset(5)})
        # broker 3 comes back and gets its share; if it gets the slot back, it reloads
        register(sm, 3, "az3", incarnation="inc-3b")
        owner = sm.image.coordinator_slots[slot].node_id
        got = await stores[owner].fetch(group, None)
        assert {tp: c.offset for tp, c in got.items()} == {("t", 0): 10, ("t", 1): 5}
        # a store that cached the document at an older epoch cannot write with it
        if owner == 3:
            stale = stores[3]
            stale._docs[group] = (0, {})  # as cached before the slot moved away
            await stale.commit(group, {("t", 2): CommittedOffset(1)})  # reloads: new epoch
            got = await stale.fetch(group, None)
            assert {tp: c.offset for tp, c in got.items()} == {
                ("t", 0): 10,
                ("t", 1): 5,
                ("t", 2): 1,
            }

    asyncio.run(scenario())


def test_a_write_at_a_superseded_epoch_is_refused_and_dropped_from_the_cache(sm):
    from dataplane.kafka.offset_store import KVOffsetStore

    group, slot = _group_on(sm, 2)
    store = KVOffsetStore(InProcessController(machine=sm), lambda: sm.image, 2, lambda: 0)

    async def scenario() -> None:
        await store.commit(group, {("t", 0): CommittedOffset(1)})
        # the broker's image lags: it still shows itself as the owner at the old epoch
        lagging = sm.image.model_copy(deep=True)
        store.image_fn = lambda: lagging
        expire(sm, 2)
        with pytest.raises(OffsetStoreError) as exc:
            await store.commit(group, {("t", 0): CommittedOffset(2)})
        assert exc.value.error_code == KafkaError.NOT_COORDINATOR
        assert group not in store._docs
        owner = sm.image.coordinator_slots[slot].node_id
        assert sm.image.kv[f"group-offsets/{group}"] == '{"t":{"0":[1,-1,null,-1]}}', owner

    asyncio.run(scenario())


# ---------------------------------------------------------------- FindCoordinator


def test_find_coordinator_answers_from_the_slot_map_for_single_and_batched_keys(sm):
    from kafka.protocol.metadata import FindCoordinatorRequest

    from dataplane.kafka.api_context import BrokerIdentity
    from dataplane.kafka.apis import KafkaApis

    apis = KafkaApis(
        BrokerIdentity(1, "127.0.0.1", 9001, "az1"),
        lambda: sm.image,
        lambda *_: True,
        None,
        None,
        lambda: 0,
        io_threads=1,
    )
    try:
        g2, _ = _group_on(sm, 2)
        g3, _ = _group_on(sm, 3)

        def ask(version: int, *keys: str):
            if version >= 4:
                req = FindCoordinatorRequest[version](key_type=0, coordinator_keys=list(keys))
            elif version >= 1:
                req = FindCoordinatorRequest[version](key=keys[0], key_type=0)
            else:
                req = FindCoordinatorRequest[version](key=keys[0])
            return asyncio.run(
                apis.cluster.find_coordinator(req, SimpleNamespace(api_version=version, extras={}))
            )

        for v in range(4):
            resp = ask(v, g2)
            assert (resp.error_code, resp.node_id, resp.port) == (0, 2, 9002)
        resp = ask(4, g2, g3)
        assert [(c.key, c.node_id, c.error_code) for c in resp.coordinators] == [
            (g2, 2, 0),
            (g3, 3, 0),
        ]
        # broker 3 restarted (registered, not yet heartbeating): its groups are unavailable
        register(sm, 3, "az3", incarnation="inc-3b", heartbeat=False)
        resp = ask(4, g2, g3)
        assert [(c.node_id, c.error_code) for c in resp.coordinators] == [
            (2, 0),
            (-1, KafkaError.COORDINATOR_NOT_AVAILABLE),
        ]
        assert ask(0, g3).error_code == KafkaError.COORDINATOR_NOT_AVAILABLE
        assert owned_slots(sm.image, 3)  # still its slots: it will serve them again
    finally:
        apis.io.shutdown(wait=True)
