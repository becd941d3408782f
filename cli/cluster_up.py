"""`automqctl cluster up`: its options, and its steps (create or reload the config, start
what is missing in order, wait until ready, undo what it started when start-up fails, and
tell the operator how to connect)."""

from __future__ import annotations

import enum
import time
from pathlib import Path

import typer
from rich.markup import escape

from cli import cluster_properties
from cli.cluster_config import (
    COMPACTION_SCHEDULER,
    STORE_COMPONENTS,
    SUPERVISOR,
    ClusterConfig,
    ClusterError,
)
from cli.config_files import parse_broker_overrides
from cli.external_buckets import check_bucket_reachable
from cli.flag_differences import flag_differences
from cli.local_cluster import LocalCluster
from cli.output import OutputFormat, console, fail, print_data, waiting, warn
from cli.status_table import print_status
from dataplane.config_mapping import PropertiesMapping
from dataplane.config_properties import PropertiesError
from dataplane.objectstore.seaweed import EmbeddedS3Error, weed_binary


class WALKind(str, enum.Enum):
    """Where brokers keep their write-ahead log (`cluster up --wal`)."""

    file = "file"
    s3 = "s3"


BrokersOption = typer.Option(3, min=1, max=64, help="number of brokers")
ControllersOption = typer.Option(3, min=1, max=7, help="number of controllers (odd)")
AzsOption = typer.Option("az1,az2,az3", help="comma-separated AZ names, brokers round-robin")
ClientAzCidrsOption = typer.Option(
    None,
    "--client-az-cidrs",
    metavar="AZ=CIDR,...",
    help="client address ranges of each AZ, e.g. az1=10.0.0.0/16,az2=10.1.0.0/16 (an AZ may "
    "repeat): the zone router places a client by them when neither its client.id "
    "(automq_az=) nor its Fetch's rack (client.rack) names an AZ",
)


class ChannelMode(str, enum.Enum):
    """Which produce at a main goes through its RouterChannel (zone_router.channel_mode)."""

    all = "all"
    az_clients = "az_clients"


