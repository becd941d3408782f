"""Pure planning logic of `automqctl reassign` (no I/O): balancing, plan files, progress.

A plan is `{"version": 1, "partitions": [{"topic", "partition", "node_id"}, ...]}`: the
broker that should lead each listed partition. Moving a partition copies no data (the old
leader uploads and closes its stream, the new leader opens it with the next epoch), so the
planners only try to move as few partitions as possible, not as few bytes.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass

PLAN_VERSION = 1
DEFAULT_TOLERANCE = 0.1


class PlanError(ValueError):
    """A plan that cannot be used; the message is meant for the operator."""


@dataclass(frozen=True)
class Assignment:
    """One partition and the broker that leads it (now, or in a plan)."""

    topic: str
    partition: int
    node_id: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    def to_json(self) -> dict:
        return {"topic": self.topic, "partition": self.partition, "node_id": self.node_id}


@dataclass(frozen=True)
class BrokerInfo:
    """What the planner needs to know about a registered broker."""

    node_id: int
    fenced: bool = False
    fence_reason: str = ""
    shutting_down: bool = False


# ---------------------------------------------------------------- plan files


def plan_to_json(assignments: list[Assignment]) -> dict:
    """The plan file's JSON object, partitions sorted by topic and partition."""
    ordered = sorted(assignments, key=lambda a: a.key)
    return {"version": PLAN_VERSION, "partitions": [a.to_json() for a in ordered]}


def format_plan(data: dict) -> str:
    """A plan as JSON text with one partition per line (readable and diff-friendly)."""
    lines = [json.dumps(p) for p in data["partitions"]]
    body = ",\n    ".join(lines)
    return f'{{\n  "version": {data["version"]},\n  "partitions": [\n    {body}\n  ]\n}}\n'


