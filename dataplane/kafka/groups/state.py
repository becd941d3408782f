"""Pure data model of a classic Kafka consumer group (no asyncio, no I/O); its limits
and timings are `dataplane.config.GroupCoordinatorConfig` (the `groups` section).

The model follows the Java broker's ``ClassicGroup`` / Scala ``GroupMetadata``:
members in join order (the first one is the leader), a generation counter, the
protocol type shared by all members and the protocol selected for the current
generation.  :mod:`dataplane.kafka.groups.coordinator` drives it with timers and
futures; everything here is synchronous and deterministic so it can be tested
without an event loop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol


class GroupState(str, enum.Enum):
    """Classic group states; values are the names Kafka reports on the wire."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


#: target state -> states it may be entered from (as Kafka's ClassicGroupState).
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    GroupState.DEAD: frozenset(GroupState),
    GroupState.COMPLETING_REBALANCE: frozenset({GroupState.PREPARING_REBALANCE}),
    GroupState.STABLE: frozenset({GroupState.COMPLETING_REBALANCE}),
    GroupState.PREPARING_REBALANCE: frozenset(
        {GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY}
    ),
    GroupState.EMPTY: frozenset({GroupState.PREPARING_REBALANCE}),
}

#: The group type reported by ListGroups v5+ (only the classic protocol exists here).
CLASSIC_GROUP_TYPE = "classic"


class IllegalStateTransition(RuntimeError):
    """A bug: the coordinator attempted a transition Kafka does not allow."""


class Waiter(Protocol):
    """What the model needs of a pending response (an ``asyncio.Future`` fits)."""

    def done(self) -> bool: ...

    def set_result(self, result: Any) -> None: ...


@dataclass(frozen=True)
class MemberMetadata:
    """One member as the leader sees it in its JoinGroup response."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True)
class JoinGroupParams:
    """A JoinGroup request, independent of its wire version.

    ``rebalance_timeout_ms`` < 0 means "not sent" (v0): the session timeout is used.
    ``require_known_member_id`` is True for v4+ (MEMBER_ID_REQUIRED round trip).
    """

    group_id: str
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    require_known_member_id: bool = True
    reason: str | None = None


@dataclass(frozen=True)
class JoinGroupResult:
    """The coordinator's answer to a JoinGroup; the leader's ``members`` is filled."""

    error_code: int
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str = ""
    members: tuple[MemberMetadata, ...] = ()
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncGroupResult:
    """The coordinator's answer to a SyncGroup."""

    error_code: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True)
class LeaveMemberResult:
    """Outcome for one member of a LeaveGroup request (echoes the request's ids)."""

    member_id: str
    group_instance_id: str | None
    error_code: int


@dataclass(frozen=True)
class LeaveGroupResult:
    """Group-level error plus one entry per leaving member."""

    error_code: int
    members: tuple[LeaveMemberResult, ...] = ()


