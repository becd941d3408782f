"""`automqctl broker list|stop|kill|start NODE`: operate single brokers of a local cluster."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from cli.cluster_config import ClusterConfig
from cli.component_commands import kill_component, stop_component
from cli.local_cluster import LocalCluster
from cli.options import DirOption, FormatOption, load_component, open_cluster
from cli.output import OutputFormat, console, fail, print_data, print_result, waiting
from cli.status import collect_status

app = typer.Typer(help="Operate single brokers of a local cluster.", no_args_is_help=True)


def _broker(directory: Path, node: int) -> tuple[LocalCluster, ClusterConfig, str]:
    return load_component(directory, "broker", node)


@app.command("list")
def list_(
    dir: Path = DirOption, format: OutputFormat = typer.Option(OutputFormat.table, "--format")
) -> None:
    """Brokers with AZ, address, node epoch, state and PID."""
    cluster, config = open_cluster(dir)
    brokers = collect_status(cluster, config)["brokers"]
    if format != OutputFormat.table:
        print_data(brokers, format)
        return
    table = Table(title="brokers")
    for col in ("node", "az", "address", "epoch", "state", "pid"):
        table.add_column(col)
    for b in brokers:
        state = (
            "stopped"
            if not b["registered"] and b["pid"] is None
            else "unregistered"
            if not b["registered"]
            else f"fenced ({b['fence_reason']})"
            if b["fenced"]
            else "active"
        )
        table.add_row(
            str(b["node_id"]),
            b["az"],
            b["address"],
            "" if b["node_epoch"] is None else str(b["node_epoch"]),
            state,
            str(b["pid"] or "stopped"),
        )
    console.print(table)


@app.command()
def stop(node: int, dir: Path = DirOption, format: OutputFormat = FormatOption) -> None:
    """Graceful stop (SIGTERM): the broker uploads its WAL and fences its own epoch."""
    cluster, _, name = _broker(dir, node)
    stop_component(cluster, name, format)


@app.command()
def kill(node: int, dir: Path = DirOption, format: OutputFormat = FormatOption) -> None:
    """A real kill -9 of the broker's process (a crash, for demonstrations and drills)."""
    cluster, _, name = _broker(dir, node)
    kill_component(cluster, name, format)


@app.command()
def start(
    node: int,
    dir: Path = DirOption,
    timeout_s: float = typer.Option(60.0, help="how long to wait until it is active"),
    format: OutputFormat = FormatOption,
) -> None:
    """Start a stopped broker and wait until it is registered and unfenced (on a supervised
    cluster, one the supervisor already restarted is waited for, not an error)."""
    cluster, config, name = _broker(dir, node)
    running = cluster.running(name) is not None
    if running and not config.supervise:
        fail(f"{name} is already running")
    before = next(b for b in collect_status(cluster, config)["brokers"] if b["node_id"] == node)
    old_epoch = before["node_epoch"] if before["registered"] else -1
    if running:  # the supervisor restarted it (after `broker kill`): wait until it is active
        old_epoch = -1
    else:
        cluster.start_broker(config, node)
    deadline = time.monotonic() + timeout_s
    with waiting(f"waiting up to {timeout_s:g}s for {name} to register"):
        epoch = _wait_active(cluster, config, name, node, old_epoch, deadline)
    if epoch is None:
        fail(f"{name} did not become active within {timeout_s:.0f}s")
    print_result(
        {"started": name, "node_epoch": epoch}, format, f"started {name} (node epoch {epoch})"
    )


def _wait_active(
    cluster: LocalCluster, config: ClusterConfig, name: str, node: int, old_epoch: int, deadline
) -> int | None:
    """The new node epoch once `name` is active with it; None at the deadline."""
    while time.monotonic() < deadline:
        if cluster.running(name) is None:
            fail(f"{name} exited during start-up; see `automqctl cluster logs {name}`")
        b = next(b for b in collect_status(cluster, config)["brokers"] if b["node_id"] == node)
        age = b["last_heartbeat_age_ms"]
        # a new registration (the old epoch may still look active until its session ends)
        if (
            b["registered"]
            and b["node_epoch"] > old_epoch
            and not b["fenced"]
            and age is not None
            and age < 5000
        ):
            return b["node_epoch"]
        time.sleep(0.3)
    return None
