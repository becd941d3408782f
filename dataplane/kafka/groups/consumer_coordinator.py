"""KIP-848 consumer group coordinator (ConsumerGroupHeartbeat) on asyncio.

A port of the consumer-group half of Kafka 4's `GroupMetadataManager`: the broker computes
the assignment (:mod:`.assignors`), members reconcile towards it one heartbeat at a time
(:func:`.consumer_state.reconcile`), every change of a group is made durable before the
heartbeat that caused it is answered, and a member that stops heartbeating (session timeout)
or does not revoke its partitions in time (rebalance timeout) is fenced.

Group types: this coordinator serves the ``consumer`` groups; the classic coordinator
(:class:`.coordinator.GroupCoordinator`) the ``classic`` ones. A group id is one type at a
time: a consumer-protocol member may take over an *empty* classic group (KIP-848's online
migration rule for empty groups: the classic group is dropped, its offsets stay); a classic
group with members answers GROUP_ID_NOT_FOUND, and the group handlers refuse a classic
JoinGroup to a consumer group with members (INCONSISTENT_GROUP_PROTOCOL). A future share
group coordinator sits beside these two the same way (`group_type`).

Durability: the group's state (:meth:`ConsumerGroup.to_json`) lives in the group's document in
the controller KV, beside its committed offsets (`ConsumerGroupStore`, implemented by
`KVOffsetStore`), so it survives a broker kill -9 and moves with the coordinator slot: a new
coordinator loads it on first use and restarts every member's session timer.

Everything runs on the event loop (no locks); timers are ``loop.call_at`` handles owned by
members and cancelled when they leave or the group is unloaded.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError

from .assignors import ASSIGNORS
from .consumer_state import (
    JOIN_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    ConsumerGroupState,
    ConsumerMember,
    MemberState,
    Partitions,
    copy_partitions,
    is_subset,
    reconcile,
)
from .coordinator import GroupCoordinator
from .offsets import OffsetStoreError
from .state import GroupState

log = logging.getLogger(__name__)

MAX_REGEX_LENGTH = 1_000
MAX_SUBSCRIBED_TOPICS = 10_000
CONSUMER_GENERATED_MEMBER_ID_VERSION = 1  # ConsumerGroupHeartbeat v1+: the client names itself
# Python constructs RE2 (Kafka's regex engine, via RE2/J) does not have
_NON_RE2 = re.compile(r"\\[1-9]|\(\?[=!]|\(\?<[=!]|\(\?P=|\(\?>|\(\?\(|\\Z|[*+?}][+]")


class HeartbeatError(Exception):
    """A heartbeat refused with a Kafka error code (and Kafka's message)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ConsumerGroupStore(Protocol):
    """Where consumer groups' state lives (`KVOffsetStore`); errors are `OffsetStoreError`."""

    def load_group_state(self, group_id: str) -> dict[str, Any] | None:
        """The stored state, or None; NOT_COORDINATOR if this broker does not own the group."""
        ...

    def save_group_state(
        self, group_id: str, snapshot: Callable[[], dict[str, Any] | None]
    ) -> Awaitable[None]:
        """Store ``snapshot()`` (taken when the write starts, so writes carry the latest)."""
        ...


@dataclass(frozen=True)
class TopicInfo:
    """A topic as the coordinator needs it."""

    topic_id: str
    partitions: int


@dataclass(frozen=True)
class HeartbeatParams:
    """A ConsumerGroupHeartbeat request, independent of its wire version (None: not sent)."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Partitions | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 0  # from v1 (KIP-1082) the client generates its member id


@dataclass(frozen=True)
class HeartbeatResult:
    """The answer to a heartbeat; ``assignment`` None means "unchanged, not sent"."""

    error_code: int
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None


def topic_info(image: Any, name: str) -> TopicInfo | None:
    """A topic of a metadata image (`controlplane.image.MetadataImage`) by name."""
    state = image.topic_by_name(name)
    return None if state is None else TopicInfo(state.topic_id, len(state.partitions))


def topic_name(image: Any, topic_id: str) -> str | None:
    """The name of a topic of a metadata image by id."""
    state = image.topics.get(topic_id)
    return None if state is None else state.name


def check_regex(pattern: str) -> str | None:
    """Why ``pattern`` is not an RE2-compatible regular expression we can run, or None."""
    if len(pattern) > MAX_REGEX_LENGTH:
        return f"regex longer than {MAX_REGEX_LENGTH} characters"
    if _NON_RE2.search(pattern):
        return "regex uses a construct RE2 does not support (backreference, lookaround, ...)"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"invalid regex: {exc}"
    return None


def _check_request(p: HeartbeatParams, assignors: Iterable[str]) -> None:
    """Kafka's throwIfConsumerGroupHeartbeatRequestIsInvalid."""
    bad = KafkaError.INVALID_REQUEST
    if p.api_version >= CONSUMER_GENERATED_MEMBER_ID_VERSION and not p.member_id:
        raise HeartbeatError(bad, "MemberId can't be empty.")
    if not p.group_id:
        raise HeartbeatError(bad, "GroupId can't be empty.")
    if p.instance_id == "":
        raise HeartbeatError(bad, "InstanceId can't be empty.")
    if p.rack_id == "":
        raise HeartbeatError(bad, "RackId can't be empty.")
    if p.member_epoch > 0 or p.member_epoch == LEAVE_EPOCH:
        if not p.member_id:
            raise HeartbeatError(bad, "MemberId can't be empty.")
    elif p.member_epoch == JOIN_EPOCH:
        if p.rebalance_timeout_ms == -1:
            raise HeartbeatError(bad, "RebalanceTimeoutMs must be provided in first request.")
        if p.owned is None or any(p.owned.values()):
            raise HeartbeatError(bad, "TopicPartitions must be empty when (re-)joining.")
        if not p.subscribed_topic_names and p.subscribed_topic_regex is None:
            raise HeartbeatError(
                bad, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
            )
    elif p.member_epoch == STATIC_LEAVE_EPOCH:
        if not p.member_id:
            raise HeartbeatError(bad, "MemberId can't be empty.")
        if p.instance_id is None:
            raise HeartbeatError(bad, "InstanceId can't be null.")
    else:
        raise HeartbeatError(bad, "MemberEpoch is invalid.")
    if p.server_assignor is not None and p.server_assignor not in assignors:
        raise HeartbeatError(
            KafkaError.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {p.server_assignor} is not supported. Supported assignors: "
            f"{', '.join(assignors)}.",
        )
    if p.subscribed_topic_regex is not None:
        why = check_regex(p.subscribed_topic_regex)
        if why is not None:
            raise HeartbeatError(KafkaError.INVALID_REGULAR_EXPRESSION, why)
    if (
        p.subscribed_topic_names is not None
        and len(p.subscribed_topic_names) > MAX_SUBSCRIBED_TOPICS
    ):
        raise HeartbeatError(bad, f"more than {MAX_SUBSCRIBED_TOPICS} subscribed topics")


def _check_epoch(member: ConsumerMember, received: int, owned: Partitions | None) -> None:
    """Kafka's throwIfConsumerGroupMemberEpochIsInvalid."""
    if received > member.member_epoch:
        raise HeartbeatError(
            KafkaError.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a greater member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )
    if received < member.member_epoch and (
        received != member.previous_member_epoch or not is_subset(owned, member.assigned)
    ):
        raise HeartbeatError(
            KafkaError.FENCED_MEMBER_EPOCH,
            f"The consumer group member has a smaller member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )


class ConsumerGroupCoordinator:
    """The consumer groups of one broker, on its event loop (see the module docstring).

    Args:
        config: limits and timings (`groups` section: heartbeat interval, session timeout,
            assignors, group size).
        store: the durable state.
        classic: the classic coordinator (an empty classic group may be taken over).
        topic_lookup: ``name -> TopicInfo | None`` from the current metadata.
        topic_names: the names of all topics (regex subscriptions).
        topic_name: ``topic id -> name | None`` (ConsumerGroupDescribe).
        monotonic_ms: the clock (tests inject one).
    """

    def __init__(
        self,
        config: GroupCoordinatorConfig,
        store: ConsumerGroupStore,
        classic: GroupCoordinator,
        topic_lookup: Callable[[str], TopicInfo | None],
        topic_names: Callable[[], Iterable[str]],
        topic_name: Callable[[str], str | None] = lambda _id: None,
        *,
        monotonic_ms: Callable[[], float] | None = None,
    ) -> None:
        self._config = config
        self._store = store
        self._classic = classic
        self._topic_lookup = topic_lookup
        self._topic_names = topic_names
        self.topic_name = topic_name
        self._now_ms = monotonic_ms or (lambda: time.monotonic() * 1000)
        self._groups: dict[str, ConsumerGroup] = {}
        self._background: set[asyncio.Task[None]] = set()
        self._closed = False

    # ------------------------------------------------------------------ queries

    @property
    def assignor_names(self) -> tuple[str, ...]:
        """The configured assignors; the first is the default."""
        return tuple(self._config.consumer_assignors)

    def loaded(self, group_id: str) -> ConsumerGroup | None:
        """The group if it is in memory (no store access)."""
        return self._groups.get(group_id)

    def group(self, group_id: str) -> ConsumerGroup | None:
        """The consumer group ``group_id``, loaded from the store if needed; None if there is
        none (or the store cannot be read: the caller's own checks report that)."""
        try:
            return self._get(group_id)
        except OffsetStoreError:
            return None

    def groups(self) -> list[ConsumerGroup]:
        """The groups in memory."""
        return list(self._groups.values())

    def validate_offset_commit(
        self, group_id: str, member_id: str, member_epoch: int, version: int
    ) -> int | None:
        """Kafka's ConsumerGroup.validateOffsetCommit; None if ``group_id`` is not a consumer
        group (the classic rules apply)."""
        group = self.group(group_id)
        if group is None:
            return None
        if member_epoch < 0 and not group.members:
            return KafkaError.NONE
        member = group.members.get(member_id)
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if version < 9:
            return KafkaError.UNSUPPORTED_VERSION
        if member_epoch != member.member_epoch:
            return KafkaError.STALE_MEMBER_EPOCH
        return KafkaError.NONE

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> int:
        """Kafka's ConsumerGroup.validateOffsetFetch (NONE for other groups)."""
        if member_id is None and member_epoch < 0:
            return KafkaError.NONE
        group = self.group(group_id)
        if group is None:
            return KafkaError.NONE
        member = group.members.get(member_id or "")
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if member_epoch != member.member_epoch:
            return KafkaError.STALE_MEMBER_EPOCH
        return KafkaError.NONE

    # ------------------------------------------------------------------ heartbeat

    async def heartbeat(self, params: HeartbeatParams) -> HeartbeatResult:
        """Handle a ConsumerGroupHeartbeat; answers after the group's change is durable."""
        try:
            if self._closed:
                raise HeartbeatError(KafkaError.COORDINATOR_NOT_AVAILABLE, "coordinator closed")
            _check_request(params, self.assignor_names)
            if params.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                group, result = self._leave(params)
            else:
                group, result = self._join_or_heartbeat(params)
            await self._persist(group)
            return result
        except HeartbeatError as exc:
            return HeartbeatResult(exc.code, exc.message, member_id=params.member_id or None)
        except OffsetStoreError as exc:
            self._groups.pop(params.group_id, None)  # reload from the store next time
            return HeartbeatResult(exc.error_code, str(exc), member_id=params.member_id or None)

    def _get(self, group_id: str) -> ConsumerGroup | None:
        group = self._groups.get(group_id)
        if group is not None:
            return group
        doc = self._store.load_group_state(group_id)
        if not doc or doc.get("type") != "consumer":
            return None
        try:
            group = ConsumerGroup.from_json(group_id, doc)
        except ValueError as exc:
            log.error("%s; starting the group afresh", exc)
            group = ConsumerGroup(group_id, group_epoch=int(doc.get("epoch", 0) or 0) + 1)
        self._groups[group_id] = group
        for member in group.members.values():  # a new coordinator: fresh sessions
            self._schedule_session(group, member)
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                self._schedule_revocation(group, member)
        log.info(
            "consumer group %r loaded: epoch %d, %d members",
            group_id,
            group.group_epoch,
            len(group.members),
        )
        return group

    def _get_or_create(self, group_id: str, create: bool) -> ConsumerGroup:
        group = self._get(group_id)
        if group is not None:
            return group
        classic_state = self._classic.group_state(group_id)
        if classic_state is not None and classic_state is not GroupState.EMPTY:
            raise HeartbeatError(
                KafkaError.GROUP_ID_NOT_FOUND, f"Group {group_id} is not a consumer group."
            )
        if not create:
            raise HeartbeatError(
                KafkaError.GROUP_ID_NOT_FOUND, f"Consumer group {group_id} not found."
            )
        if len(self._groups) >= self._config.max_groups:
            raise HeartbeatError(KafkaError.COORDINATOR_NOT_AVAILABLE, "too many groups")
        if classic_state is not None:  # an empty classic group: converted (its offsets stay)
            self._classic.unload_groups(lambda gid: gid == group_id)
            log.info("empty classic group %r becomes a consumer group", group_id)
        group = ConsumerGroup(group_id)
        self._groups[group_id] = group
        return group

    def _member_for(
        self, group: ConsumerGroup, p: HeartbeatParams, member_id: str
    ) -> ConsumerMember:
        create = p.member_epoch == JOIN_EPOCH
        if p.instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                if not create:
                    raise HeartbeatError(
                        KafkaError.UNKNOWN_MEMBER_ID,
                        f"Member {member_id} is not a member of group {group.group_id}.",
                    )
                member = ConsumerMember(member_id)
                group.members[member_id] = member
            elif create:  # a fenced member rejoining with its id: it has given up its partitions
                self._release(group, member)
            else:
                _check_epoch(member, p.member_epoch, p.owned)
            return member
        existing = group.static_member(p.instance_id)
        if create:
            if existing is None:
                member = ConsumerMember(member_id, instance_id=p.instance_id)
                group.members[member_id] = member
                return member
            if existing.member_epoch != STATIC_LEAVE_EPOCH and existing.member_id != member_id:
                raise HeartbeatError(
                    KafkaError.UNRELEASED_INSTANCE_ID,
                    f"Static member {member_id} with instance id {p.instance_id} cannot join the "
                    f"group because the instance id is owned by {existing.member_id} member.",
                )
            # the static member is back: it takes its old place and assignment (no rebalance)
            self._cancel_timers(existing)
            del group.members[existing.member_id]
            existing.member_id = member_id
            existing.member_epoch = existing.previous_member_epoch = 0
            existing.state = MemberState.STABLE
            group.members[member_id] = existing
            return existing
        if existing is None:
            raise HeartbeatError(
                KafkaError.UNKNOWN_MEMBER_ID, f"Instance id {p.instance_id} is unknown."
            )
        if existing.member_id != member_id:
            raise HeartbeatError(
                KafkaError.FENCED_INSTANCE_ID,
                f"Static member {member_id} with instance id {p.instance_id} was fenced by "
                f"member {existing.member_id}.",
            )
        _check_epoch(existing, p.member_epoch, p.owned)
        return existing

    def _release(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        """The member gave up everything (rejoin with epoch 0)."""
        member.member_epoch, member.previous_member_epoch = 0, -1
        member.state = MemberState.STABLE
        member.assigned, member.pending_revocation = {}, {}
        self._cancel_revocation(member)

    def _join_or_heartbeat(self, p: HeartbeatParams) -> tuple[ConsumerGroup, HeartbeatResult]:
        group = self._get_or_create(p.group_id, p.member_epoch == JOIN_EPOCH)
        member_id = p.member_id or str(uuid.uuid4())
        if (
            len(group.members) >= self._config.consumer_max_size
            and member_id not in group.members
            and (p.instance_id is None or group.static_member(p.instance_id) is None)
        ):
            raise HeartbeatError(
                KafkaError.GROUP_MAX_SIZE_REACHED,
                f"The consumer group has reached its maximum capacity of {self._config.consumer_max_size} members.",
            )
        old_id = None
        if p.instance_id is not None and p.member_epoch == JOIN_EPOCH:
            existing = group.static_member(p.instance_id)
            old_id = existing.member_id if existing is not None else None
        member = self._member_for(group, p, member_id)
        if old_id is not None and old_id != member.member_id and old_id in group.target:
            group.target[member.member_id] = group.target.pop(old_id)
        before = copy_partitions(member.assigned)
        subscription_changed = self._update_member(member, p)
        self._maybe_new_target(group, subscription_changed)
        if reconcile(group, member, p.owned):
            if member.state is MemberState.UNREVOKED_PARTITIONS:
                self._schedule_revocation(group, member)
            else:
                self._cancel_revocation(member)
        self._schedule_session(group, member)
        full = p.member_epoch == JOIN_EPOCH or (
            p.rebalance_timeout_ms != -1
            and p.subscribed_topic_names is not None
            and p.owned is not None
        )
        changed = before != member.assigned
        interval_ms = self._config.consumer_heartbeat_interval_ms
        if member.state is not MemberState.STABLE:
            # waiting for partitions others release (or to report its own revocation): come
            # back sooner than the group's interval, so a handover takes one revocation, not
            # a revocation plus a whole interval
            interval_ms = min(interval_ms, self._config.consumer_reconciling_heartbeat_interval_ms)
        return group, HeartbeatResult(
            KafkaError.NONE,
            member_id=member.member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=interval_ms,
            assignment=copy_partitions(member.assigned) if full or changed else None,
        )

    def _update_member(self, member: ConsumerMember, p: HeartbeatParams) -> bool:
        """Apply the request's non-null fields; True if the subscription changed."""
        before = (
            member.subscribed_topic_names,
            member.subscribed_topic_regex,
            member.server_assignor,
        )
        if p.instance_id is not None:
            member.instance_id = p.instance_id
        if p.rack_id is not None:
            member.rack_id = p.rack_id
        if p.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = max(
                0, min(p.rebalance_timeout_ms, self._config.max_rebalance_timeout_ms)
            )
        if p.subscribed_topic_names is not None:
            member.subscribed_topic_names = tuple(sorted(set(p.subscribed_topic_names)))
        if p.subscribed_topic_regex is not None:
            member.subscribed_topic_regex = p.subscribed_topic_regex or None
        if p.server_assignor is not None:
            member.server_assignor = p.server_assignor
        member.client_id, member.client_host = p.client_id, p.client_host
        new_member = (
            member.member_epoch == 0 and not member.assigned and member.previous_member_epoch == -1
        )
        after = (
            member.subscribed_topic_names,
            member.subscribed_topic_regex,
            member.server_assignor,
        )
        return before != after or new_member

    # ------------------------------------------------------------------ target assignment

    def _subscriptions(self, group: ConsumerGroup) -> tuple[dict[str, set[str]], dict[str, int]]:
        """member id -> subscribed topic ids, and topic id -> partitions, from the metadata."""
        regexes = {
            m.subscribed_topic_regex for m in group.members.values() if m.subscribed_topic_regex
        }
        names = list(self._topic_names()) if regexes else []
        matched = {rx: {n for n in names if re.fullmatch(rx, n)} for rx in regexes}
        info: dict[str, TopicInfo | None] = {}
        subscriptions: dict[str, set[str]] = {}
        counts: dict[str, int] = {}
        for member in group.members.values():
            wanted = set(member.subscribed_topic_names)
            if member.subscribed_topic_regex:
                wanted |= matched[member.subscribed_topic_regex]
            ids = set()
            for name in wanted:
                if name not in info:
                    info[name] = self._topic_lookup(name)
                topic = info[name]
                if topic is not None and topic.partitions > 0:
                    ids.add(topic.topic_id)
                    counts[topic.topic_id] = topic.partitions
            subscriptions[member.member_id] = ids
        return subscriptions, counts

    def _maybe_new_target(self, group: ConsumerGroup, bump: bool) -> None:
        """Bump the group epoch on a subscription or metadata change and compute the target."""
        subscriptions, counts = self._subscriptions(group)
        if counts != group.subscribed_metadata:
            group.subscribed_metadata = counts
            bump = True
        if bump:
            group.group_epoch += 1
        if group.group_epoch <= group.assignment_epoch:
            return
        name = self._preferred_assignor(group)
        previous = {mid: group.target.get(mid, {}) for mid in subscriptions}
        group.target = ASSIGNORS[name](subscriptions, counts, previous)
        group.assignment_epoch = group.group_epoch
        group.assignor_name = name
        log.info(
            "consumer group %r: epoch %d, target assignment by %s for %d members",
            group.group_id,
            group.group_epoch,
            name,
            len(group.members),
        )

    def _preferred_assignor(self, group: ConsumerGroup) -> str:
        """The assignor most members ask for (Kafka's rule), else the configured default."""
        votes: dict[str, int] = {}
        for member in group.members.values():
            if member.server_assignor in ASSIGNORS:
                votes[member.server_assignor] = votes.get(member.server_assignor, 0) + 1
        if votes:
            return max(sorted(votes), key=lambda n: votes[n])
        return self.assignor_names[0]

    # ------------------------------------------------------------------ leaving, fencing

    def _leave(self, p: HeartbeatParams) -> tuple[ConsumerGroup, HeartbeatResult]:
        group = self._get(p.group_id)
        if group is None:
            raise HeartbeatError(
                KafkaError.GROUP_ID_NOT_FOUND, f"Consumer group {p.group_id} not found."
            )
        if p.instance_id is None:
            member = group.members.get(p.member_id)
            if member is None:
                raise HeartbeatError(
                    KafkaError.UNKNOWN_MEMBER_ID, f"Member {p.member_id} is unknown."
                )
        else:
            member = group.static_member(p.instance_id)
            if member is None:
                raise HeartbeatError(
                    KafkaError.UNKNOWN_MEMBER_ID, f"Instance id {p.instance_id} is unknown."
                )
            if member.member_id != p.member_id:
                raise HeartbeatError(
                    KafkaError.FENCED_INSTANCE_ID,
                    f"Static member {p.member_id} was fenced by member {member.member_id}.",
                )
        if p.member_epoch == STATIC_LEAVE_EPOCH:
            # a static member leaving for a while keeps its assignment until its session expires
            member.member_epoch, member.pending_revocation = STATIC_LEAVE_EPOCH, {}
            self._cancel_revocation(member)
            log.info(
                "consumer group %r: static member %s left temporarily",
                group.group_id,
                member.member_id,
            )
        else:
            self._remove(group, member, "left the group")
        return group, HeartbeatResult(
            KafkaError.NONE,
            member_id=p.member_id,
            member_epoch=p.member_epoch,
            heartbeat_interval_ms=self._config.consumer_heartbeat_interval_ms,
        )

    def _remove(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        """Fence a member: it goes, the group epoch is bumped and a new target computed."""
        self._cancel_timers(member)
        group.members.pop(member.member_id, None)
        group.target.pop(member.member_id, None)
        log.info("consumer group %r: member %s %s", group.group_id, member.member_id, why)
        self._maybe_new_target(group, True)

    def _fence_later(self, group_id: str, member_id: str, why: str) -> None:
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return
        self._remove(group, member, why)
        task = asyncio.ensure_future(self._persist_logged(group))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _persist_logged(self, group: ConsumerGroup) -> None:
        try:
            await self._persist(group)
        except OffsetStoreError as exc:
            log.warning("consumer group %r: storing its state failed: %s", group.group_id, exc)
            self._groups.pop(group.group_id, None)

    async def _persist(self, group: ConsumerGroup) -> None:
        if self._groups.get(group.group_id) is not group:
            return  # unloaded meanwhile
        await self._store.save_group_state(group.group_id, group.to_json)

    # ------------------------------------------------------------------ timers

    def _call_later_ms(
        self, delay_ms: float, fn: Callable[..., None], *args: Any
    ) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(max(0.0, delay_ms) / 1000, fn, *args)

    def _schedule_session(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        if member.session_timer is not None:
            member.session_timer.cancel()
        member.session_timer = self._call_later_ms(
            self._config.consumer_session_timeout_ms,
            self._fence_later,
            group.group_id,
            member.member_id,
            "expired (session timeout)",
        )

    def _schedule_revocation(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        self._cancel_revocation(member)
        member.revocation_timer = self._call_later_ms(
            member.rebalance_timeout_ms,
            self._fence_later,
            group.group_id,
            member.member_id,
            "did not revoke its partitions in time",
        )

    @staticmethod
    def _cancel_revocation(member: ConsumerMember) -> None:
        if member.revocation_timer is not None:
            member.revocation_timer.cancel()
            member.revocation_timer = None

    def _cancel_timers(self, member: ConsumerMember) -> None:
        self._cancel_revocation(member)
        if member.session_timer is not None:
            member.session_timer.cancel()
            member.session_timer = None

    # ------------------------------------------------------------------ lifecycle

    def delete_group(self, group_id: str) -> int | None:
        """DeleteGroups of a consumer group: NON_EMPTY_GROUP if it has members, else it is
        dropped from memory (the caller deletes its document) and NONE; None if ``group_id``
        is not a consumer group."""
        group = self.group(group_id)
        if group is None:
            return None
        if group.members:
            return KafkaError.NON_EMPTY_GROUP
        self._groups.pop(group_id, None)
        return KafkaError.NONE

    async def forget_state(self, group_id: str) -> None:
        """Remove the stored state of a group dropped by :meth:`delete_group` (store errors
        propagate)."""
        if group_id not in self._groups:
            await self._store.save_group_state(group_id, lambda: None)

    def state_of(self, group_id: str) -> ConsumerGroupState | None:
        """The group's state, None if it is not a consumer group."""
        group = self.group(group_id)
        return None if group is None else group.state()

    def unload_groups(self, predicate: Callable[[str], bool]) -> int:
        """Drop the groups ``predicate`` picks (their coordinator slot moved); their state
        stays in the store for the next coordinator."""
        dropped = [gid for gid in self._groups if predicate(gid)]
        for gid in dropped:
            for member in self._groups.pop(gid).members.values():
                self._cancel_timers(member)
        return len(dropped)

    def close(self) -> None:
        """Stop: cancel every timer and background write."""
        self._closed = True
        self.unload_groups(lambda _gid: True)
        for task in list(self._background):
            task.cancel()


class GroupTypes:
    """The coordinators of every group type (classic, consumer; a share-group coordinator would
    join them) behind the one rule callers outside the group package need: may this offset
    commit proceed (TxnOffsetCommit's check). Event loop only."""

    def __init__(self, classic: GroupCoordinator, consumer: ConsumerGroupCoordinator) -> None:
        self._classic = classic
        self._consumer = consumer

    def validate_offset_commit(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> int:
        """A consumer group's member epoch rule (transactional commits skip Kafka's
        OffsetCommit-version check), else the classic group's generation rule."""
        code = self._consumer.validate_offset_commit(group_id, member_id, generation_id, 9)
        if code is not None:
            return code
        return self._classic.validate_offset_commit(
            group_id, generation_id, member_id, group_instance_id
        )
