"""Transaction metadata of one transactional id and its transitions (Kafka's
`TransactionMetadata` / `TransactionCoordinator` rules), pure: no I/O, no clock.

States: EMPTY (no transaction yet, or none since InitProducerId), ONGOING (partitions or
offsets added), PREPARE_COMMIT / PREPARE_ABORT (the decision is durable; markers are being
written), COMPLETE_COMMIT / COMPLETE_ABORT (markers written everywhere). Every change is
first made on a copy, stored durably by the coordinator, and only then becomes the current
metadata, so a failed write changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from enum import Enum

from dataplane.formats.kafka_errors import KafkaError

MAX_TXN_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms default (15 min)
MAX_PRODUCER_EPOCH = 32_767  # Short.MaxValue: a new producer id once reached
MAX_TXN_PARTITIONS = 10_000  # bounded metadata document


class TxnState(str, Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"

    @property
    def preparing(self) -> bool:
        return self in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)

    @property
    def open(self) -> bool:
        """A new AddPartitions/AddOffsets may start or extend a transaction."""
        return self in (
            TxnState.EMPTY,
            TxnState.ONGOING,
            TxnState.COMPLETE_COMMIT,
            TxnState.COMPLETE_ABORT,
        )


@dataclass(frozen=True)
class TxnMetadata:
    """One transactional id (immutable: transitions return a new value)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: frozenset[tuple[str, int]] = frozenset()
    groups: frozenset[str] = frozenset()  # consumer groups whose offsets are in the txn
    txn_start_ms: int = -1
    last_update_ms: int = -1

    def to_json(self) -> str:
        return json.dumps(
            {
                "pid": self.producer_id,
                "epoch": self.producer_epoch,
                "timeout_ms": self.timeout_ms,
                "state": self.state.value,
                "partitions": sorted([t, p] for t, p in self.partitions),
                "groups": sorted(self.groups),
                "start_ms": self.txn_start_ms,
                "update_ms": self.last_update_ms,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, transactional_id: str, text: str) -> TxnMetadata:
        d = json.loads(text)
        return cls(
            transactional_id=transactional_id,
            producer_id=int(d["pid"]),
            producer_epoch=int(d["epoch"]),
            timeout_ms=int(d["timeout_ms"]),
            state=TxnState(d["state"]),
            partitions=frozenset((str(t), int(p)) for t, p in d.get("partitions", [])),
            groups=frozenset(d.get("groups", [])),
            txn_start_ms=int(d.get("start_ms", -1)),
            last_update_ms=int(d.get("update_ms", -1)),
        )

    def expired(self, now_ms: int) -> bool:
        """An ONGOING transaction past its timeout (the coordinator aborts it)."""
        return (
            self.state == TxnState.ONGOING
            and self.txn_start_ms >= 0
            and now_ms - self.txn_start_ms > self.timeout_ms
        )


@dataclass(frozen=True)
class Transition:
    """The result of a request: an error, or the new metadata to store (None: no change)."""

    error: int = KafkaError.NONE
    new: TxnMetadata | None = None
    # markers must be written for this metadata (the transaction moved to a PREPARE state)
    markers: bool = False


def validate_timeout(timeout_ms: int, max_timeout_ms: int = MAX_TXN_TIMEOUT_MS) -> int:
    if timeout_ms <= 0 or timeout_ms > max_timeout_ms:
        return KafkaError.INVALID_TRANSACTION_TIMEOUT
    return KafkaError.NONE


def check_producer(meta: TxnMetadata | None, producer_id: int, producer_epoch: int) -> int:
    """Kafka's checks of (producer id, epoch) against the stored ones."""
    if meta is None or meta.producer_id != producer_id:
        return KafkaError.INVALID_PRODUCER_ID_MAPPING
    if producer_epoch != meta.producer_epoch:
        return KafkaError.PRODUCER_FENCED
    return KafkaError.NONE


def begin_abort(meta: TxnMetadata, now_ms: int, bump_epoch: bool) -> TxnMetadata:
    """ONGOING -> PREPARE_ABORT (timeout or a new producer instance: the epoch is bumped so
    the old instance is fenced by every partition the markers reach)."""
    epoch = meta.producer_epoch + 1 if bump_epoch else meta.producer_epoch
    return replace(
        meta,
        producer_epoch=min(epoch, MAX_PRODUCER_EPOCH),
        state=TxnState.PREPARE_ABORT,
        last_update_ms=now_ms,
    )


def complete(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """PREPARE_x -> COMPLETE_x once every marker is written."""
    done = (
        TxnState.COMPLETE_COMMIT
        if meta.state == TxnState.PREPARE_COMMIT
        else TxnState.COMPLETE_ABORT
    )
    return replace(
        meta,
        state=done,
        partitions=frozenset(),
        groups=frozenset(),
        txn_start_ms=-1,
        last_update_ms=now_ms,
    )


def init_producer(
    meta: TxnMetadata | None,
    transactional_id: str,
    timeout_ms: int,
    new_producer_id: int,
    now_ms: int,
    expected: tuple[int, int] = (-1, -1),
) -> Transition:
    """InitProducerId for a transactional id whose metadata is `meta` (None: unknown) and
    in no PREPARE/ONGOING state (the coordinator ends those first). A new id starts at epoch
    0; a known one gets its epoch bumped (fencing the previous instance), or a new producer
    id (`new_producer_id`) once the epoch is exhausted. `expected` (KIP-360, v3+): the
    caller's current (producer id, epoch) that must still be current."""
    error = validate_timeout(timeout_ms)
    if error:
        return Transition(error)
    if meta is None:
        return Transition(
            new=TxnMetadata(transactional_id, new_producer_id, 0, timeout_ms, last_update_ms=now_ms)
        )
    if meta.state == TxnState.ONGOING or meta.state.preparing:
        return Transition(KafkaError.CONCURRENT_TRANSACTIONS)
    exp_pid, exp_epoch = expected
    if exp_pid >= 0 and (exp_pid, exp_epoch) != (meta.producer_id, meta.producer_epoch):
        # a retry after the bump already happened: the caller's epoch is one behind
        if not (exp_pid == meta.producer_id and exp_epoch == meta.producer_epoch - 1):
            return Transition(KafkaError.PRODUCER_FENCED)
    if meta.producer_epoch + 1 >= MAX_PRODUCER_EPOCH:
        pid, epoch = new_producer_id, 0
    else:
        pid, epoch = meta.producer_id, meta.producer_epoch + 1
    return Transition(
        new=replace(
            meta,
            producer_id=pid,
            producer_epoch=epoch,
            timeout_ms=timeout_ms,
            state=TxnState.EMPTY,
            partitions=frozenset(),
            groups=frozenset(),
            txn_start_ms=-1,
            last_update_ms=now_ms,
        )
    )


def add_to_txn(
    meta: TxnMetadata | None,
    producer_id: int,
    producer_epoch: int,
    now_ms: int,
    partitions: frozenset[tuple[str, int]] = frozenset(),
    groups: frozenset[str] = frozenset(),
) -> Transition:
    """AddPartitionsToTxn / AddOffsetsToTxn: the transaction becomes (or stays) ONGOING."""
    error = check_producer(meta, producer_id, producer_epoch)
    if error:
        return Transition(error)
    assert meta is not None
    if meta.state.preparing:
        return Transition(KafkaError.CONCURRENT_TRANSACTIONS)
    if meta.state == TxnState.ONGOING and partitions <= meta.partitions and groups <= meta.groups:
        return Transition()  # nothing new (a retry)
    merged = meta.partitions | partitions
    if len(merged) > MAX_TXN_PARTITIONS:
        return Transition(KafkaError.INVALID_REQUEST)
    start = meta.txn_start_ms if meta.state == TxnState.ONGOING else now_ms
    if meta.state != TxnState.ONGOING:
        merged = frozenset(partitions)
    return Transition(
        new=replace(
            meta,
            state=TxnState.ONGOING,
            partitions=merged,
            groups=(meta.groups if meta.state == TxnState.ONGOING else frozenset()) | groups,
            txn_start_ms=start,
            last_update_ms=now_ms,
        )
    )


def end_txn(
    meta: TxnMetadata | None, producer_id: int, producer_epoch: int, commit: bool, now_ms: int
) -> Transition:
    """EndTxn: ONGOING -> PREPARE_COMMIT/ABORT (markers follow); retries of a decision
    already taken succeed; the other way round is INVALID_TXN_STATE."""
    error = check_producer(meta, producer_id, producer_epoch)
    if error:
        # an abort retried after a timeout bumped the epoch: Kafka answers the bumped
        # producer's retry as fenced too
        return Transition(error)
    assert meta is not None
    target = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    done = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    if meta.state == TxnState.ONGOING:
        return Transition(new=replace(meta, state=target, last_update_ms=now_ms), markers=True)
    if meta.state == done:
        return Transition()  # a retry: the same decision is complete
    if meta.state == target:
        return Transition(KafkaError.CONCURRENT_TRANSACTIONS)
    if meta.state == TxnState.EMPTY and not commit:
        return Transition()  # aborting nothing (Kafka's producer may send it)
    return Transition(KafkaError.INVALID_TXN_STATE)
