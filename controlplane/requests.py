"""Bodies of the controller API (pydantic): what brokers, the CLI and Spark jobs send.

Each request class has a `command` name; the API posts it to `/v1/<command>` and the quorum
replicates `(command, body)` so every controller validates and applies it identically.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from controlplane.records import AclBinding, BrokerEndpoint
from controlplane.settings import MAX_BALANCER_MOVES_PER_COMMAND, MAX_PARTITIONS_PER_TOPIC

MAX_RANGES_PER_COMMIT = 10_000
MAX_OBJECTS_PER_PREPARE = 1_000
MAX_PREPARE_TTL_MS = 7 * 24 * 3600 * 1000
MAX_MOVES_PER_REASSIGNMENT = 10_000
MAX_PARTITIONS_PER_BROKER_REPORT = 100_000

MAX_LISTENERS_PER_BROKER = 16
MAX_TOPIC_CONFIGS = 1_000  # = topic_configs.MAX_CONFIG_OPS; the schema refuses unknown keys


def validation_message(exc: ValidationError) -> str:
    """A refused request body in one line: the first few fields and why."""
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(x) for x in err.get("loc", ())) or "body"
        parts.append(f"{loc}: {err.get('msg')}")
    return "malformed request: " + "; ".join(parts)


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")
    command: ClassVar[str]


# ---------------------------------------------------------------- brokers


class RegisterBrokerRequest(_Request):
    command: ClassVar[str] = "register_broker"
    node_id: int = Field(ge=0)
    az: str = Field(min_length=1, max_length=64)
    host: str = Field(min_length=1, max_length=255)
    kafka_port: int = Field(ge=0, le=65535)
    incarnation_id: str = Field(min_length=1, max_length=64)
    wal_uri: str = Field(default="", max_length=1024)
    # every Kafka listener of the broker (None from brokers that predate listeners: their
    # one listener is host:kafka_port)
    endpoints: list[BrokerEndpoint] | None = Field(
        default=None, min_length=1, max_length=MAX_LISTENERS_PER_BROKER
    )
    shard_store_port: int = Field(default=0, ge=0, le=65535)  # 0: no erasure shard store

    @model_validator(mode="after")
    def _unique_listeners(self) -> RegisterBrokerRequest:
        if self.endpoints is not None:
            names = [e.name.upper() for e in self.endpoints]
            if len(set(names)) != len(names):
                raise ValueError(f"listener names must be unique: {names}")
        return self


class RegisterBrokerResponse(BaseModel):
    node_id: int
    node_epoch: int


MAX_UPLOAD_ERROR_CHARS = 1024
MAX_WAL_LOSSES_PER_REPORT = 8
MAX_WAL_LOSS_CHARS = 1024


class BrokerUploadStats(BaseModel):
    """Upload health a broker reports with each heartbeat. The leader keeps the last one
    per broker in memory for `status` (never in the metadata log: it is not a decision)."""

    model_config = ConfigDict(extra="forbid")
    wal_used_bytes: int = Field(ge=0)
    wal_capacity_bytes: int = Field(ge=0)
    # age of the oldest acknowledged WAL data not uploaded yet; 0 when nothing is pending
    upload_lag_s: float = Field(ge=0, le=10**9)
    # the broker's last upload attempt's error; None once an upload succeeded
    last_upload_error: str | None = Field(default=None, max_length=MAX_UPLOAD_ERROR_CHARS)
    # the zone router's cumulative byte counters (dataplane/zonerouter/traffic.py KEYS)
    zone_traffic: dict[str, int] | None = Field(default=None, max_length=32)
    # the zone router: the route epoch up to which this main's routed data is committed
    route_epoch_persisted: int | None = Field(default=None, ge=-1)
    # WAL losses this broker's process found (restart or failover scans): one line each
    wal_losses: list[Annotated[str, Field(max_length=MAX_WAL_LOSS_CHARS)]] = Field(
        default_factory=list, max_length=MAX_WAL_LOSSES_PER_REPORT
    )


MAX_BUCKETS_PER_REPORT = 16


class BucketWriteHealth(BaseModel):
    """A broker's view of writes to one bucket (uploads and its probes), for detection.

    `failing_for_ms`: time since the first failed write after the last successful one
    (0: the last write succeeded); `healthy_for_ms`: time since the last failure;
    `last_failure_age_ms`: time since the most recent failed write (None: none, or a broker
    from before this field).
    """

    model_config = ConfigDict(extra="forbid")
    bucket_id: int = Field(ge=0)
    failing_for_ms: int = Field(ge=0)
    healthy_for_ms: int = Field(ge=0)
    last_failure_age_ms: int | None = Field(default=None, ge=0)
    write_errors: int = Field(default=0, ge=0)
    writes_ok: int = Field(default=0, ge=0)
    last_latency_ms: float | None = Field(default=None, ge=0)
    last_error: str | None = Field(default=None, max_length=MAX_UPLOAD_ERROR_CHARS)


class BrokerHeartbeatRequest(_Request):
    command: ClassVar[str] = "broker_heartbeat"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    metadata_offset: int = -1  # how far the broker has replayed the log
    stats: BrokerUploadStats | None = None  # None: no storage engine on this broker
    # produce rate (bytes/s, smoothed) of each stream this broker leads, for the balancer;
    # kept in the leader's memory only, never logged
    produce_bytes_per_s: dict[int, float] = Field(
        default_factory=dict, max_length=MAX_PARTITIONS_PER_BROKER_REPORT
    )
    # write health per bucket (object-storage failover detection); leader memory only
    bucket_health: list[BucketWriteHealth] = Field(
        default_factory=list, max_length=MAX_BUCKETS_PER_REPORT
    )
    # Kafka's WantFence: a broker still starting (opening its WAL, replaying metadata) keeps
    # its session alive but stays fenced, so a slow start never expires its registration
    want_fence: bool = False


class BrokerHeartbeatResponse(BaseModel):
    fenced: bool
    node_epoch: int
    fence_reason: str = ""  # "registered" until the first heartbeat; anything else is final
    # the controller's broker session (0: not said); a broker stopped longer than this may
    # have been fenced meanwhile and must not serve from its old state (dataplane/stall.py)
    session_timeout_ms: int = 0


class FenceBrokerRequest(_Request):
    """Fence a broker now (controlled shutdown, operator action)."""

    command: ClassVar[str] = "fence_broker"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    reason: str = Field(default="requested", max_length=256)


class ControlledShutdownRequest(_Request):
    """A broker is stopping: move its partitions to other brokers (same AZ first)."""

    command: ClassVar[str] = "controlled_shutdown"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)


class CompleteWALFailoverRequest(_Request):
    """The failover target uploaded the failed node's WAL and closed its streams."""

    command: ClassVar[str] = "complete_wal_failover"
    node_id: int = Field(ge=0)  # the recovering node
    node_epoch: int = Field(ge=0)
    failed_node_id: int = Field(ge=0)
    failover_epoch: int = Field(ge=0)  # the reservation epoch it recovered with