ChannelModeOption = typer.Option(
    None,
    "--zone-router-channel-mode",
    help="which produce at a main goes through its own RouterChannel when other AZs have "
    "brokers: all (the default: remote-AZ consumers read every record within ms, produce "
    "waits for a PUT) or az_clients (only clients with an AZ; others append straight to "
    "the WAL and other AZs read their records once uploaded); docs/operations.md",
)
BasePortOption = typer.Option(
    None, help="first of consecutive ports (default: free ports of --port-range's range)"
)
PortRangeOption = typer.Option(
    None,
    "--port-range",
    metavar="LOW-HIGH",
    help="every port of the cluster (controllers, brokers, embedded stores and their admin "
    "gRPC ports) is a free one of this range, taken from its low end; embedded stores need "
    "a range of more than 10000 ports (default: free ports of 10000-32767, below the "
    "kernel's ephemeral range)",
)
BucketUrisOption = typer.Option(
    None,
    help="external S3 buckets instead of the embedded store: "
    "0@s3://main?region=..&endpoint=..,1@s3://failover?...",
)
BucketSecretsFileOption = typer.Option(
    None,
    "--bucket-secrets-file",
    help="credentials of the --bucket-uris buckets: a file of "
    "AUTOMQ_S3_ACCESS_KEY_<id>=.. and AUTOMQ_S3_SECRET_KEY_<id>=.. lines, readable by "
    "its owner only (chmod 600); the same variables in the environment work too",
)
FailoverDetectSOption = typer.Option(
    None,
    "--failover-detect-s",
    min=0.5,
    max=3600,
    help="object-storage failover: switch new objects to bucket 1 once a majority of "
    "brokers has failed to write to bucket 0 for this long (default 10 s)",
)
BucketPrefixOption = typer.Option(
    None,
    "--bucket-prefix",
    help="a key prefix (e.g. cluster-a) for every object of this cluster in its buckets, so "
    "clusters can share a bucket, or a new cluster can use a bucket an earlier one used "
    "without meeting its WAL and router channels (stored in the cluster config)",
)
SuperviseOption = typer.Option(
    None,
    "--supervise/--no-supervise",
    help="a supervisor process restarts crashed processes (stores, controllers, brokers; "
    "`broker kill` counts as a crash) with a backoff of 1 s doubling to 30 s; `broker "
    "stop` and `cluster down` stop them for good; restarts show in `cluster status` and "
    "logs/supervisor.log. Default: on for a new cluster; an existing cluster keeps the "
    "setting stored in its config unless one of these flags is given",
)
SessionTimeoutMsOption = typer.Option(6000, min=500, help="broker session timeout")
WalCapacityMibOption = typer.Option(
    None,
    min=16,
    max=64 * 1024,
    help="each broker's WAL size in MiB (default 512, preallocated on disk); "
    "fixed once a WAL file exists",
)
UploadIntervalSOption = typer.Option(
    None, min=0.1, max=3600, help="how often brokers upload their WAL (default 5 s)"
)
SaslOption = typer.Option(
    False,
    "--sasl/--no-sasl",
    help="SASL_PLAINTEXT listeners (PLAIN, SCRAM-SHA-256/512) with ACLs; creates the "
    "admin super user (its login: DIR/admin.credentials, mode 0600)",
)
TlsOption = typer.Option(
    False,
    "--tls/--no-tls",
    help="TLS on the Kafka listeners (SASL_SSL with --sasl, else SSL) with a generated "
    "CA (DIR/tls/ca.pem: what clients trust) and broker certificate",
)
RetentionCheckIntervalSOption = typer.Option(
    None,
    min=0.1,
    max=86400,
    help="how often brokers apply retention.ms/retention.bytes (default 300 s)",
)
ObjectDeleteDelaySOption = typer.Option(
    None,
    min=0,
    max=86400,
    help="how long objects no longer needed (trimmed, compacted) stay in their bucket "
    "before the controller deletes them, so readers that located them can finish "
    "(default 60 s)",
)
WalOption = typer.Option(
    WALKind.file,
    "--wal",
    help="where brokers keep their WAL: file (a local file) or s3 (objects under "
    "wal/node-N in the main bucket, recoverable from any host)",
)
ListenersOption = typer.Option(
    None,
    "--listeners",
    help="several Kafka listeners per broker, each its own port and security protocol: "
    "PROTOCOL or NAME:PROTOCOL, comma-separated (e.g. PLAINTEXT,SASL_SSL or "
    "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL; SASL ones need --sasl, SSL ones --tls). "
    "Default: one listener, SASL with --sasl, TLS with --tls",
)
MtlsOption = typer.Option(
    False,
    "--mtls/--no-mtls",
    help="mutual TLS (ssl.client.auth=required) on SSL listeners: clients need a "
    "certificate of the cluster CA, whose CN is their principal for ACLs; issues the "
    "admin's (DIR/tls/admin.pem, admin.key) and the brokers' client certificates",
)
StoreDirOption = typer.Option(
    None,
    "--store-dir",
    help="an existing writable directory for the embedded object stores' data (its s3/ "
    "and s3-failover/) instead of --dir, e.g. on another disk than the brokers' WALs "
    "(a real object store is not on the broker's disk); kept for the cluster",
)
ConfigFileOption = typer.Option(
    None,
    "--config",
    help="an AutoMQ/Kafka server.properties: its buckets (s3.data.buckets, or s3.endpoint/"
    "s3.region/s3.bucket with N@ parts, and KAFKA_S3_ACCESS_KEY/KAFKA_S3_SECRET_KEY), WAL, "
    "cache and bandwidth sizes and topic defaults (docs/configuration.md); keys not used "
    "are named on stderr",
)
OverrideOption = typer.Option(
    None,
    "--override",
    help="KEY=VALUE: a server.properties key that replaces the --config file's (repeatable, "
    "as kafka-server-start.sh takes it)",
)
TimeoutSOption = typer.Option(90.0, help="how long to wait for the cluster to be ready")
BrokerConfigOption = typer.Option(
    [],
    "--broker-config",
    metavar="SECTION.KEY=VALUE",
    help="section.key=value of every broker's config (docs/configuration.md), repeatable, "
    "e.g. network.egress_bytes_per_s=20000000",
)

