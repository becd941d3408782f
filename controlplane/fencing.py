"""The fencing rules of the metadata, in one place (pure: image in, ControllerError out).

- **Node epochs**: only the current, unfenced epoch of a registered broker may write
  (`require_active_broker`); every registration issues a new epoch.
- **Stream epochs**: only the node that opened a stream's current epoch may change it
  (`require_stream_owner`); the stream epoch is the partition's leader epoch.
- **Compaction principals**: a compaction job (no broker) commits as a registered
  compactor name at its current epoch (`require_compactor`); it may only rewrite
  committed data, never extend a stream.
- **WAL failover**: the current failover target of a failed node may act on that node's
  behalf (`require_failover_target`, `authorize_owner`); `is_down` says which brokers count
  as failed.
"""

from __future__ import annotations

from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import (
    BrokerState,
    CompactorState,
    MetadataImage,
    NodeWALState,
    StreamMetaState,
)
from controlplane.records import StreamState

# the fence reason of a broker that registered and has not heartbeaten yet: not failed
REGISTERED_REASON = "registered"


def require_active_broker(image: MetadataImage, node_id: int, node_epoch: int) -> BrokerState:
    """The node fencing rule: only the current, unfenced epoch of a registered node may write."""
    broker = image.brokers.get(node_id)
    if broker is None:
        raise ControllerError(ErrorCode.UNKNOWN_NODE, f"node {node_id} is not registered")
    if node_epoch < broker.node_epoch:
        raise ControllerError(
            ErrorCode.STALE_NODE_EPOCH,
            f"node {node_id} epoch {node_epoch} is older than the current "
            f"epoch {broker.node_epoch}",
        )
    if node_epoch > broker.node_epoch:
        raise ControllerError(
            ErrorCode.INVALID_REQUEST,
            f"node {node_id} epoch {node_epoch} was never issued (current {broker.node_epoch})",
        )
    if broker.fenced and broker.fence_reason != REGISTERED_REASON:
        raise ControllerError(
            ErrorCode.NODE_FENCED,
            f"node {node_id} epoch {node_epoch} is fenced: {broker.fence_reason}",
        )
    return broker


def is_down(
    broker: BrokerState | None, newly_fenced: set[int] | frozenset[int] = frozenset()
) -> bool:
    """Fenced for good (not merely waiting for its first heartbeat), or unknown."""
    if broker is None:
        return True
    if broker.node_id in newly_fenced:
        return True
    return broker.fenced and broker.fence_reason != REGISTERED_REASON


def get_stream(image: MetadataImage, stream_id: int) -> StreamMetaState:
    stream = image.streams.get(stream_id)
    if stream is None:
        raise ControllerError(ErrorCode.UNKNOWN_STREAM, f"stream {stream_id} does not exist")
    return stream


def require_stream_owner(stream: StreamMetaState, stream_epoch: int, node_id: int) -> None:
    """The stream fencing rule: only the node that opened the current epoch may write."""
    if stream_epoch < stream.epoch:
        raise ControllerError(
            ErrorCode.STREAM_FENCED,
            f"stream {stream.stream_id} epoch {stream_epoch} is fenced by epoch {stream.epoch}",
        )
    if stream_epoch > stream.epoch or stream.state != StreamState.OPENED:
        raise ControllerError(
            ErrorCode.STREAM_NOT_OPENED,
            f"stream {stream.stream_id} is not open with epoch {stream_epoch}",
        )
    if stream.node_id != node_id:
        raise ControllerError(
            ErrorCode.STREAM_FENCED,
            f"stream {stream.stream_id} epoch {stream_epoch} is owned by "
            f"node {stream.node_id}, not {node_id}",
        )


def require_failover_target(
    image: MetadataImage, node_id: int, node_epoch: int, failed_node_id: int
) -> NodeWALState:
    """`node_id` (active, at `node_epoch`) is the current target of `failed_node_id`'s
    WAL failover: it may commit and close streams on the failed node's behalf."""
    require_active_broker(image, node_id, node_epoch)
    wal = image.node_wals.get(failed_node_id)
    if wal is None or not wal.failover_mode or wal.failover_target_node_id != node_id:
        raise ControllerError(
            ErrorCode.NOT_FAILOVER_TARGET,
            f"node {node_id} is not recovering the WAL of node {failed_node_id}",
        )
    return wal


def authorize_owner(
    image: MetadataImage, node_id: int, node_epoch: int, failover_node_id: int | None
) -> int:
    """The node whose streams a request may change: the requester itself (active), or in
    WAL failover the failed node whose WAL the requester (its current target) recovers."""
    if failover_node_id is None:
        require_active_broker(image, node_id, node_epoch)
        return node_id
    require_failover_target(image, node_id, node_epoch, failover_node_id)
    return failover_node_id


def require_compactor(image: MetadataImage, name: str, epoch: int) -> CompactorState:
    """The compactor fencing rule: only the current epoch of a registered compactor."""
    compactor = image.compactors.get(name)
    if compactor is None:
        raise ControllerError(ErrorCode.UNKNOWN_COMPACTOR, f"compactor {name!r} is not registered")
    if epoch != compactor.epoch:
        raise ControllerError(
            ErrorCode.STALE_COMPACTOR_EPOCH,
            f"compactor {name!r} epoch {epoch} is fenced (current epoch {compactor.epoch})",
        )
    return compactor
