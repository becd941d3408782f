"""The broker's configuration: the boundary between `automqctl` (which writes it) and the
broker process (which reads it), and the one source of the engine's defaults.

One tree: `BrokerConfig` holds the broker's own settings and one section per component
(`storage`, `wal`, `object_store`, `groups`, `zone_router`, `erasure`, `network`); each
section is the model that component takes, so a setting is defined, bounded and defaulted
once, and every one can be given in the broker's JSON config file. `docs/configuration.md` is generated from
these models (`python -m dataplane.config_reference`).

Pure: pydantic models and constants, no I/O; the CLI may import this module (not the
broker's internals). Layer: above `controlplane` and `dataplane.objectstore` (whose
`ObjectStorageConfig` it nests), below the engines that take its sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from controlplane.records import BrokerEndpoint
from controlplane.settings import MAX_PARTITIONS_PER_TOPIC
from controlplane.topic_configs import (
    BROKER_SCHEMA,
    ERASURE_REPAIR_DELAY_MS,
    ERASURE_REPAIR_ENABLE,
    ERASURE_REPAIR_RATE,
)
from dataplane.formats.client_az import CidrAzMap
from dataplane.objectstore import ObjectStorageConfig

KiB = 1024
MiB = 1024 * KiB

# defaults used by more than one model or module (AutoMQ's, scaled to one machine)
WAL_CAPACITY_BYTES = 512 * MiB
UPLOAD_THRESHOLD_BYTES = 64 * MiB
UPLOAD_INTERVAL_S = 5.0
UPLOAD_SEND_MIN_BYTES_PER_S = 16 * MiB
MAX_REQUEST_BYTES = 100 * MiB  # Kafka's socket.request.max.bytes
DEFAULT_PARTITIONS = 1  # Kafka's num.partitions
RETENTION_CHECK_INTERVAL_MS = 300_000  # Kafka's log.retention.check.interval.ms
# CPython's own default (sys.getswitchinterval()): 1 ms measured no better on a busy
# 2-core machine (issue 28: 7 runs each, in turns, load ~16)
GIL_SWITCH_INTERVAL_MS = 5.0
# one partition's records in one produce request (the broker refuses more)
MAX_PARTITION_PRODUCE_BYTES = 8 * MiB
# a WAL record is one such produce plus its stream header; a smaller limit failed such
# produces as NOT_LEADER
WAL_MAX_RECORD_BYTES = MAX_PARTITION_PRODUCE_BYTES + 64 * KiB
WAL_MAX_BATCH_BYTES = MAX_PARTITION_PRODUCE_BYTES + 128 * KiB  # one record and its header
WAL_MAX_QUEUE_BYTES = 64 * MiB
WAL_QUEUE_WAIT_TIMEOUT_S = 30.0
# the broker's object-storage pool: uploads, reads and the zone router share it
BROKER_OBJECT_STORE_CONCURRENCY = 64
# erasure repair: the dynamic broker configs' documented defaults are the static ones too
ERASURE_REPAIR_BYTES_PER_S = int(BROKER_SCHEMA[ERASURE_REPAIR_RATE].default)


class _Section(BaseModel):
    """A config section: immutable, unknown keys refused (a typo is an error, not a no-op)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class StorageConfig(_Section):
    """The storage engine (`S3Storage` and its `ObjectUploader`): uploads, caches, limits."""

    upload_threshold_bytes: int = Field(
        UPLOAD_THRESHOLD_BYTES,
        ge=4 * KiB,
        description="acknowledged bytes in the log cache that start an upload (the broker "
        "caps it at a quarter of the WAL capacity)",
    )
    upload_interval_s: float = Field(
        UPLOAD_INTERVAL_S,
        gt=0,
        le=3600,
        description="longest time acknowledged records wait before they are uploaded",
    )
    max_object_bytes: int = Field(
        256 * MiB, ge=1 * MiB, le=5 * 1024 * MiB, description="largest object an upload writes"
    )
    stream_split_bytes: int = Field(
        8 * MiB,
        ge=0,
        description="a stream with at least this much data in an upload gets its own "
        "stream object; the rest share one stream-set object",
    )
    block_size_bytes: int = Field(
        512 * KiB, ge=4 * KiB, le=64 * MiB, description="data block size inside objects"
    )
    log_cache_uploaded_bytes: int = Field(
        256 * MiB,
        ge=0,
        description="uploaded records kept in the log cache for tail reads",
    )
    block_cache_bytes: int = Field(
        512 * MiB, ge=1 * MiB, description="cache of data blocks read from objects"
    )
    prepared_ttl_ms: int = Field(
        3_600_000,
        ge=1_000,
        description="how long prepared object ids stay valid before the controller "
        "destroys their objects",
    )
    upload_attempts: int = Field(
        8, ge=1, le=100, description="attempts of an object PUT before the upload fails"
    )
    upload_send_min_bytes_per_s: int = Field(
        UPLOAD_SEND_MIN_BYTES_PER_S,
        ge=0,
        description="regular uploads are sent at twice the rate their data arrived at, "
        "at least this fast, so the object store's work on them is spread out (a burst of "
        "it takes the cores produce requests need); 0: as fast as the store takes them "
        "(also when the WAL is half full, and for flushes)",
    )
    wal_full_wait_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="longest an append waits for WAL space (uploads trim the WAL)",
    )
    close_wait_s: float = Field(
        30.0, gt=0, le=3600, description="longest closing a stream waits for its upload"
    )
    max_readers: int = Field(
        10_000, ge=1, description="open stream readers kept (least recently used go)"
    )
    reader_idle_s: float = Field(60.0, gt=0, description="an idle stream reader is closed after")


