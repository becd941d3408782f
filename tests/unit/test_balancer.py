"""Placement and self-balancing: spread of new partitions, and the balancer's rounds as pure
decisions on the image (controlplane/balancer.py), applied through the state machine."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from controlplane.balancer import (
    MOVE_DONE,
    STATE_IDLE,
    STATE_IN_PROGRESS,
    STATE_OFF,
    STATE_STALLED,
    BalancerSettings,
    move_status,
    plan_round,
    recent_moves,
    status_document,
)
from controlplane.records import StreamState
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from dataplane.kafka.partition_manager import ProduceRateMeter
from tests.support.metadata_images import register_broker
from tests.unit.test_metadata_state_machine import ok

T0 = 1_000_000
MiB = 1024 * 1024
SETTINGS = BalancerSettings(max_moves_per_round=4)


# ---------------------------------------------------------------- helpers


def machine() -> MetadataStateMachine:
    return MetadataStateMachine(ControllerSettings(bucket_ids=[0]))


def register(sm, node: int, az: str, now_ms: int = T0, incarnation: str | None = None) -> int:
    return register_broker(sm, node, az, now_ms, incarnation=incarnation)


def create(sm, name: str, partitions: int, now_ms: int = T0) -> str:
    ok(
        sm.execute(
            "create_topic",
            {"name": name, "partitions": partitions, "topic_id": f"id-{name}"},
            now_ms,
        )
    )
    settle(sm)
    return f"id-{name}"


def settle(sm, now_ms: int = T0) -> None:
    """What the brokers do after metadata changes: the old owner closes a moved partition's
    stream, the new leader opens it at the leader epoch."""
    image = sm.image
    for topic in list(image.topics.values()):
        for p in list(topic.partitions.values()):
            s = image.streams[p.stream_id]
            if s.state == StreamState.OPENED and (s.node_id, s.epoch) == (
                p.leader_node_id,
                p.leader_epoch,
            ):
                continue
            if s.state == StreamState.OPENED:
                owner = image.brokers[s.node_id]
                ok(
                    sm.execute(
                        "close_stream",
                        {
                            "node_id": s.node_id,
                            "node_epoch": owner.node_epoch,
                            "stream_id": s.stream_id,
                            "stream_epoch": s.epoch,
                        },
                        now_ms,
                    )
                )
            leader = image.brokers[p.leader_node_id]
            ok(
                sm.execute(
                    "open_stream",
                    {
                        "node_id": p.leader_node_id,
                        "node_epoch": leader.node_epoch,
                        "stream_id": p.stream_id,
                        "stream_epoch": p.leader_epoch,
                    },
                    now_ms,
                )
            )


def counts(sm, topic_id: str | None = None) -> Counter:
    c: Counter = Counter({n: 0 for n in sm.image.brokers})
    for t in sm.image.topics.values():
        if topic_id is None or t.topic_id == topic_id:
            c.update(p.leader_node_id for p in t.partitions.values())
    return c


def submit(sm, decision, now_ms: int) -> dict:
    return ok(
        sm.execute(
            "balance_partitions", {"moves": [m.model_dump() for m in decision.moves]}, now_ms
        )
    )


def run_rounds(
    sm, now_ms: int, settings: BalancerSettings = SETTINGS, rates=None, max_rounds: int = 50
) -> tuple[list[list], int]:
    """Rounds until one plans nothing: each round's moves are applied and finished."""
    rounds = []
    for _ in range(max_rounds):
        decision = plan_round(
            sm.image, rates(sm) if callable(rates) else (rates or {}), now_ms, settings
        )
        if not decision.moves:
            return rounds, now_ms
        assert len(decision.moves) <= settings.max_moves_per_round
        submit(sm, decision, now_ms)
        rounds.append(decision.moves)
        settle(sm, now_ms)
        now_ms += settings.round_interval_ms
    raise AssertionError(f"no convergence after {max_rounds} rounds")


@pytest.fixture
def joined():
    """Brokers 2 and 3 (az2, az3) lead 24 partitions; broker 1 (az1) has just returned."""
    sm = machine()
    register(sm, 2, "az2")
    register(sm, 3, "az3")
    create(sm, "a", 12)
    create(sm, "b", 12)
    register(sm, 1, "az1", now_ms=T0 + 10_000)
    return sm


# ---------------------------------------------------------------- placement of new partitions


