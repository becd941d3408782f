"""The KIP-932 share-group APIs: ShareGroupHeartbeat and ShareGroupDescribe (at the group's
coordinator, `coordinator.py`), ShareFetch and ShareAcknowledge (at each partition's leader,
on its share-partitions, `partitions.py`, within share sessions, `sessions.py`).

ShareFetch: first the request's acknowledgements are applied and stored durably, then
records are acquired for the member from the session's partitions - waiting up to MaxWaitMs
for new records or released ones - and answered as whole record batches with the acquired
offset ranges (the client delivers only those). Acknowledgements are answered only once
stored (`SharePartitions.persist`).

Erasure-coded topics and partitions reached through the zone router (an AZ's proxy) are
refused with INVALID_REQUEST and a message saying so: a share-partition has one owner, the
partition's leader, and neither has one there.

Runs on the event loop; the reads and store calls go to the I/O pool.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.admin import DeleteGroupsRequest, DeleteGroupsResponse, ListGroupsRequest

from controlplane.coordinators import slot_of
from controlplane.share_state import SHARE_STATE_KEY_PREFIX
from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError
from dataplane.formats.record_batch import parse_batch_header
from dataplane.kafka.api_context import BrokerApiContext
from dataplane.kafka.share_fetch_encoder import (
    ShareFetchAnswer,
    ShareFetchPartitionAnswer,
    ShareFetchTopicAnswer,
)
from dataplane.objectstore import ObjectStoreError

from .coordinator import ShareGroupCoordinator
from .describe import (
    DESCRIBE_GROUPS_KEY,
    OTHER_GROUP_JOINS,
    describe_groups,
    describe_share_groups_as_not_classic,
    describe_share_partitions,
    list_groups_with_share,
    refuse_share_group_ids,
)
from .offsets import ShareGroupOffsets
from .partition_state import AcknowledgeError, LogBatch
from .partitions import SharePartitions
from .protocol import (
    AlterShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequest,
    DescribeSharePartitionsRequest,
    ShareAcknowledgeRequest,
    ShareAcknowledgeResponse,
    ShareFetchRequest,
    ShareGroupDescribeRequest,
    ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
)
from .sessions import FINAL_EPOCH, INITIAL_EPOCH, SessionError, ShareSession, ShareSessions
from .store import ShareStateError

log = logging.getLogger(__name__)


def has_share_state(image: Any, group_id: str) -> bool:
    """Whether the metadata image holds stored share-partition state of the group."""
    prefix = f"{SHARE_STATE_KEY_PREFIX}{group_id}/"
    return any(key.startswith(prefix) for key in image.kv)


MAX_WAIT_MS = 30_000
MAX_RECORDS_PER_FETCH = 10_000
MAX_BYTES_PER_PARTITION = 8 * 1024 * 1024
MAX_BATCHES_PER_READ = 10_000

TP = tuple[str, int]  # (topic id, partition)


@dataclass
class _PartitionResult:
    error: KafkaError = KafkaError.NONE
    message: str | None = None
    ack_error: KafkaError | None = None
    ack_message: str | None = None
    records: bytes = b""
    acquired: list = field(default_factory=list)
    leader: tuple[int, int] = (-1, -1)


class ShareApis:
    """Handlers of the share-group APIs (see the module docstring)."""

    def __init__(
        self,
        broker: BrokerApiContext,
        coordinator: ShareGroupCoordinator,
        partitions: SharePartitions,
        sessions: ShareSessions,
        coordinates,
    ) -> None:
        self.broker = broker
        self.coordinator = coordinator
        self.partitions = partitions
        self.sessions = sessions
        # whether this broker coordinates a group (its coordinator slot, caught up)
        self.coordinates = coordinates
        self.offsets = ShareGroupOffsets(broker, coordinator, partitions, coordinates)

    def registrations(self) -> list:
        """(request class, min version, max version, handler) for the API registry."""
        return [
            (ShareGroupHeartbeatRequest, 1, 1, self.heartbeat),
            (ShareGroupDescribeRequest, 1, 1, self.describe),
            (ShareFetchRequest, 1, 1, self.share_fetch),
            (ShareAcknowledgeRequest, 1, 1, self.share_acknowledge),
            (DescribeSharePartitionsRequest, 0, 0, self.describe_partitions),
            (DescribeShareGroupOffsetsRequest, 0, 0, self.describe_offsets),
            (DeleteShareGroupOffsetsRequest, 0, 0, self.delete_offsets),
            (AlterShareGroupOffsetsRequest, 0, 0, self.alter_offsets),
        ]

    def wrap(self, request_class: type, handler):
        """`handler` of `request_class` as served with share groups: ListGroups lists them
        too; a classic JoinGroup (INCONSISTENT_GROUP_PROTOCOL) or a ConsumerGroupHeartbeat
        (GROUP_ID_NOT_FOUND) for a share group's id is refused, and DescribeGroups answers
        a share group's id "not a classic group", as Kafka does; any other
        handler is returned as it is."""
        if request_class is ListGroupsRequest:
            return list_groups_with_share(handler, self.coordinator, self.coordinates)
        if int(getattr(request_class, "API_KEY", -1)) in OTHER_GROUP_JOINS:
            return refuse_share_group_ids(handler, self.coordinator)
        if int(getattr(request_class, "API_KEY", -1)) == DESCRIBE_GROUPS_KEY:
            return describe_share_groups_as_not_classic(handler, self.coordinator)
        if request_class is DeleteGroupsRequest:
            return self._deleting_share_groups(handler)
        return handler

    def _deleting_share_groups(self, inner):
        """DeleteGroups `inner` (classic and consumer groups), with share groups deleted
        here: an empty one (or one known only by its stored state, its coordinator having
        moved) loses its stored share-partition states (the controller KV) and then its
        membership; one with members is NON_EMPTY_GROUP, as Kafka answers."""

        async def delete(req: Any, ctx: Any) -> Any:
            ids = list(dict.fromkeys(req.groups_names or []))
            image = self.broker.image_fn()
            share = [
                g for g in ids if g and (self.coordinator.group(g) or has_share_state(image, g))
            ]
            results = {g: await self._delete_share_group(image, g) for g in share}
            rest = [g for g in ids if g not in results]
            if rest:
                req.groups_names = rest
                for entry in (await inner(req, ctx)).results:
                    results[entry.group_id] = entry.error_code
            R = DeleteGroupsResponse[ctx.api_version]
            return R(
                throttle_time_ms=0,
                results=[R.DeletableGroupResult(group_id=g, error_code=results[g]) for g in ids],
            )

        return delete

    async def _delete_share_group(self, image: Any, group_id: str) -> int:
        if not self.coordinates(group_id):
            return KafkaError.NOT_COORDINATOR
        group = self.coordinator.group(group_id)
        if group is not None and group.members:
            return KafkaError.NON_EMPTY_GROUP
        slot = slot_of(image, group_id)
        owner = image.coordinator_slots.get(slot) if slot is not None else None
        if owner is None or owner.node_id != self.broker.me.node_id:
            return KafkaError.NOT_COORDINATOR
        try:
            await self.broker.run_io(self.partitions.store.delete_group, group_id, owner.epoch)
        except ShareStateError as exc:
            return exc.error
        self.partitions.drop_group(group_id)
        return self.coordinator.delete_group(group_id)  # NON_EMPTY_GROUP if one joined meanwhile

    # ------------------------------------------------------------------ group coordinator

    async def heartbeat(self, req: Any, ctx: Any) -> Any:
        """ShareGroupHeartbeat v1: join (epoch 0), heartbeat, leave (epoch -1)."""
        R = ShareGroupHeartbeatResponse
        if req.group_id and not self.coordinates(req.group_id):
            return R(
                version=1,
                throttle_time_ms=0,
                error_code=KafkaError.NOT_COORDINATOR,
                error_message=f"node {self.broker.me.node_id} does not coordinate the group",
                member_epoch=-1,
                heartbeat_interval_ms=0,
            )
        image = self.broker.image_fn()

        def topics(name: str):
            t = image.topic_by_name(name)
            return (t.topic_id, len(t.partitions)) if t is not None else None

        peer = getattr(ctx, "peer", None)
        result = self.coordinator.heartbeat(
            req.group_id or "",
            req.member_id or "",
            req.member_epoch,
            req.rack_id,
            req.subscribed_topic_names,
            ctx.client_id or "",
            f"/{peer[0]}" if peer else "",
            topics,
        )
        assignment = None
        if result.assignment is not None:
            assignment = R.Assignment(
                topic_partitions=[
                    R.Assignment.TopicPartitions(topic_id=uuid.UUID(tid), partitions=list(ps))
                    for tid, ps in result.assignment.items()
                ]
            )
        return R(
            version=1,
            throttle_time_ms=0,
            error_code=result.error,
            error_message=result.message,
            member_id=result.member_id,
            member_epoch=result.member_epoch,
            heartbeat_interval_ms=result.heartbeat_interval_ms,
            assignment=assignment,
        )

    async def describe(self, req: Any, ctx: Any) -> Any:
        """ShareGroupDescribe v1."""
        return describe_groups(
            req, self.coordinator, self.coordinates, self.broker.image_fn(), self.partitions
        )

    async def describe_partitions(self, req: Any, ctx: Any) -> Any:
        """DescribeSharePartitions v0 (this project's): the group's share-partitions here."""
        return describe_share_partitions(self.partitions, self.broker.image_fn(), req.group_id)

    async def describe_offsets(self, req: Any, ctx: Any) -> Any:
        """DescribeShareGroupOffsets v0 (`offsets.py`)."""
        return await self.offsets.describe_offsets(req, ctx)

    async def delete_offsets(self, req: Any, ctx: Any) -> Any:
        """DeleteShareGroupOffsets v0 (`offsets.py`)."""
        return await self.offsets.delete_offsets(req, ctx)

    async def alter_offsets(self, req: Any, ctx: Any) -> Any:
        """AlterShareGroupOffsets v0 (`offsets.py`)."""
        return await self.offsets.alter_offsets(req, ctx)

    # ------------------------------------------------------------------ share fetch

    async def share_fetch(self, req: Any, ctx: Any) -> Any:
        """ShareFetch v1 (see the module docstring)."""
        group_id, member_id, epoch = req.group_id, req.member_id, req.share_session_epoch
        requested: dict[TP, None] = {}
        acks: dict[TP, list] = {}
        for t in req.topics or []:
            for p in t.partitions or []:
                tp = (_topic_key(t.topic_id), p.partition_index)
                requested[tp] = None
                if p.acknowledgement_batches:
                    acks.setdefault(tp, []).extend(p.acknowledgement_batches)
        forgotten = [
            (_topic_key(f.topic_id), p)
            for f in req.forgotten_topics_data or []
            for p in f.partitions
        ]
        if not group_id or not member_id:
            return self._fetch_error(
                KafkaError.INVALID_REQUEST, "GroupId and MemberId are required", 0
            )
        lock_ms = self.partitions.settings_fn(group_id).record_lock_duration_ms
        try:
            session = self._session_for(group_id, member_id, epoch, bool(acks), "ShareFetch")
            if epoch != FINAL_EPOCH:
                self.sessions.update(session, list(requested), forgotten)
        except SessionError as exc:
            return self._fetch_error(exc.error, str(exc), lock_ms)
        results: dict[TP, _PartitionResult] = {}
        for tp, batches in acks.items():
            results[tp] = res = _PartitionResult()
            res.ack_error, res.ack_message = await self._acknowledge(
                group_id, member_id, tp, batches
            )
        if epoch == FINAL_EPOCH:
            self._release_session(session)
        elif req.max_records > 0:
            await self._fetch(req, ctx, session, results, lock_ms)
        return self._fetch_response(results, lock_ms)

    def _session_for(
        self, group_id: str, member_id: str, epoch: int, with_acks: bool, api: str
    ) -> ShareSession:
        if epoch == INITIAL_EPOCH:
            if api == "ShareAcknowledge":
                raise SessionError(
                    KafkaError.INVALID_SHARE_SESSION_EPOCH,
                    "ShareAcknowledge cannot open a share session (epoch 0)",
                )
            if with_acks:
                raise SessionError(
                    KafkaError.INVALID_REQUEST,
                    "acknowledgements are not allowed when opening a share session",
                )
            session, _previous = self.sessions.open(group_id, member_id)
            return session
        if epoch < FINAL_EPOCH:
            raise SessionError(KafkaError.INVALID_SHARE_SESSION_EPOCH, f"epoch {epoch}")
        return self.sessions.next(group_id, member_id, epoch)

    def _release_session(self, session: ShareSession) -> None:
        for tid, partition in session.partitions:
            self.partitions.release_member((session.group_id, tid, partition), session.member_id)

    async def _fetch(self, req, ctx, session: ShareSession, results: dict, lock_ms: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(req.max_wait_ms, 0), MAX_WAIT_MS) / 1000
        max_records = min(req.max_records, MAX_RECORDS_PER_FETCH)
        max_bytes = req.max_bytes if req.max_bytes > 0 else MAX_BYTES_PER_PARTITION
        woken = asyncio.Event()

        def wake() -> None:
            loop.call_soon_threadsafe(woken.set)

        listening: dict[object, Any] = {}
        released = self.partitions.released_event()
        try:
            while True:
                woken.clear()
                got = await self._fetch_once(
                    session, ctx, results, (max_records, max_bytes, lock_ms), listening, wake
                )
                if got or loop.time() >= deadline:
                    return
                waiters = [
                    asyncio.ensure_future(woken.wait()),
                    asyncio.ensure_future(released.wait()),
                ]
                try:
                    await asyncio.wait(
                        waiters,
                        timeout=max(deadline - loop.time(), 0),
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    for w in waiters:
                        w.cancel()
        finally:
            for plog in listening.values():
                plog.remove_listener(wake)

    async def _fetch_once(self, session, ctx, results, limits, listening, wake) -> bool:
        """One pass over the session's partitions; whether there is anything to answer."""
        max_records, max_bytes, lock_ms = limits
        image = self.broker.image_fn()
        az = self.broker.client_az(ctx)
        got = False
        remaining = max_records
        for tp in list(session.partitions):
            if remaining <= 0 or max_bytes <= 0:
                break
            res = results.get(tp) or _PartitionResult()
            plog, error, message = self._resolve(image, tp, az)
            res.leader = _leader(image, tp)
            if plog is None:
                res.error, res.message = error, message
                results[tp] = res
                got = True
                continue
            if plog.identity not in listening:
                plog.add_listener(wake)
                listening[plog.identity] = plog
            try:
                records, acquired = await self._acquire(
                    session, tp, plog, (remaining, min(max_bytes, MAX_BYTES_PER_PARTITION)), lock_ms
                )
            except ShareStateError as exc:
                res.error, res.message = exc.error, str(exc)
                results[tp] = res
                got = True
                continue
            except ObjectStoreError as exc:
                res.error, res.message = KafkaError.KAFKA_STORAGE_ERROR, str(exc)
                results[tp] = res
                got = True
                continue
            if acquired:
                res.records, res.acquired = records, acquired
                results[tp] = res
                remaining -= sum(a.last_offset - a.first_offset + 1 for a in acquired)
                max_bytes -= len(records)
                got = True
        return got or any(r.ack_error is not None for r in results.values())

    async def _acquire(self, session, tp: TP, plog, limits: tuple[int, int], lock_ms: int):
        max_records, max_bytes = limits
        key = (session.group_id, tp[0], tp[1])
        sp = await self.partitions.get(key, plog)
        self.partitions.expire_locks(sp)
        hw = plog.high_watermark
        if not sp.state.has_available(hw):
            return b"", []
        offset = sp.state.next_fetch_offset()
        if offset >= hw:
            return b"", []
        data = bytes(await self.broker.run_io(plog.read, offset, max_bytes, hw))
        headers = _batch_headers(data)
        if self.partitions.get_loaded(key) is not sp:
            return b"", []  # reloaded meanwhile: the next pass acquires from the new state
        acquired = sp.state.acquire(
            session.member_id,
            [LogBatch(h.base_offset, h.last_offset, h.is_control) for h in headers],
            max_records,
            self.partitions.clock_ms(),
            lock_ms,
        )
        if not acquired:
            return b"", []
        first, last = acquired[0].first_offset, acquired[-1].last_offset
        kept = [h for h in headers if h.last_offset >= first and h.base_offset <= last]
        start = kept[0].position
        end = kept[-1].position + kept[-1].size_in_bytes
        return data[start:end], acquired

    def _resolve(self, image, tp: TP, az):
        """(partition backend, error, message) of a share-partition led here."""
        topic = image.topics.get(tp[0])
        part = topic.partitions.get(tp[1]) if topic is not None else None
        if topic is None:
            return None, KafkaError.UNKNOWN_TOPIC_ID, None
        if part is None:
            return None, KafkaError.UNKNOWN_TOPIC_OR_PARTITION, None
        if part.erasure_coded:
            return (
                None,
                KafkaError.INVALID_REQUEST,
                f"share groups cannot read the erasure-coded topic {topic.name}",
            )
        plog = self.broker.routing.get(tp[0], tp[1], az)
        if plog is None:
            return None, KafkaError.NOT_LEADER_OR_FOLLOWER, None
        if plog.forwards_to_main or plog.lags_leader:
            return (
                None,
                KafkaError.INVALID_REQUEST,
                f"share groups are not served through the zone router ({topic.name}-{tp[1]} is "
                "proxied for this client's AZ): use a client without an AZ",
            )
        return plog, KafkaError.NONE, None

    async def _acknowledge(
        self, group_id, member_id, tp: TP, batches
    ) -> tuple[KafkaError, str | None]:
        image = self.broker.image_fn()
        plog, error, message = self._resolve(image, tp, None)
        if plog is None:
            return error, message
        key = (group_id, tp[0], tp[1])
        try:
            sp = await self.partitions.get(key, plog)
            self.partitions.expire_locks(sp)
            released = sp.state.acknowledge_batches(
                member_id,
                [(b.first_offset, b.last_offset, list(b.acknowledge_types)) for b in batches],
            )
            change = sp.changed()
            await self.partitions.persist(sp, change)
        except AcknowledgeError as exc:
            return exc.error, str(exc)
        except ShareStateError as exc:
            return exc.error, str(exc)
        if released:
            self.partitions.notify_released()
        return KafkaError.NONE, None

    # ------------------------------------------------------------------ share acknowledge

    async def share_acknowledge(self, req: Any, ctx: Any) -> Any:
        """ShareAcknowledge v1: acknowledgements within a share session (-1 closes it)."""
        R = ShareAcknowledgeResponse
        group_id, member_id, epoch = req.group_id, req.member_id, req.share_session_epoch

        def top(error: KafkaError, message: str | None) -> Any:
            return R(
                version=1,
                throttle_time_ms=0,
                error_code=error,
                error_message=message,
                responses=[],
                node_endpoints=[],
            )

        if not group_id or not member_id:
            return top(KafkaError.INVALID_REQUEST, "GroupId and MemberId are required")
        try:
            session = self._session_for(group_id, member_id, epoch, True, "ShareAcknowledge")
        except SessionError as exc:
            return top(exc.error, str(exc))
        acks: dict[TP, list] = {}
        for t in req.topics or []:
            for p in t.partitions or []:
                acks.setdefault((_topic_key(t.topic_id), p.partition_index), []).extend(
                    p.acknowledgement_batches or []
                )
        image = self.broker.image_fn()
        by_topic: dict[str, list] = {}
        for tp, batches in acks.items():
            error, message = await self._acknowledge(group_id, member_id, tp, batches)
            leader, leader_epoch = _leader(image, tp)
            P = R.ShareAcknowledgeTopicResponse.PartitionData
            by_topic.setdefault(tp[0], []).append(
                P(
                    partition_index=tp[1],
                    error_code=error,
                    error_message=message,
                    current_leader=P.LeaderIdAndEpoch(leader_id=leader, leader_epoch=leader_epoch),
                )
            )
        if epoch == FINAL_EPOCH:
            self._release_session(session)
        return R(
            version=1,
            throttle_time_ms=0,
            error_code=KafkaError.NONE,
            responses=[
                R.ShareAcknowledgeTopicResponse(topic_id=uuid.UUID(tid), partitions=parts)
                for tid, parts in by_topic.items()
            ],
            node_endpoints=[],
        )

    # ------------------------------------------------------------------ responses

    def _fetch_error(self, error: KafkaError, message: str, lock_ms: int) -> ShareFetchAnswer:
        return ShareFetchAnswer(
            version=1,
            responses=[],
            acquisition_lock_timeout_ms=lock_ms,
            error_code=error,
            error_message=message,
        )

    def _fetch_response(
        self, results: dict[TP, _PartitionResult], lock_ms: int
    ) -> ShareFetchAnswer:
        """The ShareFetch v1 answer, written directly (share_fetch_encoder.py): the record
        sets go into the frame uncopied."""
        by_topic: dict[str, list[ShareFetchPartitionAnswer]] = {}
        for (tid, partition), res in results.items():
            by_topic.setdefault(tid, []).append(
                ShareFetchPartitionAnswer(
                    partition_index=partition,
                    error_code=res.error,
                    error_message=res.message,
                    acknowledge_error_code=res.ack_error or KafkaError.NONE,
                    acknowledge_error_message=res.ack_message,
                    leader_id=res.leader[0],
                    leader_epoch=res.leader[1],
                    records=res.records,
                    acquired_records=[
                        (a.first_offset, a.last_offset, a.delivery_count) for a in res.acquired
                    ],
                )
            )
        return ShareFetchAnswer(
            version=1,
            responses=[
                ShareFetchTopicAnswer(uuid.UUID(tid), parts) for tid, parts in by_topic.items()
            ],
            acquisition_lock_timeout_ms=lock_ms,
        )


def _topic_key(topic_id: uuid.UUID | None) -> str:
    """A requested topic id as the handlers key it: kafka-python decodes the nil id as None,
    which is answered as the nil id (an unknown topic), not as the string "None"."""
    return str(topic_id if topic_id is not None else uuid.UUID(int=0))


def _leader(image, tp: TP) -> tuple[int, int]:
    topic = image.topics.get(tp[0])
    part = topic.partitions.get(tp[1]) if topic is not None else None
    return (part.leader_node_id, part.leader_epoch) if part is not None else (-1, -1)


def _batch_headers(data: bytes) -> list:
    """The batch headers of `data` (whole batches; a torn tail is left out)."""
    headers = []
    position = 0
    while position < len(data) and len(headers) < MAX_BATCHES_PER_READ:
        try:
            header = parse_batch_header(data, position, copy=False)
        except InvalidRecordBatchError:
            break
        headers.append(header)
        position += header.size_in_bytes
    return headers
