"""Kafka transaction APIs: kafka-python requests in, responses out.

InitProducerId (with a transactional id; KafkaApis hands those here), AddPartitionsToTxn
v0-3, AddOffsetsToTxn v0-3, EndTxn v0-3 and WriteTxnMarkers v1 go to / come from the
transaction coordinator; TxnOffsetCommit v0-3 is served by the group's coordinator, which
keeps the offsets pending (durably, in the group's offsets document) until the
transaction's marker commits or drops them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from kafka.protocol.admin import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.groups.consumer_coordinator import GroupTypes
from dataplane.kafka.groups.coordinator import GroupCoordinator
from dataplane.kafka.groups.handlers import partition_in_image
from dataplane.kafka.groups.offsets import CommittedOffset, OffsetStoreError
from dataplane.kafka.offset_store import KVOffsetStore
from dataplane.kafka.partition_backend import PartitionResolver
from dataplane.kafka.txn.coordinator import MARKER_TIMEOUT_S, TransactionCoordinator
from dataplane.kafka.txn.marker_client import CONSUMER_OFFSETS_TOPIC
from dataplane.kafka.txn.state import TxnState
from dataplane.runtime import outcome_within

log = logging.getLogger(__name__)


async def complete_group_offsets(
    store: KVOffsetStore, slot: int, producer_id: int, commit: bool
) -> bool:
    """A marker for the groups of `slot` coordinated here: their pending offsets of
    `producer_id` become committed (or are dropped). False if a write failed or the slot
    is not (or no longer) this broker's: the transaction coordinator then retries at the
    slot's current owner, so no pending offsets are left behind by a slot move."""
    if not store.owns_slot(slot):
        return False
    ok = True
    for group_id in store.groups_with_pending(slot, producer_id):
        try:
            await store.complete_pending(group_id, producer_id, commit)
        except OffsetStoreError as exc:
            log.warning("completing txn offsets of group %r failed: %s", group_id, exc)
            ok = False
    return ok


