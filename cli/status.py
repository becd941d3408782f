"""Cluster status as one JSON document (a stable interface; see docs/operations.md)."""

from __future__ import annotations

from cli.cluster_config import (
    STORE_COMPONENTS,
    SUPERVISOR,
    BrokerSpec,
    ClusterConfig,
    effective_wal_capacity_bytes,
)
from cli.external_buckets import redact_uri
from cli.local_cluster import LocalCluster
from cli.remote_status import controller_views
from cli.store_status import store_problems
from cli.supervisor import read_state as read_supervisor_state

STATUS_TIMEOUT_S = 3.0


def collect_status(cluster: LocalCluster, config: ClusterConfig) -> dict:
    """Ask every controller for its view; brokers and heartbeats come from the leader."""
    views = _controller_views(config)
    pids = cluster.running_pids(config)
    controllers, leader_view = _controllers(config, views, pids)
    leader_id = leader_view["node_id"] if leader_view else None
    registered = {b["node_id"]: b for b in (leader_view or {}).get("brokers", [])}
    brokers = [_broker(config, spec, registered.get(spec.node_id), pids) for spec in config.brokers]
    # which bucket is active only the leader knows: none is reported active without one
    active_bucket = (leader_view or {}).get("active_bucket_id", 0) if leader_view else None
    buckets = [
        {"bucket_id": b.bucket_id, "uri": redact_uri(b.uri), "active": b.bucket_id == active_bucket}
        for b in config.buckets
    ]
    problems = _problems(config, controllers, brokers, leader_view)
    store_ages_s = {
        name: age
        for name in STORE_COMPONENTS
        if name in pids and (age := cluster.store_answering_s(name, pids[name])) is not None
    }
    problems += store_problems(config, brokers, leader_view, pids, store_ages_s)
    if config.supervise and SUPERVISOR not in pids:
        problems.append(
            "the supervisor is not running: crashed processes are not restarted "
            "(`automqctl cluster up` starts it again)"
        )
    if not pids:
        state = "stopped"
        # one problem instead of one per controller and broker
        problems = ["no process of the cluster runs (start it with `automqctl cluster up`)"]
    else:
        state = "degraded" if problems else "healthy"
    return {
        "cluster_dir": str(cluster.dir),
        # stopped: no process runs; degraded: some run, problems say what is wrong
        "state": state,
        "healthy": not problems,
        "problems": problems,
        "bootstrap_servers": config.bootstrap_servers(),
        # every listener's bootstrap servers (the CLI's is bootstrap_servers)
        "listeners": {
            k.name: {
                "security_protocol": k.security_protocol,
                "bootstrap_servers": config.bootstrap_servers(k.name),
            }
            for k in config.listener_kinds()
        },
        "leader": leader_id,
        "controllers": controllers,
        "brokers": brokers,
        "buckets": buckets,
        **_leader_and_store_fields(cluster, config, leader_view, active_bucket, pids),
    }


def _controller_views(config: ClusterConfig) -> list[dict | None]:
    """Each controller's status answer, asked at once (None: unreachable)."""
    return controller_views(config.controller_client(request_timeout_s=STATUS_TIMEOUT_S))


def _controllers(
    config: ClusterConfig, views: list[dict | None], pids: dict[str, int]
) -> tuple[list[dict], dict | None]:
    """The controllers' entries and the leader's view (None: no leader)."""
    controllers = []
    leader_view: dict | None = None
    for ctrl, view in zip(config.controllers, views):
        raft = (view or {}).get("raft", {})
        is_leader = raft.get("state") == "leader"
        if is_leader and (
            leader_view is None or raft.get("term", -1) > leader_view["raft"].get("term", -1)
        ):
            leader_view = view
        controllers.append(
            {
                "node_id": ctrl.node_id,
                "address": ctrl.api_address,
                "raft_address": ctrl.raft_address,
                "reachable": view is not None,
                "is_leader": is_leader,
                "state": raft.get("state", "unreachable"),
                "term": raft.get("term"),
                "commit_index": raft.get("commit_index"),
                "last_applied": raft.get("last_applied"),
                "pid": pids.get(f"controller-{ctrl.node_id}"),
            }
        )
    # only one leader per term can be real; if two claim it, the higher term wins above
    leader_id = leader_view["node_id"] if leader_view else None
    for c in controllers:
        c["is_leader"] = c["node_id"] == leader_id
    return controllers, leader_view


