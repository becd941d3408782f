"""The classic group state machine behind `GroupCoordinator`: the groups in memory, their
members' timers and every state change (see `dataplane.kafka.groups.coordinator` for the
states and the timers).

`GroupRebalancer` runs the join phase (members added or updated, the rebalance prepared,
completed once every member rejoined or the rebalance timeout fired), the sync phase (the
leader's assignments handed to every member; members that never sync are removed), member
expiry and removal, and kills groups (deleted, unloaded). Every method is synchronous and
runs on the coordinator's event loop; requests are answered through their waiter futures.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from dataplane.config import GroupCoordinatorConfig
from dataplane.formats.kafka_errors import KafkaError

from .state import (
    Group,
    GroupState,
    JoinGroupParams,
    JoinGroupResult,
    Member,
    SyncGroupResult,
)

__all__ = ["GroupRebalancer"]

log = logging.getLogger(__name__)


class GroupRebalancer:
    """The groups of one `GroupCoordinator` and their state changes, on one event loop."""

    def __init__(self, config: GroupCoordinatorConfig) -> None:
        self.config = config
        self.groups: dict[str, Group] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind_loop(self) -> asyncio.AbstractEventLoop:
        """The running event loop, bound on first use (one loop per coordinator)."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise RuntimeError("GroupCoordinator used from two event loops")
        return loop

    def now_ms(self) -> float:
        """The event loop's clock in milliseconds."""
        assert self._loop is not None
        return self._loop.time() * 1000.0

    def call_at_ms(
        self, when_ms: float, callback: Callable[..., None], *args: Any
    ) -> asyncio.TimerHandle:
        """A timer calling `callback(*args)` at `when_ms` on the loop's clock."""
        assert self._loop is not None
        return self._loop.call_at(when_ms / 1000.0, callback, *args)

    @staticmethod
    def respond(waiter: Any, result: Any) -> None:
        """Answer a request waiting on `waiter` (nothing if it is gone or answered)."""
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    def touch(self, group: Group, member: Member) -> None:
        """Heartbeat: the member lives for another session timeout."""
        self._set_deadline(group, member, self.now_ms() + member.session_timeout_ms)

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
        member.timer = self.call_at_ms(deadline_ms, self._on_member_timer, group, member)

    def join_error(self, waiter: Any, error_code: int, member_id: str) -> None:
        """Answer a JoinGroup with an error."""
        self.respond(waiter, JoinGroupResult(error_code=error_code, member_id=member_id))

    def create_group(self, group_id: str) -> Group | None:
        """A new Empty group, evicting an idle Empty group if at ``max_groups``."""
        if len(self.groups) >= self.config.max_groups:
            victim = next(
                (
                    g
                    for g in self.groups.values()
                    if g.state is GroupState.EMPTY and not g.members and not g.pending_members
                ),
                None,
            )
            if victim is None:
                return None
            del self.groups[victim.group_id]
            self.kill(victim, KafkaError.NOT_COORDINATOR)
        group = Group(group_id=group_id)
        self.groups[group_id] = group
        return group

    def _rebalance_timeout(self, params: JoinGroupParams) -> int:
        timeout = (
            params.rebalance_timeout_ms
            if params.rebalance_timeout_ms >= 0
            else params.session_timeout_ms
        )
        return min(timeout, self.config.max_rebalance_timeout_ms)

    def add_member_and_rebalance(
        self, group: Group, member_id: str, params: JoinGroupParams, waiter: Any
    ) -> None:
        """Add a new member (fencing the old holder of its instance id) and rebalance."""
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
        self._set_deadline(group, member, self.now_ms() + self.config.new_member_join_timeout_ms)
        if group.state is GroupState.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        self._maybe_prepare_rebalance(group, f"new member {member_id} joined")
        self.try_complete_join(group)

    def update_member_and_rebalance(
        self, group: Group, member: Member, params: JoinGroupParams, waiter: Any
    ) -> None:
        """Take a known member's rejoin and rebalance."""
        member.protocols = tuple(params.protocols)
        member.session_timeout_ms = params.session_timeout_ms
        member.rebalance_timeout_ms = self._rebalance_timeout(params)
        member.client_id = params.client_id
        member.client_host = params.client_host
        if member.awaiting_join:
            # A retried JoinGroup supersedes the one still waiting.
            self.join_error(member.join_waiter, KafkaError.REBALANCE_IN_PROGRESS, member.member_id)
        member.join_waiter = waiter
        if member.is_new:
            self._set_deadline(
                group, member, self.now_ms() + self.config.new_member_join_timeout_ms
            )
        else:
            self.touch(group, member)
        self._maybe_prepare_rebalance(group, f"member {member.member_id} rejoined")
        self.try_complete_join(group)

    def rejoin_static_member(
        self, group: Group, old_id: str, new_id: str, params: JoinGroupParams, waiter: Any
    ) -> None:
        """A static member that restarted (its instance id, no member id) takes over its
        old member under `new_id`; the old id's pending requests get FENCED_INSTANCE_ID.

        Kafka's updateStaticMemberAndRebalance: in a Stable group with the same protocols
        the member gets the current generation back, no rebalance (the leader is told to
        skip the assignment, KIP-814), and its SyncGroup returns its old assignment; with
        other protocols, or in CompletingRebalance (the leader may be assigning to the old
        id), the group rebalances; in PreparingRebalance it joins the rebalance."""
        member = group.members[old_id]
        join_waiter, member.join_waiter = member.join_waiter, None
        if join_waiter is not None:
            self.join_error(join_waiter, KafkaError.FENCED_INSTANCE_ID, old_id)
        sync_waiter, member.sync_waiter = member.sync_waiter, None
        if sync_waiter is not None:
            self.respond(sync_waiter, SyncGroupResult(KafkaError.FENCED_INSTANCE_ID))
        log.info(
            "group %r: static member %r restarted: %s replaces %s",
            group.group_id,
            params.group_instance_id,
            new_id,
            old_id,
        )
        group.rename_member(old_id, new_id)
        if group.state is not GroupState.STABLE or not member.matches(params.protocols):
            return self.update_member_and_rebalance(group, member, params, waiter)
        member.session_timeout_ms = params.session_timeout_ms
        member.rebalance_timeout_ms = self._rebalance_timeout(params)
        member.client_id, member.client_host = params.client_id, params.client_host
        self.touch(group, member)
        result = self.join_result(group, member)
        self.respond(waiter, replace(result, skip_assignment=group.is_leader(new_id)))

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.can_rebalance():
            self.prepare_rebalance(group, reason)

    def prepare_rebalance(self, group: Group, reason: str) -> None:
        """Enter PreparingRebalance: members waiting for an assignment must rejoin."""
        if group.state is GroupState.COMPLETING_REBALANCE:
            # Members waiting for their assignment must rejoin instead.
            for member in group.members.values():
                member.assignment = b""
                if member.awaiting_sync:
                    self.respond(
                        member.sync_waiter, SyncGroupResult(KafkaError.REBALANCE_IN_PROGRESS)
                    )
        self._cancel_sync_timer(group)
        was_empty = group.state is GroupState.EMPTY
        group.transition_to(GroupState.PREPARING_REBALANCE)
        self._cancel_join_timer(group)
        now = self.now_ms()
        rebalance_timeout = group.rebalance_timeout_ms()
        if was_empty:
            delay = self.config.group_initial_rebalance_delay_ms
            group.initial_join = (delay, max(rebalance_timeout - delay, 0))
            group.join_timer = self.call_at_ms(now + delay, self._on_initial_join_timer, group)
        else:
            group.initial_join = None
            group.join_timer = self.call_at_ms(now + rebalance_timeout, self._on_join_timer, group)
        log.info(
            "group %r: preparing rebalance (generation %d): %s",
            group.group_id,
            group.generation_id,
            reason,
        )
        self.try_complete_join(group)  # e.g. the last member left: nobody to wait for

    def try_complete_join(self, group: Group) -> None:
        """Complete the join phase if every member rejoined."""
        if (
            group.state is GroupState.PREPARING_REBALANCE
            and group.initial_join is None
            and group.has_all_members_joined()
        ):
            self._complete_join(group)

    def _on_initial_join_timer(self, group: Group) -> None:
        group.join_timer = None
        if (
            self.groups.get(group.group_id) is not group
            or group.state is not GroupState.PREPARING_REBALANCE
        ):
            return
        assert group.initial_join is not None
        configured, remaining = self.config.group_initial_rebalance_delay_ms, group.initial_join[1]
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            delay = min(configured, remaining)
            group.initial_join = (delay, max(remaining - delay, 0))
            group.join_timer = self.call_at_ms(
                self.now_ms() + delay, self._on_initial_join_timer, group
            )
            return
        self._complete_join(group)

    def _on_join_timer(self, group: Group) -> None:
        group.join_timer = None
        if (
            self.groups.get(group.group_id) is group
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
        now = self.now_ms()
        for member in group.members.values():
            result = self.join_result(group, member)
            waiter, member.join_waiter = member.join_waiter, None
            member.is_new = False
            self._set_deadline(group, member, now + member.session_timeout_ms)
            self.respond(waiter, result)
        group.pending_sync = set(group.members)
        group.sync_timer = self.call_at_ms(
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

    def join_result(self, group: Group, member: Member) -> JoinGroupResult:
        """A member's JoinGroup answer for the current generation."""
        return JoinGroupResult(
            error_code=KafkaError.NONE,
            member_id=member.member_id,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id or "",
            members=group.current_member_metadata() if group.is_leader(member.member_id) else (),
        )

    def member_synced(self, group: Group, member: Member) -> None:
        """The member sent its SyncGroup (counts as a heartbeat)."""
        self.touch(group, member)
        group.pending_sync.discard(member.member_id)
        if not group.pending_sync:
            self._cancel_sync_timer(group)

    @staticmethod
    def sync_result(group: Group, member: Member) -> SyncGroupResult:
        """A member's SyncGroup answer with its assignment."""
        return SyncGroupResult(
            KafkaError.NONE,
            assignment=member.assignment,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
        )

    def _on_sync_timer(self, group: Group, generation_id: int) -> None:
        group.sync_timer = None
        if (
            self.groups.get(group.group_id) is not group
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
        self.prepare_rebalance(group, f"members {laggards} sent no SyncGroup in time")

    def _on_member_timer(self, group: Group, member: Member) -> None:
        member.timer = None
        if (
            self.groups.get(group.group_id) is not group
            or group.members.get(member.member_id) is not member
        ):
            return
        now = self.now_ms()
        if (member.awaiting_join and not member.is_new) or member.awaiting_sync:
            # Members waiting on the coordinator cannot heartbeat; the rebalance/sync timers bound them.
            member.deadline_ms = now + member.session_timeout_ms
        if now < member.deadline_ms:
            member.timer = self.call_at_ms(member.deadline_ms, self._on_member_timer, group, member)
            return
        log.info("group %r: member %s expired (no heartbeat)", group.group_id, member.member_id)
        self.remove_member_and_update_group(group, member, "session timeout")

    def on_pending_member_timer(self, group: Group, member_id: str) -> None:
        """A member id handed out with MEMBER_ID_REQUIRED was never used."""
        if self.groups.get(group.group_id) is not group or member_id not in group.pending_members:
            return
        del group.pending_members[member_id]
        log.info("group %r: pending member %s never rejoined", group.group_id, member_id)
        self.try_complete_join(group)

    def _fence_member(self, group: Group, member: Member, error_code: int) -> None:
        """Remove a member without touching the group state; its pending requests get ``error_code``."""
        if member.timer is not None:
            member.timer.cancel()
            member.timer = None
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is not None:
            self.join_error(waiter, error_code, member.member_id)
        sync_waiter, member.sync_waiter = member.sync_waiter, None
        if sync_waiter is not None:
            self.respond(sync_waiter, SyncGroupResult(error_code))
        group.remove(member.member_id)

    def remove_member_and_update_group(self, group: Group, member: Member, reason: str) -> None:
        """Remove a member and rebalance (or complete the join phase)."""
        self._fence_member(group, member, KafkaError.UNKNOWN_MEMBER_ID)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"member {member.member_id} removed: {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE:
            self.try_complete_join(group)

    def _cancel_join_timer(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None

    def _cancel_sync_timer(self, group: Group) -> None:
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None

    def kill(self, group: Group, error_code: int) -> None:
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