# ---------------------------------------------------------------- topics


class CreateTopicRequest(_Request):
    command: ClassVar[str] = "create_topic"
    name: str = Field(min_length=1, max_length=249)
    partitions: int = Field(ge=1, le=MAX_PARTITIONS_PER_TOPIC)
    # validated against controlplane/topic_configs.py by every voter
    configs: dict[str, str] = Field(default_factory=dict, max_length=MAX_TOPIC_CONFIGS)
    # filled in by the API before replication so every controller picks the same id
    topic_id: str | None = None


class CreateTopicResponse(BaseModel):
    topic_id: str
    name: str
    partitions: int


class DeleteTopicRequest(_Request):
    command: ClassVar[str] = "delete_topic"
    name: str = Field(min_length=1, max_length=249)


class CreatePartitionsRequest(_Request):
    command: ClassVar[str] = "create_partitions"
    name: str = Field(min_length=1, max_length=249)
    total_count: int = Field(ge=1, le=MAX_PARTITIONS_PER_TOPIC)


class PartitionMove(BaseModel):
    """One partition of a reassignment plan and the broker that should lead it."""

    model_config = ConfigDict(extra="forbid")
    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(ge=0)
    node_id: int = Field(ge=0)


class ReassignPartitionsRequest(_Request):
    """Move partitions to other brokers: no data is copied, the stream is closed by its
    owner (after uploading its WAL data) and opened by the new leader with epoch + 1."""

    command: ClassVar[str] = "reassign_partitions"
    moves: list[PartitionMove] = Field(min_length=1, max_length=MAX_MOVES_PER_REASSIGNMENT)


