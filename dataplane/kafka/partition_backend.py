"""The seam between the Kafka APIs and storage: one partition as the APIs see it.

`kafka/data_apis.py` decodes a request, asks the `PartitionResolver` for each partition's
`PartitionBackend`, calls it, and encodes the answer; every partition rule (batch validation,
idempotent-producer checks, offset assignment, epochs, what a fetch may read) lives in the
backend. `partition_log.PartitionLog` (this broker leads the partition; its stream is in the
engine) is the first implementation; `erasure_partition.ErasurePartition` (a leaderless
erasure-coded partition any broker serves) the second; the zone router's `ProxyPartition`
(zonerouter/proxy_partition.py: a partition led in another AZ, served to this AZ's clients) the third.
`ClientRouting` decides, by the client's AZ, which broker a client is told leads a partition
and which backend serves it here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from controlplane import topic_configs
from controlplane.erasure_placement import serving_node
from controlplane.records import PartitionKind
from dataplane.config import MAX_PARTITION_PRODUCE_BYTES
from dataplane.formats.kafka_errors import InvalidRecordBatchError, KafkaError
from dataplane.formats.record_batch import (
    RecordBatchHeader,
    RecordChunks,
    null_key_records,
    parse_batches,
)
from dataplane.s3stream.uploader import StorageError

log = logging.getLogger(__name__)

# the zone router's main: `link(position, length)` gives, for the batch at
# `records[position:position+length]`, the function that builds its Link Record from the
# base offset the batch gets
LinkBuilder = Callable[[int, int], Callable[[int], bytes]]


@dataclass
class AppendOutcome:
    """What an append did: an error, or the base offset and the futures that complete
    when the appended batches are durable (none for a pure duplicate)."""

    error: KafkaError
    base_offset: int = -1
    # complete when the appended batches are durable; a failed one raises what
    # `kafka_error_of` maps to the partition's error. Their results are not used (a
    # partition log's give a base offset), unless `forwarded`
    durable: list[Future] = field(default_factory=list)
    # set when the base offset is known only once the append is durable (an erasure-coded
    # partition: the offset its write won); its result is the base offset
    base_offset_future: Future | None = None
    # the append was done elsewhere (a zone-router proxy forwards it to the partition's
    # main): each `durable` future resolves to that append's `AppendOutcome`, whose error
    # and base offset are the answer
    forwarded: bool = False
    # KIP-467: (batch index, message) of each record that made the partition's records
    # refused (with INVALID_RECORD): the client fails exactly those records
    record_errors: list[tuple[int, str]] = field(default_factory=list)
    error_message: str | None = None
    # the time the batches were stamped with on a LogAppendTime topic (the produce
    # response's log_append_time_ms), else -1
    log_append_time_ms: int = -1


class OffsetOutOfRangeError(ValueError):
    """An offset past the partition's high watermark (OFFSET_OUT_OF_RANGE)."""


def parse_produced_batches(
    records: bytes | memoryview | None, configs: Mapping[str, str], *, copy: bool = True
) -> list[RecordBatchHeader] | AppendOutcome:
    """The batches of one partition's records in a produce request, or the outcome that
    refuses them all (Kafka's LogValidator: nothing of the request is kept): none or not
    parseable: CORRUPT_MESSAGE; more than MAX_PARTITION_PRODUCE_BYTES, or a batch (with
    its log overhead) above the topic's max.message.bytes (from its `configs`):
    MESSAGE_TOO_LARGE; a bad batch: its error; a record with a null key on a compacted
    topic: INVALID_RECORD with its `record_errors` (KIP-467). Every backend's `append` starts here: the
    size limits are checked only here. `copy=False`: each batch's `data` is a view of
    `records` (for a caller that copies the batch anyway, e.g. to patch its offsets)."""
    if not records:
        return AppendOutcome(KafkaError.CORRUPT_MESSAGE)
    if len(records) > MAX_PARTITION_PRODUCE_BYTES:
        return AppendOutcome(KafkaError.MESSAGE_TOO_LARGE)
    max_batch_bytes = topic_configs.effective_int(configs, "max.message.bytes")
    try:
        # the CRC check must stay: a partition log carries each checked CRC into the WAL
        # record's checksum (`batch_crc32c`), so an unchecked bad batch would corrupt the WAL
        batches = parse_batches(records, max_batch_bytes=max_batch_bytes, copy=copy)
    except InvalidRecordBatchError as exc:
        return AppendOutcome(KafkaError(exc.error_code))
    if not batches:
        return AppendOutcome(KafkaError.CORRUPT_MESSAGE)
    if "compact" in topic_configs.effective(configs, "cleanup.policy"):
        return _refuse_null_keys(batches) or batches
    return batches