class FileWALConfig(_Section):
    """The local-file WAL (`FileWAL`, dataplane/s3stream/wal/file_wal.py): group commit."""

    max_record_bytes: int = Field(
        WAL_MAX_RECORD_BYTES, gt=0, description="largest record (one produce) accepted"
    )
    max_batch_bytes: int = Field(
        WAL_MAX_BATCH_BYTES,
        gt=0,
        description="most bytes written by one group commit (one fdatasync); holds one "
        "max_record_bytes record and its header, a multiple of align_bytes",
    )
    max_queue_bytes: int = Field(
        WAL_MAX_QUEUE_BYTES,
        gt=0,
        description="most bytes queued and not yet written (>= max_batch_bytes); appends "
        "wait while the queue is full",
    )
    linger_s: float = Field(
        0.0,
        ge=0,
        le=1,
        description="how long the committer thread waits for more appends before a smaller "
        "group commit",
    )
    close_timeout_s: float = Field(
        30.0, gt=0, description="longest closing waits for the writer to drain"
    )
    scan_chunk_bytes: int = Field(1 * MiB, ge=4096, description="read size of the recovery scan")
    align_bytes: int = Field(
        4096,
        ge=0,
        description="each batch is padded to this boundary (0 or 1: none; else a power of "
        "two up to 64 KiB) so it starts on a fresh page",
    )
    direct_io: bool = Field(
        True,
        description="write each group commit that starts and ends on a 4 KiB boundary "
        "with O_DIRECT from a reused aligned buffer (no page-cache copy and writeback: "
        "less kernel CPU); off, or on a filesystem without O_DIRECT: buffered writes. "
        "Every acknowledgement still waits for fdatasync",
    )
    prefill_ahead_bytes: int = Field(
        64 * MiB,
        ge=0,
        description="in a new file, zeros are written this far ahead of the writer during "
        "the first lap (appends into unwritten extents are slower); 0: off",
    )