def test_new_topic_spreads_even_when_a_broker_has_just_restarted_empty():
    """The reported pile-up: after a restart all 6 partitions of a new topic went to the
    empty broker, because placement looked at the cluster-wide count only."""
    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    create(sm, "old", 6)
    ok(sm.execute("controlled_shutdown", {"node_id": 1, "node_epoch": 0}, T0))
    settle(sm)
    ok(
        sm.execute(
            "fence_broker", {"node_id": 1, "node_epoch": 0, "reason": "controlled shutdown"}, T0
        )
    )
    register(sm, 1, "az1", incarnation="inc-1-again")
    assert counts(sm)[1] == 0
    new = create(sm, "new", 6)
    assert counts(sm, new) == {1: 2, 2: 2, 3: 2}
    ok(sm.execute("create_partitions", {"name": "new", "total_count": 9}, T0))
    assert counts(sm, new) == {1: 3, 2: 3, 3: 3}
    # ties go to the least loaded broker overall: the restarted one
    ok(sm.execute("create_partitions", {"name": "new", "total_count": 10}, T0))
    assert counts(sm, new)[1] == 4


def test_new_partitions_spread_over_azs_on_ties():
    sm = machine()
    for node, az in ((1, "az1"), (2, "az1"), (3, "az2"), (4, "az2")):
        register(sm, node, az)
    tid = create(sm, "t", 2)
    leaders = [p.leader_node_id for p in sm.image.topics[tid].partitions.values()]
    assert {sm.image.brokers[n].az for n in leaders} == {"az1", "az2"}


def test_fenced_shutting_down_and_unregistered_heartbeat_brokers_get_no_new_partitions():
    sm = machine()
    for node in (1, 2, 3, 4):
        register(sm, node, f"az{node}")
    ok(sm.execute("fence_broker", {"node_id": 3, "node_epoch": 0, "reason": "test"}, T0))
    ok(sm.execute("controlled_shutdown", {"node_id": 4, "node_epoch": 0}, T0))
    # registered, but no heartbeat yet (fenced until it has caught up)
    ok(
        sm.execute(
            "register_broker",
            {
                "node_id": 5,
                "az": "az5",
                "host": "h",
                "kafka_port": 1,
                "incarnation_id": "x",
                "wal_uri": "",
            },
            T0,
        )
    )
    tid = create(sm, "t", 6)
    assert counts(sm, tid) == {1: 3, 2: 3, 3: 0, 4: 0, 5: 0}


# ---------------------------------------------------------------- the balancer by count


def test_joining_broker_gets_its_share_in_bounded_batches(joined):
    sm = joined
    # not yet: broker 1 registered less than broker_settle_ms ago
    early = plan_round(sm.image, {}, T0 + 10_000 + 1_000, SETTINGS)
    assert early.moves == [] and early.state == STATE_IDLE
    assert [b.why_not for b in early.brokers if b.node_id == 1] == ["just registered"]

    rounds, _ = run_rounds(sm, T0 + 20_000)
    assert counts(sm) == {1: 8, 2: 8, 3: 8}
    moves = [m for r in rounds for m in r]
    assert len(moves) == 8 and all(m.to_node_id == 1 for m in moves)  # no move between 2 and 3
    assert all(len(r) <= SETTINGS.max_moves_per_round for r in rounds) and len(rounds) == 2
    # topics stay spread on the joiner
    assert counts(sm, "id-a")[1] == 4 and counts(sm, "id-b")[1] == 4
    # every move is recorded with its reason and is done
    history = recent_moves(sm.image)
    assert len(history) == 8 and all(move_status(sm.image, m) == MOVE_DONE for m in history)
    assert history[0].reason.startswith("count: broker")


def test_no_new_round_while_moves_are_in_progress_then_stalled_then_abandoned(joined):
    sm = joined
    now = T0 + 20_000
    first = plan_round(sm.image, {}, now, SETTINGS)
    assert len(first.moves) == 4
    submit(sm, first, now)  # the brokers have not acted yet
    for later, state in (
        (now + 3_000, STATE_IN_PROGRESS),
        (now + SETTINGS.stall_after_ms, STATE_STALLED),
        (now + SETTINGS.abandon_after_ms - 1, STATE_STALLED),
    ):
        d = plan_round(sm.image, {}, later, SETTINGS)
        assert (d.state, d.moves) == (state, []), d.detail
    assert "waiting for" in plan_round(sm.image, {}, now + 60_000, SETTINGS).detail
    # never wedged for good: after abandon_after_ms it goes on (moves avoid the stuck ones)
    d = plan_round(sm.image, {}, now + SETTINGS.abandon_after_ms, SETTINGS)
    assert d.state == STATE_IDLE and d.moves
    stuck = {(m.topic, m.partition) for m in first.moves}
    assert not stuck & {(m.topic, m.partition) for m in d.moves}
    # once the new leaders open the streams, the next round goes on
    settle(sm, now + 1_000)
    d = plan_round(sm.image, {}, now + 3_000, SETTINGS)
    assert d.state == STATE_IDLE and len(d.moves) == 4


