"""The metadata image: the cluster's metadata as plain state at one log offset.

No I/O happens here. Controllers keep one image as their replicated state; brokers replay the
same log into their own image (Kafka's KRaft MetadataImage and MetadataDelta are the model).
The image is a pydantic model so it snapshots to JSON and pickles (pysyncobj snapshots by
pickling).

Published images are immutable: `with_records(batch)` returns a *new* image and the
`MetadataDelta` of what the batch changed, sharing every container and entity the batch did
not touch (copy on write). A reader holds one image for a whole request and never sees a
half-applied batch or a dict changing size under it. `apply(record)` mutates in place and is
only for an image nobody else holds yet (a builder, a test).
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, model_validator

from controlplane import records as r
from controlplane.records import ObjectState, StreamState


class BrokerState(BaseModel):
    node_id: int
    node_epoch: int
    az: str
    host: str
    kafka_port: int
    incarnation_id: str
    shard_store_port: int = 0  # its erasure shard store (0: none)
    fenced: bool = True
    registered_ms: int = 0
    fence_reason: str = ""
    shutting_down: bool = False  # controlled shutdown: no new partitions
    # every listener (empty: registered before brokers had several; host:kafka_port is then
    # its one listener)
    endpoints: tuple[r.BrokerEndpoint, ...] = ()

    def endpoint(self, listener: str | None) -> tuple[str, int] | None:
        """(host, port) a client that connected on listener `listener` is told for this
        broker, or None if the broker has no such listener (Kafka leaves it out). A broker
        registered without endpoints, or a caller that does not know its listener (None),
        gets host:kafka_port."""
        if listener is None or not self.endpoints:
            return self.host, self.kafka_port
        for e in self.endpoints:
            if e.name.upper() == listener.upper():
                return e.host, e.port
        return None

    @property
    def active(self) -> bool:
        """Unfenced and not shutting down: may be given partitions."""
        return not self.fenced and not self.shutting_down


class NodeWALState(BaseModel):
    node_id: int
    node_epoch: int
    wal_uri: str
    failover_mode: bool = False
    failover_target_node_id: int | None = None


class PartitionState(BaseModel):
    """A partition's placement (see `records.PartitionRecord`): led by `leader_node_id`, or
    erasure-coded (no leader; `shard_stores[i]` keeps shard i of every offset)."""

    partition: int
    kind: r.PartitionKind
    leader_node_id: int  # records.NO_LEADER for an erasure-coded partition
    leader_epoch: int
    stream_id: int
    shard_stores: list[int] = Field(default_factory=list)  # erasure: broker of shard i

    @model_validator(mode="before")
    @classmethod
    def _upgrade_pre_kind_snapshot(cls, fields: Any) -> Any:
        """JSON snapshots written before partitions had a kind."""
        return r.with_partition_kind(fields)

    @model_validator(mode="after")
    def _placement_fits_kind(self) -> PartitionState:
        r.check_partition_kind(
            self.kind, self.leader_node_id, self.shard_stores, f"partition {self.partition}"
        )
        return self

    def __setstate__(self, state: dict[Any, Any]) -> None:
        """Unpickling (pysyncobj snapshots) sets the fields without validating them: a
        partition pickled before partitions had a kind gets it here."""
        super().__setstate__(state)
        if "kind" not in self.__dict__:
            self.__dict__.update(r.with_partition_kind(dict(self.__dict__)))
            self.__pydantic_fields_set__.add("kind")

    @property
    def erasure_coded(self) -> bool:
        """Leaderless, erasure-coded over `shard_stores`."""
        return self.kind is r.PartitionKind.ERASURE


class TopicState(BaseModel):
    topic_id: str
    name: str
    configs: dict[str, str] = Field(default_factory=dict)
    partitions: dict[int, PartitionState] = Field(default_factory=dict)


class RangeState(BaseModel):
    range_index: int
    epoch: int
    start_offset: int
    end_offset: int
    node_id: int


class ObjectRange(BaseModel):
    """Where a stream's offsets [start, end) live: a stream-set object or a stream object."""

    object_id: int
    start_offset: int
    end_offset: int
    kind: str  # "sso" | "so"


