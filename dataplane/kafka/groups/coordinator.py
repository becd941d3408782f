"""Classic consumer-group coordinator (Kafka's JoinGroup/SyncGroup protocol) on asyncio.

A port of the Java broker's classic group state machine::

    Empty --join--> PreparingRebalance --all joined / timeout--> CompletingRebalance
      ^                 ^       |                                     |  leader's SyncGroup
      |                 |       +--no members left--> Empty           v
      |                 +------- member joins/leaves/expires ----- Stable
    (DeleteGroups: Empty -> Dead, then forgotten)

Every state change is a synchronous method run on the event loop, so no locks are
needed; the public ``async`` methods only wait for the response future of their
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
OffsetCommit check the instance id.  There is no rebalance-free restart of a static
member and static members are removed on session expiry like dynamic ones.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError

from .state import (
    Group,
    GroupListing,
    GroupState,
    GroupSummary,
    JoinGroupParams,
    JoinGroupResult,
    LeaveGroupResult,
    LeaveMemberResult,
    Member,
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
        self._groups: dict[str, Group] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    # ------------------------------------------------------------------ public API

    @property
    def config(self) -> GroupCoordinatorConfig:
        """The coordinator's configuration."""
        return self._config

    async def join_group(self, params: JoinGroupParams) -> JoinGroupResult:
        """Handle a JoinGroup; returns when the member's rebalance completes (or at once on error)."""
        waiter: asyncio.Future[JoinGroupResult] = self._bind_loop().create_future()
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
        waiter: asyncio.Future[SyncGroupResult] = self._bind_loop().create_future()
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
        self._bind_loop()
        return self._do_heartbeat(group_id, generation_id, member_id, group_instance_id)

    async def leave_group(
        self, group_id: str, members: Sequence[tuple[str, str | None]]
    ) -> LeaveGroupResult:
        """Handle a LeaveGroup for ``(member_id, group_instance_id)`` pairs.

        A pair with an instance id removes the member holding that instance id
        (``member_id`` may then be empty; if given it must match, else FENCED_INSTANCE_ID).
        """
        self._bind_loop()
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
        group = self._groups.get(group_id)
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
            self._touch(group, member)
            return KafkaError.NONE
        if group.state is not GroupState.EMPTY:
            return KafkaError.UNKNOWN_MEMBER_ID
        return KafkaError.NONE

    def list_groups(self) -> list[GroupListing]:
        """All groups held in memory except Dead ones."""
        return [g.listing() for g in self._groups.values() if g.state is not GroupState.DEAD]

    def describe_group(self, group_id: str) -> GroupSummary | None:
        """The group's summary, or None if it is not in memory (or being deleted)."""
        group = self._groups.get(group_id)
        if group is None or group.state is GroupState.DEAD:
            return None
        return group.summary()

    def group_state(self, group_id: str) -> GroupState | None:
        """The group's state, or None if it is not in memory."""
        group = self._groups.get(group_id)
        return None if group is None else group.state

    def subscriptions(self, group_id: str) -> tuple[GroupState | None, set[str] | None]:
        """(state, subscribed topics) for OffsetDelete: state None if the group is not in
        memory; topics None unless it is a consumer group (see `Group.subscribed_topics`)."""
        group = self._groups.get(group_id)
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
        group = self._groups.get(group_id)
        if group is None:
            self._groups[group_id] = Group(group_id=group_id, state=GroupState.DEAD)
            return KafkaError.NONE, False
        if group.state is GroupState.DEAD:
            return KafkaError.GROUP_ID_NOT_FOUND, True
        if group.state is not GroupState.EMPTY:
            return KafkaError.NON_EMPTY_GROUP, True
        self._kill(group, KafkaError.COORDINATOR_NOT_AVAILABLE)
        return KafkaError.NONE, True

    def finish_delete(self, group_id: str) -> None:
        """Forget a group marked Dead by :meth:`begin_delete`."""
        group = self._groups.get(group_id)
        if group is not None and group.state is GroupState.DEAD:
            del self._groups[group_id]

    def unload_groups(self, predicate: Callable[[str], bool]) -> int:
        """Drop the groups whose id matches (e.g. this broker no longer coordinates them).

        Pending JoinGroup/SyncGroup responses get NOT_COORDINATOR so clients look the
        coordinator up again.  Returns the number of groups dropped.
        """
        dropped = [gid for gid in self._groups if predicate(gid)]
        for gid in dropped:
            group = self._groups.pop(gid)
            self._kill(group, KafkaError.NOT_COORDINATOR)
        return len(dropped)

    def close(self) -> None:
        """Stop: cancel every timer, answer every pending request with NOT_COORDINATOR."""
        self._closed = True
        self.unload_groups(lambda _gid: True)

    def __len__(self) -> int:
        return len(self._groups)

    # ------------------------------------------------------------------ helpers

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("GroupCoordinator used from two event loops")
        return loop

    def _now_ms(self) -> float:
        assert self._loop is not None
        return self._loop.time() * 1000.0

    def _call_at_ms(
        self, when_ms: float, callback: Callable[..., None], *args: Any
    ) -> asyncio.TimerHandle:
        assert self._loop is not None
        return self._loop.call_at(when_ms / 1000.0, callback, *args)

    def _validate_group_id(self, group_id: str | None) -> int:
        if not group_id or len(group_id) > self._config.max_group_id_length:
            return KafkaError.INVALID_GROUP_ID
        return KafkaError.NONE

    @staticmethod
    def _respond(waiter: Any, result: Any) -> None:
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    def _touch(self, group: Group, member: Member) -> None:
        """Heartbeat: the member lives for another session timeout."""
        self._set_deadline(group, member, self._now_ms() + member.session_timeout_ms)

    def _set_deadline(self, group: Group, member: Member, deadline_ms: float) -> None:
        """Move the member's expiry; its single timer is re-armed only if it would fire too late.

        A timer that fires before the deadline re-arms itself, so the common case (a
        heartbeat pushing the deadline further out) costs no timer operation.
        """
        member.deadline_ms = deadline_ms
        timer = member.timer
        if timer is not None and timer.when() * 1000.0 <= deadline_ms:
            return
        if timer is not None:
            timer.cancel()
        member.timer = self._call_at_ms(deadline_ms, self._on_member_timer, group, member)

    def _join_error(self, waiter: Any, error_code: int, member_id: str) -> None:
        self._respond(waiter, JoinGroupResult(error_code=error_code, member_id=member_id))

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

    def _create_group(self, group_id: str) -> Group | None:
        """A new Empty group, evicting an idle Empty group if at ``max_groups``."""
        if len(self._groups) >= self._config.max_groups:
            victim = next(
                (
                    g
                    for g in self._groups.values()
                    if g.state is GroupState.EMPTY and not g.members and not g.pending_members
                ),
                None,
            )
            if victim is None:
                return None
            del self._groups[victim.group_id]
            self._kill(victim, KafkaError.NOT_COORDINATOR)
        group = Group(group_id=group_id)
        self._groups[group_id] = group
        return group

    # ------------------------------------------------------------------ JoinGroup

    def _do_join(self, params: JoinGroupParams, waiter: Any) -> None:
        member_id = params.member_id
        error = self._validate_group_id(params.group_id)
        if error == KafkaError.NONE and self._closed:
            error = KafkaError.COORDINATOR_NOT_AVAILABLE
        if error == KafkaError.NONE:
            error = self._check_join_request(params)
        if error != KafkaError.NONE:
            return self._join_error(waiter, error, member_id)

        names = [name for name, _ in params.protocols]
        group = self._groups.get(params.group_id)
        if group is None:
            if member_id:
                return self._join_error(waiter, KafkaError.UNKNOWN_MEMBER_ID, member_id)
            if not params.protocol_type or not names:
                return self._join_error(waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id)
            group = self._create_group(params.group_id)
            if group is None:
                log.warning(
                    "refusing group %r: %d groups in memory", params.group_id, len(self._groups)
                )
                return self._join_error(waiter, KafkaError.COORDINATOR_NOT_AVAILABLE, member_id)
        if group.state is GroupState.DEAD:
            return self._join_error(waiter, KafkaError.COORDINATOR_NOT_AVAILABLE, member_id)

        if not member_id:
            self._join_unknown_member(group, params, waiter)
        else:
            self._join_known_member(group, params, waiter)

    def _join_unknown_member(self, group: Group, params: JoinGroupParams, waiter: Any) -> None:
        if not group.supports_protocols(params.protocol_type, [n for n, _ in params.protocols]):
            return self._join_error(waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, "")
        if group.size() >= self._config.group_max_size:
            return self._join_error(waiter, KafkaError.GROUP_MAX_SIZE_REACHED, "")
        new_id = self._new_member_id(params.group_instance_id or params.client_id)
        if params.require_known_member_id:
            # KIP-394: hand out the id, expect the member back with it.
            group.pending_members[new_id] = self._call_at_ms(
                self._now_ms() + params.session_timeout_ms,
                self._on_pending_member_timer,
                group,
                new_id,
            )
            return self._join_error(waiter, KafkaError.MEMBER_ID_REQUIRED, new_id)
        self._add_member_and_rebalance(group, new_id, params, waiter)

    def _join_known_member(self, group: Group, params: JoinGroupParams, waiter: Any) -> None:
        member_id = params.member_id
        names = [n for n, _ in params.protocols]
        if member_id in group.pending_members:
            if not group.supports_protocols(params.protocol_type, names):
                return self._join_error(waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id)
            timer = group.pending_members.pop(member_id)
            if timer is not None:
                timer.cancel()
            return self._add_member_and_rebalance(group, member_id, params, waiter)

        member = group.members.get(member_id)
        if member is None or group.state is GroupState.EMPTY:
            return self._join_error(waiter, KafkaError.UNKNOWN_MEMBER_ID, member_id)
        if group.is_static_member_fenced(member_id, params.group_instance_id):
            return self._join_error(waiter, KafkaError.FENCED_INSTANCE_ID, member_id)
        if not group.supports_protocols_excluding(member_id, params.protocol_type, names):
            return self._join_error(waiter, KafkaError.INCONSISTENT_GROUP_PROTOCOL, member_id)

        state = group.state
        if state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, params, waiter)
        elif state is GroupState.COMPLETING_REBALANCE:
            if member.matches(params.protocols):
                # The member lost its JoinGroup response: resend the current generation.
                self._touch(group, member)
                self._respond(waiter, self._join_result(group, member))
            else:
                self._update_member_and_rebalance(group, member, params, waiter)
        elif state is GroupState.STABLE:
            if group.is_leader(member_id) or not member.matches(params.protocols):
                # The leader rejoins to get fresh metadata (e.g. new topics); others on change.
                self._update_member_and_rebalance(group, member, params, waiter)
            else:
                self._touch(group, member)
                self._respond(waiter, self._join_result(group, member))
        else:  # pragma: no cover - Dead and Empty are handled above
            self._join_error(waiter, KafkaError.UNKNOWN_MEMBER_ID, member_id)

    def _rebalance_timeout(self, params: JoinGroupParams) -> int:
        timeout = (
            params.rebalance_timeout_ms
            if params.rebalance_timeout_ms >= 0
            else params.session_timeout_ms
        )
        return min(timeout, self._config.max_rebalance_timeout_ms)

    def _add_member_and_rebalance(
        self, group: Group, member_id: str, params: JoinGroupParams, waiter: Any
    ) -> None:
        if params.group_instance_id is not None:
            old_id = group.static_members.get(params.group_instance_id)
            if old_id is not None and old_id != member_id:
                old = group.members.get(old_id)
                if old is not None:
                    log.info(
                        "group %r: member %s replaces %s (group.instance.id %r)",
                        group.group_id,
                        member_id,
                        old_id,
                        params.group_instance_id,
                    )
                    self._fence_member(group, old, KafkaError.FENCED_INSTANCE_ID)
        member = Member(
            member_id=member_id,
            group_instance_id=params.group_instance_id,
            client_id=params.client_id,
            client_host=params.client_host,
            session_timeout_ms=params.session_timeout_ms,
            rebalance_timeout_ms=self._rebalance_timeout(params),
            protocol_type=params.protocol_type,
            protocols=tuple(params.protocols),
            join_waiter=waiter,
        )
        group.add(member)
        self._set_deadline(group, member, self._now_ms() + self._config.new_member_join_timeout_ms)
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        self._maybe_prepare_rebalance(group, f"new member {member_id} joined")
        self._try_complete_join(group)

    def _update_member_and_rebalance(
        self, group: Group, member: Member, params: JoinGroupParams, waiter: Any
    ) -> None:
        member.protocols = tuple(params.protocols)
        member.session_timeout_ms = params.session_timeout_ms
        member.rebalance_timeout_ms = self._rebalance_timeout(params)
        member.client_id = params.client_id
        member.client_host = params.client_host
        if member.awaiting_join:
            # A retried JoinGroup supersedes the one still waiting.
            self._join_error(member.join_waiter, KafkaError.REBALANCE_IN_PROGRESS, member.member_id)
        member.join_waiter = waiter
        if member.is_new:
            self._set_deadline(
                group, member, self._now_ms() + self._config.new_member_join_timeout_ms
            )
        else:
            self._touch(group, member)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")
        self._try_complete_join(group)

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            # Members waiting for their assignment must rejoin instead.
            for member in group.members.values():
                member.assignment = b""
                if member.awaiting_sync:
                    self._respond(
                        member.sync_waiter, SyncGroupResult(KafkaError.REBALANCE_IN_PROGRESS)
                    )
        self._cancel_sync_timer(group)
        was_empty = group.state is GroupState.EMPTY
        group.transition_to(GroupState.PREPARING_REBALANCE)
        self._cancel_join_timer(group)
        now = self._now_ms()
        rebalance_timeout = group.rebalance_timeout_ms()
        if was_empty:
            delay = self._config.group_initial_rebalance_delay_ms
            group.initial_join = (delay, max(rebalance_timeout - delay, 0))
            group.join_timer = self._call_at_ms(now + delay, self._on_initial_join_timer, group)
        else:
            group.initial_join = None
            group.join_timer = self._call_at_ms(now + rebalance_timeout, self._on_join_timer, group)
        log.info(
            "group %r: preparing rebalance (generation %d): %s",
            group.group_id,
            group.generation_id,
            reason,
        )
        self._try_complete_join(group)  # e.g. the last member left: nobody to wait for

    def _try_complete_join(self, group: Group) -> None:
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and group.initial_join is None
            and group.has_all_members_joined()
        ):
            self._complete_join(group)

    def _on_initial_join_timer(self, group: Group) -> None:
        group.join_timer = None
        if (
            self._groups.get(group.group_id) is not group
            or group.state is not GroupState.PREPARING_REBALANCE
        ):
            return
        assert group.initial_join is not None
        configured, remaining = self._config.group_initial_rebalance_delay_ms, group.initial_join[1]
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            delay = min(configured, remaining)
            group.initial_join = (delay, max(remaining - delay, 0))
            group.join_timer = self._call_at_ms(
                self._now_ms() + delay, self._on_initial_join_timer, group
            )
            return
        self._complete_join(group)

    def _on_join_timer(self, group: Group) -> None:
        group.join_timer = None
        if (
            self._groups.get(group.group_id) is group
            and group.state is GroupState.PREPARING_REBALANCE
        ):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """End of the join phase: drop members that did not rejoin, start the next generation."""
        self._cancel_join_timer(group)
        group.initial_join = None
        group.new_member_added = False
        for member in [m for m in group.members.values() if not m.awaiting_join]:
            log.info(
                "group %r: removing member %s: did not rejoin in time",
                group.group_id,
                member.member_id,
            )
            self._fence_member(group, member, KafkaError.UNKNOWN_MEMBER_ID)
        group.elect_joined_leader()
        group.generation_id += 1
        if not group.members:
            group.protocol_name = None
            group.transition_to(GroupState.EMPTY)
            log.info("group %r: generation %d is empty", group.group_id, group.generation_id)
            return
        group.protocol_name = group.select_protocol()
        group.transition_to(GroupState.COMPLETING_REBALANCE)
        now = self._now_ms()
        for member in group.members.values():
            result = self._join_result(group, member)
            waiter, member.join_waiter = member.join_waiter, None
            member.is_new = False
            self._set_deadline(group, member, now + member.session_timeout_ms)
            self._respond(waiter, result)
        group.pending_sync = set(group.members)
        group.sync_timer = self._call_at_ms(
            now + group.rebalance_timeout_ms(), self._on_sync_timer, group, group.generation_id
        )
        log.info(
            "group %r: generation %d with %d members, protocol %s, leader %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
            group.leader_id,
        )

    def _join_result(self, group: Group, member: Member) -> JoinGroupResult:
        return JoinGroupResult(
            error_code=KafkaError.NONE,
            member_id=member.member_id,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id or "",
            members=group.current_member_metadata() if group.is_leader(member.member_id) else (),
        )

    # ------------------------------------------------------------------ SyncGroup

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
            self._respond(waiter, SyncGroupResult(code))

        error = self._validate_group_id(group_id)
        if error != KafkaError.NONE:
            return fail(error)
        if self._closed:
            return fail(KafkaError.COORDINATOR_NOT_AVAILABLE)
        group = self._groups.get(group_id)
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
            self._member_synced(group, member)
            return self._respond(waiter, self._sync_result(group, member))

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
                self._prepare_rebalance(group, "oversized assignment")
                return fail(KafkaError.INVALID_REQUEST)
        if member.awaiting_sync:
            self._respond(member.sync_waiter, SyncGroupResult(KafkaError.REBALANCE_IN_PROGRESS))
        member.sync_waiter = waiter
        self._member_synced(group, member)
        if group.is_leader(member_id):
            for m in group.members.values():
                m.assignment = bytes(assignments.get(m.member_id, b""))
            group.transition_to(GroupState.STABLE)
            for m in group.members.values():
                if m.awaiting_sync:
                    waiter_m, m.sync_waiter = m.sync_waiter, None
                    self._respond(waiter_m, self._sync_result(group, m))
            log.info("group %r: generation %d is stable", group_id, group.generation_id)

    def _member_synced(self, group: Group, member: Member) -> None:
        self._touch(group, member)
        group.pending_sync.discard(member.member_id)
        if not group.pending_sync:
            self._cancel_sync_timer(group)

    @staticmethod
    def _sync_result(group: Group, member: Member) -> SyncGroupResult:
        return SyncGroupResult(
            KafkaError.NONE,
            assignment=member.assignment,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
        )

    def _on_sync_timer(self, group: Group, generation_id: int) -> None:
        group.sync_timer = None
        if (
            self._groups.get(group.group_id) is not group
            or group.generation_id != generation_id
            or group.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
            or not group.pending_sync
        ):
            return
        laggards = sorted(group.pending_sync)
        for member_id in laggards:
            member = group.members.get(member_id)
            if member is not None:
                self._fence_member(group, member, KafkaError.UNKNOWN_MEMBER_ID)
        group.pending_sync.clear()
        self._prepare_rebalance(group, f"members {laggards} sent no SyncGroup in time")

    # ------------------------------------------------------------------ Heartbeat

    def _do_heartbeat(
        self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
    ) -> int:
        error = self._validate_group_id(group_id)
        if error != KafkaError.NONE:
            return error
        if self._closed:
            return KafkaError.COORDINATOR_NOT_AVAILABLE
        group = self._groups.get(group_id)
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
        self._touch(group, member)
        if group.state is GroupState.PREPARING_REBALANCE:
            return KafkaError.REBALANCE_IN_PROGRESS
        return KafkaError.NONE

    # ------------------------------------------------------------------ LeaveGroup

    def _do_leave(
        self, group_id: str, leaving: Sequence[tuple[str, str | None]]
    ) -> LeaveGroupResult:
        error = self._validate_group_id(group_id)
        if error == KafkaError.NONE and self._closed:
            error = KafkaError.COORDINATOR_NOT_AVAILABLE
        if error != KafkaError.NONE:
            return LeaveGroupResult(error)
        group = self._groups.get(group_id)
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
            self._try_complete_join(group)
            return KafkaError.NONE
        member = group.members.get(member_id)
        if member is None:
            return KafkaError.UNKNOWN_MEMBER_ID
        self._remove_member_and_update_group(group, member, "left the group")
        return KafkaError.NONE

    # ------------------------------------------------------------------ expiry & removal

    def _on_member_timer(self, group: Group, member: Member) -> None:
        member.timer = None
        if (
            self._groups.get(group.group_id) is not group
            or group.members.get(member.member_id) is not member
        ):
            return
        now = self._now_ms()
        if (member.awaiting_join and not member.is_new) or member.awaiting_sync:
            # Members waiting on the coordinator cannot heartbeat; the rebalance/sync timers bound them.
            member.deadline_ms = now + member.session_timeout_ms
        if now < member.deadline_ms:
            member.timer = self._call_at_ms(
                member.deadline_ms, self._on_member_timer, group, member
            )
            return
        log.info("group %r: member %s expired (no heartbeat)", group.group_id, member.member_id)
        self._remove_member_and_update_group(group, member, "session timeout")

    def _on_pending_member_timer(self, group: Group, member_id: str) -> None:
        if self._groups.get(group.group_id) is not group or member_id not in group.pending_members:
            return
        del group.pending_members[member_id]
        log.info("group %r: pending member %s never rejoined", group.group_id, member_id)
        self._try_complete_join(group)

    def _fence_member(self, group: Group, member: Member, error_code: int) -> None:
        """Remove a member without touching the group state; its pending requests get ``error_code``."""
        if member.timer is not None:
            member.timer.cancel()
            member.timer = None
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is not None:
            self._join_error(waiter, error_code, member.member_id)
        sync_waiter, member.sync_waiter = member.sync_waiter, None
        if sync_waiter is not None:
            self._respond(sync_waiter, SyncGroupResult(error_code))
        group.remove(member.member_id)

    def _remove_member_and_update_group(self, group: Group, member: Member, reason: str) -> None:
        self._fence_member(group, member, KafkaError.UNKNOWN_MEMBER_ID)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"member {member.member_id} removed: {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _cancel_join_timer(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None

    def _cancel_sync_timer(self, group: Group) -> None:
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    def _kill(self, group: Group, error_code: int) -> None:
        """Mark Dead, cancel every timer, answer every pending request with ``error_code``."""
        self._cancel_join_timer(group)
        self._cancel_sync_timer(group)
        for timer in group.pending_members.values():
            if timer is not None:
                timer.cancel()
        group.pending_members.clear()
        for member in list(group.members.values()):
            self._fence_member(group, member, error_code)
        group.transition_to(GroupState.DEAD)