def test_nothing_moves_when_balanced_or_within_the_tolerance_band():
    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    create(sm, "t", 9)
    d = plan_round(sm.image, {}, T0 + 60_000, SETTINGS)
    assert (d.state, d.moves, d.detail) == (STATE_IDLE, [], "balanced by count")
    # 11/10/9 (mean 10, band 9..11): tolerated, no move (hysteresis)
    sm2 = machine()
    for node in (1, 2, 3):
        register(sm2, node, f"az{node}")
    create(sm2, "t", 30)
    tid = "id-t"
    p = next(p for p in sm2.image.topics[tid].partitions.values() if p.leader_node_id == 3)
    ok(
        sm2.execute(
            "reassign_partitions",
            {"moves": [{"topic": "t", "partition": p.partition, "node_id": 1}]},
            T0,
        )
    )
    settle(sm2)
    assert sorted(counts(sm2).values()) == [9, 10, 11]
    assert plan_round(sm2.image, {}, T0 + 3_600_000, SETTINGS).moves == []


def test_no_flapping_after_convergence(joined):
    sm = joined
    _, now = run_rounds(sm, T0 + 20_000)
    before = counts(sm)
    for i in range(200):  # ten minutes of rounds: nothing moves
        d = plan_round(sm.image, {}, now + i * SETTINGS.round_interval_ms, SETTINGS)
        assert d.moves == [], d.detail
    assert counts(sm) == before


def test_fenced_shutting_down_and_unsettled_brokers_neither_give_nor_take(joined):
    sm = joined
    now = T0 + 20_000
    # broker 1 is shutting down: nothing moves to it; 2 and 3 are balanced between them
    ok(sm.execute("controlled_shutdown", {"node_id": 1, "node_epoch": 0}, now))
    d = plan_round(sm.image, {}, now, SETTINGS)
    assert d.moves == []
    assert {b.node_id: b.why_not for b in d.brokers}[1] == "shutting down"
    # broker 4 registered but not unfenced yet: not a target either
    ok(
        sm.execute(
            "register_broker",
            {
                "node_id": 4,
                "az": "az1",
                "host": "h",
                "kafka_port": 1,
                "incarnation_id": "x",
                "wal_uri": "",
            },
            now,
        )
    )
    d = plan_round(sm.image, {}, now + 60_000, SETTINGS)
    assert d.moves == [] and {b.node_id: b.why_not for b in d.brokers}[4] == "fenced (registered)"
    # a fenced broker's partitions are failover's business, not the balancer's
    sm2 = machine()
    for node in (1, 2, 3):
        register(sm2, node, f"az{node}")
    create(sm2, "t", 6)
    ok(
        sm2.execute(
            "reassign_partitions",
            {"moves": [{"topic": "t", "partition": p, "node_id": 3} for p in range(6)]},
            T0,
        )
    )
    settle(sm2)
    sm2.image.brokers[3].fenced = True  # fenced, failover not run (as seen between commands)
    d = plan_round(sm2.image, {}, T0 + 3_600_000, SETTINGS)
    assert d.moves == []


def test_partitions_not_open_on_their_leader_cooling_down_or_held_do_not_move(joined):
    sm = joined
    now = T0 + 20_000
    # the partitions of the last manual reassignment are held
    ok(
        sm.execute(
            "reassign_partitions",
            {
                "moves": [
                    {
                        "topic": "a",
                        "partition": p,
                        "node_id": sm.image.topics["id-a"].partitions[p].leader_node_id,
                    }
                    for p in range(12)
                ]
            },
            now,
        )
    )
    d = plan_round(sm.image, {}, now, SETTINGS)
    assert d.moves and all(m.topic == "b" for m in d.moves)
    # held no longer after manual_hold_ms
    later = now + SETTINGS.manual_hold_ms + 1
    assert "a" in {m.topic for m in plan_round(sm.image, {}, later, SETTINGS).moves}
    # a partition whose stream is not open on its leader (a move of someone else pending)
    p = sm.image.topics["id-b"].partitions[0]
    sm.image.streams[p.stream_id].state = StreamState.CLOSED
    d = plan_round(sm.image, {}, now, SETTINGS.model_copy(update={"max_moves_per_round": 100}))
    assert d.moves and ("b", 0) not in {(m.topic, m.partition) for m in d.moves}
    sm.image.streams[p.stream_id].state = StreamState.OPENED


