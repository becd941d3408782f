"""Route epochs of the zone router (pure; AutoMQ's RouterChannelEpochControlManager).

The controller leader bumps the epoch every `route_epoch_interval_ms`: current = E + 1,
fenced = E. Proxies stamp each zone-route request with the current epoch they know; a main
refuses requests at or below the fenced epoch (a request delayed across two bumps, from a
proxy that lost touch, is never appended late). The bump is conditional on the epoch it
expects, so a retried command never bumps twice.
"""

from __future__ import annotations

from controlplane import records as r
from controlplane.image import MetadataImage
from controlplane.requests import BumpRouteEpochRequest


def bump_route_epoch(image: MetadataImage, req: BumpRouteEpochRequest, now_ms: int):
    state = image.route_epoch
    if req.expected_current_epoch != state.current_epoch:
        return [], {"current_epoch": state.current_epoch, "bumped": False}
    rec = r.RouteEpochRecord(
        current_epoch=state.current_epoch + 1,
        fenced_epoch=state.current_epoch,
        # only ever advances, and never past what is fenced now
        committed_epoch=min(
            max(state.committed_epoch, -1 if req.committed_epoch is None else req.committed_epoch),
            state.current_epoch,
        ),
    )
    return [rec], {"current_epoch": rec.current_epoch, "bumped": True}


def committed_epoch(image: MetadataImage, persisted: dict[int, int | None]) -> int | None:
    """The committed route epoch: the minimum of the brokers' persisted epochs (what each
    main has committed of the routed data it accepted), over every broker but the fenced
    ones that have no open stream (nothing of theirs is left to recover); None while one
    of them has not reported (a new leader, a starting broker)."""
    open_on = {s.node_id for s in image.streams.values() if s.state == r.StreamState.OPENED}
    values = []
    for broker in image.brokers.values():
        if broker.fenced and broker.node_id not in open_on:
            continue
        value = persisted.get(broker.node_id)
        if value is None:
            return None
        values.append(value)
    return min(values) if values else None


def bump_due(image: MetadataImage, last_bump_ms: int | None, now_ms: int, interval_ms: int) -> bool:
    """Whether the leader bumps now: brokers are registered and the interval passed since
    its last bump (`last_bump_ms` None: never bumped, e.g. a new leader, which bumps at once
    as its predecessor's timing is unknown)."""
    if not image.brokers or interval_ms <= 0:
        return False
    return last_bump_ms is None or now_ms - last_bump_ms >= interval_ms