# ---------------------------------------------------------------- streams


class CreateStreamRequest(_Request):
    command: ClassVar[str] = "create_stream"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    tags: dict[str, str] = Field(default_factory=dict)


class CreateStreamResponse(BaseModel):
    stream_id: int


class OpenStreamRequest(_Request):
    command: ClassVar[str] = "open_stream"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    stream_epoch: int = Field(ge=0)


class OpenStreamResponse(BaseModel):
    stream_id: int
    stream_epoch: int
    start_offset: int
    next_offset: int
    # the transactions aborted in the stream, as recorded by its leaders (record_aborted_txns)
    aborted_txns: list[tuple[int, int, int]] = Field(default_factory=list)


class CloseStreamRequest(_Request):
    command: ClassVar[str] = "close_stream"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    stream_epoch: int = Field(ge=0)
    # set by a failover target closing a stream the failed node owned
    failover_node_id: int | None = Field(default=None, ge=0)
    # close only if no partition is led by the owner with this epoch (a broker closing
    # streams it owns but no longer leads decides on its own image, which may lag)
    orphaned_only: bool = False


class TrimStreamRequest(_Request):
    command: ClassVar[str] = "trim_stream"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    stream_epoch: int = Field(ge=0)
    new_start_offset: int = Field(ge=0)


class DeleteStreamRequest(_Request):
    command: ClassVar[str] = "delete_stream"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    stream_epoch: int = Field(ge=0)


# ---------------------------------------------------------------- objects


class CompactorIdentity(BaseModel):
    """A compaction principal's name and epoch (from `register_compactor`)."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=64)
    epoch: int = Field(ge=0)


class RegisterCompactorRequest(_Request):
    """Register a compaction job (no broker): a new epoch for the name, which fences every
    earlier instance; the same incarnation registering again gets the same epoch."""

    command: ClassVar[str] = "register_compactor"
    name: str = Field(min_length=1, max_length=64)
    incarnation_id: str = Field(min_length=1, max_length=64)


class RegisterCompactorResponse(BaseModel):
    name: str
    epoch: int


MAX_CLEANER_CHECKPOINTS = 100_000


class CleanerCheckpoint(BaseModel):
    """One compacted partition's stream: offsets below `cleaned_offset` are clean."""

    model_config = ConfigDict(extra="forbid")
    stream_id: int = Field(ge=0)
    cleaned_offset: int = Field(ge=0)


class SetCleanerCheckpointsRequest(_Request):
    """The log cleaner (a registered compactor) records how far it cleaned each partition
    of its run, so the next run computes the dirty ratio from there and maps only the
    dirty part. All or nothing; streams deleted meanwhile are skipped."""

    command: ClassVar[str] = "set_cleaner_checkpoints"
    compactor: CompactorIdentity
    checkpoints: list[CleanerCheckpoint] = Field(min_length=1, max_length=MAX_CLEANER_CHECKPOINTS)


class SetCleanerCheckpointsResponse(BaseModel):
    recorded: list[int]  # stream ids
    skipped: list[int]  # stream ids that no longer exist