def test_a_partition_is_not_moved_back_to_the_broker_it_left_within_the_cooldown():
    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    tid = create(sm, "t", 3)
    p0 = sm.image.topics[tid].partitions[0]
    assert p0.leader_node_id == 1
    # the balancer moved t-0 from 1 to 2 (say the rates said so): counts 0 / 2 / 1
    ok(
        sm.execute(
            "balance_partitions",
            {
                "moves": [
                    {
                        "topic_id": tid,
                        "topic": "t",
                        "partition": 0,
                        "from_node_id": 1,
                        "to_node_id": 2,
                        "leader_epoch": 0,
                        "reason": "test",
                    }
                ]
            },
            T0 + 60_000,
        )
    )
    settle(sm)
    now = T0 + 70_000
    d = plan_round(sm.image, {}, now, SETTINGS)
    assert [(m.partition, m.from_node_id, m.to_node_id) for m in d.moves] == [(1, 2, 1)]
    # after the cooldown it may go back (the lowest partition is the first choice)
    exact = SETTINGS.model_copy(update={"count_tolerance": 0.0})
    later = plan_round(sm.image, {}, T0 + 60_000 + SETTINGS.partition_cooldown_ms, exact)
    assert [(m.partition, m.from_node_id, m.to_node_id) for m in later.moves] == [(0, 2, 1)]


# ---------------------------------------------------------------- the balancer by throughput


def rates_of(sm, by_key: dict[tuple[str, int], float], default: float) -> dict[int, float]:
    out = {}
    for t in sm.image.topics.values():
        for p in t.partitions.values():
            out[p.stream_id] = by_key.get((t.name, p.partition), default)
    return out


def loads(sm, rates: dict[int, float]) -> dict[int, float]:
    out = {n: 0.0 for n in sm.image.brokers}
    for t in sm.image.topics.values():
        for p in t.partitions.values():
            out[p.leader_node_id] += rates.get(p.stream_id, 0.0)
    return out


def test_joining_broker_takes_its_share_of_throughput(joined):
    sm = joined
    hot = {("a", 0): 20 * MiB, ("a", 1): 12 * MiB, ("b", 3): 8 * MiB}
    rates = lambda s: rates_of(s, hot, 1 * MiB)  # noqa: E731
    rounds, now = run_rounds(sm, T0 + 20_000, rates=rates)
    assert rounds
    final = loads(sm, rates(sm))
    mean = sum(final.values()) / 3
    # within the trigger band (the tight target may be out of reach: counts stay in band)
    assert all(abs(v - mean) <= mean * 0.2 for v in final.values()), final
    assert rounds[0][0].reason.startswith(("throughput", "count"))
    # counts stay within the throughput mode's slack of the mean (8 +- 4)
    assert all(4 <= c <= 12 for c in counts(sm).values()), counts(sm)
    # once the episode is over, rates wobbling by +-5% per partition move nothing
    rng = random.Random(7)
    for i in range(100):
        noisy = {s: r * rng.uniform(0.95, 1.05) for s, r in rates(sm).items()}
        t = now + SETTINGS.episode_ms + i * SETTINGS.round_interval_ms
        assert plan_round(sm.image, noisy, t, SETTINGS).moves == []


def test_noisy_rates_do_not_make_partitions_flap(joined):
    """Ten minutes of rounds with every rate wobbling by +-15% each round: a few moves at
    most, and no partition ever goes back to a broker it left within the cooldown."""
    sm = joined
    hot = {("a", 0): 20 * MiB, ("a", 1): 12 * MiB, ("b", 3): 8 * MiB}
    rng = random.Random(11)
    base = lambda s: rates_of(s, hot, 1 * MiB)  # noqa: E731
    _, now = run_rounds(sm, T0 + 20_000, rates=base)
    later_moves = []
    for i in range(200):
        t = now + (i + 1) * SETTINGS.round_interval_ms
        noisy = {s: r * rng.uniform(0.85, 1.15) for s, r in base(sm).items()}
        d = plan_round(sm.image, noisy, t, SETTINGS)
        if d.moves:
            submit(sm, d, t)
            settle(sm, t)
            later_moves += [(t, m) for m in d.moves]
    assert len(later_moves) <= 4, [m.reason for _, m in later_moves]
    history = recent_moves(sm.image)
    for i, m in enumerate(history):
        for n in history[i + 1 :]:
            if (n.topic_id, n.partition) == (
                m.topic_id,
                m.partition,
            ) and n.to_node_id == m.from_node_id:
                assert n.time_ms - m.time_ms >= SETTINGS.partition_cooldown_ms, (m, n)


