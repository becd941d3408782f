"""Classic consumer-group coordinator (Kafka's JoinGroup/SyncGroup protocol) on asyncio.

A port of the Java broker's classic group state machine::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
      ^                 ^       |                                     |  leader's SyncGroup
      |                 |       +--no members left--> Empty           v
      |                 +------- member joins/leaves/expires ----- Stable
    (DeleteGroups: Empty -> Dead, then forgotten)

Every state change is a synchronous method run on the event loop (the state machine is
`dataplane.kafka.groups.rebalance.GroupRebalancer`; this module checks the requests and
answers the queries), so no locks are needed; the public ``async`` methods only wait for the response future of their
member (JoinGroup waits for the rebalance, a follower's SyncGroup for the leader).

Timers (``loop.call_at``), all bounded and cancelled when their owner goes away:

* one per member: session expiry (members awaiting a JoinGroup/SyncGroup response
  are kept alive, except new members awaiting their first JoinGroup, which expire
  after ``new_member_join_timeout_ms``);
* one per member id handed out with MEMBER_ID_REQUIRED (expires after the session
  timeout if the member never rejoins);
* one per group for the join phase (rebalance timeout, or the initial delay);
* one per group for the sync phase (members that never send SyncGroup within the
  rebalance timeout are removed).

Group state lives in memory only: after a coordinator restart or move, members get
UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION and rejoin (committed offsets are durable,
see :mod:`dataplane.kafka.groups.offsets`).

Static membership (``group.instance.id``) is handled like dynamic membership with
two additions: an instance id maps to at most one member (a member joining with an
instance id already in use replaces - fences - the old member and triggers a
rebalance; the old one gets FENCED_INSTANCE_ID), and LeaveGroup/Heartbeat/SyncGroup/
OffsetCommit check the instance id.  A static member that restarts (joins with its
instance id and no member id) within its session timeout takes over its old member
without a rebalance when the group is Stable and its protocols are unchanged (Kafka's
`updateStaticMemberAndRebalance`: `GroupRebalancer.rejoin_static_member`); static members
skip the MEMBER_ID_REQUIRED round (KIP-394 applies to dynamic members only) and are
removed on session expiry like dynamic ones.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError

from .rebalance import GroupRebalancer
from .state import (
    Group,
    GroupListing,
    GroupState,
    GroupSummary,
    JoinGroupParams,
    JoinGroupResult,
    LeaveGroupResult,
    LeaveMemberResult,
    SyncGroupResult,
)

log = logging.getLogger(__name__)


def _default_member_id(prefix: str) -> str:
    """Kafka's member id format: ``<client id or instance id>-<uuid4>``."""
    return f"{prefix}-{uuid.uuid4()}"