class _CommitterFields(_Request):
    """Who prepares or commits objects: a broker (node_id, node_epoch) or a compaction
    principal (`compactor`), exactly one of them."""

    node_id: int = Field(default=-1, ge=-1)
    node_epoch: int = Field(default=-1, ge=-1)
    compactor: CompactorIdentity | None = None

    @model_validator(mode="after")
    def _one_committer(self) -> _CommitterFields:
        broker = self.node_id >= 0 and self.node_epoch >= 0
        if broker == (self.compactor is not None):
            raise ValueError("give either node_id and node_epoch, or compactor")
        return self


class PrepareObjectsRequest(_CommitterFields):
    command: ClassVar[str] = "prepare_objects"
    count: int = Field(ge=1, le=MAX_OBJECTS_PER_PREPARE)
    ttl_ms: int = Field(ge=1, le=MAX_PREPARE_TTL_MS)


class PrepareObjectsResponse(BaseModel):
    first_object_id: int
    count: int
    bucket_id: int  # the bucket new objects go to (object-storage failover may change it)


class ObjectStreamRange(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stream_id: int = Field(ge=0)
    stream_epoch: int = Field(ge=0)
    start_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)


class StreamObjectSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    object_id: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    stream_epoch: int = Field(ge=0)
    start_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)
    size_bytes: int = Field(ge=0)


class CommitStreamSetObjectRequest(_CommitterFields):
    """Atomically: commit a stream-set object and stream objects, advance the streams'
    ranges (with a continuity check) and mark compacted objects destroyed.

    `object_id` is -1 when the upload produced only stream objects.
    """

    command: ClassVar[str] = "commit_stream_set_object"
    object_id: int = Field(ge=-1)
    order_id: int = Field(ge=0)
    size_bytes: int = Field(ge=0)
    bucket_id: int = Field(ge=0)
    stream_ranges: list[ObjectStreamRange] = Field(
        default_factory=list, max_length=MAX_RANGES_PER_COMMIT
    )
    stream_objects: list[StreamObjectSpec] = Field(
        default_factory=list, max_length=MAX_RANGES_PER_COMMIT
    )
    compacted_object_ids: list[int] = Field(default_factory=list, max_length=MAX_RANGES_PER_COMMIT)
    # set by a failover target uploading the failed node's WAL: the streams are owned by
    # that node, and node_id must be the target of its WAL failover
    failover_node_id: int | None = Field(default=None, ge=0)


class StreamObjectCommit(_Request):
    """The fields of a commit of one stream object: who commits it, where it lies, what
    offsets of which stream it holds."""

    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    object_id: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    start_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)
    size_bytes: int = Field(ge=0)
    bucket_id: int = Field(ge=0)


class CommitStreamObjectRequest(StreamObjectCommit):
    """Commit a stream object made by compaction from `source_object_ids`."""

    command: ClassVar[str] = "commit_stream_object"
    source_object_ids: list[int] = Field(default_factory=list, max_length=MAX_RANGES_PER_COMMIT)


class SealErasureRangeRequest(StreamObjectCommit):
    """Commit a stream object holding the decided records of an erasure-coded partition's
    stream offsets [start_offset, end_offset) (controlplane/erasure_seal.py): the range must
    continue the stream's sealed end, so exactly one sealer commits a range."""

    command: ClassVar[str] = "seal_erasure_range"


class TrimErasureStreamRequest(_Request):
    """Advance an erasure-coded partition's stream start (retention, DeleteRecords): the
    sealed objects wholly below it are destroyed like any trimmed object."""

    command: ClassVar[str] = "trim_erasure_stream"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    new_start_offset: int = Field(ge=0)


class DeletedObjectsRequest(_Request):
    """The lifecycle task deleted these MARK_DESTROYED objects from their buckets."""

    command: ClassVar[str] = "objects_deleted"
    object_ids: list[int] = Field(max_length=MAX_RANGES_PER_COMMIT)


# ---------------------------------------------------------------- cluster-wide


