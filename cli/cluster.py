"""`automqctl cluster up|status|down|logs`: a local cluster on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import time
from collections import deque
from pathlib import Path

import typer

from cli import cluster_up
from cli.cluster_config import ClusterError
from cli.lazy_commands import LazyCommand, LazyTyperGroup
from cli.local_cluster import LocalCluster
from cli.options import DirOption, FormatOption, controller_client, open_cluster
from cli.output import OutputFormat, console, fail, print_data, print_result, waiting
from cli.status_table import print_status


class _ClusterGroup(LazyTyperGroup):
    LAZY = {
        # multi-host clusters (cli/deploy.py): one config directory per host from a topology
        "init": LazyCommand("cli.deploy", "init_command"),
        # a live view of the cluster's brokers and topics (cli/cluster_top.py)
        "top": LazyCommand("cli.cluster_top", "top_command"),
    }


app = typer.Typer(
    cls=_ClusterGroup, help="Start, inspect and stop a local cluster.", no_args_is_help=True
)


@app.command()
def up(
    ctx: typer.Context,
    dir: Path = DirOption,
    brokers: int = cluster_up.BrokersOption,
    controllers: int = cluster_up.ControllersOption,
    azs: str = cluster_up.AzsOption,
    client_az_cidrs: str | None = cluster_up.ClientAzCidrsOption,
    zone_router_channel_mode: cluster_up.ChannelMode | None = cluster_up.ChannelModeOption,
    base_port: int | None = cluster_up.BasePortOption,
    port_range: str | None = cluster_up.PortRangeOption,
    bucket_uris: str | None = cluster_up.BucketUrisOption,
    bucket_secrets_file: Path | None = cluster_up.BucketSecretsFileOption,
    bucket_prefix: str | None = cluster_up.BucketPrefixOption,
    failover_detect_s: float | None = cluster_up.FailoverDetectSOption,
    session_timeout_ms: int = cluster_up.SessionTimeoutMsOption,
    wal_capacity_mib: int | None = cluster_up.WalCapacityMibOption,
    upload_interval_s: float | None = cluster_up.UploadIntervalSOption,
    sasl: bool = cluster_up.SaslOption,
    tls: bool = cluster_up.TlsOption,
    retention_check_interval_s: float | None = cluster_up.RetentionCheckIntervalSOption,
    object_delete_delay_s: float | None = cluster_up.ObjectDeleteDelaySOption,
    wal: cluster_up.WALKind = cluster_up.WalOption,
    listeners: str | None = cluster_up.ListenersOption,
    mtls: bool = cluster_up.MtlsOption,
    store_dir: Path | None = cluster_up.StoreDirOption,
    supervise: bool | None = cluster_up.SuperviseOption,
    config_file: Path | None = cluster_up.ConfigFileOption,
    override: list[str] | None = cluster_up.OverrideOption,
    broker_config: list[str] = cluster_up.BrokerConfigOption,
    timeout_s: float = cluster_up.TimeoutSOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Start the object store, the controller quorum and the brokers; wait until ready.

    On an existing directory it restarts from the persisted state (flags that differ from
    it are refused); when some of its processes still run, it starts only the missing ones;
    when all run, it waits until the cluster is healthy and prints its status (exit 0).
    A first `up` that fails leaves nothing behind, or, when processes had started, their
    logs; the next `up` then starts over with its own flags."""
    cluster_up.run_up(ctx, locals())


