"""The layout of a new local cluster (`cluster up` on an empty directory): its flags
checked, its ports spread over controllers, brokers and embedded object stores, its
buckets and controller settings."""

from __future__ import annotations

import os
from pathlib import Path

from cli.cluster_config import (
    FAILOVER_STORE,
    STORE_COMPONENTS,
    BrokerSpec,
    ClusterError,
    ListenerKind,
)
from cli.port_allocator import PortAllocator, default_port_range, parse_port_range
from controlplane.config import BucketConfig, ControllerAddress
from controlplane.listeners import (
    SASL_PROTOCOLS,
    TLS_PROTOCOLS,
    ListenerSpecError,
    parse_listener_kinds,
)
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import ADMIN_GRPC_OFFSET, SeaweedConfig

# each embedded store (main: bucket 0, failover: bucket 1) takes this many ports
PORTS_PER_STORE = 11
# the main embedded store's S3 Tables bucket: the warehouse of its Iceberg REST catalog
EMBEDDED_TABLE_BUCKET = "automq-tables"


def check_create_flags(
    *,
    brokers: int,
    controllers: int,
    azs: list[str],
    bucket_uris: str | None,
    sasl: bool,
    tls: bool,
    listeners: str | None,
    mtls: bool,
    bucket_secrets_file: Path | None,
    store_dir: Path | None,
) -> tuple[Path | None, list[ListenerKind] | None]:
    """The flags of a new cluster checked together (ClusterError for the first that does
    not fit): the --store-dir made absolute and the --listeners' kinds (None: not given)."""
    if store_dir is not None:
        if bucket_uris:
            raise ClusterError(
                "--store-dir holds the embedded object store's data: "
                "it does not go with --bucket-uris"
            )
        store_dir = check_store_dir(store_dir)
    if bucket_secrets_file is not None and not bucket_uris:
        raise ClusterError(
            "--bucket-secrets-file holds the credentials of external buckets: "
            "it needs --bucket-uris"
        )
    kinds = check_listener_flags(listeners, sasl=sasl, tls=tls)
    if mtls:
        protocols = (
            [k.security_protocol for k in kinds] if kinds else ["SASL_SSL" if sasl else "SSL"]
        )
        if not tls or "SSL" not in protocols:
            raise ClusterError("--mtls needs --tls and an SSL listener (e.g. --listeners SSL)")
    if brokers < 1 or controllers < 1:
        raise ClusterError("a cluster needs at least one broker and one controller")
    if controllers % 2 == 0:
        raise ClusterError(
            f"{controllers} controllers cannot form a safe majority; use an odd count"
        )
    if not azs:
        raise ClusterError("at least one AZ name is needed")
    return store_dir, kinds


def port_allocator(base_port: int | None, port_range: str | None) -> PortAllocator | None:
    """The allocator of a new cluster's ports: `--port-range`'s (in order from its low
    end), else the default range's (at random); None with --base-port (consecutive ports)."""
    if base_port is not None:
        if port_range is not None:
            raise ClusterError("--base-port and --port-range do not go together: give one")
        return None
    if port_range is not None:
        return PortAllocator(*parse_port_range(port_range))
    return PortAllocator(*default_port_range(), in_order=False)


def cluster_ports(
    needed: int,
    base_port: int | None,
    embedded_stores: bool,
    allocator: PortAllocator | None = None,
) -> list[int]:
    """`needed` ports for a new cluster: consecutive from --base-port (checked to fit), else
    free ones of the allocator's range (chosen, not bound yet)."""
    # the object store's admin gRPC port is its admin port + ADMIN_GRPC_OFFSET
    top = 65535 - needed - (ADMIN_GRPC_OFFSET if embedded_stores else 0)
    if base_port is not None:
        if not 1024 <= base_port <= top:
            raise ClusterError(f"--base-port must be in 1024..{top}")
        return list(range(base_port, base_port + needed))
    return (allocator or port_allocator(None, None)).take(needed)


def controller_addresses(host: str, ports: list[int], controllers: int) -> list[ControllerAddress]:
    """Controllers 0..N-1, each with its Raft port and then its API port from `ports`."""
    return [
        ControllerAddress(node_id=i, host=host, raft_port=ports[2 * i], api_port=ports[2 * i + 1])
        for i in range(controllers)
    ]


def broker_specs(
    ports: list[int], brokers: int, azs: list[str], kinds: list[ListenerKind] | None
) -> list[BrokerSpec]:
    """Brokers 1..N round-robin over `azs`, each with its listeners' ports and then its
    metrics port from `ports`."""
    per_broker = len(kinds) if kinds else 1
    stride = per_broker + 1  # each broker: its listeners' ports, then its metrics port
    return [
        BrokerSpec(
            node_id=i + 1,
            az=azs[i % len(azs)],
            kafka_port=ports[stride * i],
            metrics_port=ports[stride * i + per_broker],
            listener_ports=(ports[stride * i : stride * i + per_broker] if kinds else None),
        )
        for i in range(brokers)
    ]