def parse_plan(text: str) -> list[Assignment]:
    """Parse and check a plan file's text; raise PlanError with a precise message."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PlanError('a plan is a JSON object {"version": 1, "partitions": [...]}')
    if data.get("version") != PLAN_VERSION:
        raise PlanError(
            f"unsupported plan version {data.get('version')!r} (expected {PLAN_VERSION})"
        )
    entries = data.get("partitions")
    if not isinstance(entries, list) or not entries:
        raise PlanError('"partitions" must be a non-empty list')
    out: list[Assignment] = []
    seen: set[tuple[str, int]] = set()
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or set(e) != {"topic", "partition", "node_id"}:
            raise PlanError(
                f'partitions[{i}] must be {{"topic", "partition", "node_id"}}, got {e!r}'
            )
        topic, partition, node = e["topic"], e["partition"], e["node_id"]
        # bool is an int in Python; a plan saying `true` is a mistake, not partition 1
        if not isinstance(topic, str) or not topic:
            raise PlanError(f"partitions[{i}].topic must be a non-empty string")
        for name, value in (("partition", partition), ("node_id", node)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise PlanError(f"partitions[{i}].{name} must be an integer >= 0, got {value!r}")
        a = Assignment(topic, partition, node)
        if a.key in seen:
            raise PlanError(f"{topic}-{partition} appears twice in the plan")
        seen.add(a.key)
        out.append(a)
    return out


def check_plan(
    plan: list[Assignment],
    current: dict[tuple[str, int], int],
    topic_sizes: dict[str, int],
    brokers: dict[int, BrokerInfo],
) -> None:
    """Check a plan against the cluster: topics, partitions and active target brokers."""
    for a in plan:
        if a.topic not in topic_sizes:
            raise PlanError(f"topic {a.topic!r} does not exist")
        if a.key not in current:
            raise PlanError(
                f"topic {a.topic!r} has no partition {a.partition} (it has {topic_sizes[a.topic]})"
            )
    check_targets(sorted({a.node_id for a in plan}), brokers)


def check_targets(targets: list[int], brokers: dict[int, BrokerInfo]) -> None:
    """Every target must be registered, unfenced and not shutting down."""
    if not targets:
        raise PlanError("no target brokers given")
    for node in targets:
        b = brokers.get(node)
        if b is None:
            known = ", ".join(str(n) for n in sorted(brokers)) or "none"
            raise PlanError(f"broker {node} is not registered (registered brokers: {known})")
        if b.shutting_down:
            raise PlanError(f"broker {node} cannot take partitions: it is shutting down")
        if b.fenced:
            raise PlanError(
                f"broker {node} cannot take partitions: fenced ({b.fence_reason or 'no reason'})"
            )


# ---------------------------------------------------------------- planners


def plan_by_count(current: list[Assignment], brokers: list[int]) -> list[Assignment]:
    """Balance partition counts over `brokers` with as few moves as possible.

    Every broker ends with floor(n/k) or ceil(n/k) partitions. The brokers that already hold
    the most partitions get the ceil shares, and each keeps up to its share of what it has,
    so only partitions on other brokers or above a share move. Moved partitions go to the
    broker with the most room left, preferring one with few partitions of the same topic.
    """
    if not brokers:
        raise PlanError("no target brokers given")
    targets = sorted(set(brokers))
    n, k = len(current), len(targets)
    base, extra = divmod(n, k)
    held: dict[int, list[Assignment]] = defaultdict(list)
    for a in sorted(current, key=lambda a: a.key):
        held[a.node_id].append(a)
    by_holdings = sorted(targets, key=lambda b: (-len(held[b]), b))
    cap = {b: base + (1 if i < extra else 0) for i, b in enumerate(by_holdings)}

    result: list[Assignment] = []
    to_move: list[Assignment] = []
    per_topic: dict[int, Counter[str]] = {b: Counter() for b in targets}
    for node, parts in held.items():
        if node not in cap:
            to_move.extend(parts)
            continue
        # keep a spread of topics: drop first from the topic this broker holds most of
        kept = _spread_pick(parts, cap[node])
        kept_keys = {a.key for a in kept}
        result.extend(kept)
        per_topic[node].update(a.topic for a in kept)
        to_move.extend(a for a in parts if a.key not in kept_keys)

    load = Counter({b: per_topic[b].total() for b in targets})
    for a in sorted(to_move, key=lambda a: a.key):
        room = [b for b in targets if load[b] < cap[b]]
        node = min(room, key=lambda b: (per_topic[b][a.topic], load[b] - cap[b], b))
        result.append(Assignment(a.topic, a.partition, node))
        load[node] += 1
        per_topic[node][a.topic] += 1
    return sorted(result, key=lambda a: a.key)


def _spread_pick(parts: list[Assignment], count: int) -> list[Assignment]:
    """`count` of `parts`, taken round-robin over their topics (lowest partitions first)."""
    by_topic: dict[str, list[Assignment]] = defaultdict(list)
    for a in sorted(parts, key=lambda a: a.key):
        by_topic[a.topic].append(a)
    picked: list[Assignment] = []
    queues = [by_topic[t] for t in sorted(by_topic)]
    while len(picked) < count and any(queues):
        for q in queues:
            if q and len(picked) < count:
                picked.append(q.pop(0))
    return picked


def plan_by_throughput(
    current: list[Assignment],
    rates: dict[tuple[str, int], float],
    brokers: list[int],
    tolerance: float = DEFAULT_TOLERANCE,
) -> list[Assignment]:
    """Balance the summed produce rate (records/s) over `brokers`.

    A partition stays on its broker (if that broker is a target) while the broker's kept
    load stays within (1 + tolerance) x the fair share, heaviest partitions kept first;
    everything else is placed heaviest first onto the least-loaded broker (ties: fewer
    partitions, lower id). With no measurable traffic at all this is `plan_by_count`:
    sampling noise must not shuffle idle partitions around.
    """
    if not brokers:
        raise PlanError("no target brokers given")
    if tolerance < 0:
        raise PlanError("tolerance must be >= 0")
    targets = sorted(set(brokers))
    rate = {a.key: max(0.0, float(rates.get(a.key, 0.0))) for a in current}
    total = sum(rate.values())
    if total <= 0:
        return plan_by_count(current, targets)
    allowed = total / len(targets) * (1 + tolerance)
    load = {b: 0.0 for b in targets}
    count = Counter({b: 0 for b in targets})
    result: list[Assignment] = []
    rest: list[Assignment] = []
    heaviest_first = sorted(current, key=lambda a: (-rate[a.key], a.key))
    for a in heaviest_first:
        node = a.node_id
        # an empty broker keeps even a partition heavier than the share: it must go somewhere
        if node in load and (load[node] == 0 or load[node] + rate[a.key] <= allowed + 1e-9):
            result.append(a)
            load[node] += rate[a.key]
            count[node] += 1
        else:
            rest.append(a)
    for a in rest:  # already heaviest first
        node = min(targets, key=lambda b: (load[b], count[b], b))
        result.append(Assignment(a.topic, a.partition, node))
        load[node] += rate[a.key]
        count[node] += 1
    return sorted(result, key=lambda a: a.key)


def moves_of(plan: list[Assignment], current: dict[tuple[str, int], int]) -> list[dict]:
    """The entries of `plan` that change a leader: topic, partition, from, to."""
    return [
        {"topic": a.topic, "partition": a.partition, "from": current.get(a.key), "to": a.node_id}
        for a in sorted(plan, key=lambda a: a.key)
        if current.get(a.key) != a.node_id
    ]


def rates_from_offsets(
    before: dict[tuple[str, int], int], after: dict[tuple[str, int], int], elapsed_s: float
) -> dict[tuple[str, int], float]:
    """Records/s per partition from two end-offset samples `elapsed_s` apart (a partition
    whose offset went down, e.g. recreated, counts as idle)."""
    if elapsed_s <= 0 or math.isnan(elapsed_s):
        raise PlanError("the two offset samples must be taken some time apart")
    return {k: max(0, after[k] - before[k]) / elapsed_s for k in after if k in before}


# ---------------------------------------------------------------- progress


@dataclass(frozen=True)
class PartitionView:
    """What the image says about one partition and its stream."""

    leader: int
    leader_epoch: int
    stream_epoch: int | None  # None: the stream is not in the image
    stream_state: str | None  # "opened" | "closed"
    stream_node: int | None


def progress(planned_node: int, view: PartitionView | None) -> tuple[bool, str]:
    """(done, what it waits for) for one planned partition.

    Done means: led by the planned broker, and that broker has the partition's stream open
    at the partition's leader epoch, i.e. it takes writes.
    """
    if view is None:
        return False, "partition does not exist"
    if view.leader != planned_node:
        return False, f"not moved: led by broker {view.leader}"
    if view.stream_state is None:
        return False, "stream missing from the metadata"
    if (
        view.stream_state == "opened"
        and view.stream_node == planned_node
        and view.stream_epoch == view.leader_epoch
    ):
        return True, "done"
    if view.stream_state == "opened" and view.stream_node != planned_node:
        return False, (
            f"moving: waiting for old owner broker {view.stream_node} to close "
            f"the stream (epoch {view.stream_epoch})"
        )
    return False, (
        f"moving: waiting for broker {planned_node} to open the stream at epoch {view.leader_epoch}"
    )