class ObjectWALConfig(_Section):
    """The object-storage WAL (`ObjectWAL`, dataplane/s3stream/wal/object_wal.py), also
    the zone router's RouterChannel."""

    max_record_bytes: int = Field(
        WAL_MAX_RECORD_BYTES, gt=0, description="largest record (one produce) accepted"
    )
    max_batch_bytes: int = Field(
        WAL_MAX_BATCH_BYTES,
        gt=0,
        description="most record bytes in one object (one PUT); holds one max_record_bytes "
        "record and its header",
    )
    max_queue_bytes: int = Field(
        WAL_MAX_QUEUE_BYTES,
        gt=0,
        description="most bytes queued and not yet PUT (>= max_batch_bytes)",
    )
    linger_s: float = Field(
        0.002, ge=0, le=1, description="how long the writer waits for more appends"
    )
    max_in_flight: int = Field(
        4, ge=1, le=64, description="PUTs running at once (acknowledged in order)"
    )
    queue_wait_timeout_s: float = Field(
        WAL_QUEUE_WAIT_TIMEOUT_S,
        gt=0,
        description="longest a worker thread waits for room in a full queue "
        "(`append_waiting`: the RouterChannel's appends; the engine's appends never wait)",
    )
    put_timeout_s: float = Field(
        60.0, gt=0, description="longest one PUT (with its retries) takes before the WAL fails"
    )
    hedge_after_s: float = Field(
        1.0,
        gt=0,
        description="a PUT not answered after this long is sent again (same key and bytes)",
    )
    max_hedges: int = Field(3, ge=0, le=10, description="most extra copies of one PUT")
    stall_switch_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="a PUT unanswered this long moves the appends to a segment in another "
        "bucket that answers (the RouterChannel, s3:// WALs; `segmented_wal.py`)",
    )
    return_after_s: float = Field(
        30.0,
        ge=0,
        le=3600,
        description="a bucket left for a stalled or failed PUT is written again after this "
        "long at least (while the metadata still names it active)",
    )
    close_timeout_s: float = Field(60.0, gt=0, description="longest close (and trim) waits")
    read_parallelism: int = Field(
        16, ge=1, le=64, description="objects fetched at once by recovery"
    )


class WALConfig(_Section):
    """The broker's write-ahead log: where it lives, its size, and its implementation's
    tuning (the URI's scheme picks `file` or `object`)."""

    uri: str = Field(
        "",
        max_length=1024,
        description="file:///abs/path or s3://bucket/prefix (a configured bucket's name); "
        "empty: a file under data_dir/storage",
    )
    capacity_bytes: int = Field(
        WAL_CAPACITY_BYTES,
        ge=16 * MiB,
        description="most acknowledged, not yet uploaded bytes (the file's ring size)",
    )
    file: FileWALConfig = Field(default_factory=FileWALConfig, description="a file:// WAL")
    object: ObjectWALConfig = Field(default_factory=ObjectWALConfig, description="an s3:// WAL")