class GroupCoordinator:
    """In-memory coordinator of classic groups; one per broker, on one event loop.

    Args:
        config: limits and timings.
        member_id_factory: ``prefix -> member id`` (tests make ids predictable).
    """

    def __init__(
        self,
        config: GroupCoordinatorConfig | None = None,
        *,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        self._config = config or GroupCoordinatorConfig()
        self._new_member_id = member_id_factory or _default_member_id
        self._rebalancer = GroupRebalancer(self._config)
        self._closed = False

    @property
    def config(self) -> GroupCoordinatorConfig:
        """The coordinator's configuration."""
        return self._config

    async def join_group(self, params: JoinGroupParams) -> JoinGroupResult:
        """Handle a JoinGroup; returns when the member's rebalance completes (or at once on error)."""
        waiter: asyncio.Future[JoinGroupResult] = self._rebalancer.bind_loop().create_future()
        self._do_join(params, waiter)
        return await waiter

    async def sync_group(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
        assignments: dict[str, bytes] | None = None,
    ) -> SyncGroupResult:
        """Handle a SyncGroup; the leader passes ``assignments`` (member id -> bytes).

        Followers wait until the leader's SyncGroup arrives (or the group rebalances).
        """
        waiter: asyncio.Future[SyncGroupResult] = self._rebalancer.bind_loop().create_future()
        self._do_sync(
            group_id,
            generation_id,
            member_id,
            group_instance_id,
            protocol_type,
            protocol_name,
            assignments or {},
            waiter,
        )
        return await waiter

    async def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> int:
        """Handle a Heartbeat; returns the error code (REBALANCE_IN_PROGRESS tells the member to rejoin)."""
        self._rebalancer.bind_loop()
        return self._do_heartbeat(group_id, generation_id, member_id, group_instance_id)

    async def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> LeaveGroupResult:
        """Handle a LeaveGroup for ``(member_id, group_instance_id)`` pairs.

        A pair with an instance id removes the member holding that instance id
        (``member_id`` may then be empty; if given it must match, else FENCED_INSTANCE_ID).
        """
        self._rebalancer.bind_loop()
        return self._do_leave(group_id, members)

    def validate_offset_commit(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> int:
        """May this OffsetCommit proceed?  Kafka's ``ClassicGroup.validateOffsetCommit``.

        * generation < 0 to an Empty or unknown group: a "simple" commit, allowed;
        * a member of the group with the current generation: allowed, except while
          CompletingRebalance (REBALANCE_IN_PROGRESS);
        * unknown group with generation >= 0: ILLEGAL_GENERATION (group state is not
          durable here, so this is also what members see after a coordinator move;
          every client answers it by rejoining);
        * otherwise UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION / FENCED_INSTANCE_ID.

        A successful member commit counts as a heartbeat.
        """
        if self._closed:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        group = self._rebalancer.groups.get(group_id)
        if group is None:
            return KafkaError.NONE if generation_id < 0 else KafkaError.ILLEGAL_GENERATION
        if group.state is GroupState.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return KafkaError.NONE
        if generation_id >= 0 or member_id or group_instance_id is not None:
            if group_instance_id is not None:
                current = group.static_members.get(group_instance_id)
                if current is None:
                    return KafkaError.UNKNOWN_MEMBER_ID
                if current != member_id:
                    return KafkaError.FENCED_INSTANCE_ID
            member = group.members.get(member_id)
            if member is None:
                return KafkaError.UNKNOWN_MEMBER_ID
            if generation_id != group.generation_id:
                return KafkaError.ILLEGAL_GENERATION
            if group.state is GroupState.COMPLETING_REBALANCE:
                return KafkaError.REBALANCE_IN_PROGRESS
            self._rebalancer.touch(group, member)
            return KafkaError.NONE
        if group.state is not GroupState.EMPTY:
            return KafkaError.UNKNOWN_MEMBER_ID
        return KafkaError.NONE

    def list_groups(self) -> list[GroupListing]:
        """All groups held in memory except Dead ones."""
        return [
            g.listing() for g in self._rebalancer.groups.values() if g.state is not GroupState.DEAD
        ]

    def describe_group(self, group_id: str) -> GroupSummary | None:
        """The group's summary, or None if it is not in memory (or being deleted)."""
        group = self._rebalancer.groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return None
        return group.summary()

    def group_state(self, group_id: str) -> GroupState | None:
        """The group's state, or None if it is not in memory."""
        group = self._rebalancer.groups.get(group_id)
        return None if group is None else group.state

    def subscriptions(self, group_id: str) -> tuple[GroupState | None, set[str] | None]:
        """(state, subscribed topics) for OffsetDelete: state None if the group is not in
        memory; topics None unless it is a consumer group (see `Group.subscribed_topics`)."""
        group = self._rebalancer.groups.get(group_id)
        if group is None:
            return None, None
        return group.state, group.subscribed_topics()

    def begin_delete(self, group_id: str) -> tuple[int, bool]:
        """First step of DeleteGroups: mark the group Dead so nobody joins meanwhile.

        Returns ``(error_code, known)``; ``known`` tells whether the group was in
        memory.  On NONE the caller deletes the committed offsets and then calls
        :meth:`finish_delete` (always, also if that failed).  A group not in memory
        gets a Dead placeholder so joins are refused until :meth:`finish_delete`.
        Errors: NON_EMPTY_GROUP if the group has members; GROUP_ID_NOT_FOUND if a
        deletion is already under way.
        """
        if self._closed:
            return KafkaError.COORDINATOR_NOT_AVAILABLE, False
        group = self._rebalancer.groups.get(group_id)
        if group is None:
            self._rebalancer.groups[group_id] = Group(group_id=group_id, state=GroupState.DEAD)
            return KafkaError.NONE, False
        if group.state is GroupState.DEAD:
            return KafkaError.GROUP_ID_NOT_FOUND, True
        if group.state is not GroupState.EMPTY:
            return KafkaError.NON_EMPTY_GROUP, True
        self._rebalancer.kill(group, KafkaError.COORDINATOR_NOT_AVAILABLE)
        return KafkaError.NONE, True

    def finish_delete(self, group_id: str) -> None:
        """Forget a group marked Dead by :meth:`begin_delete`."""
        group = self._rebalancer.groups.get(group_id)
        if group is not None and group.state is GroupState.DEAD:
            del self._rebalancer.groups[group_id]

    def unload_groups(self, predicate: Callable[[str], bool]) -> int:
        """Drop the groups whose id matches (e.g. this broker no longer coordinates them).

        Pending JoinGroup/SyncGroup responses get NOT_COORDINATOR so clients look the
        coordinator up again.  Returns the number of groups dropped.
        """
        dropped = [gid for gid in self._rebalancer.groups if predicate(gid)]
        for gid in dropped:
            group = self._rebalancer.groups.pop(gid)
            self._rebalancer.kill(group, KafkaError.NOT_COORDINATOR)
        return len(dropped)

    def close(self) -> None:
        """Stop: cancel every timer, answer every pending request with NOT_COORDINATOR."""
        self._closed = True
        self.unload_groups(lambda _gid: True)

    def __len__(self) -> int:
        return len(self._rebalancer.groups)

    def _validate_group_id(self, group_id: str | None) -> int:
        if not group_id or len(group_id) > self._config.max_group_id_length:
            return KafkaError.INVALID_GROUP_ID
        return KafkaError.NONE

    def _check_join_request(self, params: JoinGroupParams) -> int:
        cfg = self._config
        if (
            not cfg.group_min_session_timeout_ms
            <= params.session_timeout_ms
            <= cfg.group_max_session_timeout_ms
        ):
            return KafkaError.INVALID_SESSION_TIMEOUT
        if len(params.protocols) > cfg.max_protocols_per_member:
            return KafkaError.INVALID_REQUEST
        total = 0
        for name, metadata in params.protocols:
            if len(name) > cfg.max_protocol_name_length:
                return KafkaError.INVALID_REQUEST
            total += len(metadata)
        if total > cfg.max_member_metadata_bytes:
            return KafkaError.INVALID_REQUEST
        if len(params.protocol_type) > cfg.max_protocol_name_length:
            return KafkaError.INVALID_REQUEST
        return KafkaError.NONE

    def _do_join(self, params: JoinGroupParams, waiter: Any) -> None:
        member_id = params.member_id
        error = self._validate_group_id(params.group_id)
        if error == KafkaError.NONE and self._closed:
            error = KafkaError.COORDINATOR_NOT_AVAILABLE
        if error == KafkaError.NONE:
            error = self._check_join_request(params)
        if error != KafkaError.NONE:
            return self._rebalancer.join_error(waiter, error, member_id)

        names = [name for name, _ in params.protocols]
        group = self._rebalancer.groups.get(params.group_id)
        if group is None:
            if member_id:
                return self._rebalancer.join_error(waiter, KafkaError.UNKNOWN_MEMBER_ID, member_id)
            if not params.protocol_type or not names:
                return self._rebalancer.join_error(
                    waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id
                )
            group = self._rebalancer.create_group(params.group_id)
            if group is None:
                log.warning(
                    "refusing group %r: %d groups in memory",
                    params.group_id,
                    len(self._rebalancer.groups),
                )
                return self._rebalancer.join_error(
                    waiter, KafkaError.COORDINATOR_NOT_AVAILABLE, member_id
                )
        if group.state is GroupState.DEAD:
            return self._rebalancer.join_error(
                waiter, KafkaError.COORDINATOR_NOT_AVAILABLE, member_id
            )

        if not member_id:
            self._join_unknown_member(group, params, waiter)
        else:
            self._join_known_member(group, params, waiter)

    def _join_unknown_member(self, group: Group, params: JoinGroupParams, waiter: Any) -> None:
        if not group.supports_protocols(params.protocol_type, [n for n, _ in params.protocols]):
            return self._rebalancer.join_error(waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, "")
        if group.size() >= self._config.group_max_size:
            return self._rebalancer.join_error(waiter, KafkaError.GROUP_MAX_SIZE_REACHED, "")
        new_id = self._new_member_id(params.group_instance_id or params.client_id)
        if params.group_instance_id is not None:
            # Kafka's static join: no MEMBER_ID_REQUIRED round; a known instance id takes
            # over its member (a restart within its session timeout: no rebalance)
            old_id = group.static_members.get(params.group_instance_id)
            if old_id is not None and old_id in group.members:
                return self._rebalancer.rejoin_static_member(group, old_id, new_id, params, waiter)
            return self._rebalancer.add_member_and_rebalance(group, new_id, params, waiter)
        if params.require_known_member_id:
            # KIP-394: hand out the id, expect the member back with it.
            group.pending_members[new_id] = self._rebalancer.call_at_ms(
                self._rebalancer.now_ms() + params.session_timeout_ms,
                self._rebalancer.on_pending_member_timer,
                group,
                new_id,
            )
            return self._rebalancer.join_error(waiter, KafkaError.MEMBER_ID_REQUIRED, new_id)
        self._rebalancer.add_member_and_rebalance(group, new_id, params, waiter)

    def _join_known_member(self, group: Group, params: JoinGroupParams, waiter: Any) -> None:
        member_id = params.member_id
        names = [n for n, _ in params.protocols]
        if member_id in group.pending_members:
            if not group.supports_protocols(params.protocol_type, names):
                return self._rebalancer.join_error(
                    waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id
                )
            timer = group.pending_members.pop(member_id)
            if timer is not None:
                timer.cancel()
            return self._rebalancer.add_member_and_rebalance(group, member_id, params, waiter)

        member = group.members.get(member_id)
        if member is None or group.state is GroupState.EMPTY:
            return self._rebalancer.join_error(waiter, KafkaError.UNKNOWN_MEMBER_ID, member_id)
        if group.is_static_member_fenced(member_id, params.group_instance_id):
            return self._rebalancer.join_error(waiter, KafkaError.FENCED_INSTANCE_ID, member_id)
        if not group.supports_protocols_excluding(member_id, params.protocol_type, names):
            return self._rebalancer.join_error(
                waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id
            )

        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._rebalancer.update_member_and_rebalance(group, member, params, waiter)
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(params.protocols):
                # The member lost its JoinGroup response: resend the current generation.
                self._rebalancer.touch(group, member)
                self._rebalancer.respond(waiter, self._rebalancer.join_result(group, member))
            else:
                self._rebalancer.update_member_and_rebalance(group, member, params, waiter)
        elif state is GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(params.protocols):
                # The leader rejoins to get fresh metadata (e.g. new topics); others on change.
                self._rebalancer.update_member_and_rebalance(group, member, params, waiter)
            else:
                self._rebalancer.touch(group, member)
                self._rebalancer.respond(waiter, self._rebalancer.join_result(group, member))
        else:  # pragma: no cover - Dead and Empty are handled above
            self._rebalancer.join_error(waiter, KafkaError.UNKNOWN_MEMBER_ID, member_id)

    def _do_sync(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: dict[str, bytes],
        waiter: Any,
    ) -> None:
        def fail(code: int) -> None:
            self._rebalancer.respond(waiter, SyncGroupResult(code))

        error = self._validate_group_id(group_id)
        if error != KafkaError.NONE:
            return fail(error)
        if self._closed:
            return fail(KafkaError.COORDINATOR_NOT_AVAILABLE)
        group = self._rebalancer.groups.get(group_id)
        if group is None:
            return fail(KafkaError.UNKNOWN_MEMBER_ID)
        if group.state is GroupState.DEAD:
            return fail(KafkaError.COORDINATOR_NOT_AVAILABLE)
        if group.is_static_member_fenced(member_id, group_instance_id):
            return fail(KafkaError.FENCED_INSTANCE_ID)
        member = group.members.get(member_id)
        if member is None:
            return fail(KafkaError.UNKNOWN_MEMBER_ID)
        if generation_id != group.generation_id:
            return fail(KafkaError.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (
            protocol_name is not None and protocol_name != group.protocol_name
        ):
            return fail(KafkaError.INCONSISTENT_GROUP_PROTOCOL)
        if group.state is GroupState.PREPARING_REBALANCE:
            return fail(KafkaError.REBALANCE_IN_PROGRESS)

        if group.state is GroupState.STABLE:
            self._rebalancer.member_synced(group, member)
            return self._rebalancer.respond(waiter, self._rebalancer.sync_result(group, member))

        # CompletingRebalance
        if group.is_leader(member_id):
            too_big = [
                mid
                for mid, blob in assignments.items()
                if len(blob) > self._config.max_assignment_bytes
            ]
            if too_big:
                log.warning(
                    "group %r: leader %s sent assignments over %d bytes for %s; rebalancing",
                    group_id,
                    member_id,
                    self._config.max_assignment_bytes,
                    too_big[:3],
                )
                self._rebalancer.prepare_rebalance(group, "oversized assignment")
                return fail(KafkaError.INVALID_REQUEST)
        if member.awaiting_sync:
            self._rebalancer.respond(
                member.sync_waiter, SyncGroupResult(KafkaError.REBALANCE_IN_PROGRESS)
            )
        member.sync_waiter = waiter
        self._rebalancer.member_synced(group, member)
        if group.is_leader(member_id):
            for m in group.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            group.transition_to(GroupState.STABLE)
            for m in group.members.values():
                if m.awaiting_sync:
                    waiter_m, m.sync_waiter = m.sync_waiter, None
                    self._rebalancer.respond(waiter_m, self._rebalancer.sync_result(group, m))
            log.info("group %r: generation %d is stable", group_id, group.generation_id)

    def _do_heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> int:
        error = self._validate_group_id(group_id)
        if error != KafkaError.NONE:
            return error
        if self._closed:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        group = self._rebalancer.groups.get(group_id)
        if group is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        if group.state is GroupState.DEAD:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        if group.is_static_member_fenced(member_id, group_instance_id):
            return KafkaError.FENCED_INSTANCE_ID
        member = group.members.get(member_id)
        if member is None or group.state is GroupState.EMPTY:
            return KafkaError.UNKNOWN_MEMBER_ID
        if generation_id != group.generation_id:
            return KafkaError.ILLEGAL_GENERATION
        self._rebalancer.touch(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return KafkaError.REBALANCE_IN_PROGRESS
        return KafkaError.NONE

    def _do_leave(
        self, group_id: str, leaving: Sequence[tuple[str, str | None]]
    ) -> LeaveGroupResult:
        error = self._validate_group_id(group_id)
        if error == KafkaError.NONE and self._closed:
            error = KafkaError.COORDINATOR_NOT_AVAILABLE
        if error != KafkaError.NONE:
            return LeaveGroupResult(error)
        group = self._rebalancer.groups.get(group_id)
        if group is None:
            return LeaveGroupResult(
                KafkaError.NONE,
                tuple(
                    LeaveMemberResult(mid, iid, KafkaError.UNKNOWN_MEMBER_ID)
                    for mid, iid in leaving
                ),
            )
        if group.state is GroupState.DEAD:
            return LeaveGroupResult(KafkaError.COORDINATOR_NOT_AVAILABLE)
        results = []
        for member_id, instance_id in leaving:
            results.append(
                LeaveMemberResult(
                    member_id, instance_id, self._leave_one(group, member_id, instance_id)
                )
            )
        return LeaveGroupResult(KafkaError.NONE, tuple(results))

    def _leave_one(self, group: Group, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            current = group.static_members.get(instance_id)
            if current is None:
                return KafkaError.UNKNOWN_MEMBER_ID
            if member_id and member_id != current:
                return KafkaError.FENCED_INSTANCE_ID
            member_id = current
        if member_id in group.pending_members:
            timer = group.pending_members.pop(member_id)
            if timer is not None:
                timer.cancel()
            self._rebalancer.try_complete_join(group)
            return KafkaError.NONE
        member = group.members.get(member_id)
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        self._rebalancer.remove_member_and_update_group(group, member, "left the group")
        return KafkaError.NONE