NULL_KEY_MESSAGE = "Compacted topic cannot accept message without key"


def _refuse_null_keys(batches: list[RecordBatchHeader]) -> AppendOutcome | None:
    """INVALID_RECORD naming each null-key record (Kafka's LogValidator on a compacted
    topic: the partition's records are refused, the client fails exactly those records,
    each with its index in its batch), or None when every record has a key."""
    record_errors: list[tuple[int, str]] = []
    try:
        for b in batches:
            record_errors += [(i, NULL_KEY_MESSAGE) for i in null_key_records(b)]
    except InvalidRecordBatchError as exc:
        return AppendOutcome(KafkaError(exc.error_code), error_message=str(exc))
    if not record_errors:
        return None
    return AppendOutcome(
        KafkaError.INVALID_RECORD,
        record_errors=record_errors,
        error_message=f"{NULL_KEY_MESSAGE} ({len(record_errors)} records)",
    )


class BackendError(Exception):
    """A backend could not answer (e.g. a zone-router proxy whose main refused or did not
    answer a forwarded request): the Kafka error the client gets for the partition."""

    def __init__(self, error: KafkaError, message: str):
        super().__init__(message)
        self.error = error


class RoomWaiter(Protocol):
    """Where room for appends comes back (the engine's `wal.RoomSignal`)."""

    def wait(self, after_generation: int, timeout_s: float) -> bool: ...

    async def wait_async(self, after_generation: int, timeout_s: float) -> bool: ...


class BackendBackpressure(BackendError):
    """No room to append now (the broker's WAL is full, or its queue); nothing of the
    request was appended. The caller waits on `room` for a generation after `generation`,
    at most `max_wait_s`, and appends again; past that the client gets REQUEST_TIMED_OUT
    (retriable: it backs off and retries, without a metadata refresh)."""

    def __init__(self, message: str, room: RoomWaiter, generation: int, max_wait_s: float):
        super().__init__(KafkaError.REQUEST_TIMED_OUT, message)
        self.room = room
        self.generation = generation
        self.max_wait_s = max_wait_s


def kafka_error_of(exc: BaseException) -> KafkaError:
    """The Kafka error a partition answers for an exception a backend raised (see
    `PartitionBackend`): `BackendBackpressure` REQUEST_TIMED_OUT (retriable, no metadata
    refresh), another `BackendError` its own error, `OffsetOutOfRangeError`
    OFFSET_OUT_OF_RANGE, `TimeoutError` REQUEST_TIMED_OUT, and `StorageError` (the
    partition's stream closed, failed, or this node fenced) or anything else
    NOT_LEADER_OR_FOLLOWER (the client refreshes its metadata and finds the leader)."""
    if isinstance(exc, BackendError):
        return exc.error
    if isinstance(exc, OffsetOutOfRangeError):
        return KafkaError.OFFSET_OUT_OF_RANGE
    if isinstance(exc, TimeoutError):
        return KafkaError.REQUEST_TIMED_OUT
    if isinstance(exc, StorageError):
        return KafkaError.NOT_LEADER_OR_FOLLOWER
    return KafkaError.NOT_LEADER_OR_FOLLOWER


