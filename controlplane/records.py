"""The metadata log's record types.

Every change to cluster metadata is one of these records, appended to the Raft-replicated
metadata log and applied to a `MetadataImage` (see `image.py`) by controllers and by brokers
alike. Records are pydantic models tagged by `type` so the log can be stored and shipped as
JSON and decoded with one discriminated union.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------- brokers and nodes


class BrokerEndpoint(BaseModel):
    """One Kafka listener of a broker: its name (as in Kafka's `listeners`, e.g. INTERNAL),
    address and security protocol. Clients are told the endpoints of the listener they
    connected on."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    host: str = Field(min_length=1, max_length=255)
    port: int = Field(ge=0, le=65535)
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


class RegisterBrokerRecord(_Record):
    """A broker (re)registered; it gets a new node epoch and starts fenced. `host` and
    `kafka_port` are its first listener (the one brokers talk to each other on); `endpoints`
    all its listeners (None in records written before brokers had several)."""

    type: Literal["register_broker"] = "register_broker"
    node_id: int
    node_epoch: int
    az: str
    host: str
    kafka_port: int
    incarnation_id: str
    registered_ms: int
    endpoints: tuple[BrokerEndpoint, ...] | None = None
    shard_store_port: int = 0  # its erasure shard store (0: none)


class FenceBrokerRecord(_Record):
    """The broker's session expired (or it shut down): it may no longer write."""

    type: Literal["fence_broker"] = "fence_broker"
    node_id: int
    node_epoch: int
    reason: str


class UnfenceBrokerRecord(_Record):
    """The broker caught up with the metadata log and heartbeats: it may serve."""

    type: Literal["unfence_broker"] = "unfence_broker"
    node_id: int
    node_epoch: int


class BrokerShuttingDownRecord(_Record):
    """Controlled shutdown began: the broker gets no new partitions while it hands its
    current ones over, but may still upload and close its streams."""

    type: Literal["broker_shutting_down"] = "broker_shutting_down"
    node_id: int
    node_epoch: int


class UnregisterBrokerRecord(_Record):
    type: Literal["unregister_broker"] = "unregister_broker"
    node_id: int


class NodeWALMetadataRecord(_Record):
    """Where a node's WAL lives and whether another node is recovering it (failover mode).

    In failover mode `failover_target_node_id` takes the WAL over with the reservation
    (target node, `node_epoch`): `node_epoch` is then the failover epoch, greater than any
    epoch the failed node wrote with, so the failed node can no longer acknowledge appends.
    """

    type: Literal["node_wal"] = "node_wal"
    node_id: int
    node_epoch: int
    wal_uri: str
    failover_mode: bool = False
    failover_target_node_id: int | None = None


# ---------------------------------------------------------------- topics and partitions


class TopicRecord(_Record):
    type: Literal["topic"] = "topic"
    topic_id: str
    name: str
    configs: dict[str, str] = Field(default_factory=dict)


class PartitionKind(str, Enum):
    """How a partition is served: by its one leader, or leaderless and erasure-coded (every
    broker serves it through the shard stores that keep its shards, issue #14)."""

    LEADER = "leader"
    ERASURE = "erasure"


NO_LEADER = -1  # the leader_node_id of a partition that has no leader (erasure-coded)


def with_partition_kind(fields: Any) -> Any:
    """The upgrade path of partitions written before they had a `kind` (records in the
    metadata log, image snapshots): such a partition is erasure-coded if it has shard stores
    (it then also has no leader), else it has a leader. Fields that name a kind, or that are
    not a mapping, are returned unchanged."""
    if not isinstance(fields, dict) or "kind" in fields:
        return fields
    kind = PartitionKind.ERASURE if fields.get("shard_stores") else PartitionKind.LEADER
    return {**fields, "kind": kind}


def check_partition_kind(
    kind: PartitionKind, leader_node_id: int, shard_stores: list[int], where: str
) -> None:
    """Raises ValueError unless the placement fits the kind: an erasure-coded partition has
    shard stores and no leader, a led partition has no shard stores."""
    if kind is PartitionKind.ERASURE and (not shard_stores or leader_node_id != NO_LEADER):
        raise ValueError(f"{where}: an erasure-coded partition has shard stores and no leader")
    if kind is PartitionKind.LEADER and shard_stores:
        raise ValueError(f"{where}: a partition with a leader has no shard stores")


class PartitionRecord(_Record):
    """A partition's placement. The stream epoch equals the leader epoch.

    `kind` says how it is served; an erasure-coded partition has no leader
    (`leader_node_id` is NO_LEADER) and its `shard_stores` list the brokers whose shard
    stores keep shard i of every offset. Records written before partitions had a kind are
    read as `with_partition_kind` says."""

    type: Literal["partition"] = "partition"
    topic_id: str
    partition: int
    kind: PartitionKind
    leader_node_id: int
    leader_epoch: int
    stream_id: int
    shard_stores: list[int] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _upgrade_pre_kind_record(cls, fields: Any) -> Any:
        return with_partition_kind(fields)

    @model_validator(mode="after")
    def _placement_fits_kind(self) -> PartitionRecord:
        check_partition_kind(
            self.kind,
            self.leader_node_id,
            self.shard_stores,
            f"partition {self.topic_id}-{self.partition}",
        )
        return self


class RemoveTopicRecord(_Record):
    type: Literal["remove_topic"] = "remove_topic"
    topic_id: str


# ---------------------------------------------------------------- streams


class StreamState(str, Enum):
    OPENED = "opened"
    CLOSED = "closed"


class CreateStreamRecord(_Record):
    type: Literal["create_stream"] = "create_stream"
    stream_id: int
    tags: dict[str, str] = Field(default_factory=dict)


class StreamEpochRecord(_Record):
    """Open (new epoch, owner node) or close a stream; opening starts a new range."""

    type: Literal["stream_epoch"] = "stream_epoch"
    stream_id: int
    epoch: int
    state: StreamState
    node_id: int


class RangeRecord(_Record):
    """One range of a stream: the offsets one epoch of one node wrote."""

    type: Literal["range"] = "range"
    stream_id: int
    range_index: int
    epoch: int
    start_offset: int
    end_offset: int
    node_id: int


class TrimStreamRecord(_Record):
    type: Literal["trim_stream"] = "trim_stream"
    stream_id: int
    start_offset: int
    trimmed_ms: int = 0  # when (retention or DeleteRecords); 0 in logs written before it


class AbortedTxnsRecord(_Record):
    """Transactions aborted in a partition's stream, in marker order: each producer's
    batches in [first offset, marker offset] are not for read_committed consumers (Kafka's
    `.txnindex` entries). Kept with the stream until its start passes their marker."""

    type: Literal["aborted_txns"] = "aborted_txns"
    stream_id: int
    entries: list[tuple[int, int, int]]  # (producer id, first offset, marker offset)


class CleanerCheckpointRecord(_Record):
    """The log cleaner of a compacted partition's stream: offsets below `cleaned_offset`
    are clean (each key at most once), as of its run at `cleaned_ms`."""

    type: Literal["cleaner_checkpoint"] = "cleaner_checkpoint"
    stream_id: int
    cleaned_offset: int
    cleaned_ms: int


class DeleteStreamRecord(_Record):
    type: Literal["delete_stream"] = "delete_stream"
    stream_id: int


# ---------------------------------------------------------------- objects


class ObjectState(str, Enum):
    PREPARED = "prepared"
    COMMITTED = "committed"
    MARK_DESTROYED = "mark_destroyed"


class S3ObjectRecord(_Record):
    """An object's lifecycle: PREPARED -> COMMITTED -> MARK_DESTROYED -> (removed)."""

    type: Literal["s3_object"] = "s3_object"
    object_id: int
    state: ObjectState
    bucket_id: int = 0
    size_bytes: int = 0
    prepared_ms: int = 0
    deadline_ms: int = 0
    committed_ms: int = 0
    mark_destroyed_ms: int = 0


class RemoveS3ObjectRecord(_Record):
    """The object was deleted from its bucket; forget it."""

    type: Literal["remove_s3_object"] = "remove_s3_object"
    object_id: int


class StreamOffsetRange(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stream_id: int
    start_offset: int
    end_offset: int


class StreamSetObjectRecord(_Record):
    """A stream-set object: many streams' data uploaded by one node in one object."""

    type: Literal["stream_set_object"] = "stream_set_object"
    object_id: int
    node_id: int
    order_id: int
    ranges: tuple[StreamOffsetRange, ...]
    committed_ms: int


class RemoveStreamSetObjectRecord(_Record):
    type: Literal["remove_stream_set_object"] = "remove_stream_set_object"
    object_id: int


class StreamObjectRecord(_Record):
    """A stream object: one stream's contiguous offsets in one object."""

    type: Literal["stream_object"] = "stream_object"
    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int
    committed_ms: int


class RemoveStreamObjectRecord(_Record):
    type: Literal["remove_stream_object"] = "remove_stream_object"
    object_id: int
    stream_id: int


# ---------------------------------------------------------------- group coordinators


class CoordinatorSlotAssignment(BaseModel):
    """One slot's owner: the broker that coordinates the groups hashed to `slot`.

    `epoch` grows by one each time the slot changes owner (Kafka's coordinator epoch, the
    leader epoch of a `__consumer_offsets` partition): offset writes carry it, so an owner
    that lost the slot can no longer write.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    slot: int
    node_id: int
    epoch: int


class CoordinatorSlotsRecord(_Record):
    """Group coordinator slots (as Kafka's `__consumer_offsets` partitions) placed on
    brokers. `slot_count` is fixed by the first such record; group -> slot never changes."""

    type: Literal["coordinator_slots"] = "coordinator_slots"
    slot_count: int
    assignments: tuple[CoordinatorSlotAssignment, ...]


# ---------------------------------------------------------------- routing, failover, KV


class RouteEpochRecord(_Record):
    """Zone-router epochs: proxies may write for `current`; `fenced` and below are closed."""

    type: Literal["route_epoch"] = "route_epoch"
    current_epoch: int
    fenced_epoch: int
    committed_epoch: int


class BucketFailoverRecord(_Record):
    """Which bucket new objects go to (object-storage failover), since when and why.

    `mode` is "normal" (the main bucket is active) or "failover"; "" in records written
    before it existed, read as "normal" exactly when bucket 0 is active. `auto`: the
    controller's detection decided it (not an operator).
    """

    type: Literal["bucket_failover"] = "bucket_failover"
    active_bucket_id: int
    reason: str = ""
    changed_ms: int = 0
    mode: str = ""
    auto: bool = False


class KVRecord(_Record):
    type: Literal["kv"] = "kv"
    key: str
    value: str | None  # None deletes


class NextIdsRecord(_Record):
    """Allocates id ranges (objects, streams) so ids are never reused."""

    type: Literal["next_ids"] = "next_ids"
    next_object_id: int
    next_stream_id: int
    next_producer_id: int = 0


class CompactorRecord(_Record):
    """A compaction principal (a Spark job, not a broker) registered with a new epoch: the
    epoch fences every earlier instance of the job (a zombie driver cannot commit)."""

    type: Literal["compactor"] = "compactor"
    name: str
    epoch: int
    incarnation_id: str
    registered_ms: int


# ---------------------------------------------------------------- security (controlplane/security.py)

AclResourceType = Literal["TOPIC", "GROUP", "CLUSTER", "TRANSACTIONAL_ID"]
AclPatternType = Literal["LITERAL", "PREFIXED"]
AclOperation = Literal[
    "ALL",
    "READ",
    "WRITE",
    "CREATE",
    "DELETE",
    "ALTER",
    "DESCRIBE",
    "CLUSTER_ACTION",
    "DESCRIBE_CONFIGS",
    "ALTER_CONFIGS",
    "IDEMPOTENT_WRITE",
]
AclPermission = Literal["ALLOW", "DENY"]


class AclBinding(BaseModel):
    """One ACL as Kafka has it: who (principal `User:alice` or `User:*`, from host or `*`)
    may or may not do what to which resources (a name, a prefix, or `*`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    resource_type: AclResourceType
    resource_name: str = Field(min_length=1, max_length=1024)
    pattern_type: AclPatternType = "LITERAL"
    principal: str = Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]+:.+")
    host: str = Field(default="*", min_length=1, max_length=256)
    operation: AclOperation
    permission: AclPermission


class ScramCredentialRecord(_Record):
    """A user's SCRAM credential for one mechanism (RFC 5802: salted hashes only, never the
    password). Replaces an earlier credential of the same user and mechanism."""

    type: Literal["scram_credential"] = "scram_credential"
    user: str
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]
    salt: str  # base64
    iterations: int
    stored_key: str  # base64 H(ClientKey)
    server_key: str  # base64


class RemoveScramCredentialRecord(_Record):
    type: Literal["remove_scram_credential"] = "remove_scram_credential"
    user: str
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]


class AclRecord(_Record):
    """An ACL added (or, with `removed`, deleted)."""

    type: Literal["acl"] = "acl"
    binding: AclBinding
    removed: bool = False


MetadataRecord = Annotated[
    RegisterBrokerRecord
    | FenceBrokerRecord
    | UnfenceBrokerRecord
    | UnregisterBrokerRecord
    | BrokerShuttingDownRecord
    | NodeWALMetadataRecord
    | TopicRecord
    | PartitionRecord
    | RemoveTopicRecord
    | CreateStreamRecord
    | StreamEpochRecord
    | RangeRecord
    | TrimStreamRecord
    | AbortedTxnsRecord
    | CleanerCheckpointRecord
    | DeleteStreamRecord
    | S3ObjectRecord
    | RemoveS3ObjectRecord
    | StreamSetObjectRecord
    | RemoveStreamSetObjectRecord
    | StreamObjectRecord
    | RemoveStreamObjectRecord
    | RouteEpochRecord
    | BucketFailoverRecord
    | KVRecord
    | NextIdsRecord
    | CoordinatorSlotsRecord
    | CompactorRecord
    | ScramCredentialRecord
    | RemoveScramCredentialRecord
    | AclRecord,
    Field(discriminator="type"),
]

_RECORD_ADAPTER: TypeAdapter = TypeAdapter(MetadataRecord)


def decode_record(data: dict | str | bytes) -> MetadataRecord:
    """Decode one record from its JSON (text or already-parsed dict)."""
    if isinstance(data, (str, bytes)):
        return _RECORD_ADAPTER.validate_json(data)
    return _RECORD_ADAPTER.validate_python(data)


def encode_record(record: _Record) -> str:
    """The record's JSON text as stored in the metadata log."""
    return record.model_dump_json()