class SetActiveBucketRequest(_Request):
    """Switch the bucket new objects go to (object-storage failover), by hand or by the
    leader's detection (`auto`). `only_if_active`: apply only if this bucket is still the
    active one (the detection's decision must not undo an operator's switch made since)."""

    command: ClassVar[str] = "set_active_bucket"
    bucket_id: int = Field(ge=0)
    reason: str = Field(default="", max_length=256)
    auto: bool = False
    only_if_active: int | None = Field(default=None, ge=0)


class SetActiveBucketResponse(BaseModel):
    mode: str
    active_bucket_id: int
    since_ms: int
    changed: bool


class PutKVRequest(_Request):
    command: ClassVar[str] = "put_kv"
    key: str = Field(min_length=1, max_length=1024)
    value: str | None = Field(default=None, max_length=1_000_000)


class PutGroupOffsetsRequest(_Request):
    """A group coordinator stores (value) or deletes (None) a group's committed-offsets
    document; fenced by the group's coordinator slot (owner and epoch)."""

    command: ClassVar[str] = "put_group_offsets"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    group_id: str = Field(max_length=1024)
    coordinator_epoch: int = Field(ge=0)
    value: str | None = Field(default=None, max_length=1_000_000)


class LifecycleTickRequest(_Request):
    """Sent by the leader's timer: fence expired sessions, expire prepared objects."""

    command: ClassVar[str] = "lifecycle_tick"
    expired_brokers: list[tuple[int, int]] = Field(default_factory=list)  # (node_id, epoch)


class AllocateProducerIdsRequest(_Request):
    """A block of idempotent-producer ids for one broker (never reused)."""

    command: ClassVar[str] = "allocate_producer_ids"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    count: int = Field(ge=1, le=100_000)


class AllocateProducerIdsResponse(BaseModel):
    first_producer_id: int
    count: int


class ControlledShutdownResponse(BaseModel):
    moved: int  # partitions moved away by this command
    remaining: int  # partitions still led here (no active broker to take them)


class CommitResponse(BaseModel):
    """A commit's answer: `idempotent` = the same commit had been applied already."""

    idempotent: bool = False


REQUEST_TYPES: dict[str, type[_Request]] = {
    cls.command: cls
    for cls in (
        RegisterBrokerRequest,
        BrokerHeartbeatRequest,
        FenceBrokerRequest,
        ControlledShutdownRequest,
        CompleteWALFailoverRequest,
        CreateTopicRequest,
        DeleteTopicRequest,
        CreatePartitionsRequest,
        ReassignPartitionsRequest,
        CreateStreamRequest,
        OpenStreamRequest,
        CloseStreamRequest,
        TrimStreamRequest,
        DeleteStreamRequest,
        PrepareObjectsRequest,
        CommitStreamSetObjectRequest,
        CommitStreamObjectRequest,
        DeletedObjectsRequest,
        SetActiveBucketRequest,
        PutKVRequest,
        LifecycleTickRequest,
        AllocateProducerIdsRequest,
        PutGroupOffsetsRequest,
        RegisterCompactorRequest,
        SetCleanerCheckpointsRequest,
    )
}


# ---------------------------------------------------------------- balancer (controlplane/balancer.py)
# kept in one block after REQUEST_TYPES so parallel additions above merge cleanly


class SetBalancerRequest(_Request):
    """Turn the self-balancer on or off (kept in the metadata: survives leader changes)."""

    command: ClassVar[str] = "set_balancer"
    enabled: bool


class BalanceMove(BaseModel):
    """One move the balancer decided on the leader; applied only if the partition is still
    led by `from_node_id` at `leader_epoch` and both brokers are still active."""

    model_config = ConfigDict(extra="forbid")
    topic_id: str = Field(min_length=1, max_length=64)
    topic: str = Field(min_length=1, max_length=249)
    partition: int = Field(ge=0)
    from_node_id: int = Field(ge=0)
    to_node_id: int = Field(ge=0)
    leader_epoch: int = Field(ge=0)
    reason: str = Field(default="", max_length=256)


