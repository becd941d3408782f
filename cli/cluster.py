"""`automqctl cluster up|status|down|logs`: a local cluster on 127.0.0.1."""

from __future__ import annotations

import enum
import json
import sys
import time
from collections import deque
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from cli import deploy
from cli.cluster_config import (
    COMPACTION_SCHEDULER,
    MIB,
    STORE_COMPONENTS,
    ClusterConfig,
    ClusterError,
)
from cli.external_buckets import check_bucket_reachable
from cli.flag_differences import flag_differences
from cli.local_cluster import LocalCluster
from cli.options import DirOption, FormatOption
from cli.output import OutputFormat, console, fail, print_data, print_result, waiting, warn
from cli.status import collect_status, missing_status
from dataplane.objectstore.seaweed import EmbeddedS3Error, weed_binary

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


class WALKind(str, enum.Enum):
    """Where brokers keep their write-ahead log (`cluster up --wal`)."""

    file = "file"
    s3 = "s3"


_UP_FLAGS = (
    "brokers",
    "controllers",
    "azs",
    "base_port",
    "bucket_uris",
    "session_timeout_ms",
    "wal_capacity_mib",
    "upload_interval_s",
    "sasl",
    "tls",
    "retention_check_interval_s",
    "object_delete_delay_s",
    "wal",
    "listeners",
    "mtls",
    "bucket_secrets_file",
    "failover_detect_s",
    "store_dir",
)


def _given_flags(ctx: typer.Context, values: dict) -> dict:
    """The `up` flags the operator gave (command line or environment), with their values."""
    given = {}
    for name in _UP_FLAGS:
        # by name: typer vendors its own click, whose enum is not click's
        source = getattr(ctx.get_parameter_source(name), "name", None)
        if source in ("COMMANDLINE", "ENVIRONMENT"):
            given[name] = values[name]
    if "azs" in given:
        given["azs"] = [a.strip() for a in given["azs"].split(",") if a.strip()]
    if "wal" in given:
        given["wal"] = given["wal"].value
    return given


