"""The broker's data APIs: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch.

Each handler takes the decoded kafka-python request of the negotiated version and returns the
response object of the same version (`None` for acks=0 produce). Handlers only route and
encode: each partition is a `PartitionBackend` (partition_backend.py) found through the
client's routing, which owns the partition's rules (validation, idempotence, offsets,
epochs). A partition this broker does not serve answers NOT_LEADER_OR_FOLLOWER so clients
refresh their metadata.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field

from kafka.protocol.consumer import ListOffsetsResponse, OffsetForLeaderEpochResponse

from controlplane.image import MetadataImage, TopicState
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import RecordChunks
from dataplane.kafka.api_context import BrokerApiContext
from dataplane.kafka.fetch_budget import next_wave
from dataplane.kafka.fetch_encoder import FetchAnswer, FetchPartitionAnswer, FetchTopicAnswer
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    BackendBackpressure,
    BackendError,
    PartitionBackend,
    append_when_room,
    kafka_error_of,
)
from dataplane.kafka.produce_encoder import PartitionAnswer, ProduceAnswer, TopicAnswer
from dataplane.kafka.registry import in_connection_order
from dataplane.objectstore import ObjectStoreError
from dataplane.runtime import LoopHandoff, outcome_within, writer_wakeups_held
from dataplane.s3stream.committed_readers import committed_reads_on_this_thread

log = logging.getLogger(__name__)

MAX_FETCH_WAIT_MS = 30_000
# a produce waits for WAL room at most this share of its timeout: its retriable answer
# reaches the client before the client's own request timeout gives up on it
ROOM_WAIT_SHARE_OF_TIMEOUT = 0.8
MIN_DURABLE_WAIT_S = 0.001


def _room_wait_s(remaining_s: float) -> float:
    """How long a produce with `remaining_s` left may wait for WAL room."""
    return max(remaining_s * ROOM_WAIT_SHARE_OF_TIMEOUT, 0.0)


def _read_noting_objects(
    plog: PartitionBackend, offset: int, budget: int, end: int
) -> tuple[bytes | memoryview | RecordChunks, bool]:
    """`plog.read` on an I/O thread, and whether it reached object storage."""
    before = committed_reads_on_this_thread()
    records = plog.read(offset, budget, end)
    return records, committed_reads_on_this_thread() != before


def _produce_response(v: int, results: list[tuple[object, list[_ProduceSlot]]]) -> ProduceAnswer:
    """The ProduceResponse of version `v` for each topic's partition slots (`produce`)."""
    responses = []
    for t, slots in results:
        responses.append(
            TopicAnswer(
                None if v >= 13 else t.name,
                t.topic_id if v >= 13 else None,
                [slot.response() for slot in slots],
            )
        )
    return ProduceAnswer(v, responses)


@dataclass(slots=True)
class _ProduceSlot:
    """One partition of a Produce request while it is appended and made durable."""

    index: int
    error: KafkaError
    base: int = -1
    log_start: int = -1
    durable: list[Future] = field(default_factory=list)  # `AppendOutcome.durable`
    base_future: Future | None = None
    forwarded: bool = False  # appended elsewhere: `durable` resolves to that outcome
    record_errors: list[tuple[int, str]] = field(default_factory=list)
    error_message: str | None = None
    append_time_ms: int = -1

    def take(self, outcome: AppendOutcome) -> None:
        """The outcome of the partition's append (here, or forwarded to it: a proxy's
        `durable` futures resolve to the main's outcome)."""
        self.error, self.base = outcome.error, outcome.base_offset
        self.durable = outcome.durable
        self.base_future = outcome.base_offset_future
        self.forwarded = outcome.forwarded
        self.record_errors = outcome.record_errors
        self.error_message = outcome.error_message
        self.append_time_ms = outcome.log_append_time_ms

    def response(self) -> PartitionAnswer:
        """The partition's answer: a refused partition keeps its KIP-467 record errors and
        message."""
        return PartitionAnswer(
            self.index,
            self.error,
            self.base if self.error == KafkaError.NONE else -1,
            self.append_time_ms,
            self.log_start,
            self.record_errors,
            self.error_message,
        )