class GroupCoordinatorConfig(_Section):
    """The consumer-group coordinator (`GroupCoordinator`): limits and timings, named after
    Kafka's broker configs."""

    group_initial_rebalance_delay_ms: int = Field(
        300,
        ge=0,
        description="how long a rebalance of an Empty group waits for more members "
        "(extended while members keep arriving, never beyond the rebalance timeout)",
    )
    group_min_session_timeout_ms: int = Field(
        6_000, gt=0, description="shortest session timeout accepted"
    )
    group_max_session_timeout_ms: int = Field(
        1_800_000, gt=0, description="longest session timeout accepted"
    )
    max_rebalance_timeout_ms: int = Field(
        1_800_000, gt=0, description="members' rebalance timeouts are clamped to this"
    )
    new_member_join_timeout_ms: int = Field(
        300_000,
        gt=0,
        description="a new member whose first JoinGroup is still pending is removed after",
    )
    group_max_size: int = Field(
        1_000, gt=0, description="members per group (including those not rejoined yet)"
    )
    max_groups: int = Field(
        10_000, gt=0, description="groups held in memory; Empty groups are evicted first"
    )
    max_group_id_length: int = Field(1_024, gt=0, description="longer group ids are refused")
    max_protocols_per_member: int = Field(64, gt=0, description="protocols of one JoinGroup")
    max_protocol_name_length: int = Field(256, gt=0, description="of a JoinGroup protocol")
    max_member_metadata_bytes: int = Field(
        1 * MiB, gt=0, description="metadata of all protocols of one member"
    )
    max_assignment_bytes: int = Field(1 * MiB, gt=0, description="one member's assignment")
    consumer_heartbeat_interval_ms: int = Field(
        5_000,
        gt=0,
        description="KIP-848 consumer groups: the heartbeat interval told to members "
        "(Kafka's group.consumer.heartbeat.interval.ms)",
    )
    consumer_reconciling_heartbeat_interval_ms: int = Field(
        500,
        gt=0,
        description="KIP-848 consumer groups: the heartbeat interval told to a member that "
        "waits for partitions another member still has to release, or has partitions to "
        "revoke, until it is reconciled (not in Kafka: shortens a handover by up to one "
        "heartbeat interval)",
    )
    consumer_session_timeout_ms: int = Field(
        45_000,
        gt=0,
        description="KIP-848 consumer groups: a member not heard from for this long is "
        "fenced (Kafka's group.consumer.session.timeout.ms)",
    )
    consumer_max_size: int = Field(
        1_000, gt=0, description="members per KIP-848 consumer group (group.consumer.max.size)"
    )
    consumer_assignors: tuple[str, ...] = Field(
        ("uniform", "range"),
        min_length=1,
        description="server-side assignors of KIP-848 consumer groups, the first is the "
        "default (group.consumer.assignors; known: uniform, range)",
    )

    @model_validator(mode="after")
    def _session_bounds(self) -> GroupCoordinatorConfig:
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ValueError("need group_min_session_timeout_ms <= group_max_session_timeout_ms")
        unknown = set(self.consumer_assignors) - {"uniform", "range"}
        if unknown:
            raise ValueError(
                f"unknown consumer_assignors {sorted(unknown)} (known: uniform, range)"
            )
        return self


class ShareGroupsConfig(_Section):
    """Share groups (KIP-932, `dataplane/kafka/share/`): named after Kafka's `group.share.*`
    broker configs."""

    record_lock_duration_ms: int = Field(
        30_000,
        ge=1_000,
        le=3_600_000,
        description="how long a delivered record stays locked to its consumer "
        "(group.share.record.lock.duration.ms)",
    )
    delivery_count_limit: int = Field(
        5,
        ge=2,
        le=10,
        description="deliveries after which a record is archived "
        "(group.share.delivery.count.limit)",
    )
    partition_max_record_locks: int = Field(
        2_000,
        ge=100,
        le=10_000,
        description="in-flight records per share-partition "
        "(group.share.partition.max.record.locks)",
    )
    session_timeout_ms: int = Field(
        45_000,
        ge=1_000,
        le=1_800_000,
        description="a member without a heartbeat for this long leaves "
        "(group.share.session.timeout.ms)",
    )
    heartbeat_interval_ms: int = Field(
        5_000, ge=100, le=60_000, description="(group.share.heartbeat.interval.ms)"
    )
    auto_offset_reset: Literal["latest", "earliest"] = Field(
        "latest",
        description="where a share group starts reading a partition it never read "
        "(share.auto.offset.reset)",
    )
    max_groups: int = Field(1_000, gt=0, description="share groups per coordinator")
    group_max_size: int = Field(200, gt=0, description="members per share group")
    max_share_sessions: int = Field(
        1_000, gt=0, description="share sessions per broker (group.share.max.share.sessions)"
    )


class ZoneRouterConfig(_Section):
    """The zone router: how clients' AZs are told, and its RouterChannel."""

    client_az_cidrs: dict[str, str] = Field(
        default_factory=dict,
        max_length=10_000,
        description='client address ranges -> AZ (e.g. {"10.0.1.0/24": "az1"}) for '
        "clients whose client.id does not say automq_az= and whose Fetch carries no "
        "client.rack (`cluster up --client-az-cidrs`, topology client_az_cidrs)",
    )
    channel: ObjectWALConfig = Field(
        default_factory=ObjectWALConfig,
        description="the RouterChannel (an object WAL in the active bucket)",
    )
    channel_mode: Literal["all", "az_clients"] = Field(
        "all",
        description="which produce at a main goes through its own RouterChannel when other "
        'AZs have brokers: "all" (every client: remote-AZ consumers read every record from '
        'object storage within ms; produce waits for the channel\'s PUT) or "az_clients" '
        "(only clients with a declared or detected AZ; a client without one is appended "
        "straight to the WAL, faster, and consumers in other AZs read its records only once "
        "the main uploaded them) (`cluster up --zone-router-channel-mode`, topology "
        "zone_router_channel_mode; docs/operations.md)",
    )

    @field_validator("client_az_cidrs")
    @classmethod
    def _valid_cidrs(cls, value: dict[str, str]) -> dict[str, str]:
        CidrAzMap.parse(value)  # ValueError names the bad entry
        return value


