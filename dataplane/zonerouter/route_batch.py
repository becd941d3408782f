"""Zone routes batched per main (issue #32): a proxy's routes to one main, from every
partition and produce request, go in one `ZoneRouteRequest` (version 1) at a time.

Each proxied produce appends its partition's batches to the RouterChannel, then hands its
route (topic, partition, channel offset) to the `RouteBatcher` of the partition's main.
The batcher's thread sends what is queued in one request and, while it waits for the
answer, the next routes queue up: under load one request carries many routes, so the
bytes between brokers grow with the requests, not with the partitions. Before sending,
it waits (at most `linger_s`, 2 ms) for routes whose channel append just finished and
whose worker has not handed them over yet (the partitions of one produce request share a
channel object and finish together): a `RouteTicket` counts them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future

from dataplane.kafka.interbroker import BrokerConnection
from dataplane.zonerouter.channel import channel_bucket_of
from dataplane.zonerouter.protocol import ZONE_ROUTE_KEY, ZONE_ROUTE_VERSION, ZoneRouteRequest

log = logging.getLogger(__name__)

LINGER_S = 0.002  # the longest a route waits for others finishing their channel append
MAX_BATCH_ENTRIES = 256  # routes in one request (the main takes up to 1,024)
MAX_QUEUED = 4096  # routes waiting for a request (more: refused, the proxy's client retries)
RPC_EXTRA_TIMEOUT_S = 5.0

# a route's answer: error code, message, base offset, stream id, end offset of its links
RouteResult = tuple[int, str | None, int, int, int]


class RouteTicket:
    """One route on its way to the batcher: counted as expected once its channel append
    is done, until handed over (`RouteBatcher.route`) or abandoned."""

    __slots__ = ("counted", "abandoned")

    def __init__(self) -> None:
        self.counted = False
        self.abandoned = False


class _Route:
    __slots__ = ("epoch", "topic_id", "partition", "channel_offset", "timeout_ms", "future")

    def __init__(self, epoch, topic_id, partition, channel_offset, timeout_ms) -> None:
        self.epoch = epoch
        self.topic_id = topic_id
        self.partition = partition
        self.channel_offset = channel_offset
        self.timeout_ms = timeout_ms
        self.future: Future = Future()


class RouteBatcher:
    """The zone routes of this proxy to one main, sent in batches by one thread on one
    connection. Thread-safe (one condition); `close()` stops the thread and fails what is
    queued."""

    def __init__(
        self,
        conn: BrokerConnection,
        source_node_id: int,
        channel_prefix: str,
        main_node_id: int,
        linger_s: float = LINGER_S,
    ):
        self.conn = conn
        self.source_node_id = source_node_id
        self.channel_prefix = channel_prefix
        self.linger_s = linger_s
        self._cond = threading.Condition()
        self._queue: deque[_Route] = deque()
        self._expected = 0  # channel appends done whose route is not queued yet
        self._closed = False
        self.requests_sent = 0
        self._thread = threading.Thread(
            target=self._run, name=f"zone-route-{main_node_id}", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------ the proxy's workers

    def ticket(self) -> RouteTicket:
        return RouteTicket()

    def channel_done(self, ticket: RouteTicket) -> None:
        """The ticket's channel append finished (its route is about to come)."""
        with self._cond:
            if not ticket.abandoned and not ticket.counted:
                ticket.counted = True
                self._expected += 1

    def abandon(self, ticket: RouteTicket) -> None:
        """The ticket's route will not come (its channel append failed or timed out)."""
        with self._cond:
            ticket.abandoned = True
            if ticket.counted:
                ticket.counted = False
                self._expected -= 1
                self._cond.notify_all()

    def route(
        self,
        ticket: RouteTicket,
        epoch: int,
        topic_id: str,
        partition: int,
        channel_offset: int,
        timeout_ms: int,
    ) -> Future:
        """Queue one route; its future resolves to its `RouteResult` (or the connection's
        error: the main may have appended it)."""
        item = _Route(epoch, topic_id, partition, channel_offset, timeout_ms)
        with self._cond:
            if ticket.counted:
                ticket.counted = False
                self._expected -= 1
            if self._closed or len(self._queue) >= MAX_QUEUED:
                item.future.set_exception(ConnectionError("zone routes to this main are closed"))
                return item.future
            self._queue.append(item)
            self._cond.notify_all()
        return item.future

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(1.0)
        self.conn.close()

    # ------------------------------------------------------------ the sending thread

    def _take(self) -> list[_Route] | None:
        """The next batch: once routes are queued, at most `linger_s` more while routes
        whose channel append is done are still expected; routes of one route epoch."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            deadline = time.monotonic() + self.linger_s
            while self._expected > 0 and len(self._queue) < MAX_BATCH_ENTRIES:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
            epoch = self._queue[0].epoch
            batch: list[_Route] = []
            kept: deque[_Route] = deque()
            while self._queue and len(batch) < MAX_BATCH_ENTRIES:
                item = self._queue.popleft()
                (batch if item.epoch == epoch else kept).append(item)
            self._queue.extendleft(reversed(kept))
            return batch

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                break
            try:
                results = self._send(batch)
            except Exception as exc:  # noqa: BLE001 - each route learns it (the proxy decides)
                for item in batch:
                    item.future.set_exception(exc)
                continue
            for item, result in zip(batch, results, strict=True):
                item.future.set_result(result)
        with self._cond:
            left = list(self._queue)
            self._queue.clear()
        for item in left:
            item.future.set_exception(ConnectionError("zone routes to this main are closed"))

    def _send(self, batch: list[_Route]) -> list[RouteResult]:
        Q = ZoneRouteRequest[ZONE_ROUTE_VERSION]
        timeout_ms = max(item.timeout_ms for item in batch)
        req = Q(
            route_epoch=batch[0].epoch,
            source_node_id=self.source_node_id,
            # informational in v1: each entry's offset names its own segment and bucket
            channel_bucket_id=channel_bucket_of(batch[0].channel_offset),
            channel_prefix=self.channel_prefix,
            timeout_ms=timeout_ms,
            entries=[
                Q.RouteEntry(
                    topic_id=uuid.UUID(item.topic_id),
                    partition=item.partition,
                    channel_offset=item.channel_offset,
                )
                for item in batch
            ],
        )
        resp = self.conn.call(
            req,
            max(timeout_ms, 1) / 1000 + RPC_EXTRA_TIMEOUT_S,
            ZONE_ROUTE_KEY,
            ZONE_ROUTE_VERSION,
        )
        self.requests_sent += 1
        if resp.error_code:  # the whole request refused (a fenced epoch, a bad channel)
            return [(resp.error_code, resp.error_message, -1, -1, -1)] * len(batch)
        if len(resp.entries) != len(batch):
            raise ConnectionError(f"{len(resp.entries)} route answers for {len(batch)} routes")
        return [
            (e.error_code, e.error_message, e.base_offset, e.stream_id, e.end_offset)
            for e in resp.entries
        ]
