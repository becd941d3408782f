"""Server-side assignors of KIP-848 consumer groups (`group.remote.assignor`): pure functions.

An assignor maps the members' subscriptions and the subscribed topics' partition counts to a
target assignment ``member id -> {topic id -> partitions}``. Both are ports of the rules of
Kafka's group coordinator (`org.apache.kafka.coordinator.group.assignor`), simplified:

* ``uniform`` (Kafka's default): every partition of a subscribed topic goes to one member
  subscribed to it, the members' partition counts differ by at most one where their
  subscriptions allow, and it is sticky: a member keeps the partitions of its previous
  target assignment as long as that stays within its quota, so a rebalance moves as few
  partitions as it can;
* ``range``: per topic, the members subscribed to it in member-id order get contiguous
  ranges (the first ``partitions % members`` one partition more), so members subscribed to
  co-partitioned topics get the same partition numbers of each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

#: member id -> topic id -> partitions
Assignment = dict[str, dict[str, set[int]]]


def _topics_by_member(
    subscriptions: Mapping[str, set[str]], partition_counts: Mapping[str, int]
) -> dict[str, list[str]]:
    """topic id -> members subscribed to it (sorted), for topics that exist."""
    out: dict[str, list[str]] = {}
    for member_id in sorted(subscriptions):
        for topic_id in subscriptions[member_id]:
            if partition_counts.get(topic_id, 0) > 0:
                out.setdefault(topic_id, []).append(member_id)
    return out


def range_assign(
    subscriptions: Mapping[str, set[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Mapping[str, set[int]]],
) -> Assignment:
    """Kafka's ``range`` assignor (see the module docstring); ``previous`` is unused."""
    del previous
    result: Assignment = {member_id: {} for member_id in subscriptions}
    for topic_id, members in _topics_by_member(subscriptions, partition_counts).items():
        count = partition_counts[topic_id]
        quota, extra = divmod(count, len(members))
        start = 0
        for index, member_id in enumerate(members):
            size = quota + (1 if index < extra else 0)
            if size:
                result[member_id][topic_id] = set(range(start, start + size))
            start += size
    return result


def uniform_assign(
    subscriptions: Mapping[str, set[str]],
    partition_counts: Mapping[str, int],
    previous: Mapping[str, Mapping[str, set[int]]],
) -> Assignment:
    """Kafka's ``uniform`` assignor (see the module docstring): balanced and sticky."""
    members = sorted(subscriptions)
    result: Assignment = {member_id: {} for member_id in members}
    if not members:
        return result
    subscribers = _topics_by_member(subscriptions, partition_counts)
    all_partitions = [(t, p) for t in sorted(subscribers) for p in range(partition_counts[t])]
    # quota: what a member may keep; with heterogeneous subscriptions it is an upper bound
    eligible = {
        m: sum(partition_counts[t] for t in subscribers if m in subscribers[t]) for m in members
    }
    quota = -(-len(all_partitions) // len(members))
    counts = dict.fromkeys(members, 0)
    taken: set[tuple[str, int]] = set()
    for member_id in members:  # sticky: keep previous partitions up to the quota
        kept = sorted(
            (t, p)
            for t, parts in previous.get(member_id, {}).items()
            if t in subscribers and member_id in subscribers[t]
            for p in parts
            if p < partition_counts[t]
        )
        for tp in kept[: min(quota, eligible[member_id])]:
            if tp not in taken:
                taken.add(tp)
                counts[member_id] += 1
                result[member_id].setdefault(tp[0], set()).add(tp[1])
    for topic_id, partition in all_partitions:
        if (topic_id, partition) in taken:
            continue
        owner = min(subscribers[topic_id], key=lambda m: (counts[m], m))
        counts[owner] += 1
        result[owner].setdefault(topic_id, set()).add(partition)
    _rebalance_overloaded(result, counts, subscribers)
    return result


def _rebalance_overloaded(
    result: Assignment, counts: dict[str, int], subscribers: Mapping[str, list[str]]
) -> None:
    """Move partitions from the most to the least loaded member while that narrows the
    spread by more than one and the receiver subscribes to the topic (bounded passes)."""
    for _ in range(sum(counts.values()) + 1):
        moved = False
        for giver in sorted(counts, key=lambda m: -counts[m]):
            for topic_id in sorted(result[giver]):
                parts = result[giver][topic_id]
                takers = [m for m in subscribers.get(topic_id, []) if counts[m] + 1 < counts[giver]]
                if not parts or not takers:
                    continue
                taker = min(takers, key=lambda m: (counts[m], m))
                partition = max(parts)
                parts.discard(partition)
                if not parts:
                    del result[giver][topic_id]
                result[taker].setdefault(topic_id, set()).add(partition)
                counts[giver] -= 1
                counts[taker] += 1
                moved = True
                break
            if moved:
                break
        if not moved:
            return


AssignorFn = Callable[
    [Mapping[str, set[str]], Mapping[str, int], Mapping[str, Mapping[str, set[int]]]], Assignment
]

#: assignor name -> function (the names Kafka's consumers send as ServerAssignor)
ASSIGNORS: dict[str, AssignorFn] = {"uniform": uniform_assign, "range": range_assign}