_UP_FLAGS = (
    "brokers",
    "controllers",
    "azs",
    "client_az_cidrs",
    "zone_router_channel_mode",
    "base_port",
    "port_range",
    "bucket_uris",
    "bucket_prefix",
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
    "broker_config",
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
    if "client_az_cidrs" in given:
        given["client_az_cidrs"] = _client_az_cidrs(given["client_az_cidrs"])
    if "wal" in given:
        given["wal"] = given["wal"].value
    if given.get("zone_router_channel_mode") is not None:
        given["zone_router_channel_mode"] = given["zone_router_channel_mode"].value
    return given


def with_channel_mode(overrides: dict, mode: ChannelMode | None) -> dict:
    """The brokers' config overrides with --zone-router-channel-mode in them (given twice,
    with --broker-config too: the command fails)."""
    if mode is None:
        return overrides
    if "channel_mode" in overrides.get("zone_router", {}):
        fail("give the channel mode once: --zone-router-channel-mode or --broker-config, not both")
    zone_router = {**overrides.get("zone_router", {}), "channel_mode": ChannelMode(mode).value}
    return {**overrides, "zone_router": zone_router}


def _client_az_cidrs(spec: str | None) -> dict[str, str]:
    """--client-az-cidrs as the broker config's {cidr: az} (a bad entry fails the command)."""
    from dataplane.formats.client_az import parse_az_cidrs

    try:
        return parse_az_cidrs(spec or "")
    except ValueError as exc:
        fail(f"--client-az-cidrs: {exc}")


def _properties(values: dict, given: dict) -> PropertiesMapping | None:
    """`--config` / `--override` mapped, merged into the flags (warnings on stderr, one
    line per key not used); a bad key fails before anything starts."""
    try:
        mapping = cluster_properties.load_mapping(
            values["config_file"], values["override"] or [], values["bucket_uris"]
        )
        if mapping is not None:
            cluster_properties.apply_to_flags(mapping, values, given)
    except PropertiesError as exc:
        fail(str(exc))
    if mapping is not None:
        for line in mapping.warnings:
            warn(line)
    return mapping


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.3):
    """The first true value of `predicate()`, polled every `interval_s`, or ClusterError
    after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def run_up(ctx: typer.Context, values: dict) -> None:
    """`cluster up` with the values of its parameters (see cli/cluster.py:up)."""
    cluster = LocalCluster(values["dir"])
    given = _given_flags(ctx, values)
    mapping = _properties(values, given)
    format: OutputFormat = values["format"]
    started: list[str] = []  # what this call started: stopped again if start-up fails
    was_running: dict[str, int] = {}
    config: ClusterConfig | None = None
    created = False
    if cluster.exists() and cluster.incomplete():
        _start_over(cluster)
    try:
        if cluster.exists():
            config = cluster.load()
            was_running, missing = _restart_plan(
                cluster, config, given, mapping, values["supervise"]
            )
            restarting = True
        else:
            config = _create(cluster, values, mapping)
            created = True
            missing = cluster.component_names(config)
            restarting = False
        status = _start_missing(
            cluster, config, missing, was_running, started, values, set_defaults=created
        )
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
    print_status(status)
    _print_how_to_connect(cluster, config, status, started, was_running, restarting)


def _restart_plan(
    cluster: LocalCluster,
    config: ClusterConfig,
    given: dict,
    mapping: PropertiesMapping | None,
    supervise: bool | None,
) -> tuple[dict[str, int], list[str]]:
    """An existing cluster: refuse flags (and --config keys) that differ from its config;
    else store a given --supervise/--no-supervise and return (the components running, the
    components to start: none when all run, and `up` then only waits until the cluster is
    healthy and prints its status)."""
    cluster.ensure_api_secret(config)
    differ = flag_differences(config, **given)
    if mapping is not None:
        differ += cluster_properties.differences(config, mapping)
    if differ:
        fail(
            f"the cluster in {cluster.dir} was created with other settings: "
            + "; ".join(differ)
            + ". Flags like these only shape a new cluster: drop them to restart this "
            "one, or `automqctl cluster down --purge` it first (deletes its data), "
            "or use another --dir"
        )
    _apply_supervise(cluster, config, supervise)
    was_running = cluster.running_pids(config)
    missing = [n for n in cluster.component_names(config) if n not in was_running]
    return was_running, missing


def _create(
    cluster: LocalCluster, values: dict, mapping: PropertiesMapping | None
) -> ClusterConfig:
    """A new cluster's config from the `up` flags (and --config's keys)."""
    wal_capacity_mib = values["wal_capacity_mib"]
    overrides = parse_broker_overrides(values["broker_config"])
    if values["client_az_cidrs"] and "client_az_cidrs" in overrides.get("zone_router", {}):
        fail("give the client AZ ranges once: --client-az-cidrs or --broker-config, not both")
    overrides = with_channel_mode(overrides, values.get("zone_router_channel_mode"))
    config = cluster.create(
        values["brokers"],
        values["controllers"],
        [a.strip() for a in values["azs"].split(",") if a.strip()],
        values["base_port"],
        values["bucket_uris"],
        values["session_timeout_ms"],
        wal_capacity_bytes=None if wal_capacity_mib is None else wal_capacity_mib * 1024 * 1024,
        upload_interval_s=values["upload_interval_s"],
        sasl=values["sasl"],
        tls=values["tls"],
        retention_check_interval_s=values["retention_check_interval_s"],
        object_delete_delay_s=values["object_delete_delay_s"],
        wal=values["wal"].value,
        listeners=values["listeners"],
        mtls=values["mtls"],
        bucket_secrets_file=values["bucket_secrets_file"],
        failover_detect_s=values["failover_detect_s"],
        store_dir=values["store_dir"],
        broker_overrides=overrides,
        client_az_cidrs=_client_az_cidrs(values["client_az_cidrs"]),
        bucket_prefix=values["bucket_prefix"],
        port_range=values["port_range"],
    )
    if mapping is not None:
        config = cluster_properties.configure_new(config, mapping)
        cluster.save(config)
    if values["supervise"] is not False:  # supervised unless --no-supervise
        config.supervise = True
        cluster.save(config)
    return config


def _apply_supervise(cluster: LocalCluster, config: ClusterConfig, given: bool | None) -> None:
    """`--supervise` / `--no-supervise` on an existing cluster: stored in its config (an
    older cluster created without supervision keeps it off unless `--supervise` is given);
    `--no-supervise` also stops a running supervisor."""
    if given is None or given == config.supervise:
        return
    config.supervise = given
    cluster.save(config)
    if not given:
        cluster.stop(SUPERVISOR)


def _start_missing(
    cluster: LocalCluster,
    config: ClusterConfig,
    missing: list[str],
    was_running: dict[str, int],
    started: list[str],
    values: dict,
    set_defaults: bool = False,
) -> dict:
    """Start the `missing` components in order (object stores, controllers, then brokers
    and the compaction scheduler), each appended to `started` as it starts; the status
    once every broker registered (anew) and the cluster is healthy. `set_defaults`: a new
    cluster, whose --config topic defaults are set once the controllers are up."""
    # imported here: the controller client costs a `cluster up` that is refused (a running
    # cluster, a flag that differs) ~0.15 s of start-up
    from cli.status import collect_status

    timeout_s, format = values["timeout_s"], values["format"]
    _start_stores_and_controllers(cluster, config, missing, was_running, started, format)
    with waiting("waiting for a controller leader", format):
        wait_until(
            lambda: collect_status(cluster, config)["leader"] is not None,
            timeout_s,
            "a controller leader",
        )
    if config.sasl:
        _create_sasl_users(cluster, config)
    if set_defaults:
        cluster_properties.set_topic_defaults(config)
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
    if SUPERVISOR in missing:  # supervised: everything it watches is started by now
        started.append(SUPERVISOR)
        cluster.start_supervisor()
    with waiting("waiting for the brokers to register", format):
        return wait_until(
            lambda: _ready_status(cluster, config, old_epochs),
            timeout_s,
            "every broker to register and be unfenced",
        )


def _start_stores_and_controllers(
    cluster: LocalCluster,
    config: ClusterConfig,
    missing: list[str],
    was_running: dict[str, int],
    started: list[str],
    format: OutputFormat,
) -> None:
    """Check what starting needs (the weed binary, free ports, reachable external buckets),
    then start the missing object stores and controllers."""
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


def _ready_status(
    cluster: LocalCluster, config: ClusterConfig, old_epochs: dict[int, int]
) -> dict | None:
    """The status once the cluster is healthy and every restarted broker registered with a
    newer epoch than before; None before; ClusterError if a component exited."""
    dead = [n for n in cluster.component_names(config) if cluster.running(n) is None]
    if dead:
        raise ClusterError(
            f"{', '.join(dead)} exited during start-up; see `automqctl cluster logs {dead[0]}`"
        )
    from cli.status import collect_status  # see _start_missing

    status = collect_status(cluster, config)
    registered_anew = all(
        b["node_epoch"] is not None and b["node_epoch"] > old_epochs[b["node_id"]]
        for b in status["brokers"]
        if b["node_id"] in old_epochs
    )
    return status if status["healthy"] and registered_anew else None


def _print_how_to_connect(
    cluster: LocalCluster,
    config: ClusterConfig,
    status: dict,
    started: list[str],
    was_running: dict[str, int],
    restarting: bool,
) -> None:
    """After a successful `up`: what was started, the bootstrap servers of each listener,
    and where the admin's login and the cluster CA are."""
    if was_running and not started:
        console.print(
            f"\ncluster in [bold]{escape(str(cluster.dir))}[/] was already running: nothing started"
        )
    elif was_running:
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