def embedded_store_configs(
    data_root: Path, ports: list[int], allocator: PortAllocator | None
) -> tuple[dict, dict, list[BucketConfig]]:
    """The main and the failover embedded stores (SeaweedConfig JSON, their data under
    `data_root`) on `ports` and their buckets 0 and 1. With an `allocator` (no
    --base-port) their admin port pairs (P, P + ADMIN_GRPC_OFFSET) come from it too."""
    buckets = []
    stores = []
    for i, (component, name) in enumerate(
        (("s3", "automq-main"), (FAILOVER_STORE, "automq-failover"))
    ):
        s3 = SeaweedConfig.generate(data_root / component, buckets=[name])
        if i == 0:  # the main store also serves an Iceberg REST catalog for table topics
            s3.table_bucket = EMBEDDED_TABLE_BUCKET
        s3.ports = dict(zip(s3.ports, ports[PORTS_PER_STORE * i : PORTS_PER_STORE * (i + 1)]))
        if allocator is not None:
            s3.ports["admin"], s3.ports["admin_grpc"] = allocator.take_pair(ADMIN_GRPC_OFFSET)
        else:
            s3.ports["admin_grpc"] = s3.ports["admin"] + ADMIN_GRPC_OFFSET
        stores.append(s3.to_json())
        buckets.append(
            BucketConfig(
                bucket_id=i,
                uri=f"{i}@s3://{name}?region=us-east-1&endpoint={s3.endpoint}",
                access_key=s3.access_key,
                secret_key=s3.secret_key,
            )
        )
    return stores[0], stores[1], buckets


def prefixed_buckets(buckets: list[BucketConfig], prefix: str) -> list[BucketConfig]:
    """`buckets` with every key under `prefix` (`--bucket-prefix`), or ClusterError naming
    what is wrong with it."""
    from dataplane.objectstore.bucket_uri import with_key_prefix

    try:
        return [b.model_copy(update={"uri": with_key_prefix(b.uri, prefix)}) for b in buckets]
    except ValueError as exc:
        raise ClusterError(f"--bucket-prefix: {exc}") from None


def controller_settings(
    buckets: list[BucketConfig],
    session_timeout_ms: int,
    object_delete_delay_s: float | None,
    failover_detect_s: float | None,
) -> ControllerSettings:
    """The controllers' settings of a new cluster from its buckets and flags."""
    settings = ControllerSettings(
        bucket_ids=[b.bucket_id for b in buckets], broker_session_timeout_ms=session_timeout_ms
    )
    if object_delete_delay_s is not None:
        settings.object_destroy_retention_ms = round(object_delete_delay_s * 1000)
    if failover_detect_s is not None:
        settings.bucket_failover_detect_ms = round(failover_detect_s * 1000)
    return settings


def check_store_dir(store_dir: Path) -> Path:
    """`cluster up --store-dir` made absolute, or ClusterError: not an existing writable
    directory, or it already holds a store (its s3/ or s3-failover/: another cluster's)."""
    path = Path(os.path.abspath(os.path.expanduser(store_dir)))
    if not path.is_dir():
        raise ClusterError(f"--store-dir {store_dir}: not an existing directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ClusterError(f"--store-dir {store_dir}: not writable")
    for component in STORE_COMPONENTS:
        if (path / component).exists():
            raise ClusterError(
                f"--store-dir {store_dir} already holds {component}/ (another cluster's "
                "object store?): give another directory, or delete it"
            )
    return path


def check_listener_flags(
    listeners: str | None, *, sasl: bool, tls: bool
) -> list[ListenerKind] | None:
    """`cluster up --listeners` as listener kinds (None: not given), or ClusterError: an
    unknown protocol, a duplicate name, a SASL listener without --sasl, an SSL one without
    --tls."""
    if listeners is None:
        return None
    try:
        kinds = parse_listener_kinds(listeners)
    except ListenerSpecError as exc:
        raise ClusterError(f"--listeners: {exc}") from None
    for name, protocol in kinds:
        label = f"listener {name}" + ("" if name == protocol else f" ({protocol})")
        if protocol in SASL_PROTOCOLS and not sasl:
            raise ClusterError(f"--listeners: {label} needs --sasl")
        if protocol in TLS_PROTOCOLS and not tls:
            raise ClusterError(f"--listeners: {label} needs --tls")
    if sasl and not any(p in SASL_PROTOCOLS for _, p in kinds):
        raise ClusterError("--sasl needs a SASL listener in --listeners (e.g. PLAINTEXT,SASL_SSL)")
    return [ListenerKind(name=n, security_protocol=p) for n, p in kinds]
