"""Pure model of a KIP-848 consumer group (no asyncio, no I/O): members, epochs, the target
assignment and each member's reconciliation towards it.

Follows Kafka's `ConsumerGroup` / `ConsumerGroupMember` / `CurrentAssignmentBuilder`:

* the **group epoch** is bumped whenever a member joins, leaves or changes its subscription,
  or the subscribed topics' partition counts change; the **target assignment** is recomputed
  by the group's assignor at the new epoch (its **assignment epoch**);
* each member has a **member epoch** and reconciles towards the target one heartbeat at a time
  (:func:`reconcile`): partitions it must give up are *pending revocation* and it stays at its
  epoch (state ``UNREVOKED_PARTITIONS``) until its heartbeat no longer lists them; only then
  does it move to the target epoch and get the new partitions, and a partition still owned or
  being revoked by another member is held back (``UNRELEASED_PARTITIONS``) until released,
  so a partition never has two owners;
* a heartbeat with an epoch the coordinator does not expect is fenced (FENCED_MEMBER_EPOCH),
  except the previous epoch with owned partitions that are a subset of the current ones (the
  member lost the response that bumped it).

Topics are keyed by topic id (a UUID string) as on the wire. :meth:`ConsumerGroup.to_json` /
:meth:`ConsumerGroup.from_json` give the durable form (timers and transient data excluded).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

#: topic id -> partitions
Partitions = dict[str, set[int]]

#: the group type reported by ListGroups v5+ and ConsumerGroupDescribe
CONSUMER_GROUP_TYPE = "consumer"
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


class ConsumerGroupState(str, enum.Enum):
    """Kafka's consumer group states (the names reported on the wire)."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


class MemberState(str, enum.Enum):
    """A member's reconciliation state (Kafka's `MemberState`)."""

    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


def copy_partitions(parts: Partitions) -> Partitions:
    """A deep copy without empty topics."""
    return {t: set(ps) for t, ps in parts.items() if ps}


