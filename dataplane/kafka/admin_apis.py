"""Admin APIs that stock Kafka tools call, mapped onto this design's metadata:
DeleteRecords (the log start offset advances, as retention does), DescribeLogDirs (object-store bytes per partition), AlterPartitionReassignments and
ListPartitionReassignments (what `kafka-reassign-partitions.sh` calls; a move here is our
reassignment: no data is copied).

A partition has exactly one replica, its leader: its data lives in object storage and in the
leader's WAL, so a reassignment names one broker. A move is "in progress" from the metadata
change until the new leader has opened the stream (its last range is the new leader's).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from kafka.protocol.admin import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
    DescribeProducersRequest,
    DescribeProducersResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)

from controlplane.calls import ControllerCalls, build_request
from controlplane.errors import ControllerError
from controlplane.image import MetadataImage, PartitionState, TopicState
from controlplane.requests import ReassignPartitionsRequest
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.api_context import kafka_error
from dataplane.kafka.partition_backend import (
    BackendError,
    OffsetOutOfRangeError,
    PartitionBackend,
    PartitionResolver,
)
from dataplane.kafka.time_index import stored_pieces

log = logging.getLogger(__name__)

LOG_DIR = "object-storage"  # the one "log dir" each broker reports
REASSIGN_TIMEOUT_S = 30.0

_AlterTopic = AlterPartitionReassignmentsResponse.ReassignableTopicResponse
_AlterPartition = _AlterTopic.ReassignablePartitionResponse
_ListTopic = ListPartitionReassignmentsResponse.OngoingTopicReassignment
_ListPartition = _ListTopic.OngoingPartitionReassignment
_DeletedTopic = DeleteRecordsResponse.DeleteRecordsTopicResult
_DeletedPartition = _DeletedTopic.DeleteRecordsPartitionResult
_DirResult = DescribeLogDirsResponse.DescribeLogDirsResult
_DirTopic = _DirResult.DescribeLogDirsTopic
_DirPartition = _DirTopic.DescribeLogDirsPartition


def stream_size_bytes(image: MetadataImage, stream_id: int) -> int:
    """Bytes of the stream's data in object storage (pure; an estimate for data in
    stream-set objects, see `time_index.stored_pieces`)."""
    start = image.streams[stream_id].start_offset if stream_id in image.streams else 0
    return sum(p.size_bytes for p in stored_pieces(image, stream_id) if p.end_offset > start)


def moving_from(image: MetadataImage, partition: PartitionState) -> int | None:
    """The broker a partition is moving away from, or None when no move is in progress: the
    stream's last range belongs to another broker than the leader (pure). An erasure-coded
    partition has no leader and never moves."""
    stream = image.streams.get(partition.stream_id)
    if partition.erasure_coded or stream is None or not stream.ranges:
        return None
    owner = stream.ranges[-1].node_id
    return owner if owner != partition.leader_node_id else None


class AdminApis:
    """Handlers of the admin APIs above. Thread-safety: handlers run on the Kafka event loop;
    controller calls run on `io` (they block), the image is read, never changed."""

    def __init__(
        self,
        node_id: int,
        image_fn: Callable[[], MetadataImage],
        controller: ControllerCalls,
        partitions: PartitionResolver,
        io: Executor,
        routed: Callable[[str, int, object], PartitionBackend | None] | None = None,
    ):
        self.node_id = node_id
        self.image_fn = image_fn
        self.controller = controller
        self.partitions = partitions
        self.io = io
        # (topic id, partition, request context) -> the backend the client's routing names
        # (a zone-router proxy forwards DeleteRecords to the partition's main)
        self.routed = routed

    def registrations(self) -> list:
        """(request class, min version, max version, handler) for the API registry."""
        return [
            (DeleteRecordsRequest, 0, 2, self.delete_records),
            (DescribeLogDirsRequest, 1, 4, self.describe_log_dirs),
            (DescribeProducersRequest, 0, 0, self.describe_producers),
            (AlterPartitionReassignmentsRequest, 0, 0, self.alter_partition_reassignments),
            (ListPartitionReassignmentsRequest, 0, 0, self.list_partition_reassignments),
        ]

    # ------------------------------------------------------------ DeleteRecords

    async def delete_records(self, req, ctx):
        """Advance each partition's log start offset (`kafka-delete-records.sh`, Kafka
        Streams' repartition purge); -1 means the high watermark."""
        image = self.image_fn()
        loop = asyncio.get_running_loop()
        topics = []
        for t in req.topics:
            parts = []
            topic = image.topic_by_name(t.name)
            for p in t.partitions:
                low, error = -1, KafkaError.NONE
                plog = self.partitions.get(topic.topic_id, p.partition_index) if topic else None
                if plog is None and topic is not None and self.routed is not None:
                    # a client of an AZ told this broker leads it (its proxy)
                    routed = self.routed(topic.topic_id, p.partition_index, ctx)
                    plog = routed if routed is not None and routed.forwards_to_main else None
                if topic is None or p.partition_index not in topic.partitions:
                    error = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                elif plog is None:
                    error = KafkaError.NOT_LEADER_OR_FOLLOWER
                else:
                    try:
                        low = await loop.run_in_executor(self.io, plog.delete_records, p.offset)
                    except OffsetOutOfRangeError:
                        error = KafkaError.OFFSET_OUT_OF_RANGE
                    except BackendError as exc:
                        log.info("DeleteRecords of %s-%d: %s", t.name, p.partition_index, exc)
                        error = exc.error
                    except ControllerError as exc:
                        error = kafka_error(exc)
                    except Exception:  # noqa: BLE001 - a storage failure, retriable
                        log.exception("DeleteRecords of %s-%d failed", t.name, p.partition_index)
                        error = KafkaError.KAFKA_STORAGE_ERROR
                parts.append(
                    _DeletedPartition(
                        partition_index=p.partition_index, low_watermark=low, error_code=error
                    )
                )
            topics.append(_DeletedTopic(name=t.name, partitions=parts))
        return DeleteRecordsResponse[ctx.api_version](throttle_time_ms=0, topics=topics)

    # ------------------------------------------------------------ DescribeProducers

    async def describe_producers(self, req, ctx):
        """The idempotent and transactional producers of partitions led here
        (`kafka-transactions.sh describe-producers`): id, epoch, last sequence, and the
        first offset of an open transaction; timestamps and coordinator epochs are not kept
        (-1)."""
        R = DescribeProducersResponse
        image = self.image_fn()
        topics = []
        for t in req.topics:
            topic = image.topic_by_name(t.name)
            parts = []
            for index in t.partition_indexes:
                plog = self.partitions.get(topic.topic_id, index) if topic else None
                error, message, producers = KafkaError.NONE, None, []
                if topic is None or index not in topic.partitions:
                    error = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                elif plog is None:
                    error = KafkaError.NOT_LEADER_OR_FOLLOWER
                    message = f"broker {self.node_id} does not lead {t.name}-{index}"
                else:
                    producers = [
                        R.TopicResponse.PartitionResponse.ProducerState(
                            producer_id=pid,
                            producer_epoch=epoch,
                            last_sequence=seq,
                            last_timestamp=-1,
                            coordinator_epoch=-1,
                            current_txn_start_offset=txn_start,
                        )
                        for pid, epoch, seq, txn_start in sorted(plog.active_producers())
                    ]
                parts.append(
                    R.TopicResponse.PartitionResponse(
                        partition_index=index,
                        error_code=error,
                        error_message=message,
                        active_producers=producers,
                    )
                )
            topics.append(R.TopicResponse(name=t.name, partitions=parts))
        return R[ctx.api_version](throttle_time_ms=0, topics=topics)

    # ------------------------------------------------------------ DescribeLogDirs

    async def describe_log_dirs(self, req, ctx):
        """The partitions this broker leads, with their object-store bytes; one log dir."""
        image = self.image_fn()
        wanted: dict[str, set[int] | None] | None = None
        if req.topics is not None:
            wanted = {t.topic: set(t.partitions) for t in req.topics}
        topics = []
        for topic in sorted(image.topics.values(), key=lambda t: t.name):
            if wanted is not None and topic.name not in wanted:
                continue
            parts = [
                _DirPartition(
                    partition_index=p.partition,
                    partition_size=stream_size_bytes(image, p.stream_id),
                    offset_lag=0,
                    is_future_key=False,
                )
                for p in sorted(topic.partitions.values(), key=lambda p: p.partition)
                if p.leader_node_id == self.node_id
                and (wanted is None or p.partition in (wanted[topic.name] or ()))
            ]
            if parts:
                topics.append(_DirTopic(name=topic.name, partitions=parts))
        result = _DirResult(
            error_code=KafkaError.NONE,
            log_dir=LOG_DIR,
            topics=topics,
            total_bytes=-1,  # object storage has no fixed size
            usable_bytes=-1,
            is_cordoned=False,
        )
        return DescribeLogDirsResponse[ctx.api_version](
            throttle_time_ms=0, error_code=KafkaError.NONE, results=[result]
        )

    # ------------------------------------------------------------ reassignments

    async def list_partition_reassignments(self, req, ctx):
        """Partitions whose move has not finished (the new leader has not opened them)."""
        image = self.image_fn()
        selected: list[tuple[TopicState, list[int]]] = []
        if req.topics is None:
            selected = [(t, sorted(t.partitions)) for t in image.topics.values()]
        else:
            for t in req.topics:
                topic = image.topic_by_name(t.name)
                if topic is not None:
                    selected.append((topic, list(t.partition_indexes)))
        out = []
        for topic, indexes in sorted(selected, key=lambda s: s[0].name):
            parts = []
            for index in indexes:
                partition = topic.partitions.get(index)
                source = moving_from(image, partition) if partition is not None else None
                if source is None:
                    continue
                target = partition.leader_node_id
                parts.append(
                    _ListPartition(
                        partition_index=index,
                        replicas=[target, source],
                        adding_replicas=[target],
                        removing_replicas=[source],
                    )
                )
            if parts:
                out.append(_ListTopic(name=topic.name, partitions=parts))
        return ListPartitionReassignmentsResponse[ctx.api_version](
            throttle_time_ms=0, error_code=KafkaError.NONE, error_message=None, topics=out
        )

    def _target(self, image: MetadataImage, name: str, index: int, replicas) -> tuple:
        """(node id or None, error, message) for one requested partition (pure)."""
        topic = image.topic_by_name(name)
        partition = topic.partitions.get(index) if topic is not None else None
        if partition is None:
            return None, KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{name}-{index} does not exist"
        if replicas is None:  # cancel: go back to where the data is
            source = moving_from(image, partition)
            if source is None:
                return None, KafkaError.NO_REASSIGNMENT_IN_PROGRESS, None
            replicas = [source]
        if len(replicas) != 1:
            return (
                None,
                KafkaError.INVALID_REPLICA_ASSIGNMENT,
                "a partition has exactly one replica here (its data is in object storage): "
                f"name one broker, not {len(replicas)}",
            )
        node = replicas[0]
        broker = image.brokers.get(node)
        if broker is None or not broker.active:
            state = "not registered" if broker is None else "fenced or shutting down"
            return None, KafkaError.INVALID_REPLICA_ASSIGNMENT, f"broker {node} is {state}"
        return node, KafkaError.NONE, None

    async def alter_partition_reassignments(self, req, ctx):
        """Move each partition to its one named broker (all valid moves in one controller
        command); `replicas = null` cancels an unfinished move by moving back."""
        image = self.image_fn()
        results: dict[tuple[str, int], tuple[int, str | None]] = {}
        moves: list[dict] = []
        order: list[tuple[str, int]] = []
        for t in req.topics:
            for p in t.partitions:
                key = (t.name, p.partition_index)
                order.append(key)
                node, error, message = self._target(image, t.name, p.partition_index, p.replicas)
                if key in results or any((m["topic"], m["partition"]) == key for m in moves):
                    error, message = KafkaError.INVALID_REQUEST, "partition given twice"
                    moves = [m for m in moves if (m["topic"], m["partition"]) != key]
                if error != KafkaError.NONE:
                    results[key] = (error, message)
                    continue
                moves.append({"topic": t.name, "partition": p.partition_index, "node_id": node})
        if moves:
            try:
                request = build_request(ReassignPartitionsRequest, moves=moves)
                await asyncio.get_running_loop().run_in_executor(
                    self.io, lambda: self.controller.send(request, timeout_s=REASSIGN_TIMEOUT_S)
                )
                outcome: tuple[int, str | None] = (KafkaError.NONE, None)
            except ControllerError as exc:
                outcome = (kafka_error(exc), str(exc))
            for m in moves:
                results[(m["topic"], m["partition"])] = outcome
        by_topic: dict[str, list] = {}
        for name, index in dict.fromkeys(order):
            error, message = results[(name, index)]
            by_topic.setdefault(name, []).append(
                _AlterPartition(partition_index=index, error_code=error, error_message=message)
            )
        return AlterPartitionReassignmentsResponse[ctx.api_version](
            throttle_time_ms=0,
            error_code=KafkaError.NONE,
            error_message=None,
            responses=[_AlterTopic(name=n, partitions=ps) for n, ps in by_topic.items()],
        )