class BalancePartitionsRequest(_Request):
    """Sent by the leader's balancer round (never accepted from outside, like
    `lifecycle_tick`): a small batch of moves."""

    command: ClassVar[str] = "balance_partitions"
    moves: list[BalanceMove] = Field(min_length=1, max_length=MAX_BALANCER_MOVES_PER_COMMAND)


REQUEST_TYPES.update({cls.command: cls for cls in (SetBalancerRequest, BalancePartitionsRequest)})


# ---------------------------------------------------------------- topic configs (controlplane/topic_configs.py)
# kept in one block at the end so parallel additions above merge cleanly


class TopicConfigOp(BaseModel):
    """One entry of an alter: set, delete, append to or subtract from (list keys) a key."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(min_length=1, max_length=255)
    op: Literal["set", "delete", "append", "subtract"]
    value: str | None = Field(default=None, max_length=32 * 1024)


class AlterTopicConfigsRequest(_Request):
    """Change a topic's configs atomically: every entry is validated on every voter and a
    bad one changes nothing. `replace` (Kafka's AlterConfigs): keys not set here go back to
    their default; otherwise (IncrementalAlterConfigs) keys not named keep their value."""

    command: ClassVar[str] = "alter_topic_configs"
    name: str = Field(min_length=1, max_length=249)
    ops: list[TopicConfigOp] = Field(default_factory=list, max_length=MAX_TOPIC_CONFIGS)
    replace: bool = False


class AlterTopicConfigsResponse(BaseModel):
    topic_id: str
    configs: dict[str, str]  # the topic's configs after the alter (set keys only)
    # the log offset that holds the change (or the image's offset when nothing changed): a
    # broker waits for its own image to reach it before answering
    metadata_offset: int = -1


REQUEST_TYPES.update({AlterTopicConfigsRequest.command: AlterTopicConfigsRequest})


# ---------------------------------------------------------------- transactions (coordinators.py)


class PutTxnStateRequest(_Request):
    """A transaction coordinator stores (value) or deletes (None) one transactional id's
    state document; fenced by the id's coordinator slot (owner and epoch), as group offsets
    are."""

    command: ClassVar[str] = "put_txn_state"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    transactional_id: str = Field(min_length=1, max_length=1024)
    coordinator_epoch: int = Field(ge=0)
    value: str | None = Field(default=None, max_length=1_000_000)


REQUEST_TYPES.update({PutTxnStateRequest.command: PutTxnStateRequest})

MAX_ABORTED_TXNS_PER_REQUEST = 1000


class AbortedTxn(BaseModel):
    """One aborted transaction in a partition: its first offset and its abort marker's."""

    model_config = ConfigDict(extra="forbid")
    producer_id: int = Field(ge=0)
    first_offset: int = Field(ge=0)
    marker_offset: int = Field(ge=0)


class RecordAbortedTxnsRequest(_Request):
    """A partition's leader records the transactions aborted in its stream (durable abort
    markers, in marker order), so a later leader knows them without reading the whole log
    (Kafka's `.txnindex`). Only the stream's owner at its current epoch may; entries whose
    marker is not past the last recorded one are skipped (a retried request)."""

    command: ClassVar[str] = "record_aborted_txns"
    node_id: int = Field(ge=0)
    node_epoch: int = Field(ge=0)
    stream_id: int = Field(ge=0)
    stream_epoch: int = Field(ge=0)
    aborted: list[AbortedTxn] = Field(min_length=1, max_length=MAX_ABORTED_TXNS_PER_REQUEST)


class RecordAbortedTxnsResponse(BaseModel):
    recorded: int  # entries new to the stream


REQUEST_TYPES.update({RecordAbortedTxnsRequest.command: RecordAbortedTxnsRequest})


# ---------------------------------------------------------------- security (controlplane/security.py)
# kept in one block at the end so parallel additions above merge cleanly

MAX_SECURITY_ITEMS = 1000  # SCRAM changes or ACLs per command


class ScramUpsertion(BaseModel):
    """A user's new SCRAM credential for one mechanism (salted hashes, never a password)."""

    model_config = ConfigDict(extra="forbid")
    user: str = Field(min_length=1, max_length=256)
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]
    salt: str = Field(min_length=4, max_length=1024)  # base64
    iterations: int = Field(ge=4096, le=16384)  # Kafka's bounds
    stored_key: str = Field(min_length=4, max_length=1024)  # base64
    server_key: str = Field(min_length=4, max_length=1024)  # base64