@app.command()
def up(
    ctx: typer.Context,
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
    bucket_secrets_file: Path | None = typer.Option(
        None,
        "--bucket-secrets-file",
        help="credentials of the --bucket-uris buckets: a file of "
        "AUTOMQ_S3_ACCESS_KEY_<id>=.. and AUTOMQ_S3_SECRET_KEY_<id>=.. lines, readable by "
        "its owner only (chmod 600); the same variables in the environment work too",
    ),
    failover_detect_s: float | None = typer.Option(
        None,
        "--failover-detect-s",
        min=0.5,
        max=3600,
        help="object-storage failover: switch new objects to bucket 1 once a majority of "
        "brokers has failed to write to bucket 0 for this long (default 10 s)",
    ),
    session_timeout_ms: int = typer.Option(6000, min=500, help="broker session timeout"),
    wal_capacity_mib: int | None = typer.Option(
        None,
        min=16,
        max=64 * 1024,
        help="each broker's WAL size in MiB (default 512, preallocated on disk); "
        "fixed once a WAL file exists",
    ),
    upload_interval_s: float | None = typer.Option(
        None, min=0.1, max=3600, help="how often brokers upload their WAL (default 5 s)"
    ),
    sasl: bool = typer.Option(
        False,
        "--sasl/--no-sasl",
        help="SASL_PLAINTEXT listeners (PLAIN, SCRAM-SHA-256/512) with ACLs; creates the "
        "admin super user (its login: DIR/admin.credentials, mode 0600)",
    ),
    tls: bool = typer.Option(
        False,
        "--tls/--no-tls",
        help="TLS on the Kafka listeners (SASL_SSL with --sasl, else SSL) with a generated "
        "CA (DIR/tls/ca.pem: what clients trust) and broker certificate",
    ),
    retention_check_interval_s: float | None = typer.Option(
        None,
        min=0.1,
        max=86400,
        help="how often brokers apply retention.ms/retention.bytes (default 300 s)",
    ),
    object_delete_delay_s: float | None = typer.Option(
        None,
        min=0,
        max=86400,
        help="how long objects no longer needed (trimmed, compacted) stay in their bucket "
        "before the controller deletes them, so readers that located them can finish "
        "(default 60 s)",
    ),
    wal: WALKind = typer.Option(
        WALKind.file,
        "--wal",
        help="where brokers keep their WAL: file (a local file) or s3 (objects under "
        "wal/node-N in the main bucket, recoverable from any host)",
    ),
    listeners: str | None = typer.Option(
        None,
        "--listeners",
        help="several Kafka listeners per broker, each its own port and security protocol: "
        "PROTOCOL or NAME:PROTOCOL, comma-separated (e.g. PLAINTEXT,SASL_SSL or "
        "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL; SASL ones need --sasl, SSL ones --tls). "
        "Default: one listener, SASL with --sasl, TLS with --tls",
    ),
    mtls: bool = typer.Option(
        False,
        "--mtls/--no-mtls",
        help="mutual TLS (ssl.client.auth=required) on SSL listeners: clients need a "
        "certificate of the cluster CA, whose CN is their principal for ACLs; issues the "
        "admin's (DIR/tls/admin.pem, admin.key) and the brokers' client certificates",
    ),
    store_dir: Path | None = typer.Option(
        None,
        "--store-dir",
        help="an existing writable directory for the embedded object stores' data (its s3/ "
        "and s3-failover/) instead of --dir, e.g. on another disk than the brokers' WALs "
        "(a real object store is not on the broker's disk); kept for the cluster",
    ),
    timeout_s: float = typer.Option(90.0, help="how long to wait for the cluster to be ready"),
    format: OutputFormat = typer.Option(OutputFormat.table, "--format"),
) -> None:
    """Start the object store, the controller quorum and the brokers; wait until ready.

    On an existing directory it restarts from the persisted state (flags that differ from
    it are refused); when some of its processes still run, it starts only the missing ones.
    A first `up` that fails leaves nothing behind, or, when processes had started, their
    logs; the next `up` then starts over with its own flags."""
    cluster = LocalCluster(dir)
    given = _given_flags(ctx, locals())
    started: list[str] = []  # what this call started: stopped again if start-up fails
    was_running: dict[str, int] = {}
    config: ClusterConfig | None = None
    created = False
    if cluster.exists() and cluster.incomplete():
        _start_over(cluster)
    try:
        if cluster.exists():
            config = cluster.load()
            cluster.ensure_api_secret(config)
            differ = flag_differences(config, **given)
            if differ:
                fail(
                    f"the cluster in {cluster.dir} was created with other settings: "
                    + "; ".join(differ)
                    + ". Flags like these only shape a new cluster: drop them to restart this "
                    "one, or `automqctl cluster down --purge` it first (deletes its data), "
                    "or use another --dir"
                )
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
                sasl=sasl,
                tls=tls,
                retention_check_interval_s=retention_check_interval_s,
                object_delete_delay_s=object_delete_delay_s,
                wal=wal.value,
                listeners=listeners,
                mtls=mtls,
                bucket_secrets_file=bucket_secrets_file,
                failover_detect_s=failover_detect_s,
                store_dir=store_dir,
            )
            created = True
            missing = cluster.component_names(config)
            restarting = False
        stores = [n for n in STORE_COMPONENTS if n in missing]
        if stores:
            weed_binary()  # a clear error before anything starts
        cluster.check_ports(config, missing)
        if not config.embedded_s3 and "s3" not in was_running:
            for bucket in config.buckets:
                check_bucket_reachable(bucket)
        if stores:
            with waiting(f"starting the object store(s) {', '.join(stores)}", format):
                started.extend(stores)
                cluster.start_object_stores(config, stores)
        for c in config.controllers:
            if f"controller-{c.node_id}" in missing:
                started.append(f"controller-{c.node_id}")
                cluster.start_controller(config, c.node_id)
        with waiting("waiting for a controller leader", format):
            _wait_until(
                lambda: collect_status(cluster, config)["leader"] is not None,
                timeout_s,
                "a controller leader",
            )
        if config.sasl and cluster.admin_credentials() is None:
            _create_admin_user(cluster, config)
        if config.sasl and cluster.broker_credentials() is None:
            _create_broker_user(cluster, config)
        # a broker started again must register anew (a new node epoch): its dead process's
        # registration stays unfenced until its session expires and must not pass for ready
        old_epochs = {
            b["node_id"]: b["node_epoch"]
            for b in collect_status(cluster, config)["brokers"]
            if b["registered"] and f"broker-{b['node_id']}" in missing
        }
        for b in config.brokers:
            if f"broker-{b.node_id}" in missing:
                started.append(f"broker-{b.node_id}")
                cluster.start_broker(config, b.node_id)

        if COMPACTION_SCHEDULER in missing:  # a compaction schedule exists
            started.append(COMPACTION_SCHEDULER)
            cluster.start_compaction_scheduler()

        def ready():
            dead = [n for n in cluster.component_names(config) if cluster.running(n) is None]
            if dead:
                raise ClusterError(
                    f"{', '.join(dead)} exited during start-up; see "
                    f"`automqctl cluster logs {dead[0]}`"
                )
            status = collect_status(cluster, config)
            registered_anew = all(
                b["node_epoch"] is not None and b["node_epoch"] > old_epochs[b["node_id"]]
                for b in status["brokers"]
                if b["node_id"] in old_epochs
            )
            return status if status["healthy"] and registered_anew else None

        with waiting("waiting for the brokers to register", format):
            status = _wait_until(ready, timeout_s, "every broker to register and be unfenced")
    except ClusterError as exc:
        note = _after_failure(cluster, config, started, was_running, created)
        fail(f"{exc}{note}")
    except EmbeddedS3Error as exc:
        note = _after_failure(cluster, config, started, was_running, created)
        fail(f"object store: {exc}{note}")
    except BaseException:
        _after_failure(cluster, config, started, was_running, created)
        raise
    cluster.mark_complete()
    if print_data(status, format):
        return
    _print_status(status)
    if was_running:
        console.print(
            f"\nrestarted {', '.join(started)} in [bold]{escape(str(cluster.dir))}[/] "
            "(the others were running)"
        )
    else:
        verb = "restarted from" if restarting else "created in"
        console.print(f"\ncluster {verb} [bold]{escape(str(cluster.dir))}[/]")
    console.print(
        f"bootstrap servers: [bold green]{status['bootstrap_servers']}[/]", soft_wrap=True
    )
    if config.listeners:
        for name, servers in status["listeners"].items():
            console.print(
                f"listener {escape(name)} ({servers['security_protocol']}): "
                f"[bold green]{servers['bootstrap_servers']}[/]",
                soft_wrap=True,
            )
    if config.sasl:
        console.print(
            f"{config.security_protocol} (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512); the admin super "
            f"user's login is in [bold]{escape(str(cluster.admin_credentials_path))}[/] "
            "(mode 0600)",
            soft_wrap=True,
        )
    if config.tls:
        console.print(
            f"TLS: clients trust [bold]{escape(str(cluster.tls_dir / 'ca.pem'))}[/]",
            soft_wrap=True,
        )
    if config.mtls:
        console.print(
            "mutual TLS on SSL listeners: the admin super user's client certificate is "
            f"[bold]{escape(str(cluster.tls_dir / 'admin.pem'))}[/] (key admin.key, mode 0600)",
            soft_wrap=True,
        )


