"""Committed consumer-group offsets: the store protocol and Kafka's commit/fetch rules.

:class:`OffsetStore` is the storage contract.  :class:`InMemoryOffsetStore` serves
tests; the durable implementation (on the controller's replicated KV) is written
against the protocol elsewhere.  :class:`OffsetManager` applies Kafka's rules on top
of a store and a :class:`~dataplane.kafka.groups.coordinator.GroupCoordinator`:
who may commit (generation / member checks), metadata size limit, ``-1`` for
partitions without a commit, and DeleteGroups (only groups without members).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from dataplane.formats.kafka_errors import KafkaError

from .coordinator import GroupCoordinator
from .state import GroupState

log = logging.getLogger(__name__)

TopicPartition = tuple[str, int]

#: Offset reported for a partition without a committed offset.
NO_OFFSET = -1
#: Leader epoch reported when none is known.
NO_LEADER_EPOCH = -1


@dataclass(frozen=True)
class CommittedOffset:
    """One committed offset.

    ``leader_epoch`` is -1 when the client did not send one; ``metadata`` is the
    client's free-form string; ``commit_timestamp_ms`` is wall-clock time.
    """

    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str | None = None
    commit_timestamp_ms: int = -1


#: What OffsetFetch reports for a partition without a commit.
MISSING_OFFSET = CommittedOffset(NO_OFFSET, NO_LEADER_EPOCH, "", -1)


class OffsetStoreError(Exception):
    """Raised by a store to choose the Kafka error the client gets.

    Other exceptions are mapped too: ``TimeoutError``/``ConnectionError``/``OSError``
    to COORDINATOR_NOT_AVAILABLE (retriable), anything else to UNKNOWN_SERVER_ERROR.
    """

    def __init__(
        self, message: str, error_code: int = KafkaError.COORDINATOR_NOT_AVAILABLE
    ) -> None:
        super().__init__(message)
        self.error_code = error_code


@runtime_checkable
class OffsetStore(Protocol):
    """Durable committed offsets, keyed by group id then (topic, partition).

    Implementations must make ``commit`` atomic per call (all partitions or none).
    :class:`OffsetManager` never runs two ``commit``/``delete_group`` calls of the
    same group at once (so a read-modify-write of a per-group document is safe);
    calls for different groups, and ``fetch``/``list_groups``, may run concurrently.
    """

    async def commit(self, group_id: str, offsets: dict[TopicPartition, CommittedOffset]) -> None:
        """Store ``offsets`` for ``group_id`` (overwrites earlier commits of those partitions)."""
        ...

    async def fetch(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset]:
        """The committed offsets among ``partitions`` (all of the group's if None); missing ones are absent."""
        ...

    async def delete_group(self, group_id: str) -> None:
        """Forget every committed offset of ``group_id`` (no error if there are none)."""
        ...

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> None:
        """Forget the committed offsets of ``partitions`` (atomic; absent ones are fine)."""
        ...

    async def list_groups(self) -> list[str]:
        """Ids of the groups that have at least one committed offset."""
        ...


class InMemoryOffsetStore:
    """:class:`OffsetStore` in a dict (tests, single-process tools). Not durable."""

    def __init__(self) -> None:
        self._groups: dict[str, dict[TopicPartition, CommittedOffset]] = {}
        #: number of commit() calls (tests check that rejected commits never reach the store).
        self.commit_calls = 0

    async def commit(self, group_id: str, offsets: dict[TopicPartition, CommittedOffset]) -> None:
        """Store ``offsets`` for ``group_id``."""
        self.commit_calls += 1
        if offsets:
            self._groups.setdefault(group_id, {}).update(offsets)

    async def fetch(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> dict[TopicPartition, CommittedOffset]:
        """Committed offsets of ``group_id`` among ``partitions`` (all if None)."""
        stored = self._groups.get(group_id, {})
        if partitions is None:
            return dict(stored)
        return {tp: stored[tp] for tp in partitions if tp in stored}

    async def delete_group(self, group_id: str) -> None:
        """Forget the group's offsets."""
        self._groups.pop(group_id, None)

    async def delete_offsets(self, group_id: str, partitions: list[TopicPartition]) -> None:
        """Forget the offsets of ``partitions``."""
        stored = self._groups.get(group_id, {})
        for tp in partitions:
            stored.pop(tp, None)

    async def list_groups(self) -> list[str]:
        """Groups with at least one committed offset."""
        return [gid for gid, offsets in self._groups.items() if offsets]

    def snapshot(self) -> dict[str, dict[TopicPartition, CommittedOffset]]:
        """A deep copy of everything stored (tests)."""
        return copy.deepcopy(self._groups)


def store_error_code(exc: Exception) -> int:
    """Kafka error code for a failed store call (see :class:`OffsetStoreError`)."""
    if isinstance(exc, OffsetStoreError):
        return exc.error_code
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError, OSError)):
        return KafkaError.COORDINATOR_NOT_AVAILABLE
    return KafkaError.UNKNOWN_SERVER_ERROR


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


