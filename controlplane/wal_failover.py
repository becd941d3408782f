"""Crash failover of a broker's WAL (seed 001), as decisions on the image (no I/O).

When a broker is fenced for good (session expired, or it shut down) while it still owns
open streams, its WAL may hold acknowledged records that are in no object yet. The
controller then:

1. moves the broker's partitions to active brokers (same AZ first), with leader epoch + 1;
2. puts its WAL in failover mode with a target broker and a *failover epoch* greater than
   any epoch the failed broker wrote with.

The target takes the WAL over with the reservation (target, failover epoch) — durable
before it reads a record, so the failed broker, if only paused, can no longer acknowledge
an append — uploads what is not committed yet on the failed broker's behalf, closes the
failed broker's streams and reports `complete_wal_failover`. Only then can the new leaders
open the streams (`open_stream` refuses while the old owner has them open), so no
acknowledged record is skipped. If the target dies too, another one is chosen with a
greater failover epoch. The failed broker may register again only once failover is done.
"""

from __future__ import annotations

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import (
    is_down,
    require_failover_target,
)
from controlplane.image import MetadataImage, NodeWALState
from controlplane.placement import choose_broker, evacuate, leader_load
from controlplane.records import StreamState
from controlplane.requests import CompleteWALFailoverRequest


def nodes_owning_open_streams(image: MetadataImage) -> set[int]:
    return {s.node_id for s in image.streams.values() if s.state == StreamState.OPENED}


def plan_failovers(
    image: MetadataImage, newly_fenced: set[int] | frozenset[int] = frozenset()
) -> list:
    """Records that evacuate down brokers and start (or re-target) WAL failovers.

    `newly_fenced` are nodes fenced by records of the same command, not yet applied.
    Returns [] when there is nothing to do, so the leader can poll it cheaply.
    """
    recs: list = []
    owners = nodes_owning_open_streams(image)
    load = leader_load(image)
    down = {n for n, b in image.brokers.items() if is_down(b, newly_fenced)}
    for node_id in sorted(down):
        broker = image.brokers[node_id]
        recs += evacuate(image, node_id, load, exclude=down)
        wal = image.node_wals.get(node_id)
        if wal is None or node_id not in owners:
            continue
        if not wal.failover_mode:
            target = choose_broker(image, load, broker.az, exclude=down)
            if target is not None:
                epoch = max(wal.node_epoch, broker.node_epoch) + 1
                recs.append(_failover_record(wal, epoch, target))
        elif wal.failover_target_node_id is None or is_down(
            image.brokers.get(wal.failover_target_node_id), newly_fenced
        ):
            # the target died before finishing: hand the WAL to another broker
            target = choose_broker(image, load, broker.az, exclude=down)
            if target is not None:
                recs.append(_failover_record(wal, wal.node_epoch + 1, target))
    return recs


def registration_records(image: MetadataImage, node_id: int) -> list:
    """Failover consequences of `node_id` registering again (pure).

    - Its own WAL is being recovered by a live target: refused (WAL_FAILOVER_IN_PROGRESS,
      retriable) so two nodes never recover one WAL; if the target is down, the failover
      is cancelled and the node recovers its own WAL (its new epoch is greater).
    - It is the target of another WAL's failover (it restarted mid-way): its new process
      must take that WAL over again, so the failover epoch grows.
    """
    recs: list = []
    own = image.node_wals.get(node_id)
    if own is not None and own.failover_mode:
        target = own.failover_target_node_id
        if target is not None and target != node_id and not is_down(image.brokers.get(target)):
            raise ControllerError(
                ErrorCode.WAL_FAILOVER_IN_PROGRESS,
                f"node {target} is recovering the WAL of node {node_id}; "
                f"register again once it is done",
            )
    recs += [
        _failover_record(wal, wal.node_epoch + 1, node_id)
        for wal in sorted(image.node_wals.values(), key=lambda w: w.node_id)
        if wal.failover_mode and wal.failover_target_node_id == node_id and wal.node_id != node_id
    ]
    return recs


def _failover_record(wal: NodeWALState, epoch: int, target: int) -> r.NodeWALMetadataRecord:
    return r.NodeWALMetadataRecord(
        node_id=wal.node_id,
        node_epoch=epoch,
        wal_uri=wal.wal_uri,
        failover_mode=True,
        failover_target_node_id=target,
    )


def complete_wal_failover(image: MetadataImage, req: CompleteWALFailoverRequest, now_ms: int):
    wal = require_failover_target(image, req.node_id, req.node_epoch, req.failed_node_id)
    if wal.node_epoch != req.failover_epoch:
        raise ControllerError(
            ErrorCode.NOT_FAILOVER_TARGET,
            f"failover epoch {req.failover_epoch} of node "
            f"{req.failed_node_id}'s WAL was superseded by {wal.node_epoch}",
        )
    still_open = sorted(
        s.stream_id
        for s in image.streams.values()
        if s.state == StreamState.OPENED and s.node_id == req.failed_node_id
    )
    if still_open:
        raise ControllerError(
            ErrorCode.STREAM_NOT_CLOSED,
            f"node {req.failed_node_id} still owns open streams "
            f"{still_open[:10]}: close them before completing the failover",
        )
    return [
        r.NodeWALMetadataRecord(
            node_id=wal.node_id,
            node_epoch=wal.node_epoch,
            wal_uri=wal.wal_uri,
            failover_mode=False,
            failover_target_node_id=None,
        )
    ], {}
