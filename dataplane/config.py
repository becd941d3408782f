"""The broker's configuration: the boundary between `automqctl` (which writes it) and the
broker process (which reads it), and the one source of the engine's defaults.

Pure: pydantic models and constants, no I/O; the CLI may import this module (not the
broker's internals).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from controlplane.records import BrokerEndpoint
from dataplane.formats.client_az import CidrAzMap

# defaults of the storage engine and the Kafka listener (AutoMQ's, scaled to one machine);
# StorageConfig and BrokerConfig both take them from here
WAL_CAPACITY_BYTES = 512 * 1024 * 1024
UPLOAD_THRESHOLD_BYTES = 64 * 1024 * 1024
UPLOAD_INTERVAL_S = 5.0
BLOCK_CACHE_BYTES = 512 * 1024 * 1024
MAX_REQUEST_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
RETENTION_CHECK_INTERVAL_MS = 300_000  # Kafka's log.retention.check.interval.ms


class BrokerConfig(BaseModel):
    """One broker process's configuration (written by `automqctl cluster up`)."""

    node_id: int = Field(ge=0)
    az: str
    host: str = "127.0.0.1"
    kafka_port: int = Field(ge=0, le=65535)
    data_dir: Path
    controllers: list[str]  # controller API addresses host:port
    heartbeat_interval_ms: int = Field(default=1_000, ge=50, le=60_000)
    # bucket URIs with credentials (this file is mode 0600); empty: no storage engine
    bucket_uris: str = ""
    wal_capacity_bytes: int = Field(default=WAL_CAPACITY_BYTES, ge=16 * 1024 * 1024)
    # the WAL's URI (file:///abs/path or s3://bucket/prefix); empty: a file in data_dir
    wal_uri: str = Field(default="", max_length=1024)
    upload_threshold_bytes: int = Field(default=UPLOAD_THRESHOLD_BYTES, ge=1024 * 1024)
    upload_interval_s: float = Field(default=UPLOAD_INTERVAL_S, gt=0, le=3600)
    block_cache_bytes: int = Field(default=BLOCK_CACHE_BYTES, ge=16 * 1024 * 1024)
    max_request_bytes: int = Field(default=MAX_REQUEST_BYTES, ge=1024 * 1024)
    # how often the partitions led here are checked against retention.ms / retention.bytes
    retention_check_interval_ms: int = Field(
        default=RETENTION_CHECK_INTERVAL_MS, ge=100, le=86_400_000
    )
    metrics_port: int = Field(default=0, ge=0, le=65535)  # 0: no /metrics endpoint
    # the erasure shard store's port (issue #14; 0: any free port, registered with the
    # controller); it keeps this broker's shards of erasure-coded partitions
    shard_store_port: int = Field(default=0, ge=0, le=65535)
    # benchmarks' slow node: the shard store can delay every write this long, switched on
    # and off at run time (POST /v1/inject-delay, with the cluster secret); 0: it cannot
    shard_store_inject_delay_ms: int = Field(default=0, ge=0, le=60_000)
    # object-storage failover: a tiny probe write to every bucket this often, so write
    # health is known without uploads (one PUT per bucket per interval; 0: uploads only)
    bucket_probe_interval_ms: int = Field(default=2_000, ge=0, le=600_000)
    # the controller API's bearer secret (this file is mode 0600); None: the API is open
    controller_api_secret: str | None = None
    # the CA of an HTTPS controller API (None: HTTP)
    controller_ca_file: str | None = None
    # the Kafka listener's security: SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256/512) with ACLs
    # when sasl_enabled, else PLAINTEXT without authorization
    sasl_enabled: bool = False
    # principals ("User:admin") every ACL check allows
    super_users: list[str] = Field(default_factory=list)
    # a listener on a non-loopback address without SASL refuses to start unless this is set
    allow_insecure: bool = False
    # TLS on the listener (SSL, or SASL_SSL with sasl_enabled): the certificate chain and key
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    # how this broker connects to the others (the transaction coordinator's WriteTxnMarkers):
    # on a SASL cluster a super-user login (this file is mode 0600; never on a command line),
    # and with TLS the CA the other brokers' certificates are checked against
    inter_broker_sasl_username: str | None = None
    inter_broker_sasl_password: str | None = Field(default=None, repr=False)
    inter_broker_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = (
        "SCRAM-SHA-512"
    )
    tls_ca_file: Path | None = None
    # Kafka's ssl.client.auth on SSL listeners: "required" (mutual TLS: a client certificate
    # signed by tls_ca_file, whose CN is the principal, "User:<CN>"), "requested", "none"
    ssl_client_auth: Literal["none", "requested", "required"] = "none"
    # this broker's client certificate (CN: its principal, a super user) for other brokers'
    # listeners that require one
    tls_client_cert_file: Path | None = None
    tls_client_key_file: Path | None = None

    @property
    def acls_enforced(self) -> bool:
        """ACLs are checked when clients can be told apart: SASL or client certificates."""
        return self.sasl_enabled or self.ssl_client_auth != "none"

    # several Kafka listeners, each its own socket and security protocol (Kafka's
    # `listeners` with `listener.security.protocol.map` resolved; the first is the one
    # brokers talk to each other on). None: one listener host:kafka_port whose protocol
    # follows sasl_enabled and the TLS certificate
    listeners: list[BrokerEndpoint] | None = Field(default=None, min_length=1, max_length=16)
    # Kafka's `advertised.listeners` resolved: what clients are told for each listener (the
    # same names, in order), when it differs from where it binds (0.0.0.0, NAT); None: as bound
    advertised_listeners: list[BrokerEndpoint] | None = Field(
        default=None, min_length=1, max_length=16
    )

    @model_validator(mode="after")
    def _unique_listeners(self) -> BrokerConfig:
        if self.listeners:
            from controlplane.listeners import check_unique

            check_unique(self.listeners)  # ListenerSpecError is a ValueError
        if self.advertised_listeners is not None:
            bound = [(e.name, e.security_protocol) for e in self.effective_listeners()]
            told = [(e.name, e.security_protocol) for e in self.advertised_listeners]
            if bound != told:
                raise ValueError(
                    "advertised_listeners must name the listeners, in order, with their protocols"
                )
        return self

    def registered_endpoints(self) -> list[BrokerEndpoint]:
        """What this broker registers (and clients are told): its listeners as advertised."""
        return list(self.advertised_listeners or self.effective_listeners())

    def effective_listeners(self) -> list[BrokerEndpoint]:
        """The listeners this broker serves (the single legacy one when `listeners` is
        unset: named after its protocol, as Kafka does)."""
        if self.listeners:
            return list(self.listeners)
        tls = self.tls_cert_file is not None and self.tls_key_file is not None
        protocol = ("SASL_" if self.sasl_enabled else "") + ("SSL" if tls else "PLAINTEXT")
        return [
            BrokerEndpoint(
                name=protocol, host=self.host, port=self.kafka_port, security_protocol=protocol
            )
        ]

    # the zone router: client address ranges (CIDR) -> AZ, for clients whose client.id does
    # not say `automq_az=` (e.g. {"10.0.1.0/24": "az1"})
    client_az_cidrs: dict[str, str] = Field(default_factory=dict, max_length=10_000)

    @field_validator("client_az_cidrs")
    @classmethod
    def _valid_cidrs(cls, value: dict[str, str]) -> dict[str, str]:
        CidrAzMap.parse(value)  # ValueError names the bad entry
        return value