def test_hot_partition_gets_room_and_is_not_shuffled():
    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    create(sm, "t", 6)
    hot_key = next(
        (t.name, p.partition)
        for t in sm.image.topics.values()
        for p in t.partitions.values()
        if p.leader_node_id == 1
    )
    rates = lambda s: rates_of(s, {hot_key: 30 * MiB}, 1 * MiB)  # noqa: E731
    rounds, _ = run_rounds(sm, T0 + 60_000, rates=rates)
    led = sm.image.topics["id-t"].partitions[hot_key[1]].leader_node_id
    # the hot broker gives its other partition away; the hot partition itself stays put
    assert led == 1 and counts(sm)[1] == 1, (counts(sm), rounds)
    assert all((m.topic, m.partition) != hot_key for r in rounds for m in r)


def test_rates_below_the_threshold_balance_by_count(joined):
    tiny = lambda s: rates_of(s, {("a", 0): 100_000.0}, 10.0)  # noqa: E731
    d = plan_round(joined.image, tiny(joined), T0 + 20_000, SETTINGS)
    assert d.mode == "count" and len(d.moves) == 4


# ---------------------------------------------------------------- on/off and the command


def test_disabled_balancer_moves_nothing_and_the_switch_is_in_the_metadata(joined):
    sm = joined
    now = T0 + 20_000
    plan = plan_round(sm.image, {}, now, SETTINGS)
    assert ok(sm.execute("set_balancer", {"enabled": False}, now)) == {
        "enabled": False,
        "changed": True,
    }
    assert sm.image.kv["balancer/enabled"] == "false"
    d = plan_round(sm.image, {}, now, SETTINGS)
    assert (d.state, d.moves) == (STATE_OFF, [])
    # a round planned before the switch, applied after it, changes nothing
    offset = sm.next_offset
    assert submit(sm, plan, now)["moved"] == 0 and sm.next_offset == offset
    # a new controller (any replica of the log) sees the same switch
    replica = MetadataStateMachine(ControllerSettings(bucket_ids=[0]))
    replica.image = sm.image.model_copy(deep=True)
    assert plan_round(replica.image, {}, now, SETTINGS).state == STATE_OFF
    assert ok(sm.execute("set_balancer", {"enabled": True}, now))["changed"] is True
    assert len(plan_round(sm.image, {}, now, SETTINGS).moves) == 4
    assert ok(sm.execute("set_balancer", {"enabled": True}, now))["changed"] is False


def test_balance_command_skips_moves_the_image_has_overtaken(joined):
    sm = joined
    now = T0 + 20_000
    plan = plan_round(sm.image, {}, now, SETTINGS)
    first = plan.moves[0]
    ok(
        sm.execute(
            "reassign_partitions",
            {
                "moves": [
                    {
                        "topic": first.topic,
                        "partition": first.partition,
                        "node_id": first.to_node_id,
                    }
                ]
            },
            now,
        )
    )
    result = submit(sm, plan, now)
    assert result["moved"] == 3 and result["skipped"] == [f"{first.topic}-{first.partition}"]
    history = recent_moves(sm.image)
    assert len(history) == 3 and history[0].time_ms == now
    # the replicated decision is deterministic: replaying the commands gives the same image
    assert json.loads(sm.image.kv["balancer/moves"])[0]["from"] == plan.moves[1].from_node_id


def test_status_document_shows_state_brokers_and_recent_moves(joined):
    sm = joined
    _, now = run_rounds(sm, T0 + 20_000)
    doc = status_document(sm.image, {}, now, SETTINGS)
    assert doc["enabled"] and doc["state"] == STATE_IDLE and doc["mode"] == "count"
    assert {b["node_id"]: b["partitions"] for b in doc["brokers"]} == {1: 8, 2: 8, 3: 8}
    assert len(doc["recent_moves"]) == 8
    newest = doc["recent_moves"][0]
    assert set(newest) >= {"time_ms", "topic", "partition", "from", "to", "reason", "status"}
    assert newest["status"] == "done" and newest["to"] == 1
    json.dumps(doc)