def _broker(config: ClusterConfig, spec: BrokerSpec, b: dict | None, pids: dict[str, int]) -> dict:
    """One broker's entry: its config, and what the leader knows of it (`b`, None: it is
    not registered)."""
    # the listeners it registered (what clients are told), else the configured ones
    endpoints = (b or {}).get("endpoints") or [
        e.model_dump() for e in config.broker_endpoints(spec)
    ]
    return {
        "node_id": spec.node_id,
        "az": spec.az,
        "address": config.bootstrap_servers_of(spec),
        "endpoints": [
            {
                "listener": e["name"],
                "security_protocol": e["security_protocol"],
                "address": f"{e['host']}:{e['port']}",
            }
            for e in endpoints
        ],
        "metrics_address": f"{config.host}:{spec.metrics_port}" if spec.metrics_port else None,
        "registered": b is not None,
        "fenced": True if b is None else b["fenced"],
        "fence_reason": None if b is None else b["fence_reason"],
        "node_epoch": None if b is None else b["node_epoch"],
        "last_heartbeat_age_ms": None if b is None else b["last_heartbeat_age_ms"],
        "shutting_down": False if b is None else b.get("shutting_down", False),
        "partitions_led": 0 if b is None else b.get("partitions_led", 0),
        "coordinator_slots": 0 if b is None else b.get("coordinator_slots", 0),
        "wal_failover_target": None if b is None else b.get("wal_failover_target"),
        # upload health from the broker's last heartbeat (None until it reported one)
        "wal_used_bytes": None if b is None else b.get("wal_used_bytes"),
        "wal_capacity_bytes": None if b is None else b.get("wal_capacity_bytes"),
        "upload_lag_s": None if b is None else b.get("upload_lag_s"),
        "last_upload_error": None if b is None else b.get("last_upload_error"),
        # losses its WAL scans found (restart or failover), from its last heartbeat
        "wal_losses": [] if b is None else b.get("wal_losses") or [],
        # the zone router's byte counters from its last heartbeat (automqctl cost)
        "zone_traffic": None if b is None else b.get("zone_traffic"),
        "pid": pids.get(f"broker-{spec.node_id}"),
    }


def _problems(
    config: ClusterConfig, controllers: list[dict], brokers: list[dict], leader_view: dict | None
) -> list[str]:
    """What keeps the cluster from being healthy."""
    problems = []
    if leader_view is None:
        problems.append("no controller leader")
    problems += [
        f"controller {c['node_id']} unreachable" for c in controllers if not c["reachable"]
    ]
    problems += [f"broker {b['node_id']} not registered" for b in brokers if not b["registered"]]
    problems += [
        f"broker {b['node_id']} fenced ({b['fence_reason']})"
        for b in brokers
        if b["registered"] and b["fenced"]
    ]
    # the image alone can be stale (a broker that died without a word stays unfenced until
    # its session expires): a live broker is one whose heartbeat the leader has seen lately
    session_ms = config.settings.broker_session_timeout_ms
    problems += [
        f"broker {b['node_id']} sends no heartbeats"
        for b in brokers
        if b["registered"]
        and not b["fenced"]
        and leader_view is not None
        and (b["last_heartbeat_age_ms"] is None or b["last_heartbeat_age_ms"] > session_ms)
    ]
    problems += [
        f"broker {b['node_id']} lost WAL records: {loss}"
        for b in brokers
        for loss in b["wal_losses"]
    ]
    # the leader learns of a dead broker only when its session expires; the local process
    # table knows at once
    problems += [
        f"broker {b['node_id']} is not running (no process)"
        for b in brokers
        if b["registered"] and not b["fenced"] and b["pid"] is None
    ]
    return problems


def _leader_and_store_fields(
    cluster: LocalCluster,
    config: ClusterConfig,
    leader_view: dict | None,
    active_bucket: int | None,
    pids: dict[str, int],
) -> dict:
    """The status fields only the leader knows (route epochs, failover, counts), the object
    stores, the compaction scheduler and the WALs' disk."""
    wal_capacity = effective_wal_capacity_bytes(config)
    return {
        # the zone router's route epochs (current / fenced / committed), from the leader
        "route_epoch": (leader_view or {}).get("route_epoch"),
        "failover_mode": "unknown"
        if active_bucket is None
        else "normal"
        if active_bucket == (config.buckets[0].bucket_id if config.buckets else 0)
        else "failover",
        "object_store": {
            "embedded": bool(config.embedded_s3),
            "pid": pids.get("s3") if config.embedded_s3 else None,
        },
        # every embedded store: main (bucket 0) and failover (bucket 1), separate processes
        "object_stores": config.object_stores(pids),
        # object-storage failover as the leader sees it (None without a leader)
        "bucket_failover": (leader_view or {}).get("bucket_failover"),
        # the supervisor process (pid None: it is not running, a problem) and its restarts
        # per component (restarts, last_restart_ms, last_error, backoff_s); None: the
        # cluster is not supervised (`cluster up --no-supervise`)
        "supervisor": {"pid": pids.get(SUPERVISOR), "restarts": read_supervisor_state(cluster.dir)}
        if config.supervise
        else None,
        # `automqctl compaction schedule`: the scheduler process (None: not scheduled)
        "compaction_scheduler": {"pid": pids.get("compaction-scheduler")}
        if "compaction-scheduler" in cluster.component_names(config)
        else None,
        "topics": (leader_view or {}).get("topics"),
        "partitions": (leader_view or {}).get("partitions"),
        "metadata_offset": (leader_view or {}).get("metadata_offset"),
        # slot -> broker coordinating the groups of that slot (group -> slot:
        # abs(java hashCode(group id)) % len, as Kafka's __consumer_offsets partitions)
        "coordinator_slot_owners": (leader_view or {}).get("coordinator_slot_owners", []),
        # local disk `cluster up` gives the brokers' WALs (each file is preallocated)
        "wal_capacity_bytes_per_broker": wal_capacity,
        # an s3 WAL (`--wal s3`) takes no local disk
        "wal": config.broker_wal,
        "wal_allocated_bytes": wal_capacity * len(config.brokers)
        if config.broker_wal == "file"
        else 0,
    }


def missing_status(cluster: LocalCluster, problem: str) -> dict:
    """`cluster status --format json` of a directory that holds no cluster."""
    return {
        "cluster_dir": str(cluster.dir),
        "state": "missing",
        "healthy": False,
        "problems": [problem],
    }
