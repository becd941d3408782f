"""Share-group membership (KIP-932's group coordinator part): members join, heartbeat and
leave with ShareGroupHeartbeat. Assignment follows the rules of Kafka's `simple` share
assignor (KIP-932): per topic, among the members subscribed to it, when there are at least
as many partitions as members each partition goes to one member (spread evenly); when there
are more members than partitions each member gets one partition, and a partition is shared
by several members (the share-partition at the partition's leader hands each record to one
of them). Every subscribed partition has a member and every member a partition. It is
computed from the group's members at each member's heartbeat (members in join order, so a
member that joins last takes the remainder): a member sees a change at its next heartbeat.

Membership is in memory at the group's coordinator (the owner of the group's coordinator
slot, as for classic groups): after a coordinator move members get UNKNOWN_MEMBER_ID and
join again with epoch 0 (librdkafka does so at once). What must survive - which records are
done - is the share-partitions' durable state (`partitions.py`), not membership.

Epochs: the group epoch grows with every membership or subscription change; a member's epoch
is the group epoch at which its assignment last changed. A heartbeat with another epoch than
the member's is FENCED_MEMBER_EPOCH; an unknown member UNKNOWN_MEMBER_ID.

Runs on the event loop; not thread-safe.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from dataplane.formats.kafka_errors import KafkaError

MAX_GROUP_ID_LENGTH = 255
MAX_MEMBER_ID_LENGTH = 64
MAX_SUBSCRIBED_TOPICS = 1_000
ASSIGNOR_NAME = "simple"

#: topic name -> (topic id, partition count), from the metadata image
TopicLookup = Callable[[str], "tuple[str, int] | None"]


@dataclass
class ShareMember:
    """One member of a share group."""

    member_id: str
    member_epoch: int
    client_id: str
    client_host: str
    rack_id: str | None
    subscribed: tuple[str, ...]
    last_heartbeat_s: float
    # topic id -> partitions, as last computed
    assignment: dict[str, tuple[int, ...]] = field(default_factory=dict)
    assignment_sent: bool = False


@dataclass
class ShareGroup:
    """A share group: its epoch and members."""

    group_id: str
    group_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """Kafka's share group states: Empty or Stable (assignment is immediate here)."""
        return "Stable" if self.members else "Empty"


@dataclass(frozen=True)
class HeartbeatResult:
    """A ShareGroupHeartbeat's answer; `assignment` None when it did not change."""

    error: KafkaError
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: dict[str, tuple[int, ...]] | None = None


class HeartbeatError(Exception):
    """A heartbeat refused with a Kafka error code (nothing changed)."""

    def __init__(self, error: KafkaError, message: str):
        super().__init__(message)
        self.error = error