def _create_sasl_users(cluster: LocalCluster, config: ClusterConfig) -> None:
    """The super users of a `--sasl` cluster that have no login yet: the admin (its login in
    DIR/admin.credentials) and the brokers' (inter-broker WriteTxnMarkers log in as it; its
    login in DIR/broker.credentials and in each broker's 0600 config). Each gets SCRAM
    credentials (both mechanisms; PLAIN checks against them) in the metadata."""
    if cluster.admin_credentials() is None:
        creds = cluster.create_admin_credentials(config)
        _upsert_or_forget(config, creds, cluster.admin_credentials_path)
    if cluster.broker_credentials() is None:
        creds = cluster.create_broker_credentials()
        _upsert_or_forget(config, creds, cluster.broker_credentials_path)


def _upsert_or_forget(config: ClusterConfig, creds: dict, login_path: Path) -> None:
    """The user's SCRAM credentials in the metadata; its login file goes if that fails."""
    try:
        _upsert_scram_user(config, creds)
    except ClusterError:
        login_path.unlink(missing_ok=True)
        raise


def _upsert_scram_user(config: ClusterConfig, creds: dict) -> None:
    """SCRAM-SHA-256 and -512 credentials (PLAIN checks against them) of `creds`' user."""
    from controlplane.errors import ControllerError
    from controlplane.requests import AlterScramCredentialsRequest
    from controlplane.security import scram_upsertion

    client = config.controller_client(timeout_s=30)
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