class SealConfig(_Section):
    """The sealer of erasure-coded partitions (`ErasureSealer`): how often and how far
    behind the visible end they are sealed into objects, and their repair."""

    interval_ms: int = Field(1_000, ge=10, description="how often partitions are sealed")
    max_object_bytes: int = Field(
        64 * MiB, ge=1 * MiB, description="largest object one seal writes"
    )
    prepared_ttl_ms: int = Field(
        600_000, ge=1_000, description="how long a seal's prepared object id stays valid"
    )
    repair: bool = Field(
        BROKER_SCHEMA[ERASURE_REPAIR_ENABLE].default == "true",
        description="fill the holes of offsets no writer completed (the dynamic broker "
        f"config {ERASURE_REPAIR_ENABLE} overrides it)",
    )
    repair_delay_ms: int = Field(
        int(BROKER_SCHEMA[ERASURE_REPAIR_DELAY_MS].default),
        ge=0,
        description="offsets younger than this are not repaired yet (the writer's own "
        f"shards are landing; {ERASURE_REPAIR_DELAY_MS} overrides it)",
    )
    repair_max_bytes_per_s: int = Field(
        ERASURE_REPAIR_BYTES_PER_S,
        ge=1,
        description=f"repair bandwidth ({ERASURE_REPAIR_RATE} overrides it)",
    )
    repair_pass_max_ms: int = Field(
        2_000,
        ge=10,
        description="how long one partition's repair pass may go on (it always looks at "
        "one offset); the next pass resumes where it stopped, after the sealer's other work",
    )


class ErasureConfig(_Section):
    """Erasure-coded partitions: this broker's shard store and the sealer."""

    shard_store_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="the shard store's port (0: any free port, registered with the "
        "controller); it keeps this broker's shards of erasure-coded partitions",
    )
    seal: SealConfig = Field(default_factory=SealConfig, description="the sealer")


class NetworkConfig(_Section):
    """The Kafka listeners' network limits (`NetworkLimits`, dataplane/kafka/network_limits.py;
    seed 002): producer traffic first, tail reads next, catch-up reads last. The object
    store's own limits are `object_store.read_bandwidth_bytes_per_s` and
    `object_store.write_bandwidth_bytes_per_s`."""

    ingress_bytes_per_s: int = Field(
        0,
        ge=0,
        description="produced record bytes accepted per second (0: unlimited); a produce "
        "that gets no room before 80% of its timeout is answered REQUEST_TIMED_OUT",
    )
    egress_bytes_per_s: int = Field(
        0,
        ge=0,
        description="fetched record bytes sent per second (0: unlimited): tail reads (from "
        "memory) before catch-up reads (from object storage); a fetch waits at most its "
        "max_wait_ms, then sends what the limit allows",
    )
    burst_ms: int = Field(
        1_000, ge=10, le=60_000, description="each limit lets this long's bytes go at once"
    )
    max_waiters: int = Field(
        1_024,
        ge=1,
        le=100_000,
        description="requests waiting for each limit (more: answered at once, a fetch with "
        "no records, a produce REQUEST_TIMED_OUT)",
    )


def _broker_object_store() -> ObjectStorageConfig:
    return ObjectStorageConfig(max_concurrency=BROKER_OBJECT_STORE_CONCURRENCY)


