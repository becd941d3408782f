"""`automqctl cluster up|status|down|logs`: a local cluster on 127.0.0.1."""

from __future__ import annotations

import time
from collections import deque
from pathlib import Path

import typer
from rich.table import Table

from cli.options import DirOption
from cli.output import OutputFormat, console, fail, print_json
from cli.processes import (
    ClusterConfig,
    ClusterError,
    LocalCluster,
    check_bucket_reachable,
)
from cli.status import collect_status
from dataplane.objectstore.seaweed import EmbeddedS3Error

app = typer.Typer(help="Start, inspect and stop a local cluster.", no_args_is_help=True)


def _open(directory: Path) -> tuple[LocalCluster, ClusterConfig]:
    """The cluster in `directory` and its config, or a clear error."""
    cluster = LocalCluster(directory)
    try:
        return cluster, cluster.load()
    except ClusterError as exc:
        fail(str(exc))


def _wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.3):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}")


@app.command()
def up(
    dir: Path = DirOption,
    brokers: int = typer.Option(3, min=1, max=64, help="number of brokers"),
    controllers: int = typer.Option(3, min=1, max=7, help="number of controllers (odd)"),
    azs: str = typer.Option("az1,az2,az3", help="comma-separated AZ names, brokers round-robin"),
    base_port: int | None = typer.Option(
        None, help="first of consecutive ports (default: free ports)"
    ),
    bucket_uris: str | None = typer.Option(
        None,
        help="external S3 buckets instead of the embedded store: "
        "0@s3://main?region=..&endpoint=..,1@s3://failover?...",
    ),
    session_timeout_ms: int = typer.Option(6000, min=500, help="broker session timeout"),
    wal_capacity_mib: int | None = typer.Option(
        None,
        min=16,
        max=64 * 1024,
        help="each broker's WAL size in MiB (default 512); fixed once a WAL file exists",
    ),
    upload_interval_s: float | None = typer.Option(
        None, min=0.1, max=3600, help="how often brokers upload their WAL (default 5 s)"
    ),
    timeout_s: float = typer.Option(90.0, help="how long to wait for the cluster to be ready"),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Start the object store, the controller quorum and the brokers; wait until ready.

    On an existing directory it restarts from the persisted state; when some of its
    processes still run, it starts only the missing ones."""
    cluster = LocalCluster(dir)
    started: list[str] = []  # what this call started: stopped again if start-up fails
    was_running: dict[str, int] = {}
    config: ClusterConfig | None = None
    try:
        if cluster.exists():
            config = cluster.load()
            was_running = cluster.running_pids(config)
            missing = [n for n in cluster.component_names(config) if n not in was_running]
            if not missing:
                fail(
                    f"the cluster in {cluster.dir} is already running "
                    f"({', '.join(f'{n}={p}' for n, p in was_running.items())}); "
                    "use `automqctl cluster status` or `automqctl cluster down`"
                )
            restarting = True
        else:
            config = cluster.create(
                brokers,
                controllers,
                [a.strip() for a in azs.split(",") if a.strip()],
                base_port,
                bucket_uris,
                session_timeout_ms,
                wal_capacity_bytes=None
                if wal_capacity_mib is None
                else wal_capacity_mib * 1024 * 1024,
                upload_interval_s=upload_interval_s,
            )
            missing = cluster.component_names(config)
            restarting = False
        cluster.check_ports(config, missing)
        if not config.embedded_s3 and "s3" not in was_running:
            for bucket in config.buckets:
                check_bucket_reachable(bucket)
        if "s3" in missing:
            with (
                console.status("starting the object store")
                if format == OutputFormat.table
                else _nullcontext()
            ):
                started.append("s3")
                cluster.start_object_store(config)
        for c in config.controllers:
            if f"controller-{c.node_id}" in missing:
                started.append(f"controller-{c.node_id}")
                cluster.start_controller(config, c.node_id)
        _wait_until(
            lambda: collect_status(cluster, config)["leader"] is not None,
            timeout_s,
            "a controller leader",
        )
        for b in config.brokers:
            if f"broker-{b.node_id}" in missing:
                started.append(f"broker-{b.node_id}")
                cluster.start_broker(config, b.node_id)

        def ready():
            dead = [n for n in cluster.component_names(config) if cluster.running(n) is None]
            if dead:
                raise ClusterError(
                    f"{', '.join(dead)} exited during start-up; see "
                    f"`automqctl cluster logs {dead[0]}`"
                )
            status = collect_status(cluster, config)
            return status if status["healthy"] else None

        status = _wait_until(ready, timeout_s, "every broker to register and be unfenced")
    except ClusterError as exc:
        _stop_started(cluster, config, started, was_running)
        fail(str(exc))
    except EmbeddedS3Error as exc:
        _stop_started(cluster, config, started, was_running)
        fail(f"object store: {exc}")
    except BaseException:
        _stop_started(cluster, config, started, was_running)
        raise
    if format == OutputFormat.json:
        print_json(status)
        return
    _print_status(status)
    if was_running:
        console.print(
            f"\nrestarted {', '.join(started)} in [bold]{cluster.dir}[/] (the others were running)"
        )
    else:
        verb = "restarted from" if restarting else "created in"
        console.print(f"\ncluster {verb} [bold]{cluster.dir}[/]")
    console.print(f"bootstrap servers: [bold green]{status['bootstrap_servers']}[/]")


def _stop_started(
    cluster: LocalCluster,
    config: ClusterConfig | None,
    started: list[str],
    was_running: dict[str, int],
) -> None:
    """After a failed `up`: stop what it started, leave what was running before alone."""
    if config is None or not started:
        return
    if not was_running:
        cluster.stop_all(config)
        return
    for name in reversed(started):  # brokers first, the object store last
        try:
            cluster.stop(name)
        except ClusterError:
            pass


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


@app.command()
def status(
    dir: Path = DirOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Raft leader, controllers, brokers, buckets; exit code 1 when unhealthy."""
    cluster, config = _open(dir)
    status = collect_status(cluster, config)
    if format == OutputFormat.json:
        print_json(status)
    else:
        _print_status(status)
    if not status["healthy"]:
        raise typer.Exit(1)


@app.command()
def down(
    dir: Path = DirOption,
    purge: bool = typer.Option(False, "--purge", help="also delete the cluster directory"),
) -> None:
    """Stop every process of the cluster (SIGTERM, then SIGKILL after a timeout)."""
    cluster, config = _open(dir)
    stopped = cluster.stop_all(config)
    left = cluster.running_pids(config)
    if left:
        fail(f"processes still running: {left}")
    console.print(
        f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else "")
    )
    if purge:
        cluster.purge()
        console.print(f"deleted {cluster.dir}")


