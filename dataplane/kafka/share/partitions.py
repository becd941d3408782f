"""The share-partitions a broker leads (Kafka's SharePartitionManager): loaded from the durable
store on first use, kept per (group, topic id, partition), and written back durably after
every change a client relies on.

A share-partition belongs to the partition's leader at one leader epoch: when the partition
moves (or its leader epoch changes after a failover) the next use drops it and loads the
state the previous leader last stored (the store refuses an older leader's writes).

Writes: an acknowledgement changes the in-memory state, then `persist()` stores a snapshot
taken after the change and only then is the client answered. Concurrent changes share a
write (the snapshot taken when a write starts holds every change made before it). A write
that fails drops the share-partition: its in-memory state may be ahead of what is stored, so
the next use reloads what is durable (acknowledgements that were not answered with success
may then be delivered again: at-least-once). Acquisitions are not written (a restart makes
acquired records available again, as in Kafka); lock expiries and releases are written in the
background.

A share-partition's stored state may be deleted by the group's coordinator (DeleteGroups,
DeleteShareGroupOffsets) or replaced by it at a higher state epoch (AlterShareGroupOffsets).
A leader holding it loaded finds out at its next write (the store refuses it: `must_exist`,
or a state epoch other than the one it loaded), or, if it is idle (nothing in flight,
everything stored) and its entry has gone from this broker's metadata image or shows
another state epoch there (`stored_value`), at its next use: it is dropped and reloaded
(the load reads through the log, so an image that merely lags costs a reload, nothing else).

Runs on the event loop (every method); blocking store calls go to the I/O pool. Not
thread-safe beyond that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from controlplane.share_state import state_epoch_of
from dataplane.formats.kafka_errors import KafkaError

from .partition_state import SharePartitionState
from .store import ShareStateError, ShareStateStore

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 0.1
MAX_SHARE_PARTITIONS = 20_000

#: (group id, topic id, partition)
ShareKey = tuple[str, str, int]


@dataclass(frozen=True)
class ShareSettings:
    """The settings a share-partition follows (from the broker config `share_groups`)."""

    record_lock_duration_ms: int = 30_000
    delivery_count_limit: int = 5
    max_record_locks: int = 2_000
    auto_offset_reset: str = "latest"


@dataclass
class SharePartition:
    """One loaded share-partition: its state, the leader epoch it was loaded at, and its
    write bookkeeping (`changes` counts changes, `stored` the changes a write holds)."""

    key: ShareKey
    leader_epoch: int
    state: SharePartitionState
    changes: int = 0
    stored: int = 0
    write_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    # its state is in the store (loaded from it, or first stored): later writes must find
    # it there (a deleted group's state is not brought back)
    in_store: bool = True
    # the state epoch of the stored state it was loaded from (its writes must find it)
    state_epoch: int = 0
    # the stored value last seen in the metadata image, and its state epoch (parsed once)
    seen_value: str | None = None
    seen_state_epoch: int = 0

    def changed(self) -> int:
        """Note a change to write; its number (`persist` waits until it is stored)."""
        self.changes += 1
        return self.changes


class SharePartitions:
    """The loaded share-partitions of this broker (see the module docstring)."""

    def __init__(
        self,
        store: ShareStateStore,
        settings_fn: Callable[[str], ShareSettings],
        run_io: Callable[..., Awaitable[Any]],
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        stored_value: Callable[[ShareKey], str | None] | None = None,
    ) -> None:
        self.store = store
        # the stored state of a share-partition as the metadata image holds it (None: none
        # stored); no check of idle share-partitions without it
        self.stored_value = stored_value
        # a group's settings: its group configs over the broker's (group_configs.py)
        self.settings_fn = settings_fn
        self.run_io = run_io
        self.clock_ms = clock_ms
        self._partitions: dict[ShareKey, SharePartition] = {}
        self._loading: dict[ShareKey, asyncio.Future] = {}
        self._released = asyncio.Event() if _running_loop() else None
        self._sweeper: asyncio.Task | None = None

    # ------------------------------------------------------------------ access

    def loaded(self) -> list[SharePartition]:
        """The share-partitions loaded here now."""
        return list(self._partitions.values())

    def released_event(self) -> asyncio.Event:
        """Set whenever records became available again (release, lock expiry): share
        fetches waiting for records wake up."""
        if self._released is None:
            self._released = asyncio.Event()
        return self._released

    def notify_released(self) -> None:
        """Wake the share fetches waiting for records (some became available again)."""
        self._notify_released()

    def get_loaded(self, key: ShareKey) -> SharePartition | None:
        """The share-partition of `key` if loaded (no load)."""
        return self._partitions.get(key)

    def _notify_released(self) -> None:
        event = self.released_event()
        event.set()
        event.clear()  # waiters already woken keep running; later waiters wait anew

    async def get(self, key: ShareKey, plog: Any) -> SharePartition:
        """The share-partition of `key` on the partition backend `plog` (this broker leads
        it), loaded (or initialised) if needed. ShareStateError if that fails."""
        self._ensure_sweeper()
        found = self._partitions.get(key)
        if found is not None and self._replaced_meanwhile(found):
            log.info("share-partition %s: its stored state was deleted or altered; reloading", key)
            found = None
        if found is not None and found.leader_epoch == plog.leader_epoch:
            found.last_used = time.monotonic()
            if found.state.move_start(plog.log_start_offset):
                found.changed()
            return found
        self._partitions.pop(key, None)
        pending = self._loading.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._load(key, plog))
            self._loading[key] = pending
            pending.add_done_callback(lambda _f: self._loading.pop(key, None))
        return await asyncio.shield(pending)

    async def _load(self, key: ShareKey, plog: Any) -> SharePartition:
        group_id, topic_id, partition = key
        epoch = plog.leader_epoch
        doc = await self.run_io(self.store.load, group_id, topic_id, partition, epoch)
        s = self.settings_fn(group_id)
        if doc is not None:
            try:
                state = SharePartitionState.restore(
                    doc,
                    delivery_count_limit=s.delivery_count_limit,
                    max_in_flight=s.max_record_locks,
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise ShareStateError(
                    KafkaError.KAFKA_STORAGE_ERROR, f"bad share state of {key}: {exc}"
                ) from exc
            state.move_start(plog.log_start_offset)
            sp = SharePartition(key, epoch, state, state_epoch=int(doc.get("state_epoch", 0)))
        else:
            start = (
                plog.log_start_offset if s.auto_offset_reset == "earliest" else plog.high_watermark
            )
            state = SharePartitionState(
                start, delivery_count_limit=s.delivery_count_limit, max_in_flight=s.max_record_locks
            )
            sp = SharePartition(key, epoch, state)
            # the start is fixed durably at once: a later load starts at the same place
            await self.run_io(
                self.store.save, group_id, topic_id, partition, epoch, state.snapshot()
            )
        if len(self._partitions) >= MAX_SHARE_PARTITIONS:
            self._evict_idle()
        self._partitions[key] = sp
        log.info(
            "share-partition %s loaded at leader epoch %d: start %d, end %d",
            key,
            epoch,
            state.start_offset,
            state.end_offset,
        )
        return sp

    def _replaced_meanwhile(self, sp: SharePartition) -> bool:
        """Idle (nothing in flight, every change stored) and its stored state gone from the
        metadata image or at another state epoch there: the group's coordinator deleted or
        altered it."""
        if self.stored_value is None or not sp.in_store:
            return False
        value = self.stored_value(sp.key)
        if value is None:
            changed = True
        else:
            if value is not sp.seen_value:  # a new stored value: parsed once
                sp.seen_value, sp.seen_state_epoch = value, state_epoch_of(value)
            changed = sp.seen_state_epoch != sp.state_epoch
        return changed and sp.stored == sp.changes and sp.state.next_lock_deadline_ms() is None

    def _evict_idle(self) -> None:
        idle = sorted(
            (p for p in self._partitions.values() if p.state.next_lock_deadline_ms() is None),
            key=lambda p: p.last_used,
        )
        for sp in idle[: max(1, len(idle) // 10)]:
            if sp.stored == sp.changes:
                self._partitions.pop(sp.key, None)

    def drop(self, key: ShareKey) -> None:
        """Forget the loaded state of `key` (the next use loads what is stored)."""
        self._partitions.pop(key, None)

    def drop_group(self, group_id: str, topic_ids: set[str] | None = None) -> int:
        """Forget every loaded share-partition of `group_id` (the group was deleted), or
        those of `topic_ids` (their offsets were); how many. Leaders elsewhere find out at
        their next write (`must_exist`)."""
        keys = [
            key
            for key in self._partitions
            if key[0] == group_id and (topic_ids is None or key[1] in topic_ids)
        ]
        for key in keys:
            self._partitions.pop(key, None)
        return len(keys)

    # ------------------------------------------------------------------ durability

    async def persist(self, sp: SharePartition, change: int) -> None:
        """Return once change number `change` of `sp` is stored. ShareStateError if the
        write fails (then `sp` is dropped: the next use reloads what is stored)."""
        async with sp.write_lock:
            if sp.stored >= change:
                return
            if self._partitions.get(sp.key) is not sp:
                raise ShareStateError(
                    KafkaError.NOT_LEADER_OR_FOLLOWER, f"share-partition {sp.key} was reloaded"
                )
            upto = sp.changes
            doc = sp.state.snapshot()
            if sp.state_epoch:
                doc["state_epoch"] = sp.state_epoch
            group_id, topic_id, partition = sp.key
            try:
                await self.run_io(
                    self.store.save,
                    group_id,
                    topic_id,
                    partition,
                    sp.leader_epoch,
                    doc,
                    sp.in_store,
                )
            except ShareStateError:
                self.drop(sp.key)
                raise
            sp.stored = upto

    def _persist_in_background(self, sp: SharePartition) -> None:
        change = sp.changed()

        async def write() -> None:
            try:
                await self.persist(sp, change)
            except ShareStateError as exc:
                log.warning("share-partition %s: state not stored: %s", sp.key, exc)

        asyncio.ensure_future(write())

    # ------------------------------------------------------------------ locks

    def expire_locks(self, sp: SharePartition) -> None:
        """Release `sp`'s records whose lock expired (written in the background)."""
        if sp.state.expire_locks(self.clock_ms()):
            self._persist_in_background(sp)
            self._notify_released()

    def release_member(self, key: ShareKey, member_id: str) -> None:
        """Release what `member_id` holds in `key` (its share session closed)."""
        sp = self._partitions.get(key)
        if sp is not None and sp.state.release_member(member_id):
            self._persist_in_background(sp)
            self._notify_released()

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.ensure_future(self._sweep())

    async def _sweep(self) -> None:
        """Expire locks every SWEEP_INTERVAL_S while share-partitions are loaded."""
        while self._partitions or self._loading:
            now = self.clock_ms()
            for sp in list(self._partitions.values()):
                deadline = sp.state.next_lock_deadline_ms()
                if deadline is not None and deadline <= now:
                    self.expire_locks(sp)
            await asyncio.sleep(SWEEP_INTERVAL_S)

    def close(self) -> None:
        """Stop the lock sweeper (the broker stops)."""
        if self._sweeper is not None:
            self._sweeper.cancel()


def _running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