# keys of configs written before the sections existed -> where they live now
LEGACY_FLAT_KEYS: dict[str, tuple[str, str]] = {
    "wal_capacity_bytes": ("wal", "capacity_bytes"),
    "wal_uri": ("wal", "uri"),
    "upload_threshold_bytes": ("storage", "upload_threshold_bytes"),
    "upload_interval_s": ("storage", "upload_interval_s"),
    "block_cache_bytes": ("storage", "block_cache_bytes"),
    "shard_store_port": ("erasure", "shard_store_port"),
    "client_az_cidrs": ("zone_router", "client_az_cidrs"),
}
# keys of configs written before that are no product settings any more
LEGACY_DROPPED_KEYS = frozenset({"shard_store_inject_delay_ms"})  # a benchmark's knob


def upgrade_flat_config(data: Any) -> Any:
    """A config dict written before the sections existed, with its flat keys moved into
    their sections (a key given both ways must agree) and dropped keys removed; anything
    else is returned as it is."""
    if not isinstance(data, dict) or not (
        data.keys() & (LEGACY_FLAT_KEYS.keys() | LEGACY_DROPPED_KEYS)
    ):
        return data
    out = {k: v for k, v in data.items() if k not in LEGACY_DROPPED_KEYS}
    for old, (section, key) in LEGACY_FLAT_KEYS.items():
        if old not in out:
            continue
        value = out.pop(old)
        given = out.get(section) or {}
        if isinstance(given, BaseModel):
            given = given.model_dump()
        if key in given and given[key] != value:
            raise ValueError(f"{old} and {section}.{key} disagree: give {section}.{key} only")
        out[section] = {**given, key: value}
    return out


