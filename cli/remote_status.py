"""`automqctl cluster status --controllers host:port,...`: the status of a cluster that is
not local (`cluster init` + `node run` on several hosts), from its controllers' APIs alone.

Every controller is asked at once for its view (`/v1/status`): its Raft state, term, commit
index and which leader it follows. The quorum's leader is the one claiming it with the
highest term; the brokers (registration, epoch, fenced or not, heartbeat age, WAL and upload
health) come from the leader's view, as only the leader times their sessions. The document
is the local `cluster status` one without what only a local cluster knows (pids, the cluster
directory, the embedded object stores).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from rich.markup import escape
from rich.table import Table

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError

REMOTE_STATUS_TIMEOUT_S = 3.0
_STATE_STYLE = {"healthy": "bold green", "degraded": "bold yellow", "unreachable": "bold red"}


def controller_views(client: ControllerClient) -> list[dict | None]:
    """Each controller's status answer (`client`'s addresses, in order), asked at once
    (None: unreachable)."""

    def ask(address: str) -> dict | None:
        try:
            return client.status(address)
        except (ControllerError, OSError):
            return None

    with ThreadPoolExecutor(max_workers=len(client.addresses)) as pool:
        return list(pool.map(ask, client.addresses))


def _broker(b: dict) -> dict:
    endpoints = [
        {
            "listener": e.get("name"),
            "security_protocol": e.get("security_protocol"),
            "address": f"{e.get('host')}:{e.get('port')}",
        }
        for e in b.get("endpoints") or []
    ]
    return {
        "node_id": b["node_id"],
        "az": b.get("az"),
        "address": endpoints[0]["address"] if endpoints else f"{b['host']}:{b['kafka_port']}",
        "endpoints": endpoints,
        "registered": True,
        "node_epoch": b.get("node_epoch"),
        "fenced": b.get("fenced"),
        "fence_reason": b.get("fence_reason"),
        "shutting_down": b.get("shutting_down"),
        "partitions_led": b.get("partitions_led"),
        "wal_failover_target": b.get("wal_failover_target"),
        "last_heartbeat_age_ms": b.get("last_heartbeat_age_ms"),
        "wal_used_bytes": b.get("wal_used_bytes"),
        "wal_capacity_bytes": b.get("wal_capacity_bytes"),
        "upload_lag_s": b.get("upload_lag_s"),
        "last_upload_error": b.get("last_upload_error"),
    }


def collect_remote_status(client: ControllerClient) -> dict:
    """The quorum (leader, members, terms) and the brokers, as the controllers see them."""
    views = controller_views(client)
    leader_view: dict | None = None
    for view in views:
        raft = (view or {}).get("raft", {})
        if raft.get("state") == "leader" and (
            leader_view is None or raft.get("term", -1) > leader_view["raft"].get("term", -1)
        ):
            leader_view = view
    controllers = []
    for address, view in zip(client.addresses, views):
        raft = (view or {}).get("raft", {})
        controllers.append(
            {
                "node_id": (view or {}).get("node_id"),
                "address": address,
                "reachable": view is not None,
                "is_leader": view is not None and view is leader_view,
                "state": raft.get("state", "unreachable"),
                "term": raft.get("term"),
                "leader_raft_address": raft.get("leader"),
                "has_quorum": raft.get("has_quorum"),
                "commit_index": raft.get("commit_index"),
                "last_applied": raft.get("last_applied"),
            }
        )
    brokers = [_broker(b) for b in (leader_view or {}).get("brokers", [])]
    problems = [f"controller {c['address']} unreachable" for c in controllers if not c["reachable"]]
    if leader_view is None:
        problems.append(
            "no controller leader (a majority of the controllers must reach each other)"
        )
    problems += [
        f"broker {b['node_id']} fenced ({b['fence_reason']})" for b in brokers if b["fenced"]
    ]
    if leader_view is not None and not brokers:
        problems.append("no broker registered")
    reachable = any(c["reachable"] for c in controllers)
    state = "unreachable" if not reachable else "degraded" if problems else "healthy"
    return {
        "controllers_asked": list(client.addresses),
        "state": state,
        "healthy": not problems,
        "problems": problems,
        "leader": leader_view["node_id"] if leader_view else None,
        "term": leader_view["raft"]["term"] if leader_view else None,
        "metadata_offset": leader_view.get("metadata_offset") if leader_view else None,
        "bootstrap_servers": ",".join(b["address"] for b in brokers if not b["fenced"]),
        "controllers": controllers,
        "brokers": brokers,
    }


def print_remote_status(status: dict) -> None:
    """The remote status as tables: the quorum, then the brokers, then what is wrong."""
    from cli.output import console

    state = status["state"]
    console.print(
        f"cluster of controllers {escape(','.join(status['controllers_asked']))}: "
        f"[{_STATE_STYLE.get(state, 'bold')}]{state}[/]"
        + (f", leader {status['leader']} in term {status['term']}" if status["leader"] else "")
    )
    quorum = Table("node", "address", "state", "leader", "term", "commit index", title="quorum")
    for c in status["controllers"]:
        quorum.add_row(
            str(c["node_id"] if c["node_id"] is not None else "?"),
            c["address"],
            c["state"] if c["reachable"] else "[red]unreachable[/]",
            "[bold green]yes[/]" if c["is_leader"] else "",
            str(c["term"] if c["term"] is not None else ""),
            str(c["commit_index"] if c["commit_index"] is not None else ""),
        )
    console.print(quorum)
    brokers = Table(
        "node", "az", "address", "epoch", "state", "partitions", "heartbeat age", title="brokers"
    )
    for b in status["brokers"]:
        age = b["last_heartbeat_age_ms"]
        brokers.add_row(
            str(b["node_id"]),
            escape(str(b["az"])),
            b["address"],
            str(b["node_epoch"]),
            f"[red]fenced ({escape(str(b['fence_reason']))})[/]"
            if b["fenced"]
            else "[green]active[/]",
            str(b["partitions_led"] if b["partitions_led"] is not None else ""),
            f"{age} ms" if age is not None else "",
        )
    console.print(brokers)
    if status["problems"]:
        console.print("[bold red]unhealthy:[/] " + escape("; ".join(status["problems"])))