def _create_admin_user(cluster: LocalCluster, config: ClusterConfig) -> None:
    """The admin super user of a `--sasl` cluster: SCRAM credentials (both mechanisms; PLAIN
    checks against them) in the metadata, its login in DIR/admin.credentials."""
    creds = cluster.create_admin_credentials(config)
    try:
        _upsert_scram_user(config, creds)
    except ClusterError:
        cluster.admin_credentials_path.unlink(missing_ok=True)
        raise


def _create_broker_user(cluster: LocalCluster, config: ClusterConfig) -> None:
    """The brokers' super user of a `--sasl` cluster (inter-broker WriteTxnMarkers log in
    as it): SCRAM credentials in the metadata, its login in DIR/broker.credentials (0600)
    and in each broker's 0600 config."""
    creds = cluster.create_broker_credentials()
    try:
        _upsert_scram_user(config, creds)
    except ClusterError:
        cluster.broker_credentials_path.unlink(missing_ok=True)
        raise


def _upsert_scram_user(config: ClusterConfig, creds: dict) -> None:
    """SCRAM-SHA-256 and -512 credentials (PLAIN checks against them) of `creds`' user."""
    from controlplane.client import ControllerClient
    from controlplane.errors import ControllerError
    from controlplane.requests import AlterScramCredentialsRequest
    from controlplane.security import scram_upsertion

    client = ControllerClient(
        config.quorum_config().api_addresses(),
        timeout_s=30,
        api_secret=config.api_secret,
        ca_file=config.controller_ca_file,
    )
    try:
        client.alter_scram_credentials(
            AlterScramCredentialsRequest(
                upsertions=[
                    scram_upsertion(creds["username"], m, creds["password"])
                    for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                ]
            )
        )
    except ControllerError as exc:
        raise ClusterError(f"could not create the {creds['username']} user: {exc}") from None