class StreamMetaState(BaseModel):
    stream_id: int
    epoch: int = -1
    state: StreamState = StreamState.CLOSED
    node_id: int = -1
    start_offset: int = 0
    ranges: list[RangeState] = Field(default_factory=list)
    tags: dict[str, str] = Field(default_factory=dict)
    # sorted by start_offset; the read path's index from offsets to objects
    object_ranges: list[ObjectRange] = Field(default_factory=list)
    trimmed_ms: int = 0  # the last time its start advanced (retention, DeleteRecords)
    # the log cleaner's checkpoint (compacted topics): offsets below are clean; its last run
    cleaned_offset: int = 0
    cleaned_ms: int = 0
    # aborted transactions (producer id, first offset, marker offset), in marker order, whose
    # marker is at or past start_offset; at most MAX_ABORTED_TXNS_PER_STREAM (oldest dropped)
    aborted_txns: list[tuple[int, int, int]] = Field(default_factory=list)

    @property
    def end_offset(self) -> int:
        """The committed end: offsets below it are in objects."""
        return self.ranges[-1].end_offset if self.ranges else self.start_offset


class ObjectMetaState(BaseModel):
    object_id: int
    state: ObjectState
    bucket_id: int = 0
    size_bytes: int = 0
    prepared_ms: int = 0
    deadline_ms: int = 0
    committed_ms: int = 0
    mark_destroyed_ms: int = 0


class StreamSetObjectState(BaseModel):
    object_id: int
    node_id: int
    order_id: int
    ranges: list[r.StreamOffsetRange]
    committed_ms: int


class StreamObjectState(BaseModel):
    object_id: int
    stream_id: int
    start_offset: int
    end_offset: int
    committed_ms: int


class BucketFailoverState(BaseModel):
    """Object-storage failover: which bucket new objects go to, and why (AKIP-1).

    `mode` is "normal" while the main bucket is active, "failover" otherwise; compaction and
    object deletion pause in failover mode. `auto`: the controller's detection switched.
    """

    mode: str = "normal"
    active_bucket_id: int = 0
    since_ms: int = 0
    reason: str = ""
    auto: bool = False

    @property
    def in_failover(self) -> bool:
        return self.mode == "failover"


class RouteEpochState(BaseModel):
    current_epoch: int = 0
    fenced_epoch: int = -1
    committed_epoch: int = -1


MAX_ABORTED_TXNS_PER_STREAM = 10_000  # a partition's aborted transactions kept (oldest dropped)

# the image's keyed containers; a delta names the keys a batch touched in each
_KEYED_FIELDS = (
    "brokers",
    "node_wals",
    "topics",
    "topic_ids_by_name",
    "streams",
    "objects",
    "stream_set_objects",
    "stream_objects",
    "kv",
    "coordinator_slots",
    "compactors",
    "scram_credentials",
    "acls",
)


@dataclass
class MetadataDelta:
    """What one batch of records changed: the keys touched per keyed field of the image.

    A key in `touched[field]` was added, changed or removed; compare `base` and `image` to
    tell which (`image.topics.get(k) is None` = removed).
    """

    base: MetadataImage
    image: MetadataImage
    records: list = field(default_factory=list)
    touched: dict[str, set] = field(default_factory=lambda: {f: set() for f in _KEYED_FIELDS})


def _copy_entity(entity: BaseModel) -> BaseModel:
    """A copy of an entity whose own containers are copied one level (their items are
    replaced, never mutated, by the apply handlers)."""
    copy = entity.model_copy()
    for name, value in entity.__dict__.items():
        if isinstance(value, (dict, list)):
            setattr(copy, name, value.copy())
    return copy


class CompactorState(BaseModel):
    """A compaction principal: only its current epoch may prepare and commit."""

    name: str
    epoch: int
    incarnation_id: str


class ScramCredentialState(BaseModel):
    """A user's SCRAM credential for one mechanism: salt, iterations and salted hashes."""

    user: str
    mechanism: str
    salt: str  # base64
    iterations: int
    stored_key: str  # base64
    server_key: str  # base64


class CoordinatorSlotState(BaseModel):
    """The broker coordinating one slot's groups, and the slot's coordinator epoch."""

    node_id: int
    epoch: int


