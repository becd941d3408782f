"""Wire handlers of the group APIs: kafka-python request objects in, response objects out.

Each handler has the wire server's signature ``async handler(request_body, ctx)``:
``request_body`` is the decoded kafka-python request of the negotiated version,
``ctx`` has ``api_version``, ``client_id`` and ``peer`` (host, port); the handler
returns the response of the same version.  The handlers only translate between
versions of the wire format and the version-free calls of
:class:`~dataplane.kafka.groups.coordinator.GroupCoordinator` and
:class:`~dataplane.kafka.groups.offsets.OffsetManager`.

Supported versions (see :meth:`GroupHandlers.registrations`): JoinGroup 0-9,
SyncGroup 0-5, Heartbeat 0-4, LeaveGroup 0-5, OffsetCommit 0-9, OffsetFetch 0-9,
ListGroups 0-5, DescribeGroups 0-6, DeleteGroups 0-2, OffsetDelete 0.  OffsetCommit/OffsetFetch
v10 address topics by id, which needs the topic metadata this package does not
have, so they are not offered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from kafka.protocol.admin import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.consumer import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.security.authorizer import supported_operation_codes

from .consumer_coordinator import ConsumerGroupCoordinator
from .consumer_handlers import ConsumerGroupHandlers
from .consumer_state import CONSUMER_GROUP_TYPE
from .coordinator import GroupCoordinator
from .offsets import CommittedOffset, OffsetManager, OffsetStore, TopicPartition, store_error_code
from .state import CLASSIC_GROUP_TYPE, GroupState, JoinGroupParams

Handler = Callable[[Any, Any], Awaitable[Any]]


# Nested kafka-python data classes (generated from the JSON schemas).
_DeletedOffsetTopic = OffsetDeleteResponse.OffsetDeleteResponseTopic
_DeletedOffsetPartition = _DeletedOffsetTopic.OffsetDeleteResponsePartition
_JoinMember = JoinGroupResponse.JoinGroupResponseMember
_LeaveMember = LeaveGroupResponse.MemberResponse
_CommitTopic = OffsetCommitResponse.OffsetCommitResponseTopic
_CommitPartition = OffsetCommitResponse.OffsetCommitResponseTopic.OffsetCommitResponsePartition
_FetchTopic = OffsetFetchResponse.OffsetFetchResponseTopic
_FetchPartition = OffsetFetchResponse.OffsetFetchResponseTopic.OffsetFetchResponsePartition
_FetchGroup = OffsetFetchResponse.OffsetFetchResponseGroup
_FetchGroupTopic = OffsetFetchResponse.OffsetFetchResponseGroup.OffsetFetchResponseTopics
_FetchGroupPartition = OffsetFetchResponse.OffsetFetchResponseGroup.OffsetFetchResponseTopics.OffsetFetchResponsePartitions
_ListedGroup = ListGroupsResponse.ListedGroup
_DescribedGroup = DescribeGroupsResponse.DescribedGroup
_DescribedMember = DescribeGroupsResponse.DescribedGroup.DescribedGroupMember
_DeletedGroup = DeleteGroupsResponse.DeletableGroupResult


class RequestContext(Protocol):
    """What the handlers use of the wire server's per-request context."""

    api_version: int
    client_id: str | None
    peer: tuple[str, int]


def partition_in_image(image: Any, topic: str, partition: int) -> bool:
    """Whether `topic`'s partition `partition` exists in the metadata `image` (a
    `controlplane.image.MetadataImage`): what OffsetCommit and TxnOffsetCommit check, as
    Kafka checks its metadata cache."""
    state = image.topic_by_name(topic)
    return state is not None and partition in state.partitions