# ---------------------------------------------------------------- broker-side rate meter


def test_produce_rate_meter_smooths_and_restarts():
    meter = ProduceRateMeter(tau_s=5.0)
    assert meter.sample({7: 0}, 100.0) == {}  # first sample: clock starts
    assert meter.sample({7: 1000}, 101.0) == {7: 1000.0}  # first interval as measured
    burst = meter.sample({7: 101_000}, 102.0)[7]  # one second of 100 KB/s
    assert 1000 < burst < 30_000  # smoothed, not 100 KB/s
    assert meter.sample({7: 5}, 103.0) == {}  # reopened: counter restarted
    assert meter.sample({}, 104.0) == {}  # gone: forgotten


def test_heartbeats_carry_rates_that_never_reach_the_log():
    from controlplane.api import INTERNAL_COMMANDS
    from controlplane.server import _parse_rates

    sm = machine()
    register(sm, 1, "az1")
    offset = sm.next_offset
    result = sm.execute_readonly(
        "broker_heartbeat",
        {"node_id": 1, "node_epoch": 0, "produce_bytes_per_s": {"3": 1024.5, "4": 0.0}},
    )
    assert "error" not in result and sm.next_offset == offset
    assert _parse_rates({"3": 1.5, "x": 2, "5": "nan", "6": -1, "7": None}) == {3: 1.5}
    assert _parse_rates(["junk"]) == {}
    # the leader's own decisions are not accepted from outside the controller
    assert "balance_partitions" in INTERNAL_COMMANDS


def test_status_names_the_partitions_a_reassign_pinned_and_until_when():
    """Right after a `reassign` that emptied broker 1 (0/6/6), the balancer must not say
    "balanced": it says why nothing moves, which partitions are pinned, and until when."""
    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    create(sm, "orders", 12)
    # `reassign plan --topics orders --brokers 2,3` lists every partition of the topic
    targets = {
        p.partition: p.leader_node_id for p in sm.image.topics["id-orders"].partitions.values()
    }
    on_1 = sorted(p for p, node in targets.items() if node == 1)
    targets.update({p: 2 + i % 2 for i, p in enumerate(on_1)})
    moves = [{"topic": "orders", "partition": p, "node_id": n} for p, n in targets.items()]
    now = T0 + 60_000
    ok(sm.execute("reassign_partitions", {"moves": moves}, now))
    settle(sm, now)
    assert sorted(counts(sm).values()) == [0, 6, 6]

    later = now + 2_000
    d = plan_round(sm.image, {}, later, SETTINGS)
    assert d.moves == [] and d.state == STATE_IDLE
    assert "balanced by count" != d.detail and d.detail.startswith("not balanced by count")
    assert "lead 0/6/6" in d.detail
    assert "12 partition(s) pinned by the last `reassign` for another 9m58s" in d.detail
    doc = status_document(sm.image, {}, later, SETTINGS)
    assert doc["pinned_partitions"] == [{"topic": "orders", "partition": p} for p in range(12)]
    assert doc["pinned_until_ms"] == now + SETTINGS.manual_hold_ms

    # the hold over: nothing is pinned, and the balancer moves again
    after = now + SETTINGS.manual_hold_ms + 1
    doc = status_document(sm.image, {}, after, SETTINGS)
    assert doc["pinned_partitions"] == [] and doc["pinned_until_ms"] is None
    assert doc["next_moves"] and doc["detail"].endswith("move(s) by count")


def test_an_unbalanced_cluster_with_nothing_pinned_says_why_nothing_moves():
    sm = machine()
    for node in (1, 2, 3):
        register(sm, node, f"az{node}")
    create(sm, "t", 6)
    # every stream closed (their leaders have not opened them yet): nothing may move
    ok(
        sm.execute(
            "reassign_partitions",
            {"moves": [{"topic": "t", "partition": p, "node_id": 3} for p in range(6)]},
            T0,
        )
    )
    settle(sm)
    for p in sm.image.topics["id-t"].partitions.values():
        sm.image.streams[p.stream_id].state = StreamState.CLOSED
    d = plan_round(sm.image, {}, T0 + 3_600_000, SETTINGS)
    assert d.moves == [] and d.pinned == []
    assert d.detail.startswith("not balanced by count (brokers 1,2,3 lead 0/0/6 partitions)")
    assert "not open on their leader" in d.detail