class _AppendWakeup:
    """What a Fetch's long poll waits on between passes: an append to a partition it read
    (`wake`, from any thread: a WAL's committer resolving a group commit wakes the loop
    once for all its appends, `LoopHandoff`), or its deadline. A plain future and one timer
    per wait: a tail fetch waits once per batch a producer appends. Loop-only, but
    `wake`."""

    __slots__ = ("_future", "_handoff", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._handoff = LoopHandoff.of(loop)
        self._future: asyncio.Future[None] = loop.create_future()

    def rearm(self) -> None:
        """Before a pass: appends from now on wake the next wait."""
        if self._future.done():
            self._future = self._loop.create_future()

    def wake(self) -> None:
        """Any thread: an append to a read partition."""
        self._handoff.call_soon(self._set)

    def _set(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    async def wait_until(self, deadline: float) -> None:
        """Until an append since the last `rearm`, or the loop's time `deadline`."""
        if self._future.done():
            return
        timer = self._loop.call_at(deadline, self._set)
        try:
            await self._future
        finally:
            timer.cancel()


@dataclass
class _FetchSlot:
    """One partition of a Fetch request while it is being answered."""

    topic: str | None
    partition: int
    plog: PartitionBackend | None
    error: KafkaError
    fetch_offset: int
    partition_max_bytes: int = 0
    hw: int = -1
    start: int = -1
    lso: int = -1
    end: int = -1
    records: bytes | memoryview | RecordChunks = b""
    aborted: list[tuple[int, int]] = field(default_factory=list)
    from_objects: bool = False  # the read reached object storage (a catch-up read)

    def response(self) -> FetchPartitionAnswer:
        """This partition's part of the Fetch response (fetch_encoder.py writes its record
        buffers to the socket as they are)."""
        return FetchPartitionAnswer(
            self.partition,
            self.error,
            self.hw,
            self.lso,
            self.start,
            self.aborted,
            -1,
            self.records,
        )


class DataApis:
    """Handlers of the produce, fetch and offset APIs, on the broker's shared state."""

    def __init__(self, broker: BrokerApiContext):
        self.broker = broker

    def _topic(
        self, image: MetadataImage, name: str | None = None, topic_id: uuid.UUID | None = None
    ) -> TopicState | None:
        if topic_id is not None and topic_id.int != 0:
            return image.topics.get(str(topic_id))
        return image.topic_by_name(name) if name else None

    def _resolve(
        self, image: MetadataImage, name: str | None, topic_id, partition: int, az: str | None
    ):
        """(PartitionBackend or None, error) for a produce/fetch target of a client of `az`."""
        topic = self._topic(image, name, topic_id)
        if topic is None or partition not in topic.partitions:
            if topic_id is not None and getattr(topic_id, "int", 0):
                return None, KafkaError.UNKNOWN_TOPIC_ID
            return None, KafkaError.UNKNOWN_TOPIC_OR_PARTITION
        plog = self.broker.routing.get(topic.topic_id, partition, az)
        if plog is None:
            return None, KafkaError.NOT_LEADER_OR_FOLLOWER
        return plog, KafkaError.NONE

    async def _admit_ingress(self, req, timeout_s: float) -> bool:
        """The ingress limit (network_limits.py) on a produce's records: False when no
        tokens came in time (nothing is appended; the partitions answer REQUEST_TIMED_OUT)."""
        network = self.broker.network
        if not network.ingress.limited:
            return True
        produced = sum(
            len(p.records) for t in req.topic_data for p in t.partition_data if p.records
        )
        return await network.admit_produce(produced, _room_wait_s(timeout_s))

    @in_connection_order
    async def produce(self, req, ctx):
        """Append each partition's records to its backend; with acks, answer once they are
        durable or the request's timeout passed (acks=0: no response). A connection's
        Produce requests append in the order they came (`in_connection_order`): the turn
        passes once this one's records are appended, before it waits for durability. An
        idempotent producer pipelines a partition's batches (sequence n, n+1, ...); a later
        request appending while an earlier one waits for WAL room would skip the earlier
        sequences, an OUT_OF_ORDER_SEQUENCE_NUMBER the producer cannot recover from once the
        earlier batches are acked."""
        v = ctx.api_version
        az = self.broker.client_az(ctx)
        results = []
        waits = []
        # one deadline for the whole request: waiting for WAL room, then for durability
        loop = asyncio.get_running_loop()
        timeout_s = max(req.timeout_ms, 1) / 1000
        deadline = loop.time() + timeout_s
        try:
            image = self.broker.image_fn()
            admitted = await self._admit_ingress(req, timeout_s)
            await self._append_all(req, v, image, az, (loop, deadline, admitted), results, waits)
        finally:
            ctx.pass_turn()  # the connection's next Produce may append
        if req.acks != 0:
            for slot in waits:
                for fut in slot.durable:
                    try:
                        # one group commit made a request's partitions durable together:
                        # the later ones are done by now and need no wrapper and timer
                        done = (
                            fut.result()
                            if fut.done()
                            else await outcome_within(
                                fut, max(deadline - loop.time(), MIN_DURABLE_WAIT_S)
                            )
                        )
                        if slot.forwarded:
                            # appended elsewhere (a zone-router proxy's main): its outcome
                            slot.error, slot.base = done.error, done.base_offset
                            slot.record_errors = done.record_errors
                            slot.error_message = done.error_message
                            slot.append_time_ms = done.log_append_time_ms
                    except TimeoutError:
                        slot.error = KafkaError.REQUEST_TIMED_OUT
                    except Exception as exc:  # e.g. no WAL room on a worker's append
                        log.warning("append failed: %s", exc)
                        slot.error = kafka_error_of(exc)
                if slot.error == KafkaError.NONE and slot.base_future is not None:
                    slot.base = slot.base_future.result()  # done: it was among the futures
        else:
            return None
        return _produce_response(v, results)

    async def _append_all(self, req, v, image, az, when, results, waits) -> None:
        """Append each partition's records of a Produce (`when`: the loop, the request's
        deadline and whether the ingress limit admitted it) into `results` (per topic, the
        partitions' slots) and `waits` (each slot, with its durability futures).

        First every partition that has room, with the WAL committers' wakeups held (one
        group commit takes the request's batches), then, waiting for room without
        blocking the loop, those that had none."""
        loop, deadline, admitted = when
        no_room: list[
            tuple[_ProduceSlot, PartitionBackend, object, BackendBackpressure | None]
        ] = []
        waiting_for_room: set[object] = set()
        with writer_wakeups_held():  # no await inside: other requests' appends
            for t in req.topic_data:
                topic_name = getattr(t, "name", None)
                topic_id = getattr(t, "topic_id", None) if v >= 13 else None
                parts = []
                for p in t.partition_data:
                    plog, error = self._resolve(image, topic_name, topic_id, p.index, az)
                    slot = _ProduceSlot(p.index, error)
                    if plog is not None and not admitted:
                        slot.error = KafkaError.REQUEST_TIMED_OUT
                    elif plog is not None and plog.identity in waiting_for_room:
                        no_room.append((slot, plog, p.records, None))  # (its order kept)
                    elif plog is not None:
                        try:
                            slot.take(plog.append(p.records))
                        except BackendBackpressure as exc:
                            no_room.append((slot, plog, p.records, exc))
                            waiting_for_room.add(plog.identity)
                        except BackendError as exc:
                            slot.error = exc.error
                        except Exception as exc:  # the engine refused (fenced, closed...)
                            log.warning("append to %s-%d failed: %s", plog.topic, p.index, exc)
                            slot.error = kafka_error_of(exc)
                        slot.log_start = plog.log_start_offset
                    parts.append(slot)
                    waits.append(slot)
                results.append((t, parts))
        for slot, plog, records, refused in no_room:
            try:
                # a full WAL is waited for here, without blocking the loop
                outcome = await append_when_room(
                    functools.partial(plog.append, records),
                    _room_wait_s(deadline - loop.time()),
                    refused,
                )
                slot.take(outcome)
            except Exception as exc:  # the engine refused (fenced, closed...)
                log.warning("append to %s-%d failed: %s", plog.topic, slot.index, exc)
                slot.error = kafka_error_of(exc)
            slot.log_start = plog.log_start_offset

    # ------------------------------------------------------------ fetch

    async def fetch(self, req, ctx):
        """Records from each partition's fetch offset, waiting (up to max_wait_ms) until
        min_bytes are there; a partition error with nothing read answers at once."""
        v = ctx.api_version
        if v >= 11:  # KIP-392: the consumer's client.rack places it (and its connection)
            self.broker.note_client_rack(ctx, getattr(req, "rack_id", None))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(max(req.max_wait_ms, 0), MAX_FETCH_WAIT_MS) / 1000
        min_bytes = max(req.min_bytes, 0)
        max_bytes = req.max_bytes if v >= 3 and req.max_bytes > 0 else 2**31 - 1
        appended = _AppendWakeup(loop)
        wake = appended.wake  # one object: the listener every read partition is given
        listening: dict[object, PartitionBackend] = {}
        try:
            for _ in range(1_000_000):
                appended.rearm()
                image = self.broker.image_fn()
                total, topics = await self._fetch_once(
                    req,
                    v,
                    image,
                    (max_bytes, min_bytes, deadline),
                    listening,
                    wake,
                    self.broker.client_az(ctx),
                )
                if total >= min_bytes or loop.time() >= deadline or total < 0:
                    break
                await appended.wait_until(deadline)
        finally:
            for plog in listening.values():
                plog.remove_listener(wake)
        return FetchAnswer(v, topics)

    async def _fetch_once(self, req, v, image, limits, listening, wake, az):
        max_bytes, min_bytes, deadline = limits
        read_committed = getattr(req, "isolation_level", 0) == 1
        # first the partitions' state and errors, then the reads: the partitions of one
        # request are read at once (a catch-up read waits for object-store GETs), in waves
        # that keep the response within the request's max_bytes (fetch_budget.py)
        slots: list[list[_FetchSlot]] = []
        to_read: list[_FetchSlot] = []
        for t in req.topics:
            name = getattr(t, "topic", None) if v < 13 else None
            topic_id = getattr(t, "topic_id", None) if v >= 13 else None
            topic_slots = []
            for p in t.partitions:
                plog, error = self._resolve(image, name, topic_id, p.partition, az)
                slot = _FetchSlot(t.topic, p.partition, plog, error, p.fetch_offset)
                slot.partition_max_bytes = p.partition_max_bytes
                if plog is not None:
                    slot.hw, slot.start = plog.high_watermark, plog.log_start_offset
                    slot.lso = plog.last_stable_offset
                    # read_committed (KIP-98): up to the last stable offset
                    slot.end = slot.lso if read_committed else slot.hw
                    current = getattr(p, "current_leader_epoch", -1)
                    if current >= 0 and current < plog.leader_epoch:
                        slot.error = KafkaError.FENCED_LEADER_EPOCH
                    elif current > plog.leader_epoch:
                        slot.error = KafkaError.UNKNOWN_LEADER_EPOCH
                    elif p.fetch_offset < slot.start or (
                        # a backend that serves what its leader committed (a zone-router
                        # proxy) may lag: past its end is "not yet", as on a Kafka follower
                        p.fetch_offset > slot.hw and not plog.lags_leader
                    ):
                        slot.error = KafkaError.OFFSET_OUT_OF_RANGE
                    elif p.fetch_offset < slot.end:
                        to_read.append(slot)
                    if plog.identity not in listening:
                        plog.add_listener(wake)
                        listening[plog.identity] = plog
                topic_slots.append(slot)
            slots.append(topic_slots)
        total = 0
        read: list[_FetchSlot] = []
        while to_read and total < max_bytes:
            budgets = next_wave([s.partition_max_bytes for s in to_read], total, max_bytes)
            if not budgets:
                break
            wave, to_read = to_read[: len(budgets)], to_read[len(budgets) :]
            # tail reads from memory here, on the loop: a task each only for the reads
            # that wait for I/O (catch-up)
            missed = [
                (s, b)
                for s, b in zip(wave, budgets)
                if not self._read_from_cache(s, b, read_committed)
            ]
            if missed:
                await asyncio.gather(*(self._fetch_read(s, b, read_committed) for s, b in missed))
            total += sum(len(s.records) for s in wave)
            read += wave
        loop = asyncio.get_running_loop()
        if total and (total >= min_bytes or loop.time() >= deadline):
            total = await self._admit_egress(read, deadline - loop.time())
        topics = []
        errors = False
        for t, topic_slots in zip(req.topics, slots):
            parts = []
            for slot in topic_slots:
                if slot.error != KafkaError.NONE:
                    errors = True
                parts.append(slot.response())
            if v >= 13:
                topics.append(FetchTopicAnswer(None, t.topic_id, parts))
            else:
                topics.append(FetchTopicAnswer(t.topic, None, parts))
        return (-1 if errors and total == 0 else total), topics

    async def _admit_egress(self, read: list[_FetchSlot], timeout_s: float) -> int:
        """The egress limit (network_limits.py) on an answer's records: those it does not
        let go now are dropped (the consumer fetches them again). The bytes kept."""
        if not self.broker.network.egress.limited:
            return sum(len(s.records) for s in read)
        holding = [s for s in read if s.records]
        sizes = [len(s.records) for s in holding]
        kept = await self.broker.network.admit_fetch(
            sizes, any(s.from_objects for s in holding), timeout_s
        )
        for slot in holding[kept:]:
            slot.records, slot.aborted = b"", []
        return sum(sizes[:kept])

    def _read_from_cache(self, slot: _FetchSlot, budget: int, read_committed: bool) -> bool:
        """One partition's records of a Fetch into `slot` when all of them are in the
        LogCache (a tail read: from memory, on the loop, no I/O-pool hand-off); False when
        the read needs I/O (`_fetch_read`)."""
        plog = slot.plog
        cached = plog.read_cached(slot.fetch_offset, budget, slot.end)
        if cached is None:
            return False
        slot.records = cached  # from_objects stays False: a tail read
        if read_committed and cached:
            slot.aborted = plog.aborted_transactions(slot.fetch_offset, slot.end)
        return True

    async def _fetch_read(self, slot: _FetchSlot, budget: int, read_committed: bool) -> None:
        """One partition's records of a Fetch into `slot`, read on the I/O pool (the
        LogCache does not hold them all: `_read_from_cache` said so)."""
        plog = slot.plog
        try:
            if self.broker.network.egress.limited:  # tail or catch-up: where it was read
                slot.records, slot.from_objects = await self.broker.run_io(
                    _read_noting_objects, plog, slot.fetch_offset, budget, slot.end
                )
            else:
                slot.records = await self.broker.run_io(
                    plog.read, slot.fetch_offset, budget, slot.end
                )
        except ObjectStoreError as exc:
            # e.g. its bucket is down (object-storage failover): the client retries;
            # nothing is skipped
            log.warning("fetch %s-%d: %s", slot.topic, slot.partition, exc)
            slot.error = KafkaError.KAFKA_STORAGE_ERROR
            return
        if read_committed and slot.records:
            slot.aborted = plog.aborted_transactions(slot.fetch_offset, slot.end)

    # ------------------------------------------------------------ offsets

    async def list_offsets(self, req, ctx):
        """Each partition's earliest (-2), latest (-1), max-timestamp (-3) offset, or the
        first offset at or after a timestamp."""
        v = ctx.api_version
        image = self.broker.image_fn()
        R = ListOffsetsResponse
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                plog, error = self._resolve(
                    image, t.name, None, p.partition_index, self.broker.client_az(ctx)
                )
                offset, ts = -1, -1
                if plog is not None:
                    if p.timestamp == -2:
                        offset = plog.log_start_offset
                    elif p.timestamp == -1:
                        # read_committed (KIP-98): the last stable offset
                        offset = (
                            plog.last_stable_offset
                            if getattr(req, "isolation_level", 0) == 1
                            else plog.high_watermark
                        )
                    else:
                        lookup = (
                            (plog.max_timestamp_offset,)  # MAX_TIMESTAMP (KIP-734)
                            if p.timestamp == -3
                            else (plog.offset_for_timestamp, p.timestamp)
                        )
                        try:
                            found = await self.broker.run_io(*lookup)
                            offset, ts = found.offset, found.timestamp_ms
                        except BackendError as exc:
                            log.info("ListOffsets %s-%d: %s", t.name, p.partition_index, exc)
                            error = exc.error
                parts.append(
                    R.ListOffsetsTopicResponse.ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=error,
                        timestamp=ts,
                        offset=offset,
                        leader_epoch=plog.leader_epoch if plog else -1,
                    )
                )
            topics.append(R.ListOffsetsTopicResponse(name=t.name, partitions=parts))
        return R[v](throttle_time_ms=0, topics=topics)

    async def offset_for_leader_epoch(self, req, ctx):
        """Each partition's end offset of the leader epoch asked (its backend's answer)."""
        v = ctx.api_version
        image = self.broker.image_fn()
        R = OffsetForLeaderEpochResponse
        topics = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                plog, error = self._resolve(
                    image, t.topic, None, p.partition, self.broker.client_az(ctx)
                )
                epoch, end = -1, -1
                if plog is not None:
                    epoch, end = plog.epoch_end_offset(p.leader_epoch)
                parts.append(
                    R.OffsetForLeaderTopicResult.EpochEndOffset(
                        error_code=error, partition=p.partition, leader_epoch=epoch, end_offset=end
                    )
                )
            topics.append(R.OffsetForLeaderTopicResult(topic=t.topic, partitions=parts))
        return R[v](throttle_time_ms=0, topics=topics)
