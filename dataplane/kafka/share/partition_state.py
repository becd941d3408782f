"""The state of one share-partition (KIP-932): which records of a topic partition a share
group has delivered, to whom, how often, and which are done. Pure: no I/O, no clock.

A share-partition tracks the in-flight window [start_offset, end_offset): the share-partition
start offset (SPSO) is the first record not yet done (acknowledged or archived), the end
(SPEO) the first record never acquired. Each in-flight record is

* AVAILABLE - may be acquired (again);
* ACQUIRED - delivered to one member, locked until its deadline (`lock_duration_ms`);
* ACKNOWLEDGED - the member accepted it (done);
* ARCHIVED - rejected, a gap, a transaction marker, or delivered `delivery_count_limit`
  times (done).

Acquiring a record counts a delivery. A lock that expires, a RELEASE, or the member leaving
makes the record AVAILABLE again, or ARCHIVED when its deliveries reached the limit. The start
offset advances over done records; only the window is kept (at most `max_in_flight` records,
Kafka's `group.share.partition.max.record.locks`).

`snapshot()` is what is stored durably (`store.py`): the start offset and the window's
records as runs of (first, last, state, delivery count), ACQUIRED stored as AVAILABLE (a
restart forgets the locks, as Kafka's persister does: those records are delivered again, the
documented at-least-once case). `restore()` reads it back.

Not thread-safe: one owner (the event loop) changes it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from dataplane.formats.kafka_errors import KafkaError

from .protocol import ACK_ACCEPT, ACK_GAP, ACK_REJECT, ACK_RELEASE

#: format version of `snapshot()`
SNAPSHOT_VERSION = 1
MAX_ACK_TYPES = 100_000  # per acknowledgement batch (one per offset at most)


class RecordState(enum.IntEnum):
    """A share-partition record's delivery state (Kafka's RecordState numbering)."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


_DONE = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)


@dataclass(slots=True)
class InFlightRecord:
    """One record of the window (a slot per offset; the window is bounded)."""

    state: RecordState
    delivery_count: int = 0
    member_id: str = ""
    lock_deadline_ms: int = 0


@dataclass(frozen=True, slots=True)
class AcquiredRange:
    """Offsets [first_offset, last_offset] acquired together, delivered `delivery_count`
    times (this delivery included)."""

    first_offset: int
    last_offset: int
    delivery_count: int


@dataclass(frozen=True, slots=True)
class LogBatch:
    """A record batch of the log as the share fetch read it: its offsets and whether it is a
    control batch (a transaction marker: never delivered, archived at once)."""

    base_offset: int
    last_offset: int
    is_control: bool = False


class AcknowledgeError(Exception):
    """An acknowledgement that cannot apply (nothing changed): its Kafka error code."""

    def __init__(self, error: KafkaError, message: str):
        super().__init__(message)
        self.error = error