def _not_classic(entry: Callable[..., Any], group_id: str, version: int) -> Any:
    """DescribeGroups of a group of another type (a KIP-848 consumer group), as Kafka 4
    answers it: v6 GROUP_ID_NOT_FOUND "Group X is not a classic group.", older versions
    state Dead without an error (ConsumerGroupDescribe describes it)."""
    if version >= 6:
        return entry(
            KafkaError.GROUP_ID_NOT_FOUND,
            GroupState.DEAD.value,
            message=f"Group {group_id} is not a classic group.",
        )
    return entry(KafkaError.NONE, GroupState.DEAD.value)


class GroupHandlers:
    """Handlers of the classic group APIs.

    Args:
        coordinator: the broker's group coordinator.
        offset_store: where committed offsets live.
        is_coordinator: ``group_id -> bool``: does this broker coordinate the group?
            Requests for other groups get NOT_COORDINATOR; ListGroups lists only
            groups for which it is True.
        offset_metadata_max_bytes: Kafka's ``offset.metadata.max.bytes``.
        partition_exists: ``(topic, partition) -> bool`` in the current metadata: an
            OffsetCommit for a partition that does not exist is answered
            UNKNOWN_TOPIC_OR_PARTITION and not stored (Kafka's metadata-cache check);
            None: every partition exists (unit tests of the group rules).
        consumer_groups: the KIP-848 consumer group coordinator, if served: its groups are
            listed, their offset commits/fetches checked against member epochs, a classic
            JoinGroup to one with members refused (INCONSISTENT_GROUP_PROTOCOL).
    """

    def __init__(
        self,
        coordinator: GroupCoordinator,
        offset_store: OffsetStore,
        is_coordinator: Callable[[str], bool],
        *,
        offset_metadata_max_bytes: int = 4096,
        partition_exists: Callable[[str, int], bool] | None = None,
        consumer_groups: ConsumerGroupCoordinator | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._consumer = consumer_groups
        self._store = offset_store
        self._offsets = OffsetManager(
            coordinator, offset_store, offset_metadata_max_bytes=offset_metadata_max_bytes
        )
        self._is_coordinator = is_coordinator
        self._partition_exists = partition_exists

    @property
    def offsets(self) -> OffsetManager:
        """The offset rules used by the OffsetCommit/OffsetFetch/DeleteGroups handlers."""
        return self._offsets

    def registrations(self) -> list[tuple[type, int, int, Handler]]:
        """``(request class, min version, max version, handler)`` for the wire server."""
        consumer: list[tuple[type, int, int, Handler]] = []
        if getattr(self, "_consumer", None) is not None:  # (built without __init__ in a test)
            consumer = ConsumerGroupHandlers(
                self._consumer,
                lambda group_id: self._group_error(group_id, allow_empty=False),
                self._consumer.topic_name,
            ).registrations()
        return consumer + [
            (JoinGroupRequest, 0, 9, self.join_group),
            (SyncGroupRequest, 0, 5, self.sync_group),
            (HeartbeatRequest, 0, 4, self.heartbeat),
            (LeaveGroupRequest, 0, 5, self.leave_group),
            (OffsetCommitRequest, 0, 9, self.offset_commit),
            (OffsetFetchRequest, 0, 9, self.offset_fetch),
            (ListGroupsRequest, 0, 5, self.list_groups),
            (DescribeGroupsRequest, 0, 6, self.describe_groups),
            (DeleteGroupsRequest, 0, 2, self.delete_groups),
            (OffsetDeleteRequest, 0, 0, self.offset_delete),
        ]

    # ------------------------------------------------------------------ helpers

    def _group_error(self, group_id: str | None, *, allow_empty: bool) -> int:
        """Kafka's validateGroupStatus: invalid id first, then coordinatorship.

        Empty group ids are allowed for the offset APIs and the admin APIs (Kafka's
        backwards compatibility rule), not for the membership APIs.
        """
        if group_id is None or (not group_id and not allow_empty):
            return KafkaError.INVALID_GROUP_ID
        if len(group_id) > self._coordinator.config.max_group_id_length:
            return KafkaError.INVALID_GROUP_ID
        if not self._is_coordinator(group_id):
            return KafkaError.NOT_COORDINATOR
        return KafkaError.NONE

    @staticmethod
    def _client_host(ctx: Any) -> str:
        peer = getattr(ctx, "peer", None)
        host = peer[0] if peer else ""
        return f"/{host}" if host else ""

    async def _classic_join_allowed(self, group_id: str) -> int:
        """A classic JoinGroup to a consumer group: refused while it has members
        (INCONSISTENT_GROUP_PROTOCOL); an empty one becomes a classic group (its offsets stay)."""
        if self._consumer is None or self._consumer.state_of(group_id) is None:
            return KafkaError.NONE
        if self._consumer.delete_group(group_id) != KafkaError.NONE:
            return KafkaError.INCONSISTENT_GROUP_PROTOCOL
        try:
            await self._consumer.forget_state(group_id)
        except Exception as exc:  # noqa: BLE001 - reported as a Kafka error
            return store_error_code(exc)
        return KafkaError.NONE

    # ------------------------------------------------------------------ JoinGroup

    async def join_group(self, request: Any, ctx: Any) -> Any:
        """JoinGroup v0-9."""
        version = ctx.api_version
        error = self._group_error(request.group_id, allow_empty=False)
        if error == KafkaError.NONE:
            error = await self._classic_join_allowed(request.group_id)
        if error != KafkaError.NONE:
            return self._join_response(version, error, member_id=request.member_id)
        params = JoinGroupParams(
            group_id=request.group_id,
            member_id=request.member_id or "",
            group_instance_id=request.group_instance_id if version >= 5 else None,
            client_id=ctx.client_id or "",
            client_host=self._client_host(ctx),
            session_timeout_ms=request.session_timeout_ms,
            rebalance_timeout_ms=request.rebalance_timeout_ms if version >= 1 else -1,
            protocol_type=request.protocol_type or "",
            protocols=tuple((p.name, bytes(p.metadata or b"")) for p in (request.protocols or [])),
            require_known_member_id=version >= 4,
            reason=request.reason if version >= 8 else None,
        )
        result = await self._coordinator.join_group(params)
        return self._join_response(
            version,
            result.error_code,
            member_id=result.member_id,
            generation_id=result.generation_id,
            protocol_type=result.protocol_type,
            protocol_name=result.protocol_name,
            leader=result.leader_id,
            skip_assignment=result.skip_assignment and version >= 9,
            members=[
                _JoinMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    metadata=m.metadata,
                )
                for m in result.members
            ],
        )

    @staticmethod
    def _join_response(
        version: int,
        error_code: int,
        *,
        member_id: str,
        generation_id: int = -1,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        leader: str = "",
        members: list[Any] | None = None,
        skip_assignment: bool = False,
    ) -> Any:
        # ProtocolName is nullable only from v7; older clients get "".
        if version < 7 and protocol_name is None:
            protocol_name = ""
        return JoinGroupResponse[version](
            throttle_time_ms=0,
            error_code=error_code,
            generation_id=generation_id,
            protocol_type=protocol_type,
            protocol_name=protocol_name,
            leader=leader,
            skip_assignment=skip_assignment,
            member_id=member_id or "",
            members=members or [],
        )

    # ------------------------------------------------------------------ SyncGroup

    async def sync_group(self, request: Any, ctx: Any) -> Any:
        """SyncGroup v0-5."""
        version = ctx.api_version
        error = self._group_error(request.group_id, allow_empty=False)
        if error != KafkaError.NONE:
            return SyncGroupResponse[version](throttle_time_ms=0, error_code=error, assignment=b"")
        assignments: dict[str, bytes] = {}
        for entry in request.assignments or []:
            assignments[entry.member_id] = bytes(entry.assignment or b"")
        result = await self._coordinator.sync_group(
            request.group_id,
            request.generation_id,
            request.member_id,
            group_instance_id=request.group_instance_id if version >= 3 else None,
            protocol_type=request.protocol_type if version >= 5 else None,
            protocol_name=request.protocol_name if version >= 5 else None,
            assignments=assignments,
        )
        ok = result.error_code == KafkaError.NONE
        return SyncGroupResponse[version](
            throttle_time_ms=0,
            error_code=result.error_code,
            protocol_type=result.protocol_type if ok else None,
            protocol_name=result.protocol_name if ok else None,
            assignment=result.assignment if ok else b"",
        )

    # ------------------------------------------------------------------ Heartbeat

    async def heartbeat(self, request: Any, ctx: Any) -> Any:
        """Heartbeat v0-4."""
        version = ctx.api_version
        error = self._group_error(request.group_id, allow_empty=False)
        if error == KafkaError.NONE:
            error = await self._coordinator.heartbeat(
                request.group_id,
                request.generation_id,
                request.member_id,
                request.group_instance_id if version >= 3 else None,
            )
        return HeartbeatResponse[version](throttle_time_ms=0, error_code=error)

    # ------------------------------------------------------------------ LeaveGroup

    async def leave_group(self, request: Any, ctx: Any) -> Any:
        """LeaveGroup v0-5 (v0-2: one member; v3+: a batch with instance ids)."""
        version = ctx.api_version
        if version >= 3:
            leaving = [(m.member_id or "", m.group_instance_id) for m in (request.members or [])]
        else:
            leaving = [(request.member_id or "", None)]
        error = self._group_error(request.group_id, allow_empty=False)
        if error != KafkaError.NONE:
            return LeaveGroupResponse[version](throttle_time_ms=0, error_code=error, members=[])
        result = await self._coordinator.leave_group(request.group_id, leaving)
        if version < 3:
            # One member: its error is the response's error (Kafka's LeaveGroupResponse rule).
            code = result.error_code
            if code == KafkaError.NONE and result.members:
                code = result.members[0].error_code
            return LeaveGroupResponse[version](throttle_time_ms=0, error_code=code)
        return LeaveGroupResponse[version](
            throttle_time_ms=0,
            error_code=result.error_code,
            members=[
                _LeaveMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    error_code=m.error_code,
                )
                for m in result.members
            ],
        )

    # ------------------------------------------------------------------ OffsetCommit

    async def offset_commit(self, request: Any, ctx: Any) -> Any:
        """OffsetCommit v0-9 (v1 commit timestamps honoured; v2-4 retention ignored)."""
        version = ctx.api_version
        entries: dict[TopicPartition, CommittedOffset] = {}
        for topic in request.topics or []:
            for p in topic.partitions or []:
                entries[(topic.name, p.partition_index)] = CommittedOffset(
                    offset=p.committed_offset,
                    leader_epoch=p.committed_leader_epoch if version >= 6 else -1,
                    metadata=p.committed_metadata,
                    commit_timestamp_ms=p.commit_timestamp if version == 1 else -1,
                )
        error = self._group_error(request.group_id, allow_empty=True)
        exists = self._partition_exists
        unknown = {tp for tp in entries if exists is not None and not exists(*tp)}
        if error != KafkaError.NONE:
            results = {tp: error for tp in entries}
        else:
            results = {tp: KafkaError.UNKNOWN_TOPIC_OR_PARTITION for tp in unknown}
            known = {tp: e for tp, e in entries.items() if tp not in unknown}
            generation = request.generation_id_or_member_epoch if version >= 1 else -1
            member_id = (request.member_id or "") if version >= 1 else ""
            instance_id = request.group_instance_id if version >= 7 else None
            consumer_error = None
            if self._consumer is not None:
                consumer_error = self._consumer.validate_offset_commit(
                    request.group_id, member_id, generation, version
                )
            if consumer_error is not None and consumer_error != KafkaError.NONE:
                results |= {tp: consumer_error for tp in known}
            elif known or not unknown:
                if consumer_error is not None:  # checked above with the member epoch
                    generation, member_id, instance_id = -1, "", None
                results |= await self._offsets.commit_offsets(
                    request.group_id, generation, member_id, instance_id, known
                )
        topics = []
        for topic in request.topics or []:
            partitions = [
                _CommitPartition(
                    partition_index=p.partition_index,
                    error_code=results[(topic.name, p.partition_index)],
                )
                for p in topic.partitions or []
            ]
            topics.append(_CommitTopic(name=topic.name, partitions=partitions))
        return OffsetCommitResponse[version](throttle_time_ms=0, topics=topics)

    # ------------------------------------------------------------------ OffsetFetch

    async def offset_fetch(self, request: Any, ctx: Any) -> Any:
        """OffsetFetch v0-9 (v8+: several groups per request; v7+ require_stable:
        partitions with offsets of an undecided transaction are UNSTABLE_OFFSET_COMMIT)."""
        version = ctx.api_version
        if version >= 8:
            groups = []
            for group in request.groups or []:
                error = KafkaError.NONE
                if (
                    version >= 9
                    and self._consumer is not None
                    and not self._group_error(group.group_id, allow_empty=True)
                ):
                    error = self._consumer.validate_offset_fetch(
                        group.group_id, group.member_id, group.member_epoch
                    )
                topics: list[Any] = []
                if error == KafkaError.NONE:
                    error, topics = await self._fetch_group(
                        group.group_id, group.topics, version, bool(request.require_stable)
                    )
                groups.append(_FetchGroup(group_id=group.group_id, topics=topics, error_code=error))
            return OffsetFetchResponse[version](throttle_time_ms=0, groups=groups)

        requested = request.topics
        if version < 2 and requested is None:
            requested = []  # null "all topics" exists only from v2
        stable = bool(request.require_stable) if version >= 7 else False
        error, topics = await self._fetch_group(request.group_id, requested, version, stable)
        if error != KafkaError.NONE and version < 2:
            # No top-level error before v2: report it on every requested partition.
            topics = [
                _FetchTopic(
                    name=t.name,
                    partitions=[
                        _FetchPartition(
                            partition_index=p,
                            committed_offset=-1,
                            committed_leader_epoch=-1,
                            metadata="",
                            error_code=error,
                        )
                        for p in t.partition_indexes or []
                    ],
                )
                for t in requested or []
            ]
        return OffsetFetchResponse[version](throttle_time_ms=0, topics=topics, error_code=error)

    async def _fetch_group(
        self, group_id: str, requested: list[Any] | None, version: int, stable: bool = False
    ) -> tuple[int, list[Any]]:
        """Group-level error and the response topics (v8+ or pre-v8 classes per ``version``)."""
        error = self._group_error(group_id, allow_empty=True)
        if error != KafkaError.NONE:
            return error, []
        partitions: list[TopicPartition] | None = None
        if requested is not None:
            partitions = [(t.name, p) for t in requested for p in (t.partition_indexes or [])]
        error, offsets = await self._offsets.fetch_offsets(group_id, partitions)
        if error != KafkaError.NONE:
            return error, []
        # KIP-447 require_stable: a partition with offsets of an undecided transaction is
        # UNSTABLE_OFFSET_COMMIT (the consumer retries) rather than an older offset
        pending_fn = getattr(self._store, "pending_partitions", None)
        unstable = pending_fn(group_id) if stable and pending_fn is not None else set()
        by_topic: dict[str, list[tuple[int, CommittedOffset]]] = {}
        keys = partitions if partitions is not None else sorted(offsets)
        for topic, partition in keys:
            by_topic.setdefault(topic, []).append((partition, offsets[(topic, partition)]))
        if requested is not None:
            for t in requested:  # topics asked for with no partitions still appear
                by_topic.setdefault(t.name, [])
        grouped = version >= 8
        topic_cls = _FetchGroupTopic if grouped else _FetchTopic
        partition_cls = _FetchGroupPartition if grouped else _FetchPartition
        topics = [
            topic_cls(
                name=name,
                partitions=[
                    partition_cls(
                        partition_index=partition,
                        committed_offset=committed.offset,
                        committed_leader_epoch=committed.leader_epoch,
                        metadata=committed.metadata if committed.metadata is not None else "",
                        error_code=KafkaError.UNSTABLE_OFFSET_COMMIT
                        if (name, partition) in unstable
                        else KafkaError.NONE,
                    )
                    for partition, committed in entries
                ],
            )
            for name, entries in by_topic.items()
        ]
        return KafkaError.NONE, topics

    # ------------------------------------------------------------------ ListGroups

    async def list_groups(self, request: Any, ctx: Any) -> Any:
        """ListGroups v0-5: groups this broker coordinates, including groups that only
        have committed offsets (reported Empty with protocol type "")."""
        version = ctx.api_version
        states = {s.lower() for s in (request.states_filter or [])} if version >= 4 else set()
        types = {t.lower() for t in (request.types_filter or [])} if version >= 5 else set()
        listings = {
            g.group_id: g
            for g in self._coordinator.list_groups()
            if self._is_coordinator(g.group_id)
        }
        error = KafkaError.NONE
        try:
            stored = await self._store.list_groups()
        except Exception as exc:  # noqa: BLE001 - reported as a Kafka error
            error, stored = store_error_code(exc), []
        rows = [
            (g.group_id, g.protocol_type, g.state.value, CLASSIC_GROUP_TYPE)
            for g in listings.values()
        ]
        for group_id in stored:
            if group_id not in listings and self._is_coordinator(group_id):
                if self._coordinator.group_state(group_id) is None:
                    consumer = self._consumer.state_of(group_id) if self._consumer else None
                    if consumer is not None:
                        rows.append((group_id, "consumer", consumer.value, CONSUMER_GROUP_TYPE))
                    else:
                        rows.append((group_id, "", GroupState.EMPTY.value, CLASSIC_GROUP_TYPE))
        for group in self._consumer.groups() if self._consumer else []:
            if group.group_id not in stored and self._is_coordinator(group.group_id):
                rows.append((group.group_id, "consumer", group.state().value, CONSUMER_GROUP_TYPE))
        groups = [
            _ListedGroup(group_id=gid, protocol_type=ptype, group_state=state, group_type=gtype)
            for gid, ptype, state, gtype in rows
            if (not states or state.lower() in states) and (not types or gtype in types)
        ]
        return ListGroupsResponse[version](throttle_time_ms=0, error_code=error, groups=groups)

    # ------------------------------------------------------------------ DescribeGroups

    async def describe_groups(self, request: Any, ctx: Any) -> Any:
        """DescribeGroups v0-6 (v6: unknown groups get GROUP_ID_NOT_FOUND, older versions state Dead)."""
        version = ctx.api_version
        include_ops = bool(request.include_authorized_operations) if version >= 3 else False
        described = []
        for group_id in request.groups or []:
            described.append(await self._describe_one(group_id, version, include_ops))
        return DescribeGroupsResponse[version](throttle_time_ms=0, groups=described)

    async def _describe_one(self, group_id: str, version: int, include_ops: bool) -> Any:
        def entry(
            error_code: int,
            state: str,
            *,
            message: str | None = None,
            protocol_type: str = "",
            protocol_data: str = "",
            members: list[Any] | None = None,
        ) -> Any:
            return _DescribedGroup(
                error_code=error_code,
                error_message=message,
                group_id=group_id,
                group_state=state,
                protocol_type=protocol_type,
                protocol_data=protocol_data,
                members=members or [],
                authorized_operations=supported_operation_codes("GROUP")
                if include_ops and error_code == KafkaError.NONE
                else None,
            )

        error = self._group_error(group_id, allow_empty=True)
        if error != KafkaError.NONE:
            return entry(error, "")
        summary = self._coordinator.describe_group(group_id)
        if summary is not None:
            members = [
                _DescribedMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_metadata=m.metadata,
                    member_assignment=m.assignment,
                )
                for m in summary.members
            ]
            return entry(
                KafkaError.NONE,
                summary.state.value,
                protocol_type=summary.protocol_type,
                protocol_data=summary.protocol_name,
                members=members,
            )
        if self._consumer is not None and self._consumer.state_of(group_id) is not None:
            return _not_classic(entry, group_id, version)
        try:
            has_offsets = await self._offsets.has_offsets(group_id)
        except Exception as exc:  # noqa: BLE001 - reported as a Kafka error
            return entry(store_error_code(exc), "")
        if has_offsets:
            return entry(KafkaError.NONE, GroupState.EMPTY.value)
        if version >= 6:
            return entry(
                KafkaError.GROUP_ID_NOT_FOUND,
                GroupState.DEAD.value,
                message=f"Group {group_id} not found.",
            )
        return entry(KafkaError.NONE, GroupState.DEAD.value)

    # ------------------------------------------------------------------ DeleteGroups

    async def delete_groups(self, request: Any, ctx: Any) -> Any:
        """DeleteGroups v0-2: only groups without members (NON_EMPTY_GROUP otherwise)."""
        version = ctx.api_version
        results: dict[str, int] = {}
        to_delete: list[str] = []
        consumer_deleted: set[str] = set()
        for group_id in request.groups_names or []:
            if group_id in results or group_id in to_delete:
                continue
            error = self._group_error(group_id, allow_empty=True)
            if error == KafkaError.NONE and self._consumer is not None:
                consumer_error = self._consumer.delete_group(group_id)
                if consumer_error == KafkaError.NONE:
                    consumer_deleted.add(group_id)
                    try:
                        await self._consumer.forget_state(group_id)
                    except Exception as exc:  # noqa: BLE001 - reported as a Kafka error
                        consumer_error = store_error_code(exc)
                error = consumer_error or KafkaError.NONE
            if error != KafkaError.NONE:
                results[group_id] = error
            else:
                to_delete.append(group_id)
        for group_id, code in (await self._offsets.delete_groups(to_delete)).items():
            # an empty consumer group without offsets existed: deleted
            consumer_only = code == KafkaError.GROUP_ID_NOT_FOUND and group_id in consumer_deleted
            results[group_id] = KafkaError.NONE if consumer_only else code
        ordered = list(dict.fromkeys(request.groups_names or []))
        return DeleteGroupsResponse[version](
            throttle_time_ms=0,
            results=[_DeletedGroup(group_id=gid, error_code=results[gid]) for gid in ordered],
        )

    # ------------------------------------------------------------------ OffsetDelete

    async def offset_delete(self, request: Any, ctx: Any) -> Any:
        """OffsetDelete v0 (`kafka-consumer-groups.sh --delete-offsets`): see
        `OffsetManager.delete_offsets` for which offsets go."""
        requested = [
            (t.name, p.partition_index) for t in request.topics or [] for p in t.partitions or []
        ]
        error = self._group_error(request.group_id, allow_empty=True)
        results: dict[TopicPartition, int] = {}
        if error == KafkaError.NONE:
            error, results = await self._offsets.delete_offsets(
                request.group_id, list(dict.fromkeys(requested))
            )
        topics: dict[str, list[Any]] = {}
        if error == KafkaError.NONE:
            for tp in dict.fromkeys(requested):
                topics.setdefault(tp[0], []).append(
                    _DeletedOffsetPartition(partition_index=tp[1], error_code=results[tp])
                )
        return OffsetDeleteResponse[ctx.api_version](
            error_code=error,
            throttle_time_ms=0,
            topics=[_DeletedOffsetTopic(name=n, partitions=ps) for n, ps in topics.items()],
        )
