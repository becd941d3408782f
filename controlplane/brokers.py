"""Broker lifecycle: registration with node epochs, heartbeats, fencing."""

from __future__ import annotations

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import REGISTERED_REASON
from controlplane.image import MetadataImage
from controlplane.requests import (
    BrokerHeartbeatRequest,
    BrokerHeartbeatResponse,
    FenceBrokerRequest,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
)
from controlplane.wal_failover import registration_records


def register_broker(image: MetadataImage, req: RegisterBrokerRequest, now_ms: int):
    """Every registration gets a new node epoch: writes of older epochs are fenced from now on.

    Registering again with the same incarnation (a retried request) returns the same epoch.
    """
    current = image.brokers.get(req.node_id)
    if current is not None and current.incarnation_id == req.incarnation_id:
        return [], RegisterBrokerResponse(node_id=req.node_id, node_epoch=current.node_epoch)
    failover_recs = registration_records(image, req.node_id)
    wal = image.node_wals.get(req.node_id)
    last_epoch = max(current.node_epoch if current else -1, wal.node_epoch if wal else -1)
    epoch = last_epoch + 1
    recs: list = failover_recs + [
        r.RegisterBrokerRecord(
            node_id=req.node_id,
            node_epoch=epoch,
            az=req.az,
            host=req.host,
            kafka_port=req.kafka_port,
            incarnation_id=req.incarnation_id,
            registered_ms=now_ms,
            endpoints=tuple(req.endpoints) if req.endpoints is not None else None,
            shard_store_port=req.shard_store_port,
        ),
        r.FenceBrokerRecord(node_id=req.node_id, node_epoch=epoch, reason=REGISTERED_REASON),
        r.NodeWALMetadataRecord(
            node_id=req.node_id, node_epoch=epoch, wal_uri=req.wal_uri, failover_mode=False
        ),
    ]
    return recs, RegisterBrokerResponse(node_id=req.node_id, node_epoch=epoch)


def broker_heartbeat(image: MetadataImage, req: BrokerHeartbeatRequest, now_ms: int):
    """A freshly registered broker is unfenced by its first heartbeat that does not ask to
    stay fenced (`want_fence`: it is still starting). A broker fenced for any other reason (session
    expired, shutdown) stays fenced: it must register again and so get a new epoch."""
    broker = image.brokers.get(req.node_id)
    if broker is None:
        raise ControllerError(ErrorCode.UNKNOWN_NODE, f"node {req.node_id} is not registered")
    if req.node_epoch != broker.node_epoch:
        raise ControllerError(
            ErrorCode.STALE_NODE_EPOCH,
            f"node {req.node_id} epoch {req.node_epoch} is not current "
            f"({broker.node_epoch}); register again",
        )
    if broker.fenced and broker.fence_reason == REGISTERED_REASON and not req.want_fence:
        return (
            [r.UnfenceBrokerRecord(node_id=req.node_id, node_epoch=req.node_epoch)],
            BrokerHeartbeatResponse(fenced=False, node_epoch=broker.node_epoch),
        )
    return [], BrokerHeartbeatResponse(
        fenced=broker.fenced, node_epoch=broker.node_epoch, fence_reason=broker.fence_reason
    )


def fence_broker(image: MetadataImage, req: FenceBrokerRequest, now_ms: int):
    broker = image.brokers.get(req.node_id)
    if broker is None:
        raise ControllerError(ErrorCode.UNKNOWN_NODE, f"node {req.node_id} is not registered")
    if req.node_epoch != broker.node_epoch:
        raise ControllerError(
            ErrorCode.STALE_NODE_EPOCH,
            f"node {req.node_id} epoch {req.node_epoch} is not current ({broker.node_epoch})",
        )
    if broker.fenced and broker.fence_reason != REGISTERED_REASON:
        return [], {}
    return [
        r.FenceBrokerRecord(node_id=req.node_id, node_epoch=req.node_epoch, reason=req.reason)
    ], {}


def fence_expired_brokers(image: MetadataImage, expired: list[tuple[int, int]]) -> list:
    """Fence the (node, epoch) pairs whose session the leader saw expire, if still current."""
    recs: list = []
    for node_id, epoch in expired:
        broker = image.brokers.get(node_id)
        if broker is None or broker.node_epoch != epoch:
            continue
        if broker.fenced and broker.fence_reason != REGISTERED_REASON:
            continue
        recs.append(
            r.FenceBrokerRecord(node_id=node_id, node_epoch=epoch, reason="session expired")
        )
    return recs