class TxnHandlers:
    """The transaction APIs of one broker.

    Thread-safety: handlers run on the Kafka event loop.
    """

    def __init__(
        self,
        coordinator: TransactionCoordinator,
        image_fn: Callable[[], MetadataImage],
        partitions: PartitionResolver,
        groups: GroupCoordinator | GroupTypes,
        offset_store: KVOffsetStore,
        is_group_coordinator: Callable[[str], bool],
    ):
        self.coordinator = coordinator
        self.image_fn = image_fn
        self.partitions = partitions
        self.groups = groups
        self.offset_store = offset_store
        self.is_group_coordinator = is_group_coordinator

    def registrations(self) -> list:
        """(request class, min version, max version, handler); InitProducerId is
        registered by KafkaApis, which calls `init_producer_id` for transactional ids."""
        return [
            (AddPartitionsToTxnRequest, 0, 3, self.add_partitions_to_txn),
            (AddOffsetsToTxnRequest, 0, 3, self.add_offsets_to_txn),
            (EndTxnRequest, 0, 3, self.end_txn),
            (TxnOffsetCommitRequest, 0, 3, self.txn_offset_commit),
            (WriteTxnMarkersRequest, 1, 1, self.write_txn_markers),
            (DescribeTransactionsRequest, 0, 0, self.describe_transactions),
            (ListTransactionsRequest, 0, 1, self.list_transactions),
        ]

    @staticmethod
    def _fenced(error: int, version: int, first_version_with_fenced: int) -> int:
        """Older request versions know INVALID_PRODUCER_EPOCH, not PRODUCER_FENCED."""
        if error == KafkaError.PRODUCER_FENCED and version < first_version_with_fenced:
            return KafkaError.INVALID_PRODUCER_EPOCH
        return error

    async def init_producer_id(self, req: Any, ctx: Any) -> Any:
        v = ctx.api_version
        expected = (req.producer_id, req.producer_epoch) if v >= 3 else (-1, -1)
        error, pid, epoch = await self.coordinator.init_producer_id(
            req.transactional_id, req.transaction_timeout_ms, expected
        )
        error = self._fenced(error, v, 4)
        return InitProducerIdResponse[v](
            throttle_time_ms=0, error_code=error, producer_id=pid, producer_epoch=epoch
        )

    async def add_partitions_to_txn(self, req: Any, ctx: Any) -> Any:
        v = ctx.api_version
        R = AddPartitionsToTxnResponse
        TopicResult = R.AddPartitionsToTxnTopicResult
        wanted = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
        results = await self.coordinator.add_partitions(
            req.v3_and_below_transactional_id,
            req.v3_and_below_producer_id,
            req.v3_and_below_producer_epoch,
            wanted,
        )
        by_topic: dict[str, list] = {}
        for (topic, p), error in results.items():
            by_topic.setdefault(topic, []).append(
                TopicResult.AddPartitionsToTxnPartitionResult(
                    partition_index=p, partition_error_code=self._fenced(error, v, 2)
                )
            )
        return R[v](
            throttle_time_ms=0,
            results_by_topic_v3_and_below=[
                TopicResult(name=name, results_by_partition=parts)
                for name, parts in by_topic.items()
            ],
        )

    async def add_offsets_to_txn(self, req: Any, ctx: Any) -> Any:
        v = ctx.api_version
        error = await self.coordinator.add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id
        )
        return AddOffsetsToTxnResponse[v](throttle_time_ms=0, error_code=self._fenced(error, v, 2))

    async def end_txn(self, req: Any, ctx: Any) -> Any:
        v = ctx.api_version
        error = await self.coordinator.end_txn(
            req.transactional_id, req.producer_id, req.producer_epoch, bool(req.committed)
        )
        return EndTxnResponse[v](throttle_time_ms=0, error_code=self._fenced(error, v, 2))

    async def txn_offset_commit(self, req: Any, ctx: Any) -> Any:
        """Offsets of a transaction: checked as an OffsetCommit of the group (KIP-447:
        member id and generation when given), stored pending until the marker; a partition
        that does not exist is UNKNOWN_TOPIC_OR_PARTITION and not stored (as in Kafka)."""
        v = ctx.api_version
        R = TxnOffsetCommitResponse
        entries: dict[tuple[str, int], CommittedOffset] = {}
        for t in req.topics:
            for p in t.partitions:
                entries[(t.name, p.partition_index)] = CommittedOffset(
                    offset=p.committed_offset,
                    leader_epoch=p.committed_leader_epoch if v >= 2 else -1,
                    metadata=p.committed_metadata if p.committed_metadata is not None else "",
                    commit_timestamp_ms=int(time.time() * 1000),
                )
        error = KafkaError.NONE
        if not req.group_id:
            error = KafkaError.INVALID_GROUP_ID
        elif not self.is_group_coordinator(req.group_id):
            error = KafkaError.NOT_COORDINATOR
        elif v >= 3 and (req.generation_id >= 0 or req.member_id or req.group_instance_id):
            error = self.groups.validate_offset_commit(
                req.group_id, req.generation_id, req.member_id, req.group_instance_id
            )
        image = self.image_fn()
        unknown = {tp for tp in entries if not partition_in_image(image, *tp)}
        known = {tp: e for tp, e in entries.items() if tp not in unknown}
        if error == KafkaError.NONE and known:
            try:
                await self.offset_store.commit_pending(req.group_id, req.producer_id, known)
            except OffsetStoreError as exc:
                error = exc.error_code if exc.error_code else KafkaError.COORDINATOR_NOT_AVAILABLE
                log.warning("txn offset commit of group %r failed: %s", req.group_id, exc)
        by_topic: dict[str, list] = {}
        for topic, p in entries:
            by_topic.setdefault(topic, []).append(
                R.TxnOffsetCommitResponseTopic.TxnOffsetCommitResponsePartition(
                    partition_index=p,
                    error_code=(
                        KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                        if error == KafkaError.NONE and (topic, p) in unknown
                        else error
                    ),
                )
            )
        return R[v](
            throttle_time_ms=0,
            topics=[
                R.TxnOffsetCommitResponseTopic(name=name, partitions=parts)
                for name, parts in by_topic.items()
            ],
        )

    async def write_txn_markers(self, req: Any, ctx: Any) -> Any:
        """Markers from a transaction coordinator: into the partitions this broker leads,
        or (topic __consumer_offsets, partition = slot) to the groups it coordinates."""
        v = ctx.api_version
        R = WriteTxnMarkersResponse
        TR = R.WritableTxnMarkerResult.WritableTxnMarkerTopicResult
        image = self.image_fn()
        out = []
        for m in req.markers:
            commit = bool(m.transaction_result)
            futures = []
            topics = []
            for t in m.topics:
                parts = []
                for p in t.partition_indexes:
                    entry = TR.WritableTxnMarkerPartitionResult(
                        partition_index=p, error_code=KafkaError.NONE
                    )
                    parts.append(entry)
                    if t.name == CONSUMER_OFFSETS_TOPIC:
                        ok = await complete_group_offsets(
                            self.offset_store, p, m.producer_id, commit
                        )
                        if not ok:
                            entry.error_code = KafkaError.COORDINATOR_NOT_AVAILABLE
                        continue
                    topic = image.topic_by_name(t.name)
                    if topic is None or p not in topic.partitions:
                        entry.error_code = KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                        continue
                    plog = self.partitions.get(topic.topic_id, p)
                    if plog is None:
                        entry.error_code = KafkaError.NOT_LEADER_OR_FOLLOWER
                        continue
                    error, fut = plog.write_marker(
                        m.producer_id, m.producer_epoch, commit, m.coordinator_epoch
                    )
                    entry.error_code = error
                    if fut is not None:
                        futures.append((entry, fut))
                topics.append(TR(name=t.name, partitions=parts))
            for entry, fut in futures:
                try:
                    await outcome_within(fut, MARKER_TIMEOUT_S)
                except Exception as exc:
                    log.warning("marker append failed: %s", exc)
                    entry.error_code = KafkaError.NOT_LEADER_OR_FOLLOWER
            out.append(R.WritableTxnMarkerResult(producer_id=m.producer_id, topics=topics))
        return R[v](markers=out)

    # ------------------------------------------------------------ admin: list, describe

    async def list_transactions(self, req, ctx):
        """ListTransactions (`kafka-transactions.sh list`): the transactional ids this
        broker coordinates, filtered by state, producer id and (v1) running longer than."""
        states = set(req.state_filters or [])
        pids = set(req.producer_id_filters or [])
        duration_ms = getattr(req, "duration_filter", -1)
        known = {s.value for s in TxnState}
        now = self.coordinator.clock_ms()
        rows = []
        for txn_id, meta in sorted(self.coordinator.snapshot().items()):
            if not self.coordinator.coordinates(txn_id):
                continue
            if states and meta.state.value not in states:
                continue
            if pids and meta.producer_id not in pids:
                continue
            if duration_ms is not None and duration_ms >= 0:
                if meta.txn_start_ms < 0 or now - meta.txn_start_ms < duration_ms:
                    continue
            rows.append(
                ListTransactionsResponse.TransactionState(
                    transactional_id=txn_id,
                    producer_id=meta.producer_id,
                    transaction_state=meta.state.value,
                )
            )
        return ListTransactionsResponse[ctx.api_version](
            throttle_time_ms=0,
            error_code=KafkaError.NONE,
            unknown_state_filters=sorted(states - known),
            transaction_states=rows,
        )

    async def describe_transactions(self, req, ctx):
        """DescribeTransactions (`kafka-transactions.sh describe`): state, producer, timeout,
        start time and partitions of each id this broker coordinates (NOT_COORDINATOR
        otherwise, TRANSACTIONAL_ID_NOT_FOUND for an unknown one)."""
        R = DescribeTransactionsResponse
        loaded = self.coordinator.snapshot()
        out = []
        for txn_id in req.transactional_ids or []:
            meta = loaded.get(txn_id)
            if not self.coordinator.coordinates(txn_id):
                error = KafkaError.NOT_COORDINATOR
            elif meta is None:
                error = KafkaError.TRANSACTIONAL_ID_NOT_FOUND
            else:
                error = KafkaError.NONE
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(meta.partitions if meta and not error else ()):
                by_topic.setdefault(topic, []).append(partition)
            out.append(
                R.TransactionState(
                    error_code=error,
                    transactional_id=txn_id,
                    transaction_state=meta.state.value if meta and not error else "",
                    transaction_timeout_ms=meta.timeout_ms if meta and not error else 0,
                    transaction_start_time_ms=meta.txn_start_ms if meta and not error else -1,
                    producer_id=meta.producer_id if meta and not error else -1,
                    producer_epoch=meta.producer_epoch if meta and not error else -1,
                    topics=[
                        R.TransactionState.TopicData(topic=t, partitions=ps)
                        for t, ps in by_topic.items()
                    ],
                )
            )
        return R[ctx.api_version](throttle_time_ms=0, transaction_states=out)