class BrokerConfig(BaseModel):
    """One broker process's configuration (written by `automqctl cluster up`)."""

    model_config = ConfigDict(extra="forbid")

    node_id: int = Field(ge=0, description="this broker's node id")
    az: str = Field(description="this broker's availability zone")
    host: str = Field("127.0.0.1", description="the address the broker binds and registers")
    kafka_port: int = Field(ge=0, le=65535, description="the Kafka listener's port")
    data_dir: Path = Field(description="the broker's directory (WAL file, shard store)")
    controllers: list[str] = Field(description="controller API addresses host:port")
    heartbeat_interval_ms: int = Field(
        1_000, ge=50, le=60_000, description="how often the broker heartbeats the controller"
    )
    bucket_uris: str = Field(
        "",
        description="bucket URIs with credentials (this file is mode 0600); empty: no "
        "storage engine",
    )
    max_request_bytes: int = Field(
        MAX_REQUEST_BYTES,
        ge=1 * MiB,
        description="largest Kafka request accepted (Kafka's socket.request.max.bytes)",
    )
    retention_check_interval_ms: int = Field(
        RETENTION_CHECK_INTERVAL_MS,
        ge=100,
        le=86_400_000,
        description="how often the partitions led here are checked against retention.ms "
        "and retention.bytes",
    )
    metrics_port: int = Field(0, ge=0, le=65535, description="0: no /metrics endpoint")
    num_partitions: int = Field(
        DEFAULT_PARTITIONS,
        ge=1,
        le=MAX_PARTITIONS_PER_TOPIC,
        description="partitions of a topic created without a count: auto-created, or "
        "CreateTopics with -1 (Kafka's num.partitions)",
    )
    auto_create_topics_enable: bool = Field(
        True,
        description="a Metadata request may create the missing topics it names (Kafka's "
        "auto.create.topics.enable; the client must allow it too)",
    )
    gil_switch_interval_ms: float = Field(
        GIL_SWITCH_INTERVAL_MS,
        gt=0,
        le=100,
        description="how long a thread may run Python while another waits for the GIL "
        "(sys.setswitchinterval): a WAL thread done with its fdatasync, or the event loop, "
        "waits up to this long while another thread runs Python",
    )
    bucket_probe_interval_ms: int = Field(
        2_000,
        ge=0,
        le=600_000,
        description="object-storage failover: a tiny probe write to every bucket this often, "
        "so write health is known without uploads (0: uploads only)",
    )
    controller_api_secret: str | None = Field(
        None,
        description="the controller API's bearer secret (this file is mode 0600); None: "
        "the API is open",
    )
    controller_ca_file: str | None = Field(
        None, description="the CA of an HTTPS controller API (None: HTTP)"
    )
    sasl_enabled: bool = Field(
        False,
        description="the Kafka listener's security: SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256/512) "
        "with ACLs when set, else PLAINTEXT without authorization",
    )
    super_users: list[str] = Field(
        default_factory=list, description='principals ("User:admin") every ACL check allows'
    )
    allow_insecure: bool = Field(
        False,
        description="a listener on a non-loopback address without SASL refuses to start "
        "unless this is set",
    )
    tls_cert_file: Path | None = Field(
        None, description="TLS on the listener (SSL, or SASL_SSL): the certificate chain"
    )
    tls_key_file: Path | None = Field(None, description="TLS on the listener: the key")
    inter_broker_sasl_username: str | None = Field(
        None,
        description="how this broker logs in to the others on a SASL cluster (a super user; "
        "never on a command line)",
    )
    inter_broker_sasl_password: str | None = Field(
        default=None, repr=False, description="the inter-broker login's password"
    )
    inter_broker_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "SCRAM-SHA-512", description="the inter-broker login's SASL mechanism"
    )
    tls_ca_file: Path | None = Field(
        None,
        description="the CA the other brokers' (and clients') certificates are checked against",
    )
    ssl_client_auth: Literal["none", "requested", "required"] = Field(
        "none",
        description='Kafka\'s ssl.client.auth on SSL listeners: "required" (mutual TLS: a '
        'client certificate signed by tls_ca_file, whose CN is the principal "User:<CN>")',
    )
    tls_client_cert_file: Path | None = Field(
        None,
        description="this broker's client certificate (CN: its principal, a super user) for "
        "other brokers' listeners that require one",
    )
    tls_client_key_file: Path | None = Field(None, description="its key")
    listeners: list[BrokerEndpoint] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="several Kafka listeners, each its own socket and security protocol "
        "(the first is the one brokers talk to each other on); None: one listener "
        "host:kafka_port whose protocol follows sasl_enabled and the TLS certificate",
    )
    advertised_listeners: list[BrokerEndpoint] | None = Field(
        default=None,
        min_length=1,
        max_length=16,
        description="what clients are told for each listener (the same names, in order) "
        "when it differs from where it binds; None: as bound",
    )
    storage: StorageConfig = Field(default_factory=StorageConfig, description="storage engine")
    wal: WALConfig = Field(default_factory=WALConfig, description="write-ahead log")
    object_store: ObjectStorageConfig = Field(
        default_factory=_broker_object_store,
        description="the broker's object storage client (uploads, reads, WAL, zone router)",
    )
    groups: GroupCoordinatorConfig = Field(
        default_factory=GroupCoordinatorConfig, description="consumer-group coordinator"
    )
    zone_router: ZoneRouterConfig = Field(
        default_factory=ZoneRouterConfig, description="zone router"
    )
    erasure: ErasureConfig = Field(
        default_factory=ErasureConfig, description="erasure-coded partitions"
    )
    network: NetworkConfig = Field(
        default_factory=NetworkConfig, description="network limits of the Kafka listeners"
    )
    share_groups: ShareGroupsConfig = Field(
        default_factory=ShareGroupsConfig, description="share groups (KIP-932)"
    )

    @model_validator(mode="before")
    @classmethod
    def _upgrade_flat_keys(cls, data: Any) -> Any:
        return upgrade_flat_config(data)

    @property
    def acls_enforced(self) -> bool:
        """ACLs are checked when clients can be told apart: SASL or client certificates."""
        return self.sasl_enabled or self.ssl_client_auth != "none"

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

    def engine_storage(self) -> StorageConfig:
        """The storage section as the engine runs it: the upload threshold at most a
        quarter of the WAL, so a small WAL (tests) uploads long before it is full, not only
        on the interval."""
        cap = self.wal.capacity_bytes // 4
        if self.storage.upload_threshold_bytes <= cap:
            return self.storage
        return self.storage.model_copy(update={"upload_threshold_bytes": cap})