class ScramDeletion(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user: str = Field(min_length=1, max_length=256)
    mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512"]


class AlterScramCredentialsRequest(_Request):
    """Add, replace or delete SCRAM credentials (AlterUserScramCredentials, `user add`)."""

    command: ClassVar[str] = "alter_scram_credentials"
    upsertions: list[ScramUpsertion] = Field(default_factory=list, max_length=MAX_SECURITY_ITEMS)
    deletions: list[ScramDeletion] = Field(default_factory=list, max_length=MAX_SECURITY_ITEMS)


class ScramAlterResult(BaseModel):
    user: str
    mechanism: str
    error: str | None = None  # "RESOURCE_NOT_FOUND" for a deletion of nothing
    message: str = ""


class AlterScramCredentialsResponse(BaseModel):
    results: list[ScramAlterResult]
    metadata_offset: int = -1


class CreateAclsRequest(_Request):
    command: ClassVar[str] = "create_acls"
    bindings: list[AclBinding] = Field(min_length=1, max_length=MAX_SECURITY_ITEMS)


class AclFilter(BaseModel):
    """Which ACLs a delete (or describe) means: a None field matches any value."""

    model_config = ConfigDict(extra="forbid")
    resource_type: str | None = None
    resource_name: str | None = None
    pattern_type: str | None = None
    principal: str | None = None
    host: str | None = None
    operation: str | None = None
    permission: str | None = None


class DeleteAclsRequest(_Request):
    command: ClassVar[str] = "delete_acls"
    filters: list[AclFilter] = Field(min_length=1, max_length=MAX_SECURITY_ITEMS)


class DeleteAclsResponse(BaseModel):
    matches: list[list[AclBinding]]  # per filter: the ACLs it deleted
    metadata_offset: int = -1


REQUEST_TYPES.update(
    {
        cls.command: cls
        for cls in (AlterScramCredentialsRequest, CreateAclsRequest, DeleteAclsRequest)
    }
)


class AlterBrokerConfigsRequest(_Request):
    """Change the dynamic configs of every broker (`resource` "") or of one (its id); the
    keys are the topic defaults' broker synonyms and the brokers' own settings
    (controlplane/broker_configs.py)."""

    command: ClassVar[str] = "alter_broker_configs"
    resource: str = Field(default="", pattern=r"^(|[0-9]{1,9})$")
    ops: list[TopicConfigOp] = Field(default_factory=list, max_length=MAX_TOPIC_CONFIGS)
    replace: bool = False


class AlterBrokerConfigsResponse(BaseModel):
    configs: dict[str, str]  # the resource's dynamic configs after the alter
    metadata_offset: int = -1  # as AlterTopicConfigsResponse's


REQUEST_TYPES.update({AlterBrokerConfigsRequest.command: AlterBrokerConfigsRequest})


# ---------------------------------------------------------------- zone router (route_epochs.py)


class BumpRouteEpochRequest(_Request):
    """Sent by the leader's timer: current route epoch + 1, the old one fenced; only if the
    current epoch is still `expected_current_epoch` (a retry never bumps twice)."""

    command: ClassVar[str] = "bump_route_epoch"
    expected_current_epoch: int = Field(ge=0)
    # the minimum of the live brokers' persisted route epochs (None: not known yet)
    committed_epoch: int | None = Field(default=None, ge=-1)


REQUEST_TYPES.update({BumpRouteEpochRequest.command: BumpRouteEpochRequest})
REQUEST_TYPES.update(
    {cls.command: cls for cls in (SealErasureRangeRequest, TrimErasureStreamRequest)}
)