@app.command()
def status(
    dir: Path = DirOption,
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
    watch: bool = typer.Option(
        False, "--watch", "-w", help="refresh every --interval seconds until Ctrl-C"
    ),
    exit_when_healthy: bool = typer.Option(
        False,
        "--exit-when-healthy",
        help="wait until the cluster is healthy (exit 0), at most --timeout-s (then exit 1)",
    ),
    interval_s: float = typer.Option(2.0, "--interval", min=0.2, max=3600),
    timeout_s: float | None = typer.Option(
        None,
        "--timeout-s",
        min=0.0,
        help="stop waiting/watching after this long (default with --exit-when-healthy: 120)",
    ),
    controllers: str | None = typer.Option(
        None,
        "--controllers",
        help="controller API addresses host:port,... of a cluster on other hosts (cluster "
        "init + node run): its quorum (leader, members, terms) and brokers; the secret from "
        "AUTOMQ_CONTROLLER_SECRET(_FILE)",
    ),
) -> None:
    """State (healthy / degraded / stopped), Raft leader, controllers, brokers, buckets;
    exit code 1 when not healthy. JSON/YAML on stdout in every case, also for a missing
    directory (state `missing`). With --controllers: a cluster on other hosts, from its
    controllers alone."""
    # imported here, not at the top: the controller client and its request models cost
    # `cluster up` and `down` ~0.2 s of start-up they do not need
    from cli import table_jobs
    from cli.remote_status import (
        REMOTE_STATUS_TIMEOUT_S,
        collect_remote_status,
        print_remote_status,
    )
    from cli.status import collect_status, missing_status

    if controllers:
        client = controller_client(dir, controllers).with_timeouts(
            REMOTE_STATUS_TIMEOUT_S, REMOTE_STATUS_TIMEOUT_S
        )
        collect = lambda: collect_remote_status(client)  # noqa: E731
        print_table = print_remote_status
        tables_of = None  # table topics' lag needs the cluster directory's catalog
    else:
        cluster = LocalCluster(dir)
        try:
            config = cluster.load()
        except ClusterError as exc:
            if format != OutputFormat.table:
                print_data(missing_status(cluster, str(exc)), format)
            fail(str(exc))
        collect = lambda: collect_status(cluster, config)  # noqa: E731
        print_table = print_status
        tables_of = lambda: table_jobs.status_tables(cluster.dir, config)  # noqa: E731
    if exit_when_healthy and timeout_s is None:
        timeout_s = 120.0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    first = True
    try:
        while True:
            if not watch and exit_when_healthy:
                with waiting("waiting for the cluster to be healthy", format):
                    status = collect()
            else:
                status = collect()
            done = (
                (exit_when_healthy and status["healthy"])
                or (not watch and not exit_when_healthy)
                or (deadline is not None and time.monotonic() >= deadline)
            )
            if watch or done:
                if tables_of is not None and status.get("leader") is not None:
                    status["tables"] = tables_of()  # each table topic's lag
                _emit_status(status, format, watch=watch, first=first, print_table=print_table)
                first = False
            if done:
                break
            time.sleep(interval_s if watch else min(interval_s, 0.5))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if not status["healthy"]:
        if exit_when_healthy:
            fail(
                f"not healthy after {timeout_s:g}s ({status['state']}): "
                + "; ".join(status["problems"])
            )
        raise typer.Exit(1)


def _emit_status(
    status: dict, format: OutputFormat, watch: bool, first: bool, print_table=print_status
) -> None:
    if format == OutputFormat.json and watch:
        # one document per line (JSON lines), so a script can read them as they come
        sys.stdout.write(json.dumps(status) + "\n")
        sys.stdout.flush()
    elif format == OutputFormat.yaml and watch:
        if not first:
            sys.stdout.write("---\n")
        print_data(status, format)
        sys.stdout.flush()
    elif not print_data(status, format):
        if watch:
            console.clear()
            console.print(time.strftime("%H:%M:%S"), "(Ctrl-C to stop)", style="dim")
        print_table(status)


@app.command()
def down(
    dir: Path = DirOption,
    purge: bool = typer.Option(
        False,
        "--purge",
        help="also delete the cluster directory (and the object stores' data under "
        "its --store-dir)",
    ),
    format: OutputFormat = FormatOption,
) -> None:
    """Stop every process of the cluster (SIGTERM, then SIGKILL after a timeout)."""
    cluster, config = open_cluster(dir)
    stopped = cluster.stop_all(config)
    left = cluster.running_pids(config)
    if left:
        fail(f"processes still running: {left}")
    text = f"stopped {len(stopped)} processes" + (f": {', '.join(stopped)}" if stopped else "")
    if purge:
        cluster.purge()
        text += f"\ndeleted {cluster.dir}"
    print_result({"stopped": stopped, "purged": purge, "dir": str(cluster.dir)}, format, text)


@app.command()
def logs(
    node: str = typer.Argument(..., help="controller-N, broker-N or s3"),
    dir: Path = DirOption,
    lines: int = typer.Option(100, "--lines", "-n", min=1, max=1_000_000),
    follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines"),
) -> None:
    """Show the last lines of one process's log (-f: and then new lines, until Ctrl-C)."""
    cluster, config = open_cluster(dir)
    names = cluster.component_names(config)
    if node.isdigit():
        node = f"broker-{node}"
    if node not in names:
        fail(f"unknown node {node!r}; one of: {', '.join(names)}")
    path = cluster.log_path(node)
    if not path.exists() and not follow:
        fail(f"{node} has no log yet ({path})")
    position = 0
    if path.exists():
        with open(path, "rb") as f:
            for line in deque(f, maxlen=lines):
                typer.echo(line.decode(errors="replace").rstrip("\n"))
            position = f.tell()
    if follow:
        try:
            _follow(path, position)
        except KeyboardInterrupt:
            raise typer.Exit(0) from None


def _follow(path: Path, position: int, poll_s: float = 0.2) -> None:
    """Print what is appended to `path` from `position` on, forever; a file that was
    truncated or replaced (a restart with a new log) is read from its start."""
    partial = b""
    while True:
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            time.sleep(poll_s)
            continue
        if size < position:
            position, partial = 0, b""
        if size > position:
            with open(path, "rb") as f:
                f.seek(position)
                data = f.read(size - position)
            position += len(data)
            *complete, partial = (partial + data).split(b"\n")
            for line in complete:
                sys.stdout.write(line.decode(errors="replace") + "\n")
            sys.stdout.flush()
        else:
            time.sleep(poll_s)
