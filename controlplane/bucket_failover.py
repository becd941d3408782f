"""Object-storage failover (AKIP-1): which bucket new objects go to, decided by hand or by
the leader from the write health brokers report. Pure: no I/O.

The main bucket is the lowest configured bucket id; the failover bucket is the next one.
Detection: the leader enters failover mode when a majority of the live (unfenced) brokers
report failed writes to the main bucket for at least `bucket_failover_detect_ms`, and the
failover bucket is not failing for a majority too. Going back is manual unless
`bucket_failover_auto_return_ms` > 0: then a majority reporting the main bucket healthy for
that long switches back. Every switch is a `BucketFailoverRecord` with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from controlplane.requests import BucketWriteHealth, SetActiveBucketRequest, SetActiveBucketResponse
from controlplane.settings import ControllerSettings


def main_bucket_id(settings: ControllerSettings) -> int:
    """The main bucket: the lowest configured id (0 in every standard config)."""
    return min(settings.bucket_ids)


def failover_bucket_id(settings: ControllerSettings) -> int | None:
    """The bucket automatic failover switches to: the next configured id, or None."""
    others = sorted(b for b in settings.bucket_ids if b != main_bucket_id(settings))
    return others[0] if others else None


def set_active_bucket(
    image: MetadataImage, req: SetActiveBucketRequest, now_ms: int, settings: ControllerSettings
):
    """The `set_active_bucket` command: switch new objects to `req.bucket_id`.

    Refused (nothing changes) for an unknown bucket or when no failover bucket is
    configured. Switching to the bucket that is already active changes nothing.
    """
    state = image.bucket_failover
    main = main_bucket_id(settings)
    if failover_bucket_id(settings) is None and req.bucket_id != main:
        raise ControllerError(
            ErrorCode.UNKNOWN_BUCKET,
            f"no failover bucket is configured (only bucket {main}): cannot switch to "
            f"bucket {req.bucket_id}",
        )
    if req.bucket_id not in settings.bucket_ids:
        raise ControllerError(
            ErrorCode.UNKNOWN_BUCKET,
            f"bucket {req.bucket_id} is not configured (known: {sorted(settings.bucket_ids)})",
        )
    if req.only_if_active is not None and state.active_bucket_id != req.only_if_active:
        return [], _response(image, changed=False)  # someone switched since the decision
    if state.active_bucket_id == req.bucket_id:
        return [], _response(image, changed=False)
    mode = "normal" if req.bucket_id == main else "failover"
    rec = r.BucketFailoverRecord(
        active_bucket_id=req.bucket_id,
        reason=req.reason or ("manual switch" if not req.auto else "automatic"),
        changed_ms=now_ms,
        mode=mode,
        auto=req.auto,
    )
    return [rec], SetActiveBucketResponse(
        mode=mode, active_bucket_id=req.bucket_id, since_ms=now_ms, changed=True
    )


def _response(image: MetadataImage, changed: bool) -> SetActiveBucketResponse:
    state = image.bucket_failover
    return SetActiveBucketResponse(
        mode=state.mode,
        active_bucket_id=state.active_bucket_id,
        since_ms=state.since_ms,
        changed=changed,
    )


@dataclass(frozen=True)
class HealthReport:
    """One broker's last report about one bucket, aged to the leader's `now`."""

    node_id: int
    failing_for_ms: int
    healthy_for_ms: int
    last_error: str | None = None
    # time since the broker's most recent failed write (None: unknown)
    last_failure_age_ms: int | None = None


def aged_reports(
    reports: dict[int, tuple[list[BucketWriteHealth], float]], now_s: float
) -> dict[int, list[HealthReport]]:
    """Per bucket, each broker's report with the time since it arrived added (pure).

    `reports`: node id -> (its last bucket health list, monotonic seconds it arrived).
    """
    out: dict[int, list[HealthReport]] = {}
    for node_id, (health, seen_s) in reports.items():
        age_ms = max(0, int((now_s - seen_s) * 1000))
        for h in health:
            out.setdefault(h.bucket_id, []).append(
                HealthReport(
                    node_id=node_id,
                    failing_for_ms=h.failing_for_ms + age_ms if h.failing_for_ms else 0,
                    healthy_for_ms=h.healthy_for_ms + age_ms if not h.failing_for_ms else 0,
                    last_error=h.last_error,
                    last_failure_age_ms=None
                    if h.last_failure_age_ms is None
                    else h.last_failure_age_ms + age_ms,
                )
            )
    return out


def decide(
    image: MetadataImage,
    reports: dict[int, list[HealthReport]],
    settings: ControllerSettings,
    now_ms: int,
) -> SetActiveBucketRequest | None:
    """The switch the leader's detection makes now, or None (pure).

    Only reports of live (unfenced) brokers count, and a majority of those is needed, so one
    broker with a bad network path cannot move the cluster's writes. Failing and healthy
    time count only since the last switch (`now_ms` - its `since_ms`): an operator who
    switches back to a bucket that was failing gets the full detection time before an
    automatic switch can overrule them, whatever the brokers remember of the outage. And a
    failing report counts only if one of its failures happened after the switch: a broker
    that has not written to the bucket since (its failures all from the outage) is no
    evidence that the bucket is still down (seen: a return overruled 1 s later, before the
    brokers' first write to the healed bucket).
    """
    state = image.bucket_failover
    since_switch_ms = max(0, now_ms - state.since_ms) if state.since_ms else None

    def since_switch(ms: int) -> int:
        return ms if since_switch_ms is None else min(ms, since_switch_ms)

    live = {b.node_id for b in image.brokers.values() if not b.fenced}
    if not live:
        return None
    majority = len(live) // 2 + 1
    main = main_bucket_id(settings)
    target = failover_bucket_id(settings)
    if target is None:
        return None

    def failed_since_switch(h: HealthReport) -> bool:
        if since_switch_ms is None or h.last_failure_age_ms is None:
            return True
        return h.last_failure_age_ms < since_switch_ms

    def failing(bucket_id: int, for_ms: int) -> list[HealthReport]:
        return [
            h
            for h in reports.get(bucket_id, [])
            if h.node_id in live
            and h.failing_for_ms > 0
            and since_switch(h.failing_for_ms) >= for_ms
            and failed_since_switch(h)
        ]

    if state.active_bucket_id == main:
        bad = failing(main, settings.bucket_failover_detect_ms)
        if len(bad) < majority or len(failing(target, 1)) >= majority:
            return None
        worst = max(bad, key=lambda h: h.failing_for_ms)
        return SetActiveBucketRequest(
            bucket_id=target,
            auto=True,
            only_if_active=main,
            reason=(
                f"writes to bucket {main} failing on {len(bad)} of {len(live)} live brokers "
                f"for >= {settings.bucket_failover_detect_ms} ms: {worst.last_error or '?'}"
            )[:256],
        )
    if settings.bucket_failover_auto_return_ms <= 0:
        return None
    healthy = [
        h
        for h in reports.get(main, [])
        if h.node_id in live
        and h.failing_for_ms == 0
        and since_switch(h.healthy_for_ms) >= settings.bucket_failover_auto_return_ms
    ]
    if len(healthy) < majority:
        return None
    return SetActiveBucketRequest(
        bucket_id=main,
        auto=True,
        only_if_active=state.active_bucket_id,
        reason=(
            f"bucket {main} healthy on {len(healthy)} of {len(live)} live brokers for "
            f">= {settings.bucket_failover_auto_return_ms} ms"
        ),
    )


def deletion_paused(image: MetadataImage, bucket_id: int, unhealthy: set[int]) -> bool:
    """Must the controller leave this bucket's destroyed objects alone for now? (pure)

    Yes for a bucket the brokers report unhealthy (a delete would hang or fail), and in
    failover mode for every bucket but the active one (no cross-region traffic, AKIP-1).
    The objects stay MARK_DESTROYED, so they are deleted once this no longer holds.
    """
    state = image.bucket_failover
    return bucket_id in unhealthy or (state.in_failover and bucket_id != state.active_bucket_id)


def bucket_usage(image: MetadataImage) -> dict[int, tuple[int, int]]:
    """bucket id -> (objects, bytes) of the objects the metadata holds in it (pure)."""
    usage: dict[int, tuple[int, int]] = {}
    for meta in image.objects.values():
        n, size = usage.get(meta.bucket_id, (0, 0))
        usage[meta.bucket_id] = (n + 1, size + meta.size_bytes)
    return usage
