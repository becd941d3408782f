"""The pure planning logic of `automqctl reassign`: balancing, plan files, progress."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli.reassign_plan import (
    Assignment,
    BrokerInfo,
    PartitionView,
    PlanError,
    check_plan,
    check_targets,
    format_plan,
    moves_of,
    parse_plan,
    plan_by_count,
    plan_by_throughput,
    plan_to_json,
    progress,
    rates_from_offsets,
)


def assign(topic: str, leaders: list[int]) -> list[Assignment]:
    return [Assignment(topic, p, node) for p, node in enumerate(leaders)]


def counts(plan: list[Assignment]) -> Counter[int]:
    return Counter(a.node_id for a in plan)


def moved(before: list[Assignment], after: list[Assignment]) -> int:
    now = {a.key: a.node_id for a in before}
    return sum(1 for a in after if now[a.key] != a.node_id)


# ---------------------------------------------------------------- by count


def test_count_everything_onto_two_brokers():
    current = assign("t", [1, 2, 3, 1, 2, 3])
    plan = plan_by_count(current, [2, 3])
    assert counts(plan) == {2: 3, 3: 3}
    assert moved(current, plan) == 2  # only broker 1's partitions move
    assert {a.key for a in plan} == {a.key for a in current}


def test_count_balanced_plan_moves_nothing():
    current = assign("t", [1, 2, 3, 1, 2, 3])
    assert moved(current, plan_by_count(current, [1, 2, 3])) == 0


def test_count_keeps_partitions_within_fair_share():
    # broker 1 holds 5, broker 2 one: shares are 3/3, so exactly 2 move from 1 to 2
    current = assign("t", [1, 1, 1, 1, 1, 2])
    plan = plan_by_count(current, [1, 2])
    assert counts(plan) == {1: 3, 2: 3}
    assert moved(current, plan) == 2


def test_count_uneven_total_gives_the_extra_to_the_fullest_broker():
    # 5 partitions on 2 brokers: shares 3 and 2; broker 2 already has 3, so nothing moves
    current = assign("t", [1, 2, 2, 1, 2])
    plan = plan_by_count(current, [1, 2])
    assert moved(current, plan) == 0


def test_count_new_broker_takes_a_share():
    current = assign("t", [1, 2, 1, 2, 1, 2])
    plan = plan_by_count(current, [1, 2, 3])
    assert counts(plan) == {1: 2, 2: 2, 3: 2}
    assert moved(current, plan) == 2


def test_count_spreads_topics_when_moving():
    current = assign("a", [1, 1, 1, 1]) + assign("b", [1, 1, 1, 1])
    plan = plan_by_count(current, [1, 2])
    per_broker_topic = Counter((a.node_id, a.topic) for a in plan)
    assert per_broker_topic == {(1, "a"): 2, (1, "b"): 2, (2, "a"): 2, (2, "b"): 2}


def test_count_needs_brokers():
    with pytest.raises(PlanError):
        plan_by_count(assign("t", [1]), [])


@settings(max_examples=200, deadline=None)
@given(
    leaders=st.lists(st.integers(1, 6), min_size=1, max_size=60),
    targets=st.sets(st.integers(1, 6), min_size=1, max_size=6),
)
def test_count_properties(leaders, targets):
    current = assign("t", leaders)
    plan = plan_by_count(current, sorted(targets))
    c = counts(plan)
    assert set(c) <= targets
    n, k = len(current), len(targets)
    assert all(n // k <= c.get(b, 0) <= -(-n // k) for b in targets)
    # the fewest moves: per broker at most its share stays, and the shares go to the
    # fullest brokers, so this is the optimum
    held = Counter(leaders)
    shares = sorted(((n // k) + (1 if i < n % k else 0)) for i in range(k))[::-1]
    fullest = sorted((held.get(b, 0) for b in targets), reverse=True)
    best_kept = sum(min(h, s) for h, s in zip(fullest, shares))
    assert moved(current, plan) == n - best_kept


# ---------------------------------------------------------------- by throughput


def test_throughput_isolates_a_hot_partition():
    current = assign("t", [1, 1, 2, 2, 3, 3])
    rates = {("t", 0): 1000.0, **{("t", p): 10.0 for p in range(1, 6)}}
    plan = plan_by_throughput(current, rates, [1, 2, 3])
    hot = next(a.node_id for a in plan if a.partition == 0)
    assert [a for a in plan if a.node_id == hot] == [Assignment("t", 0, hot)]
    assert hot == 1  # the hot partition stays where it is


def test_throughput_balanced_within_tolerance_moves_nothing():
    current = assign("t", [1, 2, 3])
    rates = {("t", 0): 100.0, ("t", 1): 105.0, ("t", 2): 95.0}
    assert moved(current, plan_by_throughput(current, rates, [1, 2, 3], tolerance=0.1)) == 0


def test_throughput_heaviest_first_onto_lightest():
    current = assign("t", [9, 9, 9, 9])  # broker 9 leaves: everything is placed
    rates = {("t", 0): 40.0, ("t", 1): 30.0, ("t", 2): 20.0, ("t", 3): 10.0}
    plan = {a.partition: a.node_id for a in plan_by_throughput(current, rates, [1, 2])}
    assert plan == {0: 1, 1: 2, 2: 2, 3: 1}  # 50 / 50


def test_throughput_idle_falls_back_to_count():
    current = assign("t", [1, 1, 1, 1])
    plan = plan_by_throughput(current, {}, [1, 2])
    assert counts(plan) == {1: 2, 2: 2}


def test_throughput_rejects_negative_tolerance():
    with pytest.raises(PlanError):
        plan_by_throughput(assign("t", [1]), {("t", 0): 1.0}, [1], tolerance=-1)


def test_rates_from_offsets():
    rates = rates_from_offsets({("t", 0): 100, ("t", 1): 50}, {("t", 0): 300, ("t", 1): 10}, 2.0)
    assert rates == {("t", 0): 100.0, ("t", 1): 0.0}
    with pytest.raises(PlanError):
        rates_from_offsets({}, {}, 0)


# ---------------------------------------------------------------- plan files


def test_plan_roundtrip():
    plan = assign("t", [2, 3]) + assign("a", [1])
    text = format_plan(plan_to_json(plan))
    assert json.loads(text) == plan_to_json(plan)
    assert parse_plan(text) == sorted(plan, key=lambda a: a.key)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"version": 2, "partitions": []}', "unsupported plan version"),
        ('{"version": 1, "partitions": []}', "non-empty list"),
        (
            '{"version": 1, "partitions": [{"topic": "t", "partition": 0}]}',
            r"partitions\[0\] must be",
        ),
        ('{"version": 1, "partitions": [{"topic": "", "partition": 0, "node_id": 1}]}', "topic"),
        (
            '{"version": 1, "partitions": [{"topic": "t", "partition": -1, "node_id": 1}]}',
            "partition must",
        ),
        (
            '{"version": 1, "partitions": [{"topic": "t", "partition": 0, "node_id": true}]}',
            "node_id must",
        ),
        (
            '{"version": 1, "partitions": [{"topic": "t", "partition": 0, "node_id": 1},'
            ' {"topic": "t", "partition": 0, "node_id": 2}]}',
            "appears twice",
        ),
    ],
)
def test_parse_plan_errors(text, message):
    with pytest.raises(PlanError, match=message):
        parse_plan(text)


BROKERS = {
    1: BrokerInfo(1),
    2: BrokerInfo(2, fenced=True, fence_reason="session expired"),
    3: BrokerInfo(3, shutting_down=True),
}


def test_check_plan():
    current = {("t", 0): 1, ("t", 1): 1}
    sizes = {"t": 2}
    check_plan([Assignment("t", 0, 1)], current, sizes, BROKERS)
    with pytest.raises(PlanError, match="topic 'x' does not exist"):
        check_plan([Assignment("x", 0, 1)], current, sizes, BROKERS)
    with pytest.raises(PlanError, match="no partition 5 .it has 2"):
        check_plan([Assignment("t", 5, 1)], current, sizes, BROKERS)
    with pytest.raises(PlanError, match="broker 7 is not registered"):
        check_plan([Assignment("t", 0, 7)], current, sizes, BROKERS)


def test_check_targets_refuses_fenced_and_shutting_down():
    check_targets([1], BROKERS)
    with pytest.raises(PlanError, match="fenced .session expired"):
        check_targets([1, 2], BROKERS)
    with pytest.raises(PlanError, match="shutting down"):
        check_targets([3], BROKERS)
    with pytest.raises(PlanError):
        check_targets([], BROKERS)


def test_moves_of():
    plan = [Assignment("t", 0, 2), Assignment("t", 1, 1)]
    assert moves_of(plan, {("t", 0): 1, ("t", 1): 1}) == [
        {"topic": "t", "partition": 0, "from": 1, "to": 2}
    ]


# ---------------------------------------------------------------- progress


def test_progress_states():
    done = PartitionView(
        leader=2, leader_epoch=5, stream_epoch=5, stream_state="opened", stream_node=2
    )
    assert progress(2, done) == (True, "done")
    old_owner = PartitionView(2, 5, 4, "opened", 1)
    assert progress(2, old_owner) == (
        False,
        "moving: waiting for old owner broker 1 to close the stream (epoch 4)",
    )
    closed = PartitionView(2, 5, 4, "closed", 1)
    assert "waiting for broker 2 to open" in progress(2, closed)[1]
    assert progress(3, done) == (False, "not moved: led by broker 2")
    assert progress(2, None) == (False, "partition does not exist")