class GroupLocks:
    """One asyncio lock per group id, dropped when nobody holds or waits for it."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, group_id: str) -> AsyncIterator[None]:
        """Hold the group's lock for the duration of the ``async with`` block."""
        lock, users = self._locks.get(group_id, (asyncio.Lock(), 0))
        self._locks[group_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[group_id]
            if users <= 1:
                del self._locks[group_id]
            else:
                self._locks[group_id] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


class OffsetManager:
    """Kafka's OffsetCommit / OffsetFetch / DeleteGroups rules over a store and a coordinator.

    Args:
        coordinator: decides who may commit and whether a group has members.
        store: where offsets live.
        offset_metadata_max_bytes: longer commit metadata gets OFFSET_METADATA_TOO_LARGE
            (Kafka's ``offset.metadata.max.bytes``, counted in characters as Kafka does).
        wall_clock_ms: commit timestamps (injectable for tests).
    """

    def __init__(
        self,
        coordinator: GroupCoordinator,
        store: OffsetStore,
        *,
        offset_metadata_max_bytes: int = 4096,
        wall_clock_ms: Callable[[], int] = _wall_clock_ms,
    ) -> None:
        self._coordinator = coordinator
        self._store = store
        self._max_metadata = offset_metadata_max_bytes
        self._clock = wall_clock_ms
        self._locks = GroupLocks()

    @property
    def store(self) -> OffsetStore:
        """The underlying store."""
        return self._store

    async def commit_offsets(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        offsets: Mapping[TopicPartition, CommittedOffset],
    ) -> dict[TopicPartition, int]:
        """Validate and store a commit; returns an error code per partition.

        ``commit_timestamp_ms`` < 0 in an entry means "now"; ``metadata`` None is
        stored as "" (as Kafka does).  Partitions with oversized metadata are
        rejected individually; the others are committed in one store call.  Commits
        of one group reach the store one at a time (see :class:`OffsetStore`).
        """
        error = self._coordinator.validate_offset_commit(
            group_id, generation_id, member_id, group_instance_id
        )
        if error != KafkaError.NONE:
            return {tp: error for tp in offsets}
        now = self._clock()
        results: dict[TopicPartition, int] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        for tp, entry in offsets.items():
            metadata = entry.metadata if entry.metadata is not None else ""
            if len(metadata) > self._max_metadata:
                results[tp] = KafkaError.OFFSET_METADATA_TOO_LARGE
                continue
            accepted[tp] = CommittedOffset(
                offset=entry.offset,
                leader_epoch=entry.leader_epoch,
                metadata=metadata,
                commit_timestamp_ms=entry.commit_timestamp_ms
                if entry.commit_timestamp_ms >= 0
                else now,
            )
            results[tp] = KafkaError.NONE
        if accepted:
            try:
                async with self._locks.hold(group_id):
                    await self._store.commit(group_id, accepted)
            except Exception as exc:  # noqa: BLE001 - mapped to a Kafka error, logged
                code = store_error_code(exc)
                log.warning("offset commit of group %r failed: %r -> error %d", group_id, exc, code)
                for tp in accepted:
                    results[tp] = code
        return results

    async def fetch_offsets(
        self, group_id: str, partitions: list[TopicPartition] | None
    ) -> tuple[int, dict[TopicPartition, CommittedOffset]]:
        """``(error_code, offsets)``; requested partitions without a commit get offset -1.

        With ``partitions`` None, every committed partition of the group is returned.
        """
        try:
            found = await self._store.fetch(
                group_id, None if partitions is None else list(partitions)
            )
        except Exception as exc:  # noqa: BLE001 - mapped to a Kafka error, logged
            code = store_error_code(exc)
            log.warning("offset fetch of group %r failed: %r -> error %d", group_id, exc, code)
            return code, {}
        if partitions is None:
            return KafkaError.NONE, {tp: _normalized(o) for tp, o in found.items()}
        return KafkaError.NONE, {
            tp: _normalized(found[tp]) if tp in found else MISSING_OFFSET for tp in partitions
        }

    async def has_offsets(self, group_id: str) -> bool:
        """The group has at least one committed offset (store errors propagate)."""
        return bool(await self._store.fetch(group_id, None))

    async def delete_offsets(
        self, group_id: str, partitions: list[TopicPartition]
    ) -> tuple[int, dict[TopicPartition, int]]:
        """OffsetDelete (Kafka's handleDeleteOffsets): ``(group error, error per partition)``.

        An Empty group (or one known only by its offsets) loses the requested offsets; a
        consumer group with members keeps those of topics it subscribes to
        (GROUP_SUBSCRIBED_TO_TOPIC) and loses the others; a group of another protocol type
        with members is NON_EMPTY_GROUP; an unknown group is GROUP_ID_NOT_FOUND.
        """
        state, subscribed = self._coordinator.subscriptions(group_id)
        try:
            async with self._locks.hold(group_id):
                if state is None or state is GroupState.DEAD:
                    if state is GroupState.DEAD or not await self.has_offsets(group_id):
                        return KafkaError.GROUP_ID_NOT_FOUND, {}
                elif state is not GroupState.EMPTY and subscribed is None:
                    return KafkaError.NON_EMPTY_GROUP, {}
                results = {
                    tp: KafkaError.GROUP_SUBSCRIBED_TO_TOPIC
                    if state not in (None, GroupState.EMPTY) and tp[0] in (subscribed or ())
                    else KafkaError.NONE
                    for tp in partitions
                }
                deletable = [tp for tp, e in results.items() if e == KafkaError.NONE]
                if deletable:
                    await self._store.delete_offsets(group_id, deletable)
                return KafkaError.NONE, results
        except Exception as exc:  # noqa: BLE001 - mapped to a Kafka error, logged
            code = store_error_code(exc)
            log.warning("deleting offsets of group %r failed: %r -> error %d", group_id, exc, code)
            return code, {}

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, int]:
        """DeleteGroups: error code per (distinct) group id, in request order.

        Only groups without members can be deleted (NON_EMPTY_GROUP otherwise); a
        group neither in the coordinator nor with committed offsets is
        GROUP_ID_NOT_FOUND.  The group is Dead (joins refused) while its offsets
        are being deleted.
        """
        results: dict[str, int] = {}
        for group_id in group_ids:
            if group_id in results:
                continue
            results[group_id] = await self._delete_one(group_id)
        return results

    async def _delete_one(self, group_id: str) -> int:
        error, known = self._coordinator.begin_delete(group_id)
        if error != KafkaError.NONE:
            return error
        try:
            async with self._locks.hold(group_id):
                if not known and not await self.has_offsets(group_id):
                    return KafkaError.GROUP_ID_NOT_FOUND
                await self._store.delete_group(group_id)
            return KafkaError.NONE
        except Exception as exc:  # noqa: BLE001 - mapped to a Kafka error, logged
            code = store_error_code(exc)
            log.warning("deleting group %r failed: %r -> error %d", group_id, exc, code)
            return code
        finally:
            self._coordinator.finish_delete(group_id)


def _normalized(offset: CommittedOffset) -> CommittedOffset:
    """Null metadata reads back as "" (what Kafka stores for it)."""
    if offset.metadata is None:
        return CommittedOffset(offset.offset, offset.leader_epoch, "", offset.commit_timestamp_ms)
    return offset
