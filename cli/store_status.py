"""`cluster status`'s object-store problems: a bucket the brokers cannot write to, named
with the store that serves it and what waits on it (pending uploads, WAL fill, failover
mode), from the write health and upload stats the brokers send with their heartbeats (the
controller leader's `bucket_failover` and broker entries). Pure: no I/O."""

from __future__ import annotations

from cli.cluster_config import ClusterConfig
from cli.external_buckets import redact_uri

MAX_ERROR_CHARS = 200


def store_names(config: ClusterConfig, pids: dict[str, int]) -> dict[int, str]:
    """bucket id -> how a person finds its store: the embedded store's name, pid and
    endpoint, or the bucket's URI (credentials redacted)."""
    names = {b.bucket_id: redact_uri(b.uri) for b in config.buckets}
    for store in config.object_stores(pids):
        for bucket_id in store["bucket_ids"]:
            names[bucket_id] = (
                f"the embedded {store['name']} store ({store['component']}, pid "
                f"{store['pid'] or 'not running'}, {store['endpoint']})"
            )
    return names


def _waiting(brokers: list[dict], bucket_failover: dict) -> str:
    """What waits on the stores: each broker's pending uploads and WAL fill, and the mode."""
    parts = []
    for b in brokers:
        lag_s, used, capacity = b["upload_lag_s"], b["wal_used_bytes"], b["wal_capacity_bytes"]
        if lag_s is None:
            continue
        fill = f", WAL {100 * used / capacity:.0f}% full" if used is not None and capacity else ""
        pending = f"uploads pending for {lag_s:.0f} s" if lag_s > 0 else "no upload pending"
        parts.append(f"broker {b['node_id']}: {pending}{fill}")
    mode = bucket_failover.get("mode", "unknown")
    active = bucket_failover.get("active_bucket_id")
    parts.append(f"failover mode {mode} (new objects go to bucket {active})")
    return "; ".join(parts)


def store_problems(
    config: ClusterConfig,
    brokers: list[dict],
    leader_view: dict | None,
    pids: dict[str, int],
    store_ages_s: dict[str, float] | None = None,
) -> list[str]:
    """One problem per bucket that a majority of the reporting live brokers see failing
    (none without a leader: "no controller leader" says it already). `store_ages_s`: how
    long each running embedded store has answered (component -> s): writes that last
    failed before then failed while it was down or starting (the brokers have not written
    since it came back), so they are no problem of the store running now."""
    failover = (leader_view or {}).get("bucket_failover") or {}
    names = store_names(config, pids)
    restarted_since = _newest_store_age_s(config, pids, store_ages_s or {})
    problems = []
    for bucket in failover.get("buckets", []):
        if bucket.get("healthy") is not False:
            continue
        bucket_id = bucket["bucket_id"]
        last_failure_ms = bucket.get("last_failure_age_ms")
        age_s = restarted_since.get(bucket_id)
        if last_failure_ms is not None and age_s is not None and last_failure_ms / 1000 > age_s:
            continue
        since_s = bucket.get("failing_for_ms", 0) / 1000
        error = (bucket.get("last_error") or "no answer")[:MAX_ERROR_CHARS]
        problems.append(
            f"object store of bucket {bucket_id} failing: "
            f"{names.get(bucket_id, f'bucket {bucket_id}')}: writes fail on "
            f"{bucket['failing_reports']} of {bucket['reports']} brokers for {since_s:.0f} s "
            f"({error}); waiting: {_waiting(brokers, failover)}"
        )
    return problems


def _newest_store_age_s(
    config: ClusterConfig, pids: dict[str, int], store_ages_s: dict[str, float]
) -> dict[int, float]:
    """bucket id -> how long the running embedded store serving it has answered."""
    out = {}
    for store in config.object_stores(pids):
        age_s = store_ages_s.get(store["component"])
        if store["pid"] is not None and age_s is not None:
            for bucket_id in store["bucket_ids"]:
                out[bucket_id] = age_s
    return out