@dataclass(eq=False)
class ConsumerMember:
    """One member; mutable, owned by its :class:`ConsumerGroup`."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 300_000
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    #: opaque timer handles owned by the coordinator (session, rebalance timeout)
    session_timer: Any = None
    revocation_timer: Any = None

    def to_json(self) -> dict[str, Any]:
        """The durable form (timers excluded)."""
        return {
            "id": self.member_id,
            "instance": self.instance_id,
            "rack": self.rack_id,
            "client": self.client_id,
            "host": self.client_host,
            "rebalance_ms": self.rebalance_timeout_ms,
            "topics": list(self.subscribed_topic_names),
            "regex": self.subscribed_topic_regex,
            "assignor": self.server_assignor,
            "epoch": self.member_epoch,
            "prev_epoch": self.previous_member_epoch,
            "state": self.state.value,
            "assigned": {t: sorted(p) for t, p in sorted(self.assigned.items())},
            "revoking": {t: sorted(p) for t, p in sorted(self.pending_revocation.items())},
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ConsumerMember:
        """Inverse of :meth:`to_json`."""
        return cls(
            member_id=doc["id"],
            instance_id=doc.get("instance"),
            rack_id=doc.get("rack"),
            client_id=doc.get("client", ""),
            client_host=doc.get("host", ""),
            rebalance_timeout_ms=int(doc.get("rebalance_ms", 300_000)),
            subscribed_topic_names=tuple(doc.get("topics", ())),
            subscribed_topic_regex=doc.get("regex"),
            server_assignor=doc.get("assignor"),
            member_epoch=int(doc["epoch"]),
            previous_member_epoch=int(doc.get("prev_epoch", -1)),
            state=MemberState(doc.get("state", MemberState.STABLE.value)),
            assigned={t: set(p) for t, p in doc.get("assigned", {}).items()},
            pending_revocation={t: set(p) for t, p in doc.get("revoking", {}).items()},
        )


@dataclass(eq=False)
class ConsumerGroup:
    """One consumer group; all mutation goes through the coordinator."""

    group_id: str
    group_epoch: int = 0
    assignment_epoch: int = 0
    #: the assignor that computed the current target assignment
    assignor_name: str = ""
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    #: member id -> target partitions at `assignment_epoch`
    target: dict[str, Partitions] = field(default_factory=dict)
    #: topic id -> partition count the target was computed for (metadata changes bump the epoch)
    subscribed_metadata: dict[str, int] = field(default_factory=dict)

    # -- queries -------------------------------------------------------------------------

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        """The member holding ``instance_id``, if any."""
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def state(self) -> ConsumerGroupState:
        """Kafka's derived state: Empty, Assigning (target behind the group epoch),
        Reconciling (a member behind the target) or Stable."""
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.assignment_epoch < self.group_epoch:
            return ConsumerGroupState.ASSIGNING
        for member in self.members.values():
            if (
                member.member_epoch != self.assignment_epoch
                or member.state is not MemberState.STABLE
            ):
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def partition_owner_epoch(self, topic_id: str, partition: int, except_member: str) -> int:
        """The epoch of the member (other than ``except_member``) that owns or is revoking the
        partition, -1 if none (Kafka's ``currentPartitionEpoch``)."""
        for member in self.members.values():
            if member.member_id == except_member:
                continue
            if partition in member.assigned.get(topic_id, ()) or partition in (
                member.pending_revocation.get(topic_id, ())
            ):
                return member.member_epoch
        return -1

    # -- durable form --------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The durable form (what the coordinator stores after each change)."""
        return {
            "type": CONSUMER_GROUP_TYPE,
            "epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignor": self.assignor_name,
            "members": [m.to_json() for m in self.members.values()],
            "target": {
                mid: {t: sorted(p) for t, p in sorted(parts.items())}
                for mid, parts in sorted(self.target.items())
            },
            "metadata": dict(sorted(self.subscribed_metadata.items())),
        }

    @classmethod
    def from_json(cls, group_id: str, doc: dict[str, Any]) -> ConsumerGroup:
        """Inverse of :meth:`to_json`; a malformed document is a ValueError."""
        try:
            members = [ConsumerMember.from_json(m) for m in doc.get("members", [])]
            return cls(
                group_id=group_id,
                group_epoch=int(doc["epoch"]),
                assignment_epoch=int(doc.get("assignment_epoch", 0)),
                assignor_name=str(doc.get("assignor", "")),
                members={m.member_id: m for m in members},
                target={
                    mid: {t: set(p) for t, p in parts.items()}
                    for mid, parts in doc.get("target", {}).items()
                },
                subscribed_metadata={t: int(n) for t, n in doc.get("metadata", {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed consumer group state of {group_id!r}: {exc}") from None


def owns_any(owned: Partitions | None, parts: Partitions) -> bool:
    """The member's reported ``owned`` partitions include one of ``parts`` (None: unknown,
    counted as owning them, as Kafka does)."""
    if owned is None:
        return True
    return any(owned.get(t, set()) & ps for t, ps in parts.items())


def is_subset(owned: Partitions | None, parts: Partitions) -> bool:
    """Every reported partition is in ``parts`` (None is not a subset)."""
    if owned is None:
        return False
    return all(ps <= parts.get(t, set()) for t, ps in owned.items() if ps)


def reconcile(group: ConsumerGroup, member: ConsumerMember, owned: Partitions | None) -> bool:
    """Move ``member`` one step towards the group's target assignment (Kafka's
    `CurrentAssignmentBuilder.build`); ``owned`` is what its heartbeat reports (None: not
    sent). Returns True if the member changed."""
    target_epoch = group.assignment_epoch
    if member.state is MemberState.STABLE:
        if member.member_epoch == target_epoch:
            return False
        return _next_assignment(group, member, member.member_epoch, owned)
    if member.state is MemberState.UNREVOKED_PARTITIONS:
        if owns_any(owned, member.pending_revocation):
            return False
        return _next_assignment(group, member, member.member_epoch + 1, owned)
    return _next_assignment(group, member, member.member_epoch, owned)


def _set_epoch(member: ConsumerMember, epoch: int) -> None:
    if epoch != member.member_epoch:
        member.previous_member_epoch = member.member_epoch
        member.member_epoch = epoch


def _next_assignment(
    group: ConsumerGroup, member: ConsumerMember, epoch: int, owned: Partitions | None
) -> bool:
    before = (
        member.member_epoch,
        member.state,
        copy_partitions(member.assigned),
        copy_partitions(member.pending_revocation),
    )
    target = group.target.get(member.member_id, {})
    assigned: Partitions = {}
    revoking: Partitions = {}
    pending: Partitions = {}
    unreleased = False
    for topic_id in set(target) | set(member.assigned):
        want = target.get(topic_id, set())
        have = member.assigned.get(topic_id, set())
        keep = have & want
        if keep:
            assigned[topic_id] = keep
        if have - keep:
            revoking[topic_id] = have - keep
        free = set()
        for p in want - keep:
            if group.partition_owner_epoch(topic_id, p, member.member_id) != -1:
                unreleased = True
            else:
                free.add(p)
        if free:
            pending[topic_id] = free
    if revoking and owns_any(owned, revoking):
        member.state = MemberState.UNREVOKED_PARTITIONS
        _set_epoch(member, epoch)
        member.assigned, member.pending_revocation = assigned, revoking
    else:
        for topic_id, parts in pending.items():
            assigned.setdefault(topic_id, set()).update(parts)
        member.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
        _set_epoch(member, group.assignment_epoch)
        member.assigned, member.pending_revocation = assigned, {}
    after = (member.member_epoch, member.state, member.assigned, member.pending_revocation)
    return after != before
