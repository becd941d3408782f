"""`automqctl controller list|stop|kill|start NODE`: operate single controllers (Raft voters)
of a local cluster."""

from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.table import Table

from cli.cluster_config import ClusterConfig, ClusterError
from cli.component_commands import kill_component, stop_component
from cli.local_cluster import STOP_TIMEOUT_S, LocalCluster
from cli.options import DirOption, FormatOption, load_component, open_cluster
from cli.output import OutputFormat, console, err_console, fail, print_data, print_result, waiting
from cli.status import collect_status

app = typer.Typer(
    help="Operate single controllers (Raft voters) of a local cluster.", no_args_is_help=True
)

_POLL_S = 0.3


def _controller(directory: Path, node: int) -> tuple[LocalCluster, ClusterConfig, str]:
    return load_component(directory, "controller", node)


def controllers(cluster: LocalCluster, config: ClusterConfig) -> list[dict]:
    """Each controller's entry of `cluster status` plus `running` (its process is alive)."""
    return [
        {**c, "running": c["pid"] is not None}
        for c in collect_status(cluster, config)["controllers"]
    ]


def _quorum_note(cluster: LocalCluster, config: ClusterConfig) -> None:
    """Warn when fewer than a majority of the voters run: metadata writes stop."""
    running = sum(
        1 for c in config.controllers if cluster.running(f"controller-{c.node_id}") is not None
    )
    if running <= len(config.controllers) // 2:
        err_console.print(  # stderr: stdout may be JSON
            f"[yellow]warning:[/] {running} of {len(config.controllers)} "
            "controllers running: no majority, the metadata quorum is unavailable"
        )


@app.command("list")
def list_(
    dir: Path = DirOption, format: OutputFormat = typer.Option(OutputFormat.table, "--format")
) -> None:
    """Controllers: PID, running, Raft state, term, commit index, API and Raft address."""
    cluster, config = open_cluster(dir)
    rows = controllers(cluster, config)
    if format != OutputFormat.table:
        print_data(rows, format)
        return
    table = Table(title="controllers", pad_edge=False)  # fits 80 columns
    table.add_column("node")
    table.add_column("pid")
    table.add_column("state", no_wrap=True, min_width=len("unreachable"))
    table.add_column("term")
    table.add_column("commit")
    for col in ("api address", "raft address"):  # never cut: people copy them
        table.add_column(col, no_wrap=True, min_width=len(rows[0]["address"]) if rows else 0)
    for c in rows:
        state = (
            "[red]stopped[/]"
            if not c["running"]
            else f"[bold green]{c['state']}[/]"
            if c["is_leader"]
            else c["state"]
        )
        table.add_row(
            str(c["node_id"]),
            str(c["pid"] or ""),
            state,
            "" if c["term"] is None else str(c["term"]),
            "" if c["commit_index"] is None else str(c["commit_index"]),
            c["address"],
            c["raft_address"],
        )
    console.print(table)


@app.command()
def stop(
    node: int,
    dir: Path = DirOption,
    timeout_s: float = typer.Option(
        STOP_TIMEOUT_S, min=0.0, help="SIGKILL after this many seconds"
    ),
    format: OutputFormat = FormatOption,
) -> None:
    """Graceful stop: SIGTERM, then SIGKILL after --timeout-s."""
    cluster, config, name = _controller(dir, node)
    stop_component(cluster, name, format, timeout_s)
    _quorum_note(cluster, config)


@app.command()
def kill(node: int, dir: Path = DirOption, format: OutputFormat = FormatOption) -> None:
    """A real kill -9 of the controller's process (a crash); waits until it is gone."""
    cluster, config, name = _controller(dir, node)
    kill_component(cluster, name, format)
    _quorum_note(cluster, config)


@app.command()
def start(
    node: int,
    dir: Path = DirOption,
    timeout_s: float = typer.Option(60.0, min=1.0, help="how long to wait until it has rejoined"),
    format: OutputFormat = FormatOption,
) -> None:
    """Start a stopped controller and wait until it has rejoined the quorum.

    Rejoined: a follower (or the leader) that holds every entry the leader had committed
    when it was started. On a supervised cluster a controller the supervisor already
    restarted is not an error: the command waits until it has rejoined."""
    cluster, config, name = _controller(dir, node)
    pid = cluster.running(name)
    if pid is not None and not config.supervise:
        fail(f"{name} is already running (pid {pid})")
    leader = next((c for c in controllers(cluster, config) if c["is_leader"]), None)
    target_commit = leader["commit_index"] if leader else 0
    if pid is None:
        try:
            cluster.check_ports(config, [name])
        except ClusterError as exc:  # its own ports: the supervisor restarted it meanwhile
            if not (config.supervise and cluster.running(name) is not None):
                fail(str(exc))
        cluster.start_controller(config, node)  # nothing if it runs by now
    # else a supervised cluster's supervisor restarted it (after `controller kill`): wait
    # until it has rejoined, as `kill 1; start 1` does on an unsupervised cluster
    deadline = time.monotonic() + timeout_s
    joined = None
    with waiting(f"waiting up to {timeout_s:g}s for {name} to rejoin the quorum"):
        while joined is None and time.monotonic() < deadline:
            if cluster.running(name) is None:
                fail(f"{name} exited during start-up; see `automqctl cluster logs {name}`")
            rows = controllers(cluster, config)
            me = next(c for c in rows if c["node_id"] == node)
            has_leader = any(c["is_leader"] for c in rows)
            if (
                has_leader
                and me["state"] in ("leader", "follower")
                and (me["commit_index"] or 0) >= (target_commit or 0)
            ):
                joined = me
            else:
                time.sleep(_POLL_S)
    if joined is not None:
        print_result(
            {"started": name, **{k: joined[k] for k in ("pid", "state", "term", "commit_index")}},
            format,
            f"started {name} (pid {joined['pid']}, {joined['state']}, term {joined['term']}, "
            f"commit index {joined['commit_index']})",
        )
        return
    fail(
        f"{name} is running but did not rejoin the quorum within {timeout_s:.0f}s; "
        f"see `automqctl cluster logs {name}`"
    )
