"""Where partitions go: leader choice for new partitions, moves, and evacuating a broker.

Pure functions of the image (no I/O). A move is one `PartitionRecord` with the new leader
and `leader_epoch + 1`: the stream epoch follows the leader epoch, so the old owner's epoch
is fenced the moment the new leader opens the stream, and the new leader can only open it
once the old owner (or its WAL failover) has uploaded and closed it.
"""

from __future__ import annotations

from collections import Counter

from controlplane import records as r
from controlplane.image import MetadataImage, PartitionState, TopicState


def leader_load(image: MetadataImage) -> Counter[int]:
    """Partitions led per broker (every registered broker appears, possibly with 0;
    erasure-coded partitions have no leader)."""
    load: Counter[int] = Counter({node: 0 for node in image.brokers})
    for topic in image.topics.values():
        for p in topic.partitions.values():
            if not p.erasure_coded:
                load[p.leader_node_id] += 1
    return load


def active_brokers(
    image: MetadataImage, exclude: set[int] | frozenset[int] = frozenset()
) -> list[int]:
    """Brokers that may be given partitions: unfenced, not shutting down, not excluded."""
    return sorted(
        b.node_id for b in image.brokers.values() if b.active and b.node_id not in exclude
    )


def choose_broker(
    image: MetadataImage,
    load: Counter[int],
    prefer_az: str | None,
    exclude: set[int] | frozenset[int] = frozenset(),
) -> int | None:
    """The least-loaded active broker, in `prefer_az` if one is there (no cross-AZ
    traffic for the partition's clients); None if no broker is active."""
    candidates = active_brokers(image, exclude)
    if not candidates:
        return None
    same_az = [n for n in candidates if image.brokers[n].az == prefer_az]
    pool = same_az or candidates
    return min(pool, key=lambda n: (load[n], n))


def spread_leaders(image: MetadataImage, count: int, topic_id: str | None = None) -> list[int]:
    """Leaders for `count` new partitions of a topic: spread over the active brokers by
    count, partition by partition.

    Each partition goes to the active broker with (1) the fewest partitions of this topic,
    (2) the fewest of this topic per broker in its AZ, (3) the fewest partitions overall,
    (4) the lowest id. Topic count comes first because the cluster-wide count alone piled
    a whole new topic onto a broker that had just restarted empty (its load was 0, the
    others' was high); the cluster-wide imbalance is the balancer's job, by moves.
    Raises nothing: [] when no broker is active (the caller refuses the request).
    """
    live = active_brokers(image)
    if not live:
        return []
    total = leader_load(image)
    mine: Counter[int] = Counter()
    if topic_id is not None and topic_id in image.topics:
        mine.update(p.leader_node_id for p in image.topics[topic_id].partitions.values())
    az_of = {n: image.brokers[n].az for n in live}
    az_size = Counter(az_of.values())
    az_mine: Counter[str] = Counter()
    for n in live:
        az_mine[az_of[n]] += mine[n]
    leaders: list[int] = []
    for _ in range(count):
        node = min(
            live, key=lambda n: (mine[n], az_mine[az_of[n]] / az_size[az_of[n]], total[n], n)
        )
        leaders.append(node)
        mine[node] += 1
        az_mine[az_of[node]] += 1
        total[node] += 1
    return leaders


def move_record(topic: TopicState, partition: PartitionState, new_leader: int) -> r.PartitionRecord:
    """The record that moves `partition` to `new_leader` with a new leader (stream) epoch."""
    return r.PartitionRecord(
        topic_id=topic.topic_id,
        partition=partition.partition,
        kind=r.PartitionKind.LEADER,
        leader_node_id=new_leader,
        leader_epoch=partition.leader_epoch + 1,
        stream_id=partition.stream_id,
    )


def evacuate(
    image: MetadataImage,
    node_id: int,
    load: Counter[int] | None = None,
    exclude: set[int] | frozenset[int] = frozenset(),
) -> list[r.PartitionRecord]:
    """Move every partition `node_id` leads to other active brokers, same AZ first and
    balanced by partition count. Partitions stay where they are if no broker is active."""
    load = load if load is not None else leader_load(image)
    broker = image.brokers.get(node_id)
    prefer_az = broker.az if broker is not None else None
    excluded = set(exclude) | {node_id}
    recs: list[r.PartitionRecord] = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        for p in sorted(topic.partitions.values(), key=lambda p: p.partition):
            if p.leader_node_id != node_id:
                continue
            target = choose_broker(image, load, prefer_az, excluded)
            if target is None:
                return recs
            recs.append(move_record(topic, p, target))
            load[target] += 1
            load[node_id] -= 1
    return recs