class MetadataImage(BaseModel):
    """All cluster metadata at one log offset.

    Thread-safety: an image returned by `with_records` (or received as a snapshot) is never
    changed again, so any number of threads may read it without a lock.
    """

    offset: int = -1  # offset of the last applied record
    brokers: dict[int, BrokerState] = Field(default_factory=dict)
    node_wals: dict[int, NodeWALState] = Field(default_factory=dict)
    topics: dict[str, TopicState] = Field(default_factory=dict)
    topic_ids_by_name: dict[str, str] = Field(default_factory=dict)
    streams: dict[int, StreamMetaState] = Field(default_factory=dict)
    objects: dict[int, ObjectMetaState] = Field(default_factory=dict)
    stream_set_objects: dict[int, StreamSetObjectState] = Field(default_factory=dict)
    stream_objects: dict[int, StreamObjectState] = Field(default_factory=dict)
    route_epoch: RouteEpochState = Field(default_factory=RouteEpochState)
    active_bucket_id: int = 0  # = bucket_failover.active_bucket_id (older readers use it)
    bucket_failover: BucketFailoverState = Field(default_factory=BucketFailoverState)
    kv: dict[str, str] = Field(default_factory=dict)
    next_object_id: int = 0
    next_stream_id: int = 0
    next_producer_id: int = 0
    # group coordinator slots (controlplane/coordinators.py): 0 until first placed
    coordinator_slot_count: int = 0
    coordinator_slots: dict[int, CoordinatorSlotState] = Field(default_factory=dict)
    # compaction principals (Spark jobs) by name
    compactors: dict[str, CompactorState] = Field(default_factory=dict)
    # SASL/SCRAM credentials by "MECHANISM:user" (controlplane/security.py: scram_key)
    scram_credentials: dict[str, ScramCredentialState] = Field(default_factory=dict)
    # ACLs by their canonical JSON (controlplane/security.py: acl_key)
    acls: dict[str, r.AclBinding] = Field(default_factory=dict)

    # copy-on-write bookkeeping of an image being built by with_records(); None = this image
    # owns all of its containers (a fresh image, or apply() on an unpublished one)
    _owned_fields: set[str] | None = PrivateAttr(default=None)
    _owned_keys: set[tuple[str, Any]] | None = PrivateAttr(default=None)
    _delta: MetadataDelta | None = PrivateAttr(default=None)

    # ------------------------------------------------------------ apply

    def with_records(
        self, records: Iterable[tuple[r.MetadataRecord, int | None]]
    ) -> tuple[MetadataImage, MetadataDelta]:
        """A new image with `records` (each with its log offset) applied, and the delta.

        `self` is not changed; the new image shares what the records did not touch.
        """
        new = self.model_copy()
        new._owned_fields, new._owned_keys = set(), set()
        delta = MetadataDelta(base=self, image=new)
        new._delta = delta
        try:
            for rec, offset in records:
                new.apply(rec, offset)
                delta.records.append(rec)
        finally:
            new._owned_fields = new._owned_keys = new._delta = None
        return new, delta

    def apply(self, record: r.MetadataRecord, offset: int | None = None) -> None:
        """Apply one record in place. Records are validated before they are logged, so this
        never fails. Only for an image no other thread holds: see `with_records`."""
        handler = getattr(self, "_apply_" + record.type)
        handler(record)
        if offset is not None:
            self.offset = offset

    # copy-on-write accessors: every handler changes state only through these

    def _w(self, name: str) -> Any:
        """The container `name`, copied first if it is shared with another image."""
        value = getattr(self, name)
        if self._owned_fields is not None and name not in self._owned_fields:
            value = value.copy()
            setattr(self, name, value)
            self._owned_fields.add(name)
        return value

    def _touch(self, name: str, key: Any) -> None:
        if self._delta is not None:
            self._delta.touched.setdefault(name, set()).add(key)

    def _we(self, name: str, key: Any) -> Any:
        """The entity `name[key]` made writable (copied if shared), or None if absent."""
        container = self._w(name)
        entity = container.get(key)
        if entity is None:
            return None
        self._touch(name, key)
        if self._owned_keys is not None and (name, key) not in self._owned_keys:
            entity = _copy_entity(entity)
            container[key] = entity
            self._owned_keys.add((name, key))
        return entity

    def _put(self, name: str, key: Any, value: Any) -> None:
        self._w(name)[key] = value
        self._touch(name, key)
        if self._owned_keys is not None:
            self._owned_keys.add((name, key))

    def _pop(self, name: str, key: Any) -> Any:
        if key not in getattr(self, name):
            return None
        self._touch(name, key)
        return self._w(name).pop(key)

    def _apply_register_broker(self, rec: r.RegisterBrokerRecord) -> None:
        self._put(
            "brokers",
            rec.node_id,
            BrokerState(
                node_id=rec.node_id,
                node_epoch=rec.node_epoch,
                az=rec.az,
                host=rec.host,
                kafka_port=rec.kafka_port,
                incarnation_id=rec.incarnation_id,
                shard_store_port=rec.shard_store_port,
                fenced=True,
                registered_ms=rec.registered_ms,
                endpoints=rec.endpoints or (),
            ),
        )

    def _apply_fence_broker(self, rec: r.FenceBrokerRecord) -> None:
        broker = self.brokers.get(rec.node_id)
        if broker is not None and broker.node_epoch == rec.node_epoch:
            broker = self._we("brokers", rec.node_id)
            broker.fenced = True
            broker.fence_reason = rec.reason

    def _apply_unfence_broker(self, rec: r.UnfenceBrokerRecord) -> None:
        broker = self.brokers.get(rec.node_id)
        if broker is not None and broker.node_epoch == rec.node_epoch:
            broker = self._we("brokers", rec.node_id)
            broker.fenced = False
            broker.fence_reason = ""

    def _apply_broker_shutting_down(self, rec: r.BrokerShuttingDownRecord) -> None:
        broker = self.brokers.get(rec.node_id)
        if broker is not None and broker.node_epoch == rec.node_epoch:
            broker = self._we("brokers", rec.node_id)
            broker.shutting_down = True

    def _apply_unregister_broker(self, rec: r.UnregisterBrokerRecord) -> None:
        self._pop("brokers", rec.node_id)

    def _apply_node_wal(self, rec: r.NodeWALMetadataRecord) -> None:
        self._put("node_wals", rec.node_id, NodeWALState(**rec.model_dump(exclude={"type"})))

    def _apply_topic(self, rec: r.TopicRecord) -> None:
        existing = self.topics.get(rec.topic_id)
        partitions = dict(existing.partitions) if existing else {}
        self._put(
            "topics",
            rec.topic_id,
            TopicState(
                topic_id=rec.topic_id,
                name=rec.name,
                configs=dict(rec.configs),
                partitions=partitions,
            ),
        )
        self._put("topic_ids_by_name", rec.name, rec.topic_id)

    def _apply_partition(self, rec: r.PartitionRecord) -> None:
        topic = self._we("topics", rec.topic_id)
        topic.partitions[rec.partition] = PartitionState(
            partition=rec.partition,
            kind=rec.kind,
            leader_node_id=rec.leader_node_id,
            leader_epoch=rec.leader_epoch,
            stream_id=rec.stream_id,
            shard_stores=list(rec.shard_stores),
        )

    def _apply_remove_topic(self, rec: r.RemoveTopicRecord) -> None:
        topic = self._pop("topics", rec.topic_id)
        if topic is not None:
            self._pop("topic_ids_by_name", topic.name)

    def _apply_create_stream(self, rec: r.CreateStreamRecord) -> None:
        self._put(
            "streams", rec.stream_id, StreamMetaState(stream_id=rec.stream_id, tags=dict(rec.tags))
        )
        self.next_stream_id = max(self.next_stream_id, rec.stream_id + 1)

    def _apply_stream_epoch(self, rec: r.StreamEpochRecord) -> None:
        stream = self._we("streams", rec.stream_id)
        stream.epoch = rec.epoch
        stream.state = rec.state
        stream.node_id = rec.node_id

    def _apply_range(self, rec: r.RangeRecord) -> None:
        stream = self._we("streams", rec.stream_id)
        new = RangeState(
            range_index=rec.range_index,
            epoch=rec.epoch,
            start_offset=rec.start_offset,
            end_offset=rec.end_offset,
            node_id=rec.node_id,
        )
        if stream.ranges and stream.ranges[-1].range_index == rec.range_index:
            stream.ranges[-1] = new
        else:
            stream.ranges.append(new)

    def _apply_trim_stream(self, rec: r.TrimStreamRecord) -> None:
        stream = self._we("streams", rec.stream_id)
        stream.start_offset = rec.start_offset
        if rec.trimmed_ms:
            stream.trimmed_ms = rec.trimmed_ms
        # ranges wholly below the new start are gone; the last range always stays
        while len(stream.ranges) > 1 and stream.ranges[0].end_offset <= rec.start_offset:
            stream.ranges.pop(0)
        if stream.aborted_txns and stream.aborted_txns[0][2] < rec.start_offset:
            stream.aborted_txns = [a for a in stream.aborted_txns if a[2] >= rec.start_offset]

    def _apply_aborted_txns(self, rec: r.AbortedTxnsRecord) -> None:
        stream = self._we("streams", rec.stream_id)
        entries = [tuple(e) for e in rec.entries]
        stream.aborted_txns = [*stream.aborted_txns, *entries][-MAX_ABORTED_TXNS_PER_STREAM:]

    def _apply_cleaner_checkpoint(self, rec: r.CleanerCheckpointRecord) -> None:
        stream = self._we("streams", rec.stream_id)
        stream.cleaned_offset = rec.cleaned_offset
        stream.cleaned_ms = rec.cleaned_ms

    def _apply_delete_stream(self, rec: r.DeleteStreamRecord) -> None:
        self._pop("streams", rec.stream_id)

    def _apply_s3_object(self, rec: r.S3ObjectRecord) -> None:
        self._put("objects", rec.object_id, ObjectMetaState(**rec.model_dump(exclude={"type"})))
        self.next_object_id = max(self.next_object_id, rec.object_id + 1)

    def _apply_remove_s3_object(self, rec: r.RemoveS3ObjectRecord) -> None:
        self._pop("objects", rec.object_id)

    def _apply_stream_set_object(self, rec: r.StreamSetObjectRecord) -> None:
        self._put(
            "stream_set_objects",
            rec.object_id,
            StreamSetObjectState(
                object_id=rec.object_id,
                node_id=rec.node_id,
                order_id=rec.order_id,
                ranges=list(rec.ranges),
                committed_ms=rec.committed_ms,
            ),
        )
        for rng in rec.ranges:
            stream = self._we("streams", rng.stream_id)
            if stream is not None:
                _insert_object_range(
                    stream,
                    ObjectRange(
                        object_id=rec.object_id,
                        start_offset=rng.start_offset,
                        end_offset=rng.end_offset,
                        kind="sso",
                    ),
                )

    def _apply_remove_stream_set_object(self, rec: r.RemoveStreamSetObjectRecord) -> None:
        sso = self._pop("stream_set_objects", rec.object_id)
        if sso is None:
            return
        for rng in sso.ranges:
            stream = self._we("streams", rng.stream_id)
            if stream is not None:
                _remove_object_range(stream, rec.object_id)

    def _apply_stream_object(self, rec: r.StreamObjectRecord) -> None:
        self._put(
            "stream_objects",
            rec.object_id,
            StreamObjectState(
                object_id=rec.object_id,
                stream_id=rec.stream_id,
                start_offset=rec.start_offset,
                end_offset=rec.end_offset,
                committed_ms=rec.committed_ms,
            ),
        )
        stream = self._we("streams", rec.stream_id)
        if stream is not None:
            _insert_object_range(
                stream,
                ObjectRange(
                    object_id=rec.object_id,
                    start_offset=rec.start_offset,
                    end_offset=rec.end_offset,
                    kind="so",
                ),
            )

    def _apply_remove_stream_object(self, rec: r.RemoveStreamObjectRecord) -> None:
        self._pop("stream_objects", rec.object_id)
        stream = self._we("streams", rec.stream_id)
        if stream is not None:
            _remove_object_range(stream, rec.object_id)

    def _apply_route_epoch(self, rec: r.RouteEpochRecord) -> None:
        self.route_epoch = RouteEpochState(
            current_epoch=rec.current_epoch,
            fenced_epoch=rec.fenced_epoch,
            committed_epoch=rec.committed_epoch,
        )

    def _apply_bucket_failover(self, rec: r.BucketFailoverRecord) -> None:
        self.active_bucket_id = rec.active_bucket_id
        mode = rec.mode or ("normal" if rec.active_bucket_id == 0 else "failover")
        self.bucket_failover = BucketFailoverState(
            mode=mode,
            active_bucket_id=rec.active_bucket_id,
            since_ms=rec.changed_ms,
            reason=rec.reason,
            auto=rec.auto,
        )

    def _apply_kv(self, rec: r.KVRecord) -> None:
        if rec.value is None:
            self._pop("kv", rec.key)
        else:
            self._put("kv", rec.key, rec.value)

    def _apply_next_ids(self, rec: r.NextIdsRecord) -> None:
        self.next_object_id = max(self.next_object_id, rec.next_object_id)
        self.next_stream_id = max(self.next_stream_id, rec.next_stream_id)
        self.next_producer_id = max(self.next_producer_id, rec.next_producer_id)

    def _apply_coordinator_slots(self, rec: r.CoordinatorSlotsRecord) -> None:
        self.coordinator_slot_count = rec.slot_count
        for a in rec.assignments:
            self._put(
                "coordinator_slots", a.slot, CoordinatorSlotState(node_id=a.node_id, epoch=a.epoch)
            )

    def _apply_compactor(self, rec: r.CompactorRecord) -> None:
        self._put(
            "compactors",
            rec.name,
            CompactorState(name=rec.name, epoch=rec.epoch, incarnation_id=rec.incarnation_id),
        )

    def _apply_scram_credential(self, rec: r.ScramCredentialRecord) -> None:
        self._put(
            "scram_credentials",
            f"{rec.mechanism}:{rec.user}",
            ScramCredentialState(**rec.model_dump(exclude={"type"})),
        )

    def _apply_remove_scram_credential(self, rec: r.RemoveScramCredentialRecord) -> None:
        self._pop("scram_credentials", f"{rec.mechanism}:{rec.user}")

    def _apply_acl(self, rec: r.AclRecord) -> None:
        key = rec.binding.model_dump_json()
        if rec.removed:
            self._pop("acls", key)
        else:
            self._put("acls", key, rec.binding)

    # ------------------------------------------------------------ queries (pure)

    def topic_by_name(self, name: str) -> TopicState | None:
        topic_id = self.topic_ids_by_name.get(name)
        return self.topics.get(topic_id) if topic_id else None

    def stream_objects_in_range(
        self, stream_id: int, start_offset: int, end_offset: int, limit: int = 1000
    ) -> list[tuple[ObjectRange, ObjectMetaState]]:
        """Committed objects holding offsets of [start, end) of a stream, in offset order.

        Where a stream object and a stream-set object overlap (compaction in progress), the
        one that starts at the next needed offset wins; the result is contiguous as far as the
        metadata allows.
        """
        stream = self.streams.get(stream_id)
        if stream is None:
            return []
        result: list[tuple[ObjectRange, ObjectMetaState]] = []
        ranges = stream.object_ranges
        starts = [o.start_offset for o in ranges]
        i = max(bisect.bisect_right(starts, start_offset) - 1, 0)
        next_offset = start_offset
        while i < len(ranges) and len(result) < limit and next_offset < end_offset:
            o = ranges[i]
            i += 1
            if o.end_offset <= next_offset or o.start_offset > next_offset:
                if o.start_offset > next_offset:
                    break
                continue
            meta = self.objects.get(o.object_id)
            if meta is None or meta.state != ObjectState.COMMITTED:
                continue
            result.append((o, meta))
            next_offset = o.end_offset
        return result

    def fingerprint(self) -> str:
        """A hash of the whole image: equal images on every node mean equal state."""
        return hashlib.sha256(self.model_dump_json(exclude={"offset"}).encode()).hexdigest()


def _insert_object_range(stream: StreamMetaState, obj: ObjectRange) -> None:
    keys = [(o.start_offset, o.object_id) for o in stream.object_ranges]
    idx = bisect.bisect_left(keys, (obj.start_offset, obj.object_id))
    if idx < len(keys) and keys[idx] == (obj.start_offset, obj.object_id):
        return
    stream.object_ranges.insert(idx, obj)


def _remove_object_range(stream: StreamMetaState, object_id: int) -> None:
    stream.object_ranges = [o for o in stream.object_ranges if o.object_id != object_id]
