"""A partition this broker leads, as a client of an AZ produces to it (seed 000).

With zone routing on, a client that declared an AZ producing at the partition's main goes
through the main's own RouterChannel as well (`OwnChannelPartition`): the data lands in
object storage once, readable by the proxies' snapshot reads, and the WAL keeps a Link
Record (`route_handler.ZoneRouteHandler.append_own`). The produce requests of a partition
keep their order through an `OwnPipeline`: the channel appends run in parallel, the
partition sees them in order. Everything but the produce is the partition's.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.record_batch import RecordChunks
from dataplane.kafka.partition_backend import (
    AppendOutcome,
    LinkBuilder,
    OffsetAndTimestamp,
    PartitionBackend,
)
from dataplane.zonerouter.route_handler import ZoneRouteHandler
from dataplane.zonerouter.traffic import ZoneTraffic


class OwnChannelRouter(Protocol):
    """What the own-channel partition needs of this broker's zone router (`ZoneRouter`):
    its pipelines (one per partition) and its channel appends."""

    traffic: ZoneTraffic

    def existing_own_pipeline(self, topic_id: str, partition: int) -> OwnPipeline | None: ...

    def own_pipeline(self, topic_id: str, partition: int) -> OwnPipeline | None: ...

    def begin_own(self, records: bytes) -> tuple[int, Future] | None: ...

    def finish_own(
        self,
        handler: ZoneRouteHandler,
        plog: PartitionBackend,
        records: bytes,
        token: int,
        channel_append: Future,
    ) -> AppendOutcome | None: ...


def own_channel_backend(
    router: OwnChannelRouter,
    handler: ZoneRouteHandler,
    plog: PartitionBackend,
    topic_id: str,
    through_channel: bool,
) -> PartitionBackend:
    """What a produce to `plog` (a partition led here) appends to: its `OwnChannelPartition`,
    or (`through_channel` False) the partition itself once nothing of it is left in its
    channel pipeline: an append at once then keeps the produce order. Event loop only
    (produce requests are resolved and appended there, in their order)."""
    if not through_channel:
        pipeline = router.existing_own_pipeline(topic_id, plog.partition)
        if pipeline is None or pipeline.pending == 0:
            return plog
    return OwnChannelPartition(router, handler, plog, topic_id, through_channel)


class OwnChannelPartition:
    """A partition this broker leads, as a client that declared an AZ sees it when zone
    routing is on: its produce goes through this broker's own RouterChannel (the data in
    object storage once, readable by the proxies' snapshot reads; a Link Record in the
    WAL), everything else is the partition's (each `PartitionBackend` member forwarded by
    name). Thread-safe: appends are queued to the partition's serial worker (the produce
    order); the durable futures resolve to the outcome (an `AppendOutcome`)."""

    counts_own_wal_bytes = True  # the channel (or direct) write is counted here

    def __init__(
        self,
        router: OwnChannelRouter,
        handler: ZoneRouteHandler,
        plog: PartitionBackend,
        topic_id: str,
        through_channel: bool = True,
    ):
        """`through_channel`: produce goes through the own channel (proxies read the
        partition: their snapshot reads need it); False: straight to the partition, once
        the produces still in its channel pipeline are appended (their order is kept)."""
        self._plog = plog
        self._router = router
        self._handler = handler
        self._topic_id = topic_id
        self._through_channel = through_channel

    # ------------------------------------------------------------ the partition's members

    @property
    def topic_id(self) -> str:
        return self._plog.topic_id

    @property
    def topic(self) -> str:
        return self._plog.topic

    @property
    def partition(self) -> int:
        return self._plog.partition

    @property
    def identity(self) -> object:
        """The partition's: a view made per request is the same partition."""
        return self._plog.identity

    @property
    def lags_leader(self) -> bool:
        return self._plog.lags_leader

    @property
    def forwards_to_main(self) -> bool:
        return self._plog.forwards_to_main

    @property
    def stream_id(self) -> int:
        return self._plog.stream_id

    @property
    def leader_epoch(self) -> int:
        return self._plog.leader_epoch

    @property
    def log_start_offset(self) -> int:
        return self._plog.log_start_offset

    @property
    def high_watermark(self) -> int:
        return self._plog.high_watermark

    @property
    def last_stable_offset(self) -> int:
        return self._plog.last_stable_offset

    def read(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks:
        return self._plog.read(offset, max_bytes, end)

    def read_cached(
        self, offset: int, max_bytes: int, end: int | None = None
    ) -> bytes | memoryview | RecordChunks | None:
        return self._plog.read_cached(offset, max_bytes, end)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int]]:
        return self._plog.aborted_transactions(start, end)

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        return self._plog.aborted_since(marker_offset)

    def write_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> tuple[KafkaError, Future | None]:
        return self._plog.write_marker(producer_id, producer_epoch, commit, coordinator_epoch)

    def offset_for_timestamp(self, timestamp_ms: int) -> OffsetAndTimestamp:
        return self._plog.offset_for_timestamp(timestamp_ms)

    def max_timestamp_offset(self) -> OffsetAndTimestamp:
        return self._plog.max_timestamp_offset()

    def delete_records(self, offset: int) -> int:
        return self._plog.delete_records(offset)

    def epoch_end_offset(self, leader_epoch: int) -> tuple[int, int]:
        return self._plog.epoch_end_offset(leader_epoch)

    def add_listener(self, callback: Callable[[], None]) -> None:
        self._plog.add_listener(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        self._plog.remove_listener(callback)

    # ------------------------------------------------------------ produce: the own channel

    def _direct(self, records: bytes | None) -> AppendOutcome:
        outcome = self._plog.append(records)
        if outcome.error == KafkaError.NONE:
            self._router.traffic.add("wal_data_bytes", len(records or b""))
        return outcome

    def append(
        self, records: bytes | None, link: LinkBuilder | None = None, timeout_ms: int = 30_000
    ) -> AppendOutcome:
        """Called on the event loop (produce requests in their order)."""
        if link is not None:  # already routed: straight to the partition
            return self._plog.append(records, link)
        key = (self._topic_id, self._plog.partition)
        if not self._through_channel:
            # no proxy reads the partition: straight to it, once the produce requests
            # still in the pipeline are appended (their order is kept)
            pipeline = self._router.existing_own_pipeline(*key)
            if pipeline is None or pipeline.pending == 0:
                return self._direct(records)
        pipeline = self._router.own_pipeline(*key)
        if not records or pipeline is None:
            return self._direct(records)
        # a view of the request's frame (the produce decoder's) would keep the whole frame
        # alive in the router's recent records: a copy of its own
        records = bytes(records)
        done: Future = Future()
        with pipeline.lock:
            pipeline.pending += 1
        try:
            pipeline.worker.submit(self._begin, pipeline, records, done)
        except RuntimeError:  # the pipeline was closed (leadership moved, stopping)
            with pipeline.lock:
                pipeline.pending -= 1
            return AppendOutcome(KafkaError.NOT_LEADER_OR_FOLLOWER)
        return AppendOutcome(KafkaError.NONE, -1, [done], forwarded=True)

    def _begin(self, pipeline: OwnPipeline, records: bytes, done: Future) -> None:
        """On the pipeline's worker (the produce order): start the channel append and
        queue the rest behind the earlier produce requests."""
        started = self._router.begin_own(records)
        with pipeline.lock:
            pipeline.items.append((started, records, done))
        if started is None:
            self._drain(pipeline)
        else:
            started[1].add_done_callback(lambda _: self._drain(pipeline))

    def _drain(self, pipeline: OwnPipeline) -> None:
        """Append, in order, every queued produce whose channel append is done."""
        with pipeline.lock:
            while pipeline.items:
                started, records, done = pipeline.items[0]
                if started is not None and not started[1].done():
                    return
                pipeline.items.popleft()
                pipeline.pending -= 1  # appended to the partition just below: in order
                try:
                    outcome = None
                    if started is not None:
                        token, channel_append = started
                        outcome = self._router.finish_own(
                            self._handler, self._plog, records, token, channel_append
                        )
                    if outcome is None:
                        outcome = self._direct(records)
                except BaseException as exc:  # noqa: BLE001 - handed to the produce
                    done.set_exception(exc)
                    continue
                _complete_when_durable(outcome, done)


def _complete_when_durable(outcome: AppendOutcome, done: Future) -> None:
    """Resolve `done` with `outcome` (its error and base offset) once all its appends are
    durable, or with the first failure."""
    durable = list(outcome.durable)
    result = AppendOutcome(
        outcome.error,
        outcome.base_offset,
        record_errors=outcome.record_errors,
        error_message=outcome.error_message,
        log_append_time_ms=outcome.log_append_time_ms,
    )
    if outcome.error != KafkaError.NONE or not durable:
        done.set_result(result)
        return
    remaining = [len(durable)]
    lock = threading.Lock()

    def settled(fut: Future) -> None:
        exc = fut.exception()
        with lock:
            remaining[0] -= 1
            if done.done():
                return
            if exc is not None:
                done.set_exception(exc)
            elif remaining[0] == 0:
                done.set_result(result)

    for fut in durable:
        fut.add_done_callback(settled)


class OwnPipeline:
    """The produce requests of one partition led here going through the own channel, in
    their order: a serial worker starts each channel append; each is appended to the
    partition once it and every earlier one are done (channel appends run in parallel,
    the partition sees them in order). Thread-safe (`lock`)."""

    def __init__(self, partition: int):
        self.worker = ThreadPoolExecutor(1, thread_name_prefix=f"own-{partition}")
        self.lock = threading.Lock()
        self.pending = 0  # produce requests queued, not yet appended to the partition
        # (token and channel append, or None: append directly), data, the produce's future
        self.items: deque[tuple[tuple[int, Future] | None, bytes, Future]] = deque()

    def close(self) -> None:
        self.worker.shutdown(wait=False)