@dataclass(frozen=True)
class MemberSummary:
    """A member as DescribeGroups reports it."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupSummary:
    """A group as DescribeGroups reports it (metadata/assignment only when Stable)."""

    group_id: str
    state: GroupState
    protocol_type: str
    protocol_name: str
    generation_id: int
    leader_id: str
    members: tuple[MemberSummary, ...]


@dataclass(frozen=True)
class GroupListing:
    """A group as ListGroups reports it."""

    group_id: str
    protocol_type: str
    state: GroupState
    group_type: str = CLASSIC_GROUP_TYPE


@dataclass(eq=False)
class Member:
    """One member of a group; mutable, owned by its :class:`Group`."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    #: True until the member's first JoinGroup completed.
    is_new: bool = True
    #: monotonic time (ms) after which the member expires unless it is awaiting a response.
    deadline_ms: float = 0.0
    join_waiter: Waiter | None = None
    sync_waiter: Waiter | None = None
    #: opaque timer handle owned by the coordinator.
    timer: Any = None

    @property
    def awaiting_join(self) -> bool:
        """A JoinGroup response is owed to this member."""
        return self.join_waiter is not None and not self.join_waiter.done()

    @property
    def awaiting_sync(self) -> bool:
        """A SyncGroup response is owed to this member."""
        return self.sync_waiter is not None and not self.sync_waiter.done()

    def protocol_names(self) -> list[str]:
        """Protocol names in the member's order of preference."""
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol_name: str) -> bytes:
        """The member's metadata for ``protocol_name`` (b"" if it does not support it)."""
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        """Same protocols with the same metadata, in the same order."""
        return tuple(protocols) == tuple(self.protocols)

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among ``candidates``."""
        for name in self.protocol_names():
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")


CONSUMER_PROTOCOL_TYPE = "consumer"


def consumer_subscription_topics(metadata: bytes) -> set[str] | None:
    """Topics of a ConsumerProtocolSubscription (every version starts with an int16 version
    and the topic array), or None when the bytes are not one (Kafka then treats the member
    as subscribed to nothing)."""
    try:
        if len(metadata) < 6:
            return None
        count = int.from_bytes(metadata[2:6], "big", signed=True)
        if count < 0 or count > len(metadata):
            return None
        topics, pos = set(), 6
        for _ in range(count):
            size = int.from_bytes(metadata[pos : pos + 2], "big", signed=True)
            if size < 0 or pos + 2 + size > len(metadata):
                return None
            topics.add(metadata[pos + 2 : pos + 2 + size].decode("utf-8"))
            pos += 2 + size
        return topics
    except (UnicodeDecodeError, IndexError):
        return None


@dataclass(eq=False)
class Group:
    """One classic group; all mutation goes through the coordinator."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    #: member id -> member, in join order.
    members: dict[str, Member] = field(default_factory=dict)
    #: member ids told MEMBER_ID_REQUIRED that have not rejoined -> coordinator timer handle.
    pending_members: dict[str, Any] = field(default_factory=dict)
    #: group instance id -> member id.
    static_members: dict[str, str] = field(default_factory=dict)
    #: members of the current generation that have not sent SyncGroup yet.
    pending_sync: set[str] = field(default_factory=set)
    #: a member joined during the initial delayed join (extends the delay).
    new_member_added: bool = False
    #: (next delay ms, remaining ms) while the initial delayed join runs, else None.
    initial_join: tuple[int, int] | None = None
    join_timer: Any = None
    sync_timer: Any = None

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members of a consumer group subscribe to (Kafka's subscribedTopics);
        None for other protocol types, whose subscriptions are opaque."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            name = self.protocol_name or (member.protocol_names() or [""])[0]
            topics |= consumer_subscription_topics(member.metadata_for(name)) or set()
        return topics

    # -- state ---------------------------------------------------------------------------

    def transition_to(self, target: GroupState) -> None:
        """Move to ``target``; raises :class:`IllegalStateTransition` if Kafka forbids it."""
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise IllegalStateTransition(
                f"group {self.group_id!r}: {self.state.value} -> {target.value} is not allowed"
            )
        self.state = target

    def can_rebalance(self) -> bool:
        """A rebalance may start from this state."""
        return self.state in (
            GroupState.STABLE,
            GroupState.COMPLETING_REBALANCE,
            GroupState.EMPTY,
        )

    # -- membership ----------------------------------------------------------------------

    def size(self) -> int:
        """Members plus pending (MEMBER_ID_REQUIRED) members: what group_max_size bounds."""
        return len(self.members) + len(self.pending_members)

    def is_leader(self, member_id: str) -> bool:
        """``member_id`` leads the group."""
        return self.leader_id is not None and self.leader_id == member_id

    def add(self, member: Member) -> None:
        """Add a member; the first member of an empty group sets protocol type and leader."""
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        """Remove a member (leadership passes to the next member in join order)."""
        member = self.members.pop(member_id, None)
        if member is not None and member.group_instance_id is not None:
            if self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_sync.discard(member_id)
        return member

    def rename_member(self, old_id: str, new_id: str) -> Member:
        """Give the member `old_id` the id `new_id` (a static member that restarted), in its
        place in join order, keeping its assignment, leadership and pending SyncGroup."""
        member = self.members[old_id]
        member.member_id = new_id
        self.members = {(new_id if mid == old_id else mid): m for mid, m in self.members.items()}
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = new_id
        if self.leader_id == old_id:
            self.leader_id = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return member

    def is_static_member_fenced(self, member_id: str, group_instance_id: str | None) -> bool:
        """``group_instance_id`` belongs to a member other than ``member_id``."""
        if group_instance_id is None:
            return False
        current = self.static_members.get(group_instance_id)
        return current is not None and current != member_id

    def has_all_members_joined(self) -> bool:
        """Every member has a pending JoinGroup and nobody is still pending a member id."""
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def rebalance_timeout_ms(self) -> int:
        """The largest rebalance timeout of the members (0 without members)."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def elect_joined_leader(self) -> None:
        """Keep the leader if it rejoined, else pick the first member that did."""
        leader = self.members.get(self.leader_id) if self.leader_id is not None else None
        if leader is not None and leader.awaiting_join:
            return
        joined = [m.member_id for m in self.members.values() if m.awaiting_join]
        self.leader_id = joined[0] if joined else next(iter(self.members), None)

    # -- protocols -----------------------------------------------------------------------

    def candidate_protocols(self) -> set[str]:
        """Protocols every member supports."""
        members = list(self.members.values())
        if not members:
            return set()
        common = set(members[0].protocol_names())
        for member in members[1:]:
            common &= set(member.protocol_names())
        return common

    def supports_protocols(self, protocol_type: str, protocol_names: list[str]) -> bool:
        """A member with this type and these protocols may join (Kafka's supportsProtocols)."""
        if not self.members:
            return bool(protocol_type) and bool(protocol_names)
        if protocol_type != self.protocol_type:
            return False
        return bool(self.candidate_protocols() & set(protocol_names))

    def supports_protocols_excluding(
        self, member_id: str, protocol_type: str, protocol_names: list[str]
    ) -> bool:
        """As :meth:`supports_protocols`, ignoring ``member_id``'s own current protocols.

        A member updating its protocols must be compatible with the *other* members.
        """
        others = [m for mid, m in self.members.items() if mid != member_id]
        if not others:
            return bool(protocol_type) and bool(protocol_names)
        if protocol_type != self.protocol_type:
            return False
        common = set(protocol_names)
        for member in others:
            common &= set(member.protocol_names())
        return bool(common)

    def select_protocol(self) -> str:
        """Protocol for the next generation: most votes among the common protocols.

        Each member votes for its most preferred common protocol.  Ties are broken
        by the leader's order of preference (Kafka breaks them arbitrarily).
        """
        candidates = self.candidate_protocols()
        if not candidates:
            raise ValueError(f"group {self.group_id!r} has no protocol common to all members")
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        best = max(votes.values())
        leader = self.members.get(self.leader_id or "") or next(iter(self.members.values()))
        for name in leader.protocol_names():
            if votes.get(name) == best:
                return name
        return sorted(name for name, count in votes.items() if count == best)[0]

    # -- views ---------------------------------------------------------------------------

    def current_member_metadata(self) -> tuple[MemberMetadata, ...]:
        """All members with their metadata for the selected protocol (for the leader)."""
        protocol = self.protocol_name or ""
        return tuple(
            MemberMetadata(m.member_id, m.group_instance_id, m.metadata_for(protocol))
            for m in self.members.values()
        )

    def summary(self) -> GroupSummary:
        """DescribeGroups view: metadata and assignment are reported only when Stable."""
        stable = self.state is GroupState.STABLE
        protocol = self.protocol_name or ""
        members = tuple(
            MemberSummary(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                metadata=m.metadata_for(protocol) if stable else b"",
                assignment=m.assignment if stable else b"",
            )
            for m in self.members.values()
        )
        return GroupSummary(
            group_id=self.group_id,
            state=self.state,
            protocol_type=self.protocol_type or "",
            protocol_name=protocol if stable else "",
            generation_id=self.generation_id,
            leader_id=self.leader_id or "",
            members=members if self.state is not GroupState.DEAD else (),
        )

    def listing(self) -> GroupListing:
        """ListGroups view."""
        return GroupListing(self.group_id, self.protocol_type or "", self.state)