async def append_when_room(
    append: Callable[[], AppendOutcome],
    timeout_s: float,
    refused: BackendBackpressure | None = None,
) -> AppendOutcome:
    """`append()` on the event loop, waiting without blocking the loop while the backend
    has no room (`BackendBackpressure`), for at most `timeout_s` and the backend's own
    bound; then the backpressure's retriable error. A `BackendError` becomes its error.
    `refused`: a first try of `append()` already had no room (the wait comes first)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            if refused is not None:
                raise refused
            return append()
        except BackendBackpressure as exc:
            refused = None
            deadline = min(deadline, loop.time() + exc.max_wait_s)
            remaining = deadline - loop.time()
            if remaining <= 0 or not await exc.room.wait_async(exc.generation, remaining):
                log.warning("append refused after waiting for room: %s", exc)
                return AppendOutcome(exc.error)
        except BackendError as exc:
            return AppendOutcome(exc.error)


@dataclass(frozen=True)
class OffsetAndTimestamp:
    offset: int
    timestamp_ms: int


class PartitionBackend(Protocol):
    """One partition served by this broker.

    Errors: a method may raise `BackendBackpressure` (no room now: REQUEST_TIMED_OUT once
    the wait is over), another `BackendError` (its `error`), `OffsetOutOfRangeError`
    (OFFSET_OUT_OF_RANGE), or `StorageError` from a closed, failed or fenced stream
    (NOT_LEADER_OR_FOLLOWER): `kafka_error_of` is that mapping, used by the Kafka APIs for
    every call and for a failed durable future. Nothing else needs to be asked of a
    backend than what is declared here (no `getattr` with a default, no `isinstance` on
    what it returns).

    Thread-safety: every method may be called from any thread; implementations serialize
    what must be atomic (a sequence check and the append it guards).
    """

    topic_id: str
    topic: str
    partition: int

    @property
    def lags_leader(self) -> bool:
        """True when the high watermark may lag the real partition's (a zone-router proxy
        serves what its main committed): a fetch past it waits, as on a Kafka follower,
        instead of being answered OFFSET_OUT_OF_RANGE."""
        ...

    @property
    def counts_own_wal_bytes(self) -> bool:
        """True when the backend accounts the WAL or channel bytes its appends take itself
        (the caller must not count them again)."""
        ...

    @property
    def forwards_to_main(self) -> bool:
        """True when admin requests on the partition (DeleteRecords) are forwarded by the
        backend to the partition's main (a zone-router proxy), so the broker a client was
        routed to answers them although it does not lead the partition."""
        ...

    @property
    def identity(self) -> object:
        """The underlying partition: two views of one partition (e.g. the zone router's
        wrappers of one `PartitionLog`) have the same identity. What the fetch long-poll
        keys its listeners by (backends need not define __eq__/__hash__)."""
        ...

    @property
    def stream_id(self) -> int:
        """The partition's stream in this broker's storage engine (WAL and objects), -1
        when it has none here (an erasure-coded partition, a proxy)."""
        ...

    @property
    def leader_epoch(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    def append(
        self, records: bytes | memoryview | None, link: LinkBuilder | None = None
    ) -> AppendOutcome:
        """Validate (`parse_produced_batches`) and append a produce request's record
        batches (offsets assigned here). `records` is a read-only view of the request's
        frame (the produce decoder's): a backend that keeps it beyond the call copies it. `link` (the zone router's main): the WAL keeps a
        Link Record to the data in a RouterChannel instead of the data; a backend with no
        local stream refuses it (`BackendError`, NOT_LEADER_OR_FOLLOWER). Never blocks
        (called on the event loop). Raises
        `BackendBackpressure` when there is no room now (nothing appended: wait, then call
        again, see `append_when_room`), `BackendError` for another refusal with its Kafka
        error, `StorageError` when the partition's stream takes no appends (closed, failed,
        fenced). The outcome's `durable` futures: see `AppendOutcome`."""
        ...

    @property
    def last_stable_offset(self) -> int:
        """Below it every transaction is decided (read_committed reads up to it)."""
        ...

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of the aborted transactions this
        broker knows whose marker is at or past `marker_offset`, oldest first (a main's
        snapshot for its proxies); [] where transactions are not kept here."""
        ...

    def read(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks:
        """Record batches from `offset` below `end` (default: the high watermark), at most
        about `max_bytes` (at least one batch when there is one): one buffer, or several
        not joined (`RecordChunks`: `bytes()` of it joins them). Blocks on I/O: call off
        the event loop."""
        ...

    def read_cached(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks | None:
        """What `read` returns, when all of it is in memory (a tail read from the LogCache):
        never blocks, so the event loop calls it first and saves a Fetch the I/O pool's
        thread hand-offs. None when the read needs I/O (then `read` off the loop)."""
        ...

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [start, end)."""
        ...

    def write_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> tuple[KafkaError, Future | None]:
        """Append a transaction COMMIT/ABORT marker; (error, durable future)."""
        ...

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp:
        """The first record with a timestamp >= `timestamp_ms` ((-1, -1) if none)."""
        ...

    def max_timestamp_offset(self) -> OffsetAndTimestamp:
        """The record with the largest timestamp ((-1, -1) for an empty partition)."""
        ...

    def delete_records(self, offset: int) -> int:
        """Advance the log start offset to `offset` (-1: the high watermark); returns the
        new log start offset. Blocks on I/O: call off the event loop."""
        ...

    def epoch_end_offset(self, leader_epoch: int) -> tuple[int, int]:
        """(largest epoch <= `leader_epoch`, its end offset), or (-1, -1): for
        OffsetForLeaderEpoch (a follower's or consumer's log truncation check)."""
        ...

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from any thread) when new data may be readable."""
        ...

    def remove_listener(self, callback: Callable[[], None]) -> None: ...


class PartitionResolver(Protocol):
    """Finds the backend serving (topic_id, partition) on this broker, or None when this
    broker does not serve it (the APIs answer NOT_LEADER_OR_FOLLOWER)."""

    def get(self, topic_id: str, partition: int) -> PartitionBackend | None: ...


@dataclass(frozen=True)
class PartitionPlacement:
    """What a Metadata response tells a client about a partition: the broker serving it
    (None: none is live) and its replica and in-sync replica lists."""

    leader: int | None
    replicas: list[int]
    isr: list[int]


def place_partition(
    image: Any,
    state: Any,
    az: str | None,
    leader_for: Callable[[Any, int, str | None], int],
    live_ids: set[int],
) -> PartitionPlacement:
    """The one rule, by the partition's kind. An erasure-coded partition names a live
    broker as its leader, one in the client's AZ when there is one (every broker serves
    it, controlplane/erasure_placement.py), its shard stores as replicas and the live ones
    as in sync. A leader partition names its leader as `leader_for` routes it for the
    client's AZ (the zone router: the leader's proxy there), as its only replica."""
    erasure = state.kind == PartitionKind.ERASURE
    serving = serving_node(image, state, az if erasure else None)
    if erasure:
        replicas = list(state.shard_stores)
        isr = [n for n in replicas if n == serving or n in live_ids]
        return PartitionPlacement(serving, replicas, isr)
    if serving is not None:
        serving = leader_for(image, serving, az)
    replicas = [serving if serving is not None else state.leader_node_id]
    return PartitionPlacement(serving, replicas, replicas)


class ClientRouting(Protocol):
    """Which broker a client is told serves a partition, and which backend serves it here
    for that client. `DirectRouting` (every client sees the real leaders) is the default;
    the zone router's `ZoneRouting` sends a client of an AZ to brokers of its AZ.

    Thread-safety: every method may be called from any thread.
    """

    def client_az(
        self, client_id: str | None, peer_host: str | None, rack: str | None = None
    ) -> str | None:
        """The client's AZ, or None (served as everyone is without a zone router); `rack`:
        the rack id its Fetch requests carried (`client.rack`)."""
        ...

    def leader_for(self, image: Any, leader_node_id: int, az: str | None) -> int:
        """The broker a Metadata response names as the partition's leader for `az`."""
        ...

    def brokers_for(self, image: Any, az: str | None) -> list:
        """The live brokers (image `BrokerState`s) a Metadata response lists for `az`."""
        ...

    def placement(
        self, image: Any, state: Any, az: str | None, live_ids: set[int]
    ) -> PartitionPlacement:
        """What Metadata tells a client of `az` about the partition (`place_partition`
        with this routing's `leader_for`); `live_ids`: the brokers the response lists."""
        ...

    def get(self, topic_id: str, partition: int, az: str | None = None) -> PartitionBackend | None:
        """The backend serving the partition to a client of `az` here, or None."""
        ...


class DirectRouting:
    """No zone router: the real leaders, and the resolver's partitions."""

    def __init__(self, partitions: PartitionResolver):
        self.partitions = partitions

    def client_az(
        self, client_id: str | None, peer_host: str | None, rack: str | None = None
    ) -> str | None:
        return None

    def leader_for(self, image: Any, leader_node_id: int, az: str | None) -> int:
        return leader_node_id

    def brokers_for(self, image: Any, az: str | None) -> list:
        return [b for b in sorted(image.brokers.values(), key=lambda b: b.node_id) if not b.fenced]

    def placement(
        self, image: Any, state: Any, az: str | None, live_ids: set[int]
    ) -> PartitionPlacement:
        return place_partition(image, state, az, self.leader_for, live_ids)

    def get(self, topic_id: str, partition: int, az: str | None = None) -> PartitionBackend | None:
        return self.partitions.get(topic_id, partition)