@app.command()
def logs(
    node: str = typer.Argument(..., help="controller-N, broker-N or s3"),
    dir: Path = DirOption,
    lines: int = typer.Option(100, "--lines", "-n", min=1, max=1_000_000),
) -> None:
    """Show the last lines of one process's log."""
    cluster, config = _open(dir)
    names = cluster.component_names(config)
    if node.isdigit():
        node = f"broker-{node}"
    if node not in names:
        fail(f"unknown node {node!r}; one of: {', '.join(names)}")
    path = cluster.log_path(node)
    if not path.exists():
        fail(f"{node} has no log yet ({path})")
    with open(path, errors="replace") as f:
        for line in deque(f, maxlen=lines):
            typer.echo(line.rstrip("\n"))


def _print_status(status: dict) -> None:
    ctrl = Table(title="controllers")
    for col in ("node", "address", "state", "leader", "term", "commit index", "pid"):
        ctrl.add_column(col)
    for c in status["controllers"]:
        ctrl.add_row(
            str(c["node_id"]),
            c["address"],
            c["state"],
            "[bold green]yes[/]" if c["is_leader"] else "",
            str(c["term"] or ""),
            str(c["commit_index"] if c["commit_index"] is not None else ""),
            str(c["pid"] or ""),
        )
    console.print(ctrl)
    brk = Table(title="brokers")
    for col in (
        "node",
        "az",
        "address",
        "epoch",
        "state",
        "heartbeat age",
        "WAL used",
        "upload lag",
        "pid",
    ):
        brk.add_column(col)
    for b in status["brokers"]:
        state = (
            "[red]unregistered[/]"
            if not b["registered"]
            else f"[red]fenced ({b['fence_reason']})[/]"
            if b["fenced"]
            else "[green]active[/]"
        )
        age = b["last_heartbeat_age_ms"]
        wal = (
            f"{b['wal_used_bytes'] / 2**20:.0f}/{b['wal_capacity_bytes'] / 2**20:.0f} MiB"
            if b.get("wal_used_bytes") is not None and b.get("wal_capacity_bytes")
            else ""
        )
        lag = "" if b.get("upload_lag_s") is None else f"{b['upload_lag_s']:.1f} s"
        if b.get("last_upload_error"):
            lag += f" [red]({b['last_upload_error'][:60]})[/]"
        brk.add_row(
            str(b["node_id"]),
            b["az"],
            b["address"],
            str(b["node_epoch"] or 0) if b["registered"] else "",
            state,
            f"{age} ms" if age is not None else "",
            wal,
            lag,
            str(b["pid"] or ""),
        )
    console.print(brk)
    bkt = Table(title=f"buckets (mode: {status['failover_mode']})")
    for col in ("id", "uri", "active"):
        bkt.add_column(col)
    for b in status["buckets"]:
        bkt.add_row(str(b["bucket_id"]), b["uri"], "[bold green]yes[/]" if b["active"] else "")
    console.print(bkt)
    console.print(
        f"topics: {status['topics']}  partitions: {status['partitions']}  "
        f"metadata offset: {status['metadata_offset']}"
    )
    if status["problems"]:
        console.print("[bold red]unhealthy:[/] " + "; ".join(status["problems"]))
