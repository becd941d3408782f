"""The broker's Kafka APIs on top of partition backends and the metadata image.

Metadata, Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, CreateTopics, DeleteTopics,
CreatePartitions, DescribeConfigs, AlterConfigs, IncrementalAlterConfigs, FindCoordinator,
InitProducerId. Each handler takes the
decoded kafka-python request of the negotiated version and returns the response object of
the same version (`None` for acks=0 produce). Handlers only route and encode: each partition
is a `PartitionBackend` (partition_backend.py) found through a `PartitionResolver`, which owns
the partition's rules (validation, idempotence, offsets, epochs). A partition this broker
does not serve answers NOT_LEADER_OR_FOLLOWER so clients refresh their metadata.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)

from controlplane import broker_configs, topic_configs, topics
from controlplane import requests as cmd
from controlplane.calls import ControllerCalls, build_request
from controlplane.coordinators import group_coordinator, txn_coordinator
from controlplane.erasure_placement import serving_node
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage, TopicState
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import RecordChunks
from dataplane.kafka.codec import RecordsPlaceholders, ResponseWithRecords
from dataplane.kafka.fetch_budget import next_wave
from dataplane.kafka.partition_backend import (
    BackendError,
    ClientRouting,
    DirectRouting,
    PartitionBackend,
    PartitionResolver,
    append_when_room,
    kafka_error_of,
)
from dataplane.objectstore import ObjectStoreError

log = logging.getLogger(__name__)

CLUSTER_ID = "automq-local-cluster"
MAX_FETCH_WAIT_MS = 30_000
DEFAULT_PARTITIONS = 1
PRODUCER_ID_BLOCK = 1000
METADATA_WAIT_S = 10.0
# a produce waits for WAL room at most this share of its timeout: its retriable answer
# reaches the client before the client's own request timeout gives up on it
ROOM_WAIT_SHARE_OF_TIMEOUT = 0.8
MIN_DURABLE_WAIT_S = 0.001

_CONTROLLER_TO_KAFKA = {
    ErrorCode.TOPIC_ALREADY_EXISTS: KafkaError.TOPIC_ALREADY_EXISTS,
    ErrorCode.INVALID_TOPIC_NAME: KafkaError.INVALID_TOPIC_EXCEPTION,
    ErrorCode.UNKNOWN_TOPIC: KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_PARTITIONS: KafkaError.INVALID_PARTITIONS,
    ErrorCode.NOT_ENOUGH_BROKERS: KafkaError.INVALID_REPLICATION_FACTOR,
    ErrorCode.INVALID_REQUEST: KafkaError.INVALID_REQUEST,
    ErrorCode.INVALID_CONFIG: KafkaError.INVALID_CONFIG,
}

# ConfigResource.Type and AlterConfigOp.OpType of Kafka's admin protocol
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
_INCREMENTAL_OPS = {0: "set", 1: "delete", 2: "append", 3: "subtract"}


def _config_ops(res, incremental: bool) -> list[dict]:
    """An (Incremental)AlterConfigs resource's entries as the controller's config ops
    (AlterConfigs sets every key it names)."""
    return [
        {
            "key": c.name,
            "op": _INCREMENTAL_OPS.get(c.config_operation, str(c.config_operation))
            if incremental
            else "set",
            "value": c.value,
        }
        for c in res.configs
    ]


def _room_wait_s(remaining_s: float) -> float:
    """How long a produce with `remaining_s` left may wait for WAL room."""
    return max(remaining_s * ROOM_WAIT_SHARE_OF_TIMEOUT, 0.0)


def _kafka_error(exc: ControllerError) -> KafkaError:
    return _CONTROLLER_TO_KAFKA.get(
        exc.code,
        KafkaError.REQUEST_TIMED_OUT
        if exc.code in (ErrorCode.NO_LEADER, ErrorCode.TIMEOUT)
        else KafkaError.UNKNOWN_SERVER_ERROR,
    )


@dataclass
class BrokerIdentity:
    node_id: int
    host: str
    port: int
    az: str


def coordinator_for(key: str, image: MetadataImage) -> int | None:
    """The broker that coordinates a group: the live owner of the group's coordinator slot
    (`controlplane/coordinators.py`), the same answer on every broker for one image; None
    while the slot is unassigned or its owner is fenced."""
    return group_coordinator(image, key)


@dataclass
class _FetchSlot:
    """One partition of a Fetch request while it is being answered."""

    topic: str | None
    partition: int
    plog: PartitionBackend | None
    error: KafkaError
    fetch_offset: int
    partition_max_bytes: int = 0
    hw: int = -1
    start: int = -1
    lso: int = -1
    end: int = -1
    records: bytes | memoryview | RecordChunks = b""
    aborted: list[tuple[int, int]] = field(default_factory=list)

    def response(self, placeholders: RecordsPlaceholders):
        P = FetchResponse.FetchableTopicResponse.PartitionData
        return P(
            partition_index=self.partition,
            error_code=self.error,
            high_watermark=self.hw,
            last_stable_offset=self.lso,
            log_start_offset=self.start,
            aborted_transactions=[
                P.AbortedTransaction(producer_id=pid, first_offset=first)
                for pid, first in self.aborted
            ],
            preferred_read_replica=-1,
            # the record bytes go to the socket as they are, not through kafka-python's
            # encoder
            records=placeholders.placeholder(self.records) if self.records else self.records,
        )


class KafkaApis:
    """Handlers of the broker's data and admin APIs."""

    def __init__(
        self,
        me: BrokerIdentity,
        image_fn: Callable[[], MetadataImage],
        wait_for_offset: Callable[[int, float], bool],
        controller: ControllerCalls,
        partitions: PartitionResolver,
        node_epoch_fn: Callable[[], int],
        io_threads: int = 16,
        routing: ClientRouting | None = None,
    ):
        self.me = me
        self.image_fn = image_fn
        self.wait_for_offset = wait_for_offset
        self.controller = controller
        self.partitions = partitions
        # what a client is told and served, by its AZ (the zone router) or not
        self.routing: ClientRouting = routing or DirectRouting(partitions)
        self.node_epoch_fn = node_epoch_fn
        # engine calls may block on S3 or the controller: keep them off the event loop
        self.io = ThreadPoolExecutor(io_threads, thread_name_prefix="kafka-io")
        self._pid_lock = threading.Lock()
        self._pid_next = 0
        self._pid_end = 0
        # the transaction APIs (dataplane/kafka/txn/handlers.py), set by the broker's wiring;
        # InitProducerId with a transactional id goes there
        self.txn = None

    def registrations(self) -> list:
        """(request class, min version, max version, handler) for the API registry."""
        return [
            (MetadataRequest, 0, 12, self.metadata),
            (ProduceRequest, 3, 11, self.produce),
            (FetchRequest, 4, 16, self.fetch),
            (ListOffsetsRequest, 1, 8, self.list_offsets),
            (OffsetForLeaderEpochRequest, 2, 4, self.offset_for_leader_epoch),
            (CreateTopicsRequest, 2, 7, self.create_topics),
            (DeleteTopicsRequest, 1, 6, self.delete_topics),
            (CreatePartitionsRequest, 0, 3, self.create_partitions),
            (DescribeConfigsRequest, 1, 4, self.describe_configs),
            (AlterConfigsRequest, 0, 2, self.alter_configs),
            (IncrementalAlterConfigsRequest, 0, 1, self.incremental_alter_configs),
            (FindCoordinatorRequest, 0, 4, self.find_coordinator),
            (InitProducerIdRequest, 0, 4, self.init_producer_id),
            (DescribeClusterRequest, 0, 2, self.describe_cluster),
        ]

    async def _io(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    # ------------------------------------------------------------ metadata

    def _topic(
        self, image: MetadataImage, name: str | None = None, topic_id: uuid.UUID | None = None
    ) -> TopicState | None:
        if topic_id is not None and topic_id.int != 0:
            return image.topics.get(str(topic_id))
        return image.topic_by_name(name) if name else None

    def _client_az(self, ctx) -> str | None:
        peer = getattr(ctx, "peer", None)
        return self.routing.client_az(getattr(ctx, "client_id", None), peer[0] if peer else None)

    async def metadata(self, req, ctx):
        v = ctx.api_version
        image = self.image_fn()
        wanted = None if req.topics is None else [t.name for t in req.topics]
        if wanted is not None and v == 0 and not wanted:
            wanted = None  # v0: an empty list means all topics
        auto = bool(getattr(req, "allow_auto_topic_creation", True))
        missing = [n for n in (wanted or []) if n and image.topic_by_name(n) is None]
        if missing and auto:
            await self._io(self._auto_create, missing)
            image = self.image_fn()
        R = MetadataResponse
        # like Kafka: the endpoints of the listener the client connected on; a broker
        # without that listener is left out, and its partitions answer LISTENER_NOT_FOUND.
        # A client that declares its AZ is told only that AZ's brokers (zone router)
        listener = ctx.extras.get("listener")
        az = self._client_az(ctx)
        brokers = []
        for b in self.routing.brokers_for(image, az):
            endpoint = b.endpoint(listener)
            if endpoint is not None:
                brokers.append(
                    R.MetadataResponseBroker(
                        node_id=b.node_id, host=endpoint[0], port=endpoint[1], rack=b.az
                    )
                )
        listed = {b.node_id for b in brokers}
        topics = []
        live_ids = {b.node_id for b in brokers}
        names = wanted if wanted is not None else sorted(t.name for t in image.topics.values())
        for name in names:
            topic = image.topic_by_name(name) if name else None
            if topic is None:
                topics.append(
                    R.MetadataResponseTopic(
                        error_code=KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        is_internal=False,
                        partitions=[],
                    )
                )
                continue
            parts = []
            for p in sorted(topic.partitions.values(), key=lambda p: p.partition):
                # a leaderless (erasure-coded) partition names a live broker as its leader,
                # one in the client's AZ when there is one: every broker serves it
                # (controlplane/erasure_placement.py); a leader partition names the
                # leader's proxy in the client's AZ (zone router)
                serving = serving_node(image, p, az if p.erasure_coded else None)
                if serving is not None and not p.erasure_coded:
                    serving = self.routing.leader_for(image, serving, az)
                replicas = (
                    list(p.shard_stores)
                    if p.erasure_coded
                    else [serving if serving is not None else p.leader_node_id]
                )
                if serving is None:
                    error = KafkaError.LEADER_NOT_AVAILABLE
                elif serving not in listed:
                    error, serving = KafkaError.LISTENER_NOT_FOUND, None
                else:
                    error = KafkaError.NONE
                parts.append(
                    R.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=error,
                        partition_index=p.partition,
                        leader_id=serving if serving is not None else -1,
                        leader_epoch=p.leader_epoch,
                        replica_nodes=replicas,
                        isr_nodes=[n for n in replicas if n == serving or n in live_ids]
                        if p.erasure_coded
                        else replicas,
                        offline_replicas=[],
                    )
                )
            topics.append(
                R.MetadataResponseTopic(
                    error_code=KafkaError.NONE,
                    name=topic.name,
                    topic_id=uuid.UUID(topic.topic_id),
                    is_internal=False,
                    partitions=parts,
                )
            )
        controller_id = brokers[0].node_id if brokers else -1
        return R[v](
            throttle_time_ms=0,
            brokers=brokers,
            cluster_id=CLUSTER_ID,
            controller_id=controller_id,
            topics=topics,
        )

    async def describe_cluster(self, req, ctx):
        """The brokers (Kafka's AdminClient.describeCluster), each with its endpoint on the
        listener the client connected on, as Metadata; fenced ones only when v2 asks."""
        v = ctx.api_version
        R = DescribeClusterResponse
        fields: dict = {}
        if v >= 1:
            fields["endpoint_type"] = 1
            if getattr(req, "endpoint_type", 1) != 1:  # 2: controllers, not served by brokers
                return R[v](
                    throttle_time_ms=0,
                    error_code=KafkaError.UNSUPPORTED_ENDPOINT_TYPE,
                    error_message="brokers describe brokers only (endpoint type 1)",
                    cluster_id=CLUSTER_ID,
                    controller_id=-1,
                    brokers=[],
                    **fields,
                )
        image = self.image_fn()
        fenced_too = v >= 2 and bool(getattr(req, "include_fenced_brokers", False))
        listener = ctx.extras.get("listener")
        brokers = []
        for b in sorted(image.brokers.values(), key=lambda b: b.node_id):
            endpoint = b.endpoint(listener)
            if endpoint is None or (b.fenced and not fenced_too):
                continue
            extra = {"is_fenced": b.fenced} if v >= 2 else {}
            brokers.append(
                R.DescribeClusterBroker(
                    broker_id=b.node_id, host=endpoint[0], port=endpoint[1], rack=b.az, **extra
                )
            )
        active = [b.broker_id for b in brokers if not (v >= 2 and b.is_fenced)]
        return R[v](
            throttle_time_ms=0,
            error_code=KafkaError.NONE,
            error_message=None,
            cluster_id=CLUSTER_ID,
            controller_id=active[0] if active else -1,
            brokers=brokers,
            **fields,
        )

    def _auto_create(self, names: list[str]) -> None:
        for name in names:
            try:
                self.controller.create_topic(
                    build_request(cmd.CreateTopicRequest, name=name, partitions=DEFAULT_PARTITIONS)
                )
            except ControllerError as exc:
                if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.info("auto-creating topic %r failed: %s", name, exc)
        self._await_topics(names)

    def _await_topics(self, names: list[str], present: bool = True) -> None:
        deadline = time.monotonic() + METADATA_WAIT_S
        while time.monotonic() < deadline:
            image = self.image_fn()
            if all((image.topic_by_name(n) is not None) == present for n in names):
                if not present:
                    return
                # and this broker opened the partitions it leads
                ok = True
                for n in names:
                    t = image.topic_by_name(n)
                    for p in t.partitions.values():
                        if (
                            p.leader_node_id == self.me.node_id
                            and self.partitions.get(t.topic_id, p.partition) is None
                        ):
                            ok = False
                if ok:
                    return
            time.sleep(0.02)

    # ------------------------------------------------------------ produce

    def _resolve(
        self, image: MetadataImage, name: str | None, topic_id, partition: int, az: str | None
    ):
        """(PartitionBackend or None, error) for a produce/fetch target of a client of `az`."""
        topic = self._topic(image, name, topic_id)
        if topic is None or partition not in topic.partitions:
            if topic_id is not None and getattr(topic_id, "int", 0):
                return None, KafkaError.UNKNOWN_TOPIC_ID
            return None, KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        plog = self.routing.get(topic.topic_id, partition, az)
        if plog is None:
            return None, KafkaError.NOT_LEADER_OR_FOLLOWER
        return plog, KafkaError.NONE

    async def produce(self, req, ctx):
        v = ctx.api_version
        image = self.image_fn()
        R = ProduceResponse
        az = self._client_az(ctx)
        results = []
        waits = []
        # one deadline for the whole request: waiting for WAL room, then for durability
        loop = asyncio.get_running_loop()
        timeout_s = max(req.timeout_ms, 1) / 1000
        deadline = loop.time() + timeout_s
        for t in req.topic_data:
            topic_name = getattr(t, "name", None)
            topic_id = getattr(t, "topic_id", None) if v >= 13 else None
            parts = []
            for p in t.partition_data:
                plog, error = self._resolve(image, topic_name, topic_id, p.index, az)
                base, log_start = -1, -1
                futures = []
                base_future = None
                forwarded = False
                if plog is not None:
                    try:
                        # a full WAL is waited for here, without blocking the loop
                        outcome = await append_when_room(
                            functools.partial(plog.append, p.records),
                            _room_wait_s(deadline - loop.time()),
                        )
                        error, base, futures = outcome.error, outcome.base_offset, outcome.durable
                        base_future = outcome.base_offset_future
                        forwarded = outcome.forwarded
                    except Exception as exc:  # the engine refused (fenced, closed...)
                        log.warning("append to %s-%d failed: %s", plog.topic, p.index, exc)
                        error = kafka_error_of(exc)
                    log_start = plog.log_start_offset
                entry = {
                    "index": p.index,
                    "error": error,
                    "base": base,
                    "log_start": log_start,
                    "base_future": base_future,
                    "forwarded": forwarded,
                }
                parts.append(entry)
                waits.append((entry, futures))
            results.append((t, parts))
        if req.acks != 0:
            for entry, futures in waits:
                for fut in futures:
                    try:
                        # shielded: a timeout must not cancel the append's future (a
                        # retry of the batch may be waiting for the same durability)
                        done = await asyncio.wait_for(
                            asyncio.shield(asyncio.wrap_future(fut)),
                            max(deadline - loop.time(), MIN_DURABLE_WAIT_S),
                        )
                        if entry["forwarded"]:
                            # appended elsewhere (a zone-router proxy's main): its outcome
                            entry["error"], entry["base"] = done.error, done.base_offset
                    except TimeoutError:
                        entry["error"] = KafkaError.REQUEST_TIMED_OUT
                    except Exception as exc:  # e.g. no WAL room on a worker's append
                        log.warning("append failed: %s", exc)
                        entry["error"] = kafka_error_of(exc)
                base_future = entry["base_future"]
                if entry["error"] == KafkaError.NONE and base_future is not None:
                    entry["base"] = base_future.result()  # done: it was among the futures
        else:
            return None
        responses = []
        for t, parts in results:
            kwargs = {"topic_id": t.topic_id} if v >= 13 else {"name": t.name}
            responses.append(
                R.TopicProduceResponse(
                    partition_responses=[
                        R.TopicProduceResponse.PartitionProduceResponse(
                            index=e["index"],
                            error_code=e["error"],
                            base_offset=e["base"] if e["error"] == KafkaError.NONE else -1,
                            log_append_time_ms=-1,
                            log_start_offset=e["log_start"],
                            record_errors=[],
                            error_message=None,
                        )
                        for e in parts
                    ],
                    **kwargs,
                )
            )
        return R[v](responses=responses, throttle_time_ms=0)

    # ------------------------------------------------------------ fetch

    async def fetch(self, req, ctx):
        v = ctx.api_version
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(req.max_wait_ms, 0), MAX_FETCH_WAIT_MS) / 1000
        min_bytes = max(req.min_bytes, 0)
        max_bytes = req.max_bytes if v >= 3 and req.max_bytes > 0 else 2**31 - 1
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        # keyed by each partition's identity: two views of one partition listen once
        listening: dict[object, PartitionBackend] = {}
        try:
            for _ in range(1_000_000):
                woken.clear()
                image = self.image_fn()
                placeholders = RecordsPlaceholders()
                total, topics = await self._fetch_once(
                    req, v, image, max_bytes, listening, wake, placeholders, self._client_az(ctx)
                )
                if total >= min_bytes or loop.time() >= deadline or total < 0:
                    break
                try:
                    await asyncio.wait_for(woken.wait(), max(deadline - loop.time(), 0))
                except TimeoutError:
                    pass
        finally:
            for plog in listening.values():
                plog.remove_listener(wake)
        response = FetchResponse[v](
            throttle_time_ms=0, error_code=0, session_id=0, responses=topics
        )
        return ResponseWithRecords(response, placeholders)

    async def _fetch_once(self, req, v, image, max_bytes, listening, wake, placeholders, az):
        F = FetchResponse.FetchableTopicResponse
        read_committed = getattr(req, "isolation_level", 0) == 1
        # first the partitions' state and errors, then the reads: the partitions of one
        # request are read at once (a catch-up read waits for object-store GETs), in waves
        # that keep the response within the request's max_bytes (fetch_budget.py)
        slots: list[list[_FetchSlot]] = []
        to_read: list[_FetchSlot] = []
        for t in req.topics:
            name = getattr(t, "topic", None) if v < 13 else None
            topic_id = getattr(t, "topic_id", None) if v >= 13 else None
            topic_slots = []
            for p in t.partitions:
                plog, error = self._resolve(image, name, topic_id, p.partition, az)
                slot = _FetchSlot(t.topic, p.partition, plog, error, p.fetch_offset)
                slot.partition_max_bytes = p.partition_max_bytes
                if plog is not None:
                    slot.hw, slot.start = plog.high_watermark, plog.log_start_offset
                    slot.lso = plog.last_stable_offset
                    # read_committed (KIP-98): up to the last stable offset
                    slot.end = slot.lso if read_committed else slot.hw
                    current = getattr(p, "current_leader_epoch", -1)
                    if current >= 0 and current < plog.leader_epoch:
                        slot.error = KafkaError.FENCED_LEADER_EPOCH
                    elif current > plog.leader_epoch:
                        slot.error = KafkaError.UNKNOWN_LEADER_EPOCH
                    elif p.fetch_offset < slot.start or (
                        # a backend that serves what its leader committed (a zone-router
                        # proxy) may lag: past its end is "not yet", as on a Kafka follower
                        p.fetch_offset > slot.hw and not plog.lags_leader
                    ):
                        slot.error = KafkaError.OFFSET_OUT_OF_RANGE
                    elif p.fetch_offset < slot.end:
                        to_read.append(slot)
                    if plog.identity not in listening:
                        plog.add_listener(wake)
                        listening[plog.identity] = plog
                topic_slots.append(slot)
            slots.append(topic_slots)
        total = 0
        while to_read and total < max_bytes:
            budgets = next_wave([s.partition_max_bytes for s in to_read], total, max_bytes)
            if not budgets:
                break
            wave, to_read = to_read[: len(budgets)], to_read[len(budgets) :]
            await asyncio.gather(
                *(self._fetch_read(s, b, read_committed) for s, b in zip(wave, budgets))
            )
            total += sum(len(s.records) for s in wave)
        topics = []
        errors = False
        for t, topic_slots in zip(req.topics, slots):
            parts = []
            for slot in topic_slots:
                if slot.error != KafkaError.NONE:
                    errors = True
                parts.append(slot.response(placeholders))
            kwargs = {"topic_id": t.topic_id} if v >= 13 else {"topic": t.topic}
            topics.append(F(partitions=parts, **kwargs))
        return (-1 if errors and total == 0 else total), topics

    async def _fetch_read(self, slot: _FetchSlot, budget: int, read_committed: bool) -> None:
        """One partition's records of a Fetch (on the I/O pool), into `slot`."""
        plog = slot.plog
        try:
            slot.records = await self._io(plog.read, slot.fetch_offset, budget, slot.end)
        except ObjectStoreError as exc:
            # e.g. its bucket is down (object-storage failover): the client retries;
            # nothing is skipped
            log.warning("fetch %s-%d: %s", slot.topic, slot.partition, exc)
            slot.error = KafkaError.KAFKA_STORAGE_ERROR
            return
        if read_committed and slot.records:
            slot.aborted = plog.aborted_transactions(slot.fetch_offset, slot.end)

    # ------------------------------------------------------------ offsets

    async def list_offsets(self, req, ctx):
        v = ctx.api_version
        image = self.image_fn()
        R = ListOffsetsResponse
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                plog, error = self._resolve(
                    image, t.name, None, p.partition_index, self._client_az(ctx)
                )
                offset, ts = -1, -1
                if plog is not None:
                    if p.timestamp == -2:
                        offset = plog.log_start_offset
                    elif p.timestamp == -1:
                        # read_committed (KIP-98): the last stable offset
                        offset = (
                            plog.last_stable_offset
                            if getattr(req, "isolation_level", 0) == 1
                            else plog.high_watermark
                        )
                    else:
                        lookup = (
                            (plog.max_timestamp_offset,)  # MAX_TIMESTAMP (KIP-734)
                            if p.timestamp == -3
                            else (plog.offset_for_timestamp, p.timestamp)
                        )
                        try:
                            found = await self._io(*lookup)
                            offset, ts = found.offset, found.timestamp_ms
                        except BackendError as exc:
                            log.info("ListOffsets %s-%d: %s", t.name, p.partition_index, exc)
                            error = exc.error
                parts.append(
                    R.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=error,
                        timestamp=ts,
                        offset=offset,
                        leader_epoch=plog.leader_epoch if plog else -1,
                    )
                )
            topics.append(R.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return R[v](throttle_time_ms=0, topics=topics)

    async def offset_for_leader_epoch(self, req, ctx):
        v = ctx.api_version
        image = self.image_fn()
        R = OffsetForLeaderEpochResponse
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                plog, error = self._resolve(image, t.topic, None, p.partition, self._client_az(ctx))
                epoch, end = -1, -1
                if plog is not None:
                    epoch, end = plog.epoch_end_offset(p.leader_epoch)
                parts.append(
                    R.OffsetForLeaderTopicResult.EpochEndOffset(
                        error_code=error, partition=p.partition, leader_epoch=epoch, end_offset=end
                    )
                )
            topics.append(R.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
        return R[v](throttle_time_ms=0, topics=topics)

    # ------------------------------------------------------------ admin

    def _create_topic(self, name: str, partitions: int, configs: dict, validate_only: bool):
        req = build_request(
            cmd.CreateTopicRequest, name=name, partitions=partitions, configs=configs
        )
        if validate_only:
            # the state machine's own checks (name, existence, configs, brokers) on this
            # broker's image, with a throwaway id: nothing is replicated
            topics.create_topic(
                self.image_fn(), req.model_copy(update={"topic_id": str(uuid.uuid4())}), 0
            )
            return None
        res = self.controller.create_topic(req)
        self._await_topics([name])
        return res

    async def create_topics(self, req, ctx):
        v = ctx.api_version
        R = CreateTopicsResponse
        out = []
        for t in req.topics:
            partitions = t.num_partitions if t.num_partitions > 0 else DEFAULT_PARTITIONS
            configs = {c.name: c.value for c in (t.configs or []) if c.value is not None}
            error, message, topic_id = KafkaError.NONE, None, uuid.UUID(int=0)
            nulls = [c.name for c in (t.configs or []) if c.value is None]
            try:
                if nulls:
                    raise ControllerError(
                        ErrorCode.INVALID_CONFIG,
                        f"Null value not supported for topic configs: {', '.join(nulls)}",
                    )
                res = await self._io(
                    self._create_topic, t.name, partitions, configs, bool(req.validate_only)
                )
                if res:
                    topic_id = uuid.UUID(res.topic_id)
            except ControllerError as exc:
                error, message = _kafka_error(exc), exc.message
            out.append(
                R.CreatableTopicResult(
                    name=t.name,
                    topic_id=topic_id,
                    error_code=error,
                    error_message=message,
                    num_partitions=partitions if error == KafkaError.NONE else -1,
                    replication_factor=1 if error == KafkaError.NONE else -1,
                    configs=_created_topic_configs(configs) if error == KafkaError.NONE else [],
                )
            )
        return R[v](throttle_time_ms=0, topics=out)

    def _delete_topic(self, name: str) -> None:
        self.controller.delete_topic(build_request(cmd.DeleteTopicRequest, name=name))
        self._await_topics([name], present=False)

    async def delete_topics(self, req, ctx):
        v = ctx.api_version
        R = DeleteTopicsResponse
        image = self.image_fn()
        targets = []
        if v >= 6:
            for t in req.topics:
                name = t.name
                if name is None and t.topic_id is not None:
                    topic = image.topics.get(str(t.topic_id))
                    name = topic.name if topic else None
                targets.append((name, t.topic_id))
        else:
            targets = [(n, None) for n in req.topic_names]
        out = []
        for name, _tid in targets:
            error, message = KafkaError.NONE, None
            topic = image.topic_by_name(name) if name else None
            if topic is None:
                error = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
            else:
                try:
                    await self._io(self._delete_topic, name)
                except ControllerError as exc:
                    error, message = _kafka_error(exc), exc.message
            out.append(
                R.DeletableTopicResult(
                    name=name,
                    topic_id=uuid.UUID(topic.topic_id) if topic else uuid.UUID(int=0),
                    error_code=error,
                    error_message=message,
                )
            )
        return R[v](throttle_time_ms=0, responses=out)

    def _create_partitions(self, name: str, count: int, validate_only: bool) -> None:
        if validate_only:
            topic = self.image_fn().topic_by_name(name)
            if topic is None:
                raise ControllerError(ErrorCode.UNKNOWN_TOPIC, f"topic {name} does not exist")
            if count <= len(topic.partitions):
                raise ControllerError(ErrorCode.INVALID_PARTITIONS, "count must grow")
            return
        self.controller.create_partitions(
            build_request(cmd.CreatePartitionsRequest, name=name, total_count=count)
        )
        deadline = time.monotonic() + METADATA_WAIT_S
        while time.monotonic() < deadline:
            topic = self.image_fn().topic_by_name(name)
            if topic is not None and len(topic.partitions) >= count:
                return
            time.sleep(0.02)

    async def create_partitions(self, req, ctx):
        v = ctx.api_version
        R = CreatePartitionsResponse
        out = []
        for t in req.topics:
            error, message = KafkaError.NONE, None
            try:
                await self._io(self._create_partitions, t.name, t.count, bool(req.validate_only))
            except ControllerError as exc:
                error, message = _kafka_error(exc), exc.message
            out.append(
                R.CreatePartitionsTopicResult(name=t.name, error_code=error, error_message=message)
            )
        return R[v](throttle_time_ms=0, results=out)

    async def describe_configs(self, req, ctx):
        """Every topic config with its value in force and source (TOPIC_CONFIG when set on
        the topic, DEFAULT_CONFIG otherwise), synonyms and documentation when asked; a
        broker's static configs."""
        v = ctx.api_version
        R = DescribeConfigsResponse
        Entry = R.DescribeConfigsResult.DescribeConfigsResourceResult
        image = self.image_fn()
        synonyms_wanted = bool(getattr(req, "include_synonyms", False))
        docs_wanted = bool(getattr(req, "include_documentation", False))
        results = []
        for res in req.resources:
            error, message, rows = KafkaError.NONE, None, []
            if res.resource_type == RESOURCE_TOPIC:
                topic = image.topic_by_name(res.resource_name)
                if topic is None:
                    error = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                    message = f"topic {res.resource_name!r} does not exist"
                else:
                    rows = topic_configs.describe(
                        topic.configs,
                        broker_configs.configs_of(image, ""),
                        broker_configs.configs_of(image, str(self.me.node_id)),
                    )
            elif res.resource_type == RESOURCE_BROKER:
                error, message, rows = self._describe_broker(image, res.resource_name)
            else:
                error = KafkaError.INVALID_REQUEST
                message = f"unsupported resource type {res.resource_type}"
            keys = res.configuration_keys
            entries = [
                Entry(
                    name=row.name,
                    value=row.value,
                    read_only=row.read_only,
                    is_default=row.source == topic_configs.ConfigSource.DEFAULT_CONFIG,
                    config_source=row.source.value,
                    is_sensitive=False,
                    synonyms=[
                        Entry.DescribeConfigsSynonym(name=n, value=val, source=src.value)
                        for n, val, src in row.synonyms
                    ]
                    if synonyms_wanted
                    else [],
                    config_type=row.config_type,
                    documentation=row.doc if docs_wanted else None,
                )
                for row in rows
                if not keys or row.name in keys  # null or empty: all (as Kafka)
            ]
            results.append(
                R.DescribeConfigsResult(
                    error_code=error,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                    configs=entries,
                )
            )
        return R[v](throttle_time_ms=0, results=results)

    def _describe_broker(self, image, resource: str) -> tuple[int, str | None, list]:
        """A broker's static configs and every dynamic one (the topic defaults' broker
        synonyms, then the broker's own settings) with its value in force and source;
        resource "" = the cluster default."""
        if resource and (not resource.isdigit() or int(resource) not in image.brokers):
            return KafkaError.INVALID_REQUEST, f"broker {resource!r} is not registered", []
        static = topic_configs.ConfigSource.STATIC_BROKER_CONFIG
        rows = [
            topic_configs.DescribedConfig(k, v, static, True, 0, None, ((k, v, static),))
            for k, v in (
                sorted(self._broker_configs(image, int(resource)).items()) if resource else []
            )
        ]
        cluster = broker_configs.configs_of(image, "")
        node = broker_configs.configs_of(image, resource) if resource else {}
        by_topic_key = {row.name: row for row in topic_configs.describe({}, cluster, node)}
        for key, topic_key in sorted(topic_configs.BROKER_SYNONYMS.items()):
            row = by_topic_key[topic_key]
            if row.read_only:
                continue
            rows.append(
                topic_configs.DescribedConfig(
                    key, row.value, row.source, False, row.config_type, row.doc, row.synonyms
                )
            )
        rows += topic_configs.describe_broker_settings(cluster, node)
        return KafkaError.NONE, None, rows

    def _alter_broker_configs(self, req: cmd.AlterBrokerConfigsRequest, validate_only: bool):
        if validate_only:
            broker_configs.alter_broker_configs(self.image_fn(), req, 0)
            return
        res = self.controller.alter_broker_configs(req)
        self.wait_for_offset(res.metadata_offset, METADATA_WAIT_S)

    def _broker_configs(self, image: MetadataImage, node_id: int) -> dict[str, str]:
        broker = image.brokers.get(node_id)
        configs = {
            # the described broker's, as registered (any broker answers for any other)
            "broker.id": str(node_id),
            "broker.rack": broker.az if broker is not None else self.me.az,
            "num.partitions": str(DEFAULT_PARTITIONS),
            "auto.create.topics.enable": "true",
        }
        if broker is not None and broker.endpoints:  # the described broker's, as registered
            configs["listeners"] = ",".join(
                f"{e.name}://{e.host}:{e.port}" for e in broker.endpoints
            )
            configs["listener.security.protocol.map"] = ",".join(
                f"{e.name}:{e.security_protocol}" for e in broker.endpoints
            )
        return configs

    def _alter_topic_configs(self, req: cmd.AlterTopicConfigsRequest, validate_only: bool):
        """Validate (validate_only: the state machine's own check on this broker's image)
        or apply one topic's alter, then wait until this broker's image holds it, so a
        DescribeConfigs or a produce right after sees the new values."""
        if validate_only:
            topics.alter_topic_configs(self.image_fn(), req, 0)
            return
        res = self.controller.alter_topic_configs(req)
        self.wait_for_offset(res.metadata_offset, METADATA_WAIT_S)

    async def _alter_configs(self, req, ctx, R, incremental: bool):
        v = ctx.api_version
        seen: dict[tuple[int, str], int] = {}
        for res in req.resources:
            key = (res.resource_type, res.resource_name)
            seen[key] = seen.get(key, 0) + 1
        out = []
        for res in req.resources:
            error, message = KafkaError.NONE, None
            if seen[(res.resource_type, res.resource_name)] > 1:
                error, message = KafkaError.INVALID_REQUEST, "duplicate resource in the request"
            elif res.resource_type == RESOURCE_BROKER:
                error, message = await self._alter_broker(res, req, incremental)
            elif res.resource_type != RESOURCE_TOPIC:
                error = KafkaError.INVALID_REQUEST
                message = f"unsupported resource type {res.resource_type}"
            else:
                try:
                    alter = build_request(
                        cmd.AlterTopicConfigsRequest,
                        name=res.resource_name,
                        ops=_config_ops(res, incremental),
                        replace=not incremental,
                    )
                    await self._io(self._alter_topic_configs, alter, bool(req.validate_only))
                except ControllerError as exc:
                    error, message = _kafka_error(exc), exc.message
            out.append(
                R.AlterConfigsResourceResponse(
                    error_code=error,
                    error_message=message,
                    resource_type=res.resource_type,
                    resource_name=res.resource_name,
                )
            )
        return R[v](throttle_time_ms=0, responses=out)

    async def _alter_broker(self, res, req, incremental: bool) -> tuple[int, str | None]:
        """Dynamic configs of every broker (resource name "") or of one registered broker."""
        name = res.resource_name or ""
        if name and (not name.isdigit() or int(name) not in self.image_fn().brokers):
            return KafkaError.INVALID_REQUEST, f"broker {name!r} is not registered"
        try:
            alter = build_request(
                cmd.AlterBrokerConfigsRequest,
                resource=name,
                ops=_config_ops(res, incremental),
                replace=not incremental,
            )
            await self._io(self._alter_broker_configs, alter, bool(req.validate_only))
        except ControllerError as exc:
            return _kafka_error(exc), exc.message
        return KafkaError.NONE, None

    async def alter_configs(self, req, ctx):
        """AlterConfigs: a topic's configs become exactly the ones given (others default)."""
        return await self._alter_configs(req, ctx, AlterConfigsResponse, incremental=False)

    async def incremental_alter_configs(self, req, ctx):
        """IncrementalAlterConfigs: SET/DELETE any key, APPEND/SUBTRACT list keys."""
        return await self._alter_configs(
            req, ctx, IncrementalAlterConfigsResponse, incremental=True
        )

    # ------------------------------------------------------------ coordinators, producers

    async def find_coordinator(self, req, ctx):
        v = ctx.api_version
        R = FindCoordinatorResponse
        image = self.image_fn()
        keys = list(req.coordinator_keys) if v >= 4 else [req.key]
        key_type = getattr(req, "key_type", 0)
        found = []
        for key in keys:
            if key_type not in (0, 1) or (key_type == 1 and not key):
                found.append((key, KafkaError.INVALID_REQUEST, -1, "", -1))
                continue
            if key_type == 0:
                node = coordinator_for(key, image)
            else:  # 1: a transactional id
                node = txn_coordinator(image, key)
            if node is not None:
                # a client of an AZ: the broker its routing names (the zone router's proxy
                # forwards the coordinator requests to the coordinator)
                node = self.routing.leader_for(image, node, self._client_az(ctx))
            broker = image.brokers.get(node) if node is not None else None
            # the coordinator's endpoint on the listener the client connected on
            endpoint = broker.endpoint(ctx.extras.get("listener")) if broker else None
            if broker is None or endpoint is None:
                log.info(
                    "no coordinator for %r (key type %d) yet: %d slots, image offset %d",
                    key,
                    key_type,
                    len(image.coordinator_slots),
                    image.offset,
                )
                found.append((key, KafkaError.COORDINATOR_NOT_AVAILABLE, -1, "", -1))
            else:
                found.append((key, KafkaError.NONE, broker.node_id, endpoint[0], endpoint[1]))
        if v >= 4:
            return R[v](
                throttle_time_ms=0,
                coordinators=[
                    R.Coordinator(
                        key=k, node_id=n, host=h, port=p, error_code=e, error_message=None
                    )
                    for k, e, n, h, p in found
                ],
            )
        _, e, n, h, p = found[0]
        return R[v](throttle_time_ms=0, error_code=e, error_message=None, node_id=n, host=h, port=p)

    def _next_producer_id(self) -> int:
        with self._pid_lock:
            if self._pid_next >= self._pid_end:
                res = self.controller.allocate_producer_ids(
                    cmd.AllocateProducerIdsRequest(
                        node_id=self.me.node_id,
                        node_epoch=self.node_epoch_fn(),
                        count=PRODUCER_ID_BLOCK,
                    )
                )
                self._pid_next = res.first_producer_id
                self._pid_end = self._pid_next + res.count
            pid = self._pid_next
            self._pid_next += 1
            return pid

    async def init_producer_id(self, req, ctx):
        v = ctx.api_version
        if req.transactional_id is not None and self.txn is not None:
            return await self.txn.init_producer_id(req, ctx)
        if req.transactional_id is not None:
            return InitProducerIdResponse[v](
                throttle_time_ms=0,
                error_code=KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        try:
            pid = await self._io(self._next_producer_id)
        except ControllerError as exc:
            log.warning("producer id allocation failed: %s", exc)
            return InitProducerIdResponse[v](
                throttle_time_ms=0,
                error_code=KafkaError.COORDINATOR_NOT_AVAILABLE,
                producer_id=-1,
                producer_epoch=-1,
            )
        return InitProducerIdResponse[v](
            throttle_time_ms=0, error_code=KafkaError.NONE, producer_id=pid, producer_epoch=0
        )


def _created_topic_configs(configs: dict) -> list:
    """CreateTopics v5+ answers the new topic's configs (as DescribeConfigs would)."""
    C = CreateTopicsResponse.CreatableTopicResult.CreatableTopicConfigs
    stored = topic_configs.validate_new_topic_configs(configs)  # as the controller stored them
    return [
        C(
            name=row.name,
            value=row.value,
            read_only=row.read_only,
            config_source=row.source.value,
            is_sensitive=False,
        )
        for row in topic_configs.describe(stored)
    ]