class SharePartitionState:
    """The in-flight window of one share-partition (see the module docstring)."""

    def __init__(
        self,
        start_offset: int,
        *,
        delivery_count_limit: int = 5,
        max_in_flight: int = 2000,
    ) -> None:
        if start_offset < 0:
            raise ValueError(f"start offset {start_offset} < 0")
        if delivery_count_limit < 1 or max_in_flight < 1:
            raise ValueError("delivery_count_limit and max_in_flight must be >= 1")
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.delivery_count_limit = delivery_count_limit
        self.max_in_flight = max_in_flight
        self._records: dict[int, InFlightRecord] = {}

    # ------------------------------------------------------------------ reading

    def record(self, offset: int) -> InFlightRecord | None:
        """The in-flight record at `offset` (None outside the window)."""
        return self._records.get(offset)

    def in_flight(self) -> dict[str, int]:
        """Counts of the window's records by state name (for describe)."""
        counts: dict[str, int] = {}
        for rec in self._records.values():
            counts[rec.state.name] = counts.get(rec.state.name, 0) + 1
        return counts

    def next_fetch_offset(self) -> int:
        """The first offset a fetch should read from: the first AVAILABLE record of the
        window, else the window's end."""
        for offset in range(self.start_offset, self.end_offset):
            rec = self._records.get(offset)
            if rec is not None and rec.state is RecordState.AVAILABLE:
                return offset
        return self.end_offset

    def has_available(self, high_watermark: int) -> bool:
        """Whether a fetch could acquire anything below `high_watermark` now."""
        if self.end_offset < high_watermark and self._room() > 0:
            return True
        return any(r.state is RecordState.AVAILABLE for r in self._records.values())

    def _room(self) -> int:
        return self.max_in_flight - (self.end_offset - self.start_offset)

    # ------------------------------------------------------------------ changes

    def move_start(self, log_start_offset: int) -> bool:
        """Records below the log's start are gone (retention, DeleteRecords): the window
        starts there at the earliest. Whether anything changed."""
        if log_start_offset <= self.start_offset:
            return False
        for offset in range(self.start_offset, min(log_start_offset, self.end_offset)):
            self._records.pop(offset, None)
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        return True

    def acquire(
        self,
        member_id: str,
        batches: Iterable[LogBatch],
        max_records: int,
        now_ms: int,
        lock_duration_ms: int,
    ) -> list[AcquiredRange]:
        """Acquire for `member_id` up to `max_records` records of `batches` (read from the
        log, in offset order): AVAILABLE records of the window and new records past its end
        (as long as the window has room). Control batches past the end are archived."""
        acquired: list[AcquiredRange] = []
        taken = 0
        deadline = now_ms + lock_duration_ms
        for batch in batches:
            for offset in range(max(batch.base_offset, self.start_offset), batch.last_offset + 1):
                if taken >= max_records:
                    self._advance()
                    return acquired
                rec = self._records.get(offset)
                if offset >= self.end_offset:
                    if offset > self.end_offset:
                        # offsets skipped by the log (compaction): nothing to deliver; the
                        # window still bounds what is tracked (the rest comes next time)
                        if offset - self.end_offset > self._room():
                            self._archive_gap(self.end_offset, self.end_offset + self._room())
                            self._advance()
                            return acquired
                        self._archive_gap(self.end_offset, offset)
                    if self._room() <= 0:
                        self._advance()
                        return acquired
                    rec = InFlightRecord(RecordState.AVAILABLE)
                    self._records[offset] = rec
                    self.end_offset = offset + 1
                    if batch.is_control:
                        rec.state = RecordState.ARCHIVED
                        continue
                if rec is None or rec.state is not RecordState.AVAILABLE or batch.is_control:
                    continue
                rec.state = RecordState.ACQUIRED
                rec.delivery_count += 1
                rec.member_id = member_id
                rec.lock_deadline_ms = deadline
                taken += 1
                last = acquired[-1] if acquired else None
                if (
                    last is not None
                    and last.last_offset == offset - 1
                    and last.delivery_count == rec.delivery_count
                ):
                    acquired[-1] = AcquiredRange(last.first_offset, offset, last.delivery_count)
                else:
                    acquired.append(AcquiredRange(offset, offset, rec.delivery_count))
        self._advance()
        return acquired

    def _archive_gap(self, first: int, end: int) -> None:
        for offset in range(first, end):
            self._records[offset] = InFlightRecord(RecordState.ARCHIVED)
        self.end_offset = max(self.end_offset, end)

    def acknowledge(
        self, member_id: str, first_offset: int, last_offset: int, ack_types: list[int]
    ) -> int:
        """Apply one acknowledgement batch of `member_id` (see `acknowledge_batches`)."""
        return self.acknowledge_batches(member_id, [(first_offset, last_offset, ack_types)])

    def acknowledge_batches(self, member_id: str, batches: list[tuple[int, int, list[int]]]) -> int:
        """Apply acknowledgement batches (first offset, last offset, types: one for the
        whole range or one per offset) of `member_id`. All of them or nothing:
        AcknowledgeError (INVALID_REQUEST for a malformed batch, INVALID_RECORD_STATE for a
        record this member does not hold). How many records became available again."""
        changes: list[tuple[int, int]] = []
        for first_offset, last_offset, ack_types in batches:
            changes += self._plan(member_id, first_offset, last_offset, ack_types)
        released = 0
        for offset, ack in changes:
            rec = self._records[offset]
            if ack == ACK_ACCEPT:
                rec.state = RecordState.ACKNOWLEDGED
            elif ack == ACK_RELEASE:
                self._release(rec)
                released += rec.state is RecordState.AVAILABLE
            else:  # REJECT, GAP
                rec.state = RecordState.ARCHIVED
            rec.member_id, rec.lock_deadline_ms = "", 0
        self._advance()
        return released

    def _plan(
        self, member_id: str, first_offset: int, last_offset: int, ack_types: list[int]
    ) -> list[tuple[int, int]]:
        count = last_offset - first_offset + 1
        if first_offset < 0 or count < 1 or not ack_types or len(ack_types) > MAX_ACK_TYPES:
            raise AcknowledgeError(
                KafkaError.INVALID_REQUEST,
                f"bad acknowledgement batch {first_offset}..{last_offset} ({len(ack_types)} types)",
            )
        if len(ack_types) not in (1, count):
            raise AcknowledgeError(
                KafkaError.INVALID_REQUEST,
                f"{len(ack_types)} acknowledge types for {count} offsets",
            )
        if any(t not in (ACK_GAP, ACK_ACCEPT, ACK_RELEASE, ACK_REJECT) for t in ack_types):
            raise AcknowledgeError(
                KafkaError.INVALID_REQUEST, f"unknown acknowledge type in {ack_types[:10]}"
            )
        if count > self.max_in_flight + MAX_ACK_TYPES:
            raise AcknowledgeError(KafkaError.INVALID_REQUEST, f"{count} offsets in one batch")
        changes: list[tuple[int, int]] = []
        for i in range(count):
            offset = first_offset + i
            ack = ack_types[0] if len(ack_types) == 1 else ack_types[i]
            rec = self._records.get(offset)
            if rec is None or rec.state is not RecordState.ACQUIRED or rec.member_id != member_id:
                if ack == ACK_GAP and (offset < self.start_offset or (rec and rec.state in _DONE)):
                    continue
                raise AcknowledgeError(
                    KafkaError.INVALID_RECORD_STATE,
                    f"offset {offset} is not acquired by member {member_id!r}",
                )
            changes.append((offset, ack))
        return changes

    def _release(self, rec: InFlightRecord) -> None:
        done = rec.delivery_count >= self.delivery_count_limit
        rec.state = RecordState.ARCHIVED if done else RecordState.AVAILABLE
        rec.member_id, rec.lock_deadline_ms = "", 0

    def expire_locks(self, now_ms: int) -> int:
        """Release the records whose lock expired by `now_ms`; how many."""
        expired = 0
        for rec in self._records.values():
            if rec.state is RecordState.ACQUIRED and rec.lock_deadline_ms <= now_ms:
                self._release(rec)
                expired += 1
        if expired:
            self._advance()
        return expired

    def next_lock_deadline_ms(self) -> int | None:
        """The earliest lock deadline of the window, None without acquired records."""
        deadlines = [
            r.lock_deadline_ms for r in self._records.values() if r.state is RecordState.ACQUIRED
        ]
        return min(deadlines) if deadlines else None

    def release_member(self, member_id: str) -> int:
        """Release every record `member_id` holds (it left the group or closed its share
        session); how many."""
        released = 0
        for rec in self._records.values():
            if rec.state is RecordState.ACQUIRED and rec.member_id == member_id:
                self._release(rec)
                released += 1
        if released:
            self._advance()
        return released

    def _advance(self) -> None:
        while self.start_offset < self.end_offset:
            rec = self._records.get(self.start_offset)
            if rec is None or rec.state not in _DONE:
                break
            del self._records[self.start_offset]
            self.start_offset += 1

    # ------------------------------------------------------------------ durability

    def snapshot(self) -> dict:
        """The durable form (see the module docstring): JSON-ready."""
        runs: list[list[int]] = []
        for offset in range(self.start_offset, self.end_offset):
            rec = self._records.get(offset)
            if rec is None:
                continue
            state = RecordState.AVAILABLE if rec.state is RecordState.ACQUIRED else rec.state
            last = runs[-1] if runs else None
            if (
                last
                and last[1] == offset - 1
                and last[2] == state
                and last[3] == rec.delivery_count
            ):
                last[1] = offset
            else:
                runs.append([offset, offset, int(state), rec.delivery_count])
        return {"v": SNAPSHOT_VERSION, "start": self.start_offset, "runs": runs}

    @classmethod
    def restore(
        cls, doc: dict, *, delivery_count_limit: int = 5, max_in_flight: int = 2000
    ) -> SharePartitionState:
        """A state from `snapshot()`'s form; ValueError if it is not one."""
        if not isinstance(doc, dict) or doc.get("v") != SNAPSHOT_VERSION:
            raise ValueError(f"not a share-partition snapshot: {str(doc)[:200]}")
        state = cls(
            int(doc["start"]),
            delivery_count_limit=delivery_count_limit,
            max_in_flight=max_in_flight,
        )
        for first, last, rec_state, delivery_count in doc.get("runs", []):
            kind = RecordState(int(rec_state))
            if first < state.start_offset or last < first:
                raise ValueError(f"bad run {first}..{last} in a share-partition snapshot")
            for offset in range(first, last + 1):
                state._records[offset] = InFlightRecord(kind, int(delivery_count))
            state.end_offset = max(state.end_offset, last + 1)
        # offsets between runs (none are written, but be strict about the window) are new
        for offset in range(state.start_offset, state.end_offset):
            state._records.setdefault(offset, InFlightRecord(RecordState.AVAILABLE))
        state._advance()
        return state