def _start_over(cluster: LocalCluster) -> None:
    """A directory whose first `up` failed: stop what may be left, delete it, and say so."""
    try:
        old = cluster.load()
    except ClusterError:
        old = None
    if old is not None:
        running = cluster.running_pids(old)
        if running:  # another `up` is still starting it, or one was killed midway
            fail(
                f"the first `cluster up` in {cluster.dir} has not finished and its processes "
                f"run ({', '.join(f'{n}={p}' for n, p in running.items())}): wait for it, "
                "or `automqctl cluster down --purge` to start over"
            )
    cluster.remove_created()
    warn(
        f"the last `cluster up` in {cluster.dir} never finished: "
        "starting over with this call's flags"
    )


def _after_failure(
    cluster: LocalCluster,
    config: ClusterConfig | None,
    started: list[str],
    was_running: dict[str, int],
    created: bool,
) -> str:
    """Stop what a failed `up` started; a cluster it created goes again, unless processes
    logged something (kept for `cluster logs`). The note to append to the error."""
    _stop_started(cluster, config, started, was_running)
    if not created:
        return ""
    if not cluster.has_logs():
        cluster.remove_created()
        return f" (nothing was left in {cluster.dir}; retry with other flags)"
    return (
        f" (the logs are kept in {cluster.dir / 'logs'}; the next `automqctl cluster up` "
        "starts over with its own flags)"
    )


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


_STATE_STYLE = {"healthy": "bold green", "degraded": "bold yellow", "stopped": "bold red"}


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
) -> None:
    """State (healthy / degraded / stopped), Raft leader, controllers, brokers, buckets;
    exit code 1 when not healthy. JSON/YAML on stdout in every case, also for a missing
    directory (state `missing`)."""
    cluster = LocalCluster(dir)
    try:
        config = cluster.load()
    except ClusterError as exc:
        if format != OutputFormat.table:
            print_data(missing_status(cluster, str(exc)), format)
        fail(str(exc))
    if exit_when_healthy and timeout_s is None:
        timeout_s = 120.0
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    first = True
    try:
        while True:
            if not watch and exit_when_healthy:
                with waiting("waiting for the cluster to be healthy", format):
                    status = collect_status(cluster, config)
            else:
                status = collect_status(cluster, config)
            done = (
                (exit_when_healthy and status["healthy"])
                or (not watch and not exit_when_healthy)
                or (deadline is not None and time.monotonic() >= deadline)
            )
            if watch or done:
                _emit_status(status, format, watch=watch, first=first)
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


def _emit_status(status: dict, format: OutputFormat, watch: bool, first: bool) -> None:
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
        _print_status(status)


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
    cluster, config = _open(dir)
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
    cluster, config = _open(dir)
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


def _print_status(status: dict) -> None:
    state = status.get("state", "healthy" if status["healthy"] else "degraded")
    console.print(
        f"cluster [bold]{escape(status['cluster_dir'])}[/]: "
        f"[{_STATE_STYLE.get(state, 'bold')}]{state}[/]"
    )
    ctrl = Table(title="controllers")
    for col in ("node", "address", "state", "leader", "term", "commit index", "pid"):
        ctrl.add_column(col)
    for c in status["controllers"]:
        ctrl.add_row(
            str(c["node_id"]),
            c["address"],
            "[red]stopped[/]" if c["pid"] is None and not c["reachable"] else c["state"],
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
        state_text = (
            "[red]stopped[/]"
            if not b["registered"] and b["pid"] is None
            else "[red]unregistered[/]"
            if not b["registered"]
            else f"[red]fenced ({escape(str(b['fence_reason']))})[/]"
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
            lag += f" [red]({escape(b['last_upload_error'][:60])})[/]"
        endpoints = b.get("endpoints") or []
        brk.add_row(
            str(b["node_id"]),
            b["az"],
            "\n".join(
                f"{escape(e['listener'])} {e['security_protocol']} {e['address']}"
                if e["listener"] != e["security_protocol"]
                else f"{e['security_protocol']} {e['address']}"
                for e in endpoints
            )
            if len(endpoints) > 1
            else b["address"],
            str(b["node_epoch"] or 0) if b["registered"] else "",
            state_text,
            f"{age} ms" if age is not None else "",
            wal,
            lag,
            str(b["pid"] or ""),
        )
    console.print(brk)
    known = status["failover_mode"] != "unknown"
    bkt = Table(title=f"buckets (mode: {status['failover_mode']})")
    for col in ("id", "uri", "active"):
        bkt.add_column(col)
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
    if status["problems"]:
        label = "stopped:" if state == "stopped" else "unhealthy:"
        console.print(
            f"[bold red]{label}[/] " + escape("; ".join(status["problems"])), soft_wrap=True
        )


# multi-host clusters (cli/deploy.py): one config directory per host from a topology file
app.command("init")(deploy.init_command)