class ShareGroupCoordinator:
    """The share groups this broker coordinates (see the module docstring)."""

    def __init__(
        self,
        *,
        session_timeout_ms: int = 45_000,
        heartbeat_interval_ms: int = 5_000,
        max_groups: int = 1_000,
        group_max_size: int = 200,
        clock_s: Callable[[], float] = time.monotonic,
        other_group_type: Callable[[str], str | None] = lambda group_id: None,
    ) -> None:
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.max_groups = max_groups
        self.group_max_size = group_max_size
        self.clock_s = clock_s
        # "classic" / "consumer" when a group of another type has the id (Kafka refuses)
        self.other_group_type = other_group_type
        self._groups: dict[str, ShareGroup] = {}

    # ------------------------------------------------------------------ reading

    def group(self, group_id: str) -> ShareGroup | None:
        """The share group `group_id` if this coordinator holds it."""
        self.expire_members()
        return self._groups.get(group_id)

    def groups(self) -> list[ShareGroup]:
        """Every share group held here."""
        self.expire_members()
        return list(self._groups.values())

    # ------------------------------------------------------------------ heartbeat

    def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        rack_id: str | None,
        subscribed: list[str] | None,
        client_id: str,
        client_host: str,
        topics: TopicLookup,
    ) -> HeartbeatResult:
        """Apply one ShareGroupHeartbeat; never raises (errors are in the result)."""
        try:
            return self._heartbeat(
                group_id,
                member_id,
                member_epoch,
                rack_id,
                subscribed,
                client_id,
                client_host,
                topics,
            )
        except HeartbeatError as exc:
            return HeartbeatResult(exc.error, str(exc), member_epoch=member_epoch)

    def _heartbeat(
        self, group_id, member_id, member_epoch, rack_id, subscribed, client_id, client_host, topics
    ) -> HeartbeatResult:
        _validate(group_id, member_id, member_epoch, subscribed)
        self.expire_members()
        now = self.clock_s()
        group = self._groups.get(group_id)
        if member_epoch == -1:  # leave
            if group is None or member_id not in group.members:
                raise HeartbeatError(
                    KafkaError.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in {group_id!r}"
                )
            del group.members[member_id]
            group.group_epoch += 1
            return HeartbeatResult(KafkaError.NONE, member_id=member_id, member_epoch=-1)
        if member_epoch == 0:
            if group is None:
                other = self.other_group_type(group_id)
                if other is not None:
                    raise HeartbeatError(
                        KafkaError.GROUP_ID_NOT_FOUND,
                        f"group {group_id!r} is a {other} group, not a share group",
                    )
                if len(self._groups) >= self.max_groups:
                    self._evict_empty()
                if len(self._groups) >= self.max_groups:
                    raise HeartbeatError(
                        KafkaError.GROUP_MAX_SIZE_REACHED, f"{self.max_groups} share groups held"
                    )
                group = self._groups[group_id] = ShareGroup(group_id)
            if member_id not in group.members and len(group.members) >= self.group_max_size:
                raise HeartbeatError(
                    KafkaError.GROUP_MAX_SIZE_REACHED,
                    f"share group {group_id!r} has {self.group_max_size} members",
                )
            group.group_epoch += 1
            member = ShareMember(
                member_id,
                group.group_epoch,
                client_id,
                client_host,
                rack_id,
                tuple(subscribed or ()),
                now,
            )
            group.members[member_id] = member
        else:
            member = group.members.get(member_id) if group is not None else None
            if member is None:
                raise HeartbeatError(
                    KafkaError.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in {group_id!r}"
                )
            if member_epoch != member.member_epoch:
                raise HeartbeatError(
                    KafkaError.FENCED_MEMBER_EPOCH,
                    f"member {member_id!r} is at epoch {member.member_epoch}, not {member_epoch}",
                )
            member.last_heartbeat_s = now
            if rack_id is not None:
                member.rack_id = rack_id
            if subscribed is not None and tuple(subscribed) != member.subscribed:
                member.subscribed = tuple(subscribed)
                group.group_epoch += 1
        assert group is not None
        assignment = _assign(group, member, topics)
        if assignment != member.assignment or not member.assignment_sent:
            if assignment != member.assignment and member_epoch != 0:
                group.group_epoch += 1
                member.member_epoch = group.group_epoch
            member.assignment = assignment
            member.assignment_sent = True
            sent: dict[str, tuple[int, ...]] | None = assignment
        else:
            sent = None
        return HeartbeatResult(
            KafkaError.NONE,
            member_id=member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            assignment=sent,
        )

    # ------------------------------------------------------------------ expiry

    def expire_members(self) -> list[tuple[str, str]]:
        """Remove members silent for the session timeout; (group, member) removed."""
        cutoff = self.clock_s() - self.session_timeout_ms / 1000
        removed = []
        for group in self._groups.values():
            for member in list(group.members.values()):
                if member.last_heartbeat_s < cutoff:
                    del group.members[member.member_id]
                    group.group_epoch += 1
                    removed.append((group.group_id, member.member_id))
        return removed

    def _evict_empty(self) -> None:
        for group_id in [g.group_id for g in self._groups.values() if not g.members]:
            del self._groups[group_id]

    def delete_group(self, group_id: str) -> KafkaError:
        """DeleteGroups of a share group held here: NON_EMPTY_GROUP while it has members
        (nothing changes), else it is forgotten."""
        group = self.group(group_id)
        if group is not None and group.members:
            return KafkaError.NON_EMPTY_GROUP
        self._groups.pop(group_id, None)
        return KafkaError.NONE

    def unload(self, predicate: Callable[[str], bool]) -> int:
        """Forget the groups `predicate` names (their coordinator slot moved away)."""
        gone = [g for g in self._groups if predicate(g)]
        for group_id in gone:
            del self._groups[group_id]
        return len(gone)


def _validate(group_id: str, member_id: str, member_epoch: int, subscribed) -> None:
    if not group_id or len(group_id) > MAX_GROUP_ID_LENGTH:
        raise HeartbeatError(KafkaError.INVALID_REQUEST, "GroupId must be 1-255 characters")
    if not member_id or len(member_id) > MAX_MEMBER_ID_LENGTH:
        raise HeartbeatError(KafkaError.INVALID_REQUEST, "MemberId must be 1-64 characters")
    if member_epoch < -1:
        raise HeartbeatError(KafkaError.INVALID_REQUEST, f"MemberEpoch {member_epoch} < -1")
    if member_epoch == 0 and not subscribed:
        raise HeartbeatError(
            KafkaError.INVALID_REQUEST, "SubscribedTopicNames must be set when joining"
        )
    if subscribed is not None:
        if len(subscribed) > MAX_SUBSCRIBED_TOPICS or any(not t for t in subscribed):
            raise HeartbeatError(KafkaError.INVALID_REQUEST, "bad SubscribedTopicNames")


def _assign(
    group: ShareGroup, member: ShareMember, topics: TopicLookup
) -> dict[str, tuple[int, ...]]:
    """`member`'s partitions under the `simple` rules (module docstring): per subscribed
    topic, with the members subscribed to it in join order, partition p goes to member
    p mod members when partitions >= members, else member i reads partition i mod partitions."""
    assignment: dict[str, tuple[int, ...]] = {}
    for name in sorted(set(member.subscribed)):
        found = topics(name)
        if found is None or found[1] <= 0:
            continue
        topic_id, count = found
        readers = [m.member_id for m in group.members.values() if name in m.subscribed]
        index = readers.index(member.member_id)
        if count >= len(readers):
            assignment[topic_id] = tuple(range(index, count, len(readers)))
        else:
            assignment[topic_id] = (index % count,)
    return assignment


def new_member_id() -> str:
    """A member id (v1 clients send their own; kept for tools)."""
    return uuid.uuid4().hex
