"""A local cluster's config (cluster.json): its controllers, brokers, listeners, buckets
and embedded object stores, the names of its components, and the error the CLI prints.

Layout of a cluster directory:

    cluster.json          the cluster's config (ports, secrets; mode 0600)
    quorum.json           what controllers read (mode 0600)
    controller-api.secret the controller API's bearer secret (mode 0600; controlplane/auth.py)
    admin.credentials     with --sasl: the admin (super) user's SASL login, JSON (mode 0600)
    controller-N/         a controller's Raft journal and snapshot
    broker-N/             a broker's config and data (WAL)
    s3/                   the embedded object store's data (or STORE_DIR/s3 with
                          `cluster up --store-dir STORE_DIR`; s3-failover/ likewise)
    logs/<name>.log       one log per process
    pids/<name>.pid       "pid start_time" of each running process
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, Field

from controlplane.config import BucketConfig, ControllerAddress, QuorumConfig
from controlplane.listeners import SASL_PROTOCOLS
from controlplane.records import BrokerEndpoint
from controlplane.settings import ControllerSettings
from dataplane.objectstore.seaweed import SeaweedConfig

if TYPE_CHECKING:
    from controlplane.client import ControllerClient

ADMIN_USER = "admin"
ADMIN_CREDENTIALS_FILE = "admin.credentials"
# the brokers' own super user on a --sasl cluster (inter-broker requests: WriteTxnMarkers);
# its login is copied into each broker's 0600 config, not shared with the operator's
BROKER_USER = "broker"
BROKER_CREDENTIALS_FILE = "broker.credentials"
DEFAULT_CLUSTER_DIR = Path.home() / ".automqctl" / "cluster"


FAILOVER_STORE = "s3-failover"  # the component name of the failover bucket's store
STORE_COMPONENTS = ("s3", FAILOVER_STORE)
COMPACTION_SCHEDULER = "compaction-scheduler"  # component name (cli/compaction_scheduler.py)
SUPERVISOR = "supervisor"  # component name (cli/supervisor.py, `cluster up --supervise`)
MIB = 1024 * 1024


class ClusterError(RuntimeError):
    """An operator-facing error: printed as a message, never as a traceback."""


class BrokerSpec(BaseModel):
    """One broker of a local cluster: its node id, AZ and ports."""

    node_id: int
    az: str
    kafka_port: int  # its first listener's
    metrics_port: int | None = None  # Prometheus /metrics of the broker
    # the port of each listener (ClusterConfig.listeners order; the first is kafka_port);
    # None: one listener on kafka_port
    listener_ports: list[int] | None = None
    # its shard store's port (erasure-coded partitions), from the cluster's port allocator;
    # None (--base-port, or configs written before): any free port, chosen by the broker
    shard_store_port: int | None = None


SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


class ListenerKind(BaseModel):
    """One listener every broker of a local cluster serves (`cluster up --listeners`)."""

    name: str
    security_protocol: SecurityProtocol


class ClusterConfig(BaseModel):
    """Everything needed to (re)start a local cluster; persisted in cluster.json."""

    version: int = 1
    host: str = "127.0.0.1"
    controllers: list[ControllerAddress]
    brokers: list[BrokerSpec]
    password: str
    # the controller API's bearer secret; None only in configs written before it existed
    # (`cluster up` then adds one: LocalCluster.ensure_api_secret)
    api_secret: str | None = None
    settings: ControllerSettings = Field(default_factory=ControllerSettings)
    embedded_s3: dict | None = None  # SeaweedConfig JSON when the store is embedded
    # the second embedded store (component "s3-failover", bucket 1): a separate process
    # with its own data dir, so the main store can fail alone. None in configs written
    # before it existed (their one store holds both buckets)
    embedded_s3_failover: dict | None = None
    # `cluster up --store-dir`: the directory (absolute) holding the embedded stores' data
    # (its s3/ and s3-failover/) instead of the cluster directory, e.g. on another device
    # than the brokers' WALs. None: the cluster directory
    store_dir: str | None = None
    buckets: list[BucketConfig] = Field(default_factory=list)
    # broker storage knobs; None: the broker's default (BrokerConfig)
    broker_wal_capacity_bytes: int | None = Field(default=None, ge=16 * 1024 * 1024)
    broker_upload_interval_s: float | None = Field(default=None, gt=0, le=3600)
    broker_retention_check_interval_s: float | None = Field(default=None, gt=0, le=86400)
    # `cluster up --broker-config section.key=value`: broker config sections' values, as
    # nested dicts ({"network": {"egress_bytes_per_s": 20000000}}); merged into every
    # broker's config
    broker_overrides: dict[str, Any] = Field(default_factory=dict)
    # `cluster up --client-az-cidrs`: client address ranges -> AZ ({cidr: az}), every
    # broker's zone_router.client_az_cidrs
    client_az_cidrs: dict[str, str] = Field(default_factory=dict, max_length=10_000)
    # where brokers keep their WAL: a local file, or objects in the main bucket (s3)
    broker_wal: Literal["file", "s3"] = "file"
    # the flags of `cluster up` that made this config (None in configs written before)
    azs: list[str] | None = None
    base_port: int | None = None
    # `cluster up --port-range` [low, high] the ports were chosen from (None: not given)
    port_range: list[int] | None = None
    # a supervisor process restarts crashed components: `cluster up` sets it on a new cluster
    # unless --no-supervise; absent (False) in configs written before it was the default, and
    # such a cluster stays unsupervised until `cluster up --supervise`
    supervise: bool = False
    # the Kafka listeners: SASL with ACLs (`cluster up --sasl`), TLS (`--tls`, certificates
    # in DIR/tls/): SASL_SSL, SASL_PLAINTEXT, SSL or PLAINTEXT
    sasl: bool = False
    tls: bool = False
    # with --tls the controller API is HTTPS too, with the same CA (None in configs written
    # before: their controller API stays HTTP)
    tls_dir: str | None = None
    # several listeners per broker (`--listeners PLAINTEXT,SASL_SSL`); None: one whose
    # protocol follows --sasl / --tls
    listeners: list[ListenerKind] | None = None
    # `--mtls`: SSL listeners require a client certificate of the cluster CA (its CN is the
    # principal); the CLI uses DIR/tls/admin.pem (CN admin), brokers DIR/tls/broker.pem
    mtls: bool = False
    # `cluster up --config server.properties` (cli/cluster_properties.py): settings every
    # broker's config gets (an overlay of BrokerConfig's tree), and the topic defaults set
    # as cluster-wide dynamic broker configs when the cluster was created
    broker_settings: dict = Field(default_factory=dict)
    topic_defaults: dict[str, str] = Field(default_factory=dict)

    def listener_kinds(self) -> list[ListenerKind]:
        """Every broker's listeners, in order (the legacy single one when not set)."""
        if self.listeners:
            return list(self.listeners)
        protocol = ("SASL_" if self.sasl else "") + ("SSL" if self.tls else "PLAINTEXT")
        return [ListenerKind(name=protocol, security_protocol=protocol)]

    def client_listener_index(self) -> int:
        """The listener the CLI's clients and the brokers themselves use: the first SASL one
        on a --sasl cluster (the admin and broker logins need it), else the first SSL one
        with --mtls (their client certificates), else the first."""
        kinds = self.listener_kinds()
        wanted = SASL_PROTOCOLS if self.sasl else {"SSL"} if self.mtls else None
        for i, kind in enumerate(kinds):
            if wanted is not None and kind.security_protocol in wanted:
                return i
        return 0

    def broker_endpoints(self, spec: BrokerSpec) -> list[BrokerEndpoint]:
        """The endpoints of one broker, in listener order."""
        ports = spec.listener_ports or [spec.kafka_port]
        return [
            BrokerEndpoint(
                name=k.name, host=self.host, port=port, security_protocol=k.security_protocol
            )
            for k, port in zip(self.listener_kinds(), ports, strict=True)
        ]

    @property
    def controller_ca_file(self) -> str | None:
        """The CA clients verify the HTTPS controller API with (None: plain HTTP)."""
        return str(Path(self.tls_dir) / "ca.pem") if self.tls_dir else None

    @property
    def security_protocol(self) -> str:
        """The protocol of the listener the CLI's clients use."""
        return self.listener_kinds()[self.client_listener_index()].security_protocol

    def quorum_config(self) -> QuorumConfig:
        """What controllers read (quorum.json): voters, secrets, settings, buckets, TLS."""
        tls = (
            {
                "tls_cert_file": str(Path(self.tls_dir) / "server.pem"),
                "tls_key_file": str(Path(self.tls_dir) / "server.key"),
            }
            if self.tls_dir
            else {}
        )
        return QuorumConfig(
            controllers=self.controllers,
            password=self.password,
            api_secret=self.api_secret,
            settings=self.settings,
            buckets=self.buckets,
            **tls,
        )

    def controller_client(self, **timeouts: float) -> ControllerClient:
        """A client of this cluster's controller APIs (their API secret and CA);
        `timeouts`: ControllerClient's timeout_s and request_timeout_s."""
        from controlplane.client import ControllerClient

        return ControllerClient(
            self.quorum_config().api_addresses(),
            api_secret=self.api_secret,
            ca_file=self.controller_ca_file,
            **timeouts,
        )

    def bootstrap_servers(self, listener: str | None = None) -> str:
        """host:port of every broker on `listener` (default: the CLI's listener)."""
        names = [k.name for k in self.listener_kinds()]
        index = names.index(listener) if listener is not None else self.client_listener_index()
        return ",".join(
            f"{self.host}:{(b.listener_ports or [b.kafka_port])[index]}" for b in self.brokers
        )

    def bootstrap_servers_of(self, spec: BrokerSpec) -> str:
        """host:port of one broker on the CLI's listener."""
        ports = spec.listener_ports or [spec.kafka_port]
        return f"{self.host}:{ports[self.client_listener_index()]}"

    def all_ports(self) -> dict[str, int]:
        """Every port the cluster uses, by `component what` (e.g. `broker-1 kafka`)."""
        ports = {}
        for c in self.controllers:
            ports[f"controller-{c.node_id} raft"] = c.raft_port
            ports[f"controller-{c.node_id} api"] = c.api_port
        for b in self.brokers:
            if b.listener_ports and len(b.listener_ports) > 1:
                for kind, port in zip(self.listener_kinds(), b.listener_ports, strict=True):
                    ports[f"broker-{b.node_id} kafka {kind.name}"] = port
            else:
                ports[f"broker-{b.node_id} kafka"] = b.kafka_port
            if b.metrics_port:
                ports[f"broker-{b.node_id} metrics"] = b.metrics_port
            if b.shard_store_port:
                ports[f"broker-{b.node_id} shard-store"] = b.shard_store_port
        for component, store in self.embedded_stores().items():
            for name, port in store["ports"].items():
                ports[f"{component} {name}"] = port
        return ports

    def embedded_stores(self) -> dict[str, dict]:
        """Component name -> SeaweedConfig JSON of every embedded object store."""
        stores = {}
        if self.embedded_s3:
            stores["s3"] = self.embedded_s3
        if self.embedded_s3_failover:
            stores[FAILOVER_STORE] = self.embedded_s3_failover
        return stores

    def object_stores(self, pids: dict[str, int]) -> list[dict]:
        """`cluster status`'s `object_stores`: name, bucket ids, pid, endpoint of each
        embedded store (empty for external buckets)."""
        out = []
        for component, store in self.embedded_stores().items():
            endpoint = SeaweedConfig.from_json(store).endpoint
            out.append(
                {
                    "name": "main" if component == "s3" else "failover",
                    "component": component,
                    "bucket_ids": [b.bucket_id for b in self.buckets if endpoint in b.uri],
                    "pid": pids.get(component),
                    "endpoint": endpoint,
                    # where its data lives (DIR/s3, or under `cluster up --store-dir`)
                    "data_dir": store["data_dir"],
                }
            )
        return out


def broker_wal_uri(config: ClusterConfig, node_id: int) -> str:
    """An s3 cluster's broker WAL: objects under wal/node-N of the main (first) bucket,
    reached with the brokers' bucket credentials (the URI itself holds no secret)."""
    from dataplane.objectstore.bucket_uri import BucketURI

    main = BucketURI.parse(config.buckets[0].uri).bucket
    return f"s3://{main}/wal/node-{node_id}"


def effective_wal_capacity_bytes(config: ClusterConfig) -> int:
    """Each broker's WAL size: the configured one, else the broker's default."""
    from dataplane.config import WAL_CAPACITY_BYTES

    return config.broker_wal_capacity_bytes or WAL_CAPACITY_BYTES
