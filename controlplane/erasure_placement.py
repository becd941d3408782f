"""Leaderless erasure-coded partitions in the metadata (issue #14): which brokers keep a
partition's shards, and which broker a client is sent to (pure, no I/O).

A partition of a topic with `automq.partition.mode=erasure` is of kind ERASURE and has no leader
(`leader_node_id = NO_LEADER`); its `shard_stores` list the k + m brokers whose shard stores keep
shard i of every offset, chosen when the partition is created: spread over AZs first, then
rotated per partition so that every broker keeps about as many shards. Every broker can serve
the partition (it reads and writes through the stores); the Metadata answer names a live one
as "leader", preferring the partition's own stores in turn, so producers spread over them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane import topic_configs
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage, PartitionState


@dataclass(frozen=True)
class ErasureSettings:
    data_shards: int
    parity_shards: int
    read_delay_ms: int
    seal_delay_ms: int = 10_000

    @property
    def total_shards(self) -> int:
        return self.data_shards + self.parity_shards


def erasure_settings(configs: Mapping[str, str]) -> ErasureSettings | None:
    """The erasure code of a topic's partitions, None for a topic with leaders."""
    if topic_configs.effective(configs, topic_configs.PARTITION_MODE) != "erasure":
        return None
    return ErasureSettings(
        topic_configs.effective_int(configs, topic_configs.ERASURE_DATA_SHARDS),
        topic_configs.effective_int(configs, topic_configs.ERASURE_PARITY_SHARDS),
        topic_configs.effective_int(configs, topic_configs.ERASURE_READ_DELAY_MS),
        topic_configs.effective_int(configs, topic_configs.ERASURE_SEAL_DELAY_MS),
    )


def _az_interleaved(image: MetadataImage) -> list[int]:
    """Active brokers ordered so that consecutive ones are in different AZs when possible."""
    by_az: dict[str, list[int]] = defaultdict(list)
    for b in sorted(image.brokers.values(), key=lambda b: b.node_id):
        if b.active:
            by_az[b.az].append(b.node_id)
    zones = [by_az[az] for az in sorted(by_az)]
    order: list[int] = []
    for i in range(max((len(z) for z in zones), default=0)):
        order += [z[i] for z in zones if i < len(z)]
    return order


def place_shard_stores(
    image: MetadataImage, first_partition: int, count: int, settings: ErasureSettings
) -> list[list[int]]:
    """The shard stores of partitions first_partition .. + count: k + m distinct active
    brokers each, AZs interleaved, the start rotating by partition. Raises NOT_ENOUGH_BROKERS
    when fewer than k + m brokers are active."""
    order = _az_interleaved(image)
    need = settings.total_shards
    if len(order) < need:
        raise ControllerError(
            ErrorCode.NOT_ENOUGH_BROKERS,
            f"an erasure-coded partition needs {need} active brokers "
            f"({settings.data_shards} data + {settings.parity_shards} parity shards), "
            f"{len(order)} are active",
        )
    placed = []
    for partition in range(first_partition, first_partition + count):
        start = partition % len(order)
        rotated = order[start:] + order[:start]
        placed.append(rotated[:need])
    return placed


def serving_node(
    image: MetadataImage, partition: PartitionState, az: str | None = None
) -> int | None:
    """The broker clients are sent to for a partition: its leader (if unfenced), or for a
    leaderless partition a live broker, its own shard stores first (in turn from the
    partition index, so partitions spread); None when no broker can serve it. With `az`
    (the client's AZ, zone router), a live broker of that AZ when it has one, in the same
    order: any broker can write the partition, so the client never crosses AZs to reach
    one (the zone router lists only its AZ's brokers to such a client)."""

    if not partition.erasure_coded:
        leader = image.brokers.get(partition.leader_node_id)
        return partition.leader_node_id if leader is not None and not leader.fenced else None

    def live(node: int) -> bool:
        b = image.brokers.get(node)
        return b is not None and b.active

    stores = partition.shard_stores
    start = partition.partition % len(stores)
    in_turn = [n for n in stores[start:] + stores[:start] if live(n)]
    others = sorted(n for n in image.brokers if live(n))
    if az is not None:
        local = [n for n in in_turn if image.brokers[n].az == az]
        if local:
            return local[0]
        local = [n for n in others if image.brokers[n].az == az]
        if local:
            return local[partition.partition % len(local)]
    if in_turn:
        return in_turn[0]
    return others[partition.partition % len(others)] if others else None
