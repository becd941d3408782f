"""The status document of a local cluster (cli/status.py) as tables on the terminal:
`cluster status` and the end of `cluster up`."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from cli.cluster_config import MIB
from cli.output import console

_STATE_STYLE = {"healthy": "bold green", "degraded": "bold yellow", "stopped": "bold red"}


def print_status(status: dict) -> None:
    """The cluster's state, its controllers, brokers, buckets and object stores, counts, the
    disk its WALs take, and what is wrong."""
    state = status.get("state", "healthy" if status["healthy"] else "degraded")
    console.print(
        f"cluster [bold]{escape(status['cluster_dir'])}[/]: "
        f"[{_STATE_STYLE.get(state, 'bold')}]{state}[/]"
    )
    console.print(_controllers_table(status["controllers"]))
    console.print(_brokers_table(status["brokers"]))
    _print_storage(status)
    if status.get("tables"):
        console.print(_tables_table(status["tables"]))
    if status["problems"]:
        label = "stopped:" if state == "stopped" else "unhealthy:"
        console.print(
            f"[bold red]{label}[/] " + escape("; ".join(status["problems"])), soft_wrap=True
        )


def _controllers_table(controllers: list[dict]) -> Table:
    ctrl = Table(
        "node", "address", "state", "leader", "term", "commit index", "pid", title="controllers"
    )
    for c in controllers:
        ctrl.add_row(
            str(c["node_id"]),
            c["address"],
            "[red]stopped[/]" if c["pid"] is None and not c["reachable"] else c["state"],
            "[bold green]yes[/]" if c["is_leader"] else "",
            str(c["term"] or ""),
            str(c["commit_index"] if c["commit_index"] is not None else ""),
            str(c["pid"] or ""),
        )
    return ctrl


def _broker_state(b: dict) -> str:
    if not b["registered"] and b["pid"] is None:
        return "[red]stopped[/]"
    if not b["registered"]:
        return "[red]unregistered[/]"
    if b["fenced"]:
        return f"[red]fenced ({escape(str(b['fence_reason']))})[/]"
    return "[green]active[/]"


def _broker_address(b: dict) -> str:
    """Its one address, or each listener's on its own line."""
    endpoints = b.get("endpoints") or []
    if len(endpoints) <= 1:
        return b["address"]
    return "\n".join(
        f"{escape(e['listener'])} {e['security_protocol']} {e['address']}"
        if e["listener"] != e["security_protocol"]
        else f"{e['security_protocol']} {e['address']}"
        for e in endpoints
    )


def _brokers_table(brokers: list[dict]) -> Table:
    brk = Table(
        "node",
        "az",
        "address",
        "epoch",
        "state",
        "heartbeat age",
        "WAL used",
        "upload lag",
        "pid",
        title="brokers",
    )
    for b in brokers:
        age = b["last_heartbeat_age_ms"]
        wal = (
            f"{b['wal_used_bytes'] / 2**20:.0f}/{b['wal_capacity_bytes'] / 2**20:.0f} MiB"
            if b.get("wal_used_bytes") is not None and b.get("wal_capacity_bytes")
            else ""
        )
        lag = "" if b.get("upload_lag_s") is None else f"{b['upload_lag_s']:.1f} s"
        if b.get("last_upload_error"):
            lag += f" [red]({escape(b['last_upload_error'][:60])})[/]"
        brk.add_row(
            str(b["node_id"]),
            b["az"],
            _broker_address(b),
            str(b["node_epoch"] or 0) if b["registered"] else "",
            _broker_state(b),
            f"{age} ms" if age is not None else "",
            wal,
            lag,
            str(b["pid"] or ""),
        )
    return brk


def _print_storage(status: dict) -> None:
    """The buckets (and which is active), the embedded object stores, the metadata counts
    and the WALs' disk."""
    known = status["failover_mode"] != "unknown"
    bkt = Table("id", "uri", "active", title=f"buckets (mode: {status['failover_mode']})")
    for b in status["buckets"]:
        bkt.add_row(
            str(b["bucket_id"]),
            escape(b["uri"]),
            "[bold green]yes[/]" if b["active"] else "" if known else "unknown (no leader)",
        )
    console.print(bkt)
    for store in status.get("object_stores", []):
        console.print(
            f"object store {store['name']} (buckets {store['bucket_ids']}): "
            f"{store['endpoint']} pid {store['pid'] or '[bold red]not running[/]'}"
            + (f" data {escape(store['data_dir'])}" if store.get("data_dir") else ""),
            soft_wrap=True,
        )

    def known_or_dash(key: str) -> str:
        return "-" if status.get(key) is None else str(status[key])

    console.print(
        f"topics: {known_or_dash('topics')}  partitions: {known_or_dash('partitions')}  "
        f"metadata offset: {known_or_dash('metadata_offset')}"
        + ("" if known else "  (unknown without a controller leader)")
    )
    if status.get("wal") == "s3":
        console.print("WAL: objects under wal/node-N of the main bucket (--wal s3), no disk")
    elif status.get("wal_allocated_bytes") is not None:
        per = status["wal_capacity_bytes_per_broker"]
        console.print(
            f"disk: {len(status['brokers'])} brokers x {per / MIB:g} MiB WAL = "
            f"{status['wal_allocated_bytes'] / 2**30:.2g} GiB preallocated (--wal-capacity-mib)"
        )


def _tables_table(tables: list[dict]) -> Table:
    """Table topics: each one's Iceberg table and lag (offsets behind the committed end)."""
    out = Table("topic", "table", "lag", "state", title="table topics")
    for t in tables:
        state = t.get("error") or ("synced" if t.get("exists") else "not synced yet")
        out.add_row(
            escape(t.get("topic", "?")),
            escape(t.get("table", "")),
            str(t.get("lag", "")),
            escape(state),
        )
    return out
