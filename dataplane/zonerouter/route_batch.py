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

Routes across produce requests: a client sends a produce request every few ms (librdkafka
with linger.ms=5) and each costs one round trip per main (~150 bytes with the Kafka
header). So the batcher learns how often routes come (the mean gap between bursts of
routes, one burst per produce request) and, when the next burst is due within
`max_linger_s` (5 ms), holds a batch for up to that gap after its first route: one round
trip then carries the routes of several produce requests. Sparse routes are sent at once.
The request is version 4 (`route_codec.py`: entries, answers and the request's own fields
packed as varints against a route session that sends each topic id once; version 2 to a
main not upgraded yet).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.interbroker import BrokerConnection
from dataplane.zonerouter.protocol import (
    OLDEST_PACKED_ZONE_ROUTE_VERSION,
    ZONE_ROUTE_KEY,
    ZONE_ROUTE_VERSION,
    VersionProbe,
    ZoneRouteRequest,
)
from dataplane.zonerouter.route_codec import (
    ProxyRouteSession,
    pack_entries,
    pack_request,
    unpack_answers,
    unpack_answers_v5,
)

log = logging.getLogger(__name__)

LINGER_S = 0.002  # the longest a route waits for others finishing their channel append
MAX_ADAPTIVE_LINGER_S = 0.005  # the longest a batch waits for the next produce request's routes
BURST_GAP_S = 0.0005  # routes closer than this are one burst (one produce request)
GAP_WEIGHT = 0.2  # of the newest gap in the mean gap between bursts
MAX_GAP_S = 1.0  # a longer gap counts as this much
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
    __slots__ = (
        "epoch",
        "topic_id",
        "partition",
        "channel_offset",
        "timeout_ms",
        "future",
        "queued_at",
    )

    def __init__(self, epoch, topic_id, partition, channel_offset, timeout_ms) -> None:
        self.queued_at = 0.0
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
        max_linger_s: float = MAX_ADAPTIVE_LINGER_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.conn = conn
        self.source_node_id = source_node_id
        self.channel_prefix = channel_prefix
        self.linger_s = linger_s
        self.max_linger_s = max_linger_s
        self._clock = clock  # when routes come and how long a batch is held (seconds)
        # when routes last came, when the last burst began, the mean gap between bursts
        self._last_arrival = 0.0
        self._last_burst = 0.0
        self._mean_gap_s = MAX_GAP_S
        self._cond = threading.Condition()
        self._queue: deque[_Route] = deque()
        self._expected = 0  # channel appends done whose route is not queued yet
        self._closed = False
        self.requests_sent = 0
        # the version sent (a main not upgraded yet: the older one for a while)
        self.versions = VersionProbe(ZONE_ROUTE_VERSION, OLDEST_PACKED_ZONE_ROUTE_VERSION)
        self.session = ProxyRouteSession()  # version 4's state, used by the thread only
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
            now = item.queued_at = self._clock()
            if now - self._last_arrival > BURST_GAP_S:
                gap = min(now - self._last_burst, MAX_GAP_S)
                self._mean_gap_s += GAP_WEIGHT * (gap - self._mean_gap_s)
                self._last_burst = now
            self._last_arrival = now
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

    def adaptive_linger_s(self) -> float:
        """How long a batch waits after its first route for the next produce request's:
        the mean gap between bursts of routes when that is at most `max_linger_s` (the
        next burst is due), else 0 (waiting would not merge anything)."""
        with self._cond:
            gap = self._mean_gap_s
        return gap if gap <= self.max_linger_s else 0.0

    def _take(self) -> list[_Route] | None:
        """The next batch: once routes are queued, at most `linger_s` more while routes
        whose channel append is done are still expected, and until the adaptive linger
        after the first queued route has passed; routes of one route epoch."""
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            now = self._clock()
            expected_until = now + self.linger_s
            gap = self._mean_gap_s
            linger_until = self._queue[0].queued_at + (gap if gap <= self.max_linger_s else 0.0)
            while len(self._queue) < MAX_BATCH_ENTRIES and not self._closed:
                until = max(linger_until, expected_until if self._expected > 0 else now)
                remaining = until - self._clock()
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
        version = self.versions.version()
        timeout_ms = max(item.timeout_ms for item in batch)
        entries = [
            (uuid.UUID(item.topic_id), item.partition, item.channel_offset) for item in batch
        ]
        error, message, answers = self._call(version, batch[0].epoch, timeout_ms, entries)
        if version >= 4 and error == KafkaError.FETCH_SESSION_ID_NOT_FOUND:
            # the main does not have the route session as this proxy does (it restarted):
            # nothing was appended; a new session carries every topic again
            error, message, answers = self._call(version, batch[0].epoch, timeout_ms, entries)
        if error:  # the whole request refused (a fenced epoch, a bad channel)
            return [(error, message, -1, -1, -1)] * len(batch)
        if len(answers) != len(batch):
            raise ConnectionError(f"{len(answers)} route answers for {len(batch)} routes")
        return answers

    def _call(
        self, version: int, epoch: int, timeout_ms: int, entries: list
    ) -> tuple[int, str | None, list]:
        """One `ZoneRouteRequest` of `version` and its answer: the request's error code and
        message, and the entries' answers (version 4+: packed against the route session,
        which the answer confirms or, refused, unanswered or unreadable, resets). Raises
        ConnectionError when it fails or the answers are unreadable."""
        Q = ZoneRouteRequest[version]
        # version 2: the channel is the source node's (no prefix, no bucket: each entry's
        # offset names its own segment and bucket), the entries packed; 3: all packed; 4:
        # packed against the route session; 5: its answers too
        if version >= 4:
            req = Q(
                packed_entries=self.session.pack(epoch, self.source_node_id, timeout_ms, entries)
            )
        elif version >= 3:
            req = Q(packed_entries=pack_request(epoch, self.source_node_id, timeout_ms, entries))
        else:
            req = Q(
                route_epoch=epoch,
                source_node_id=self.source_node_id,
                timeout_ms=timeout_ms,
                packed_entries=pack_entries(entries),
            )
        try:
            resp = self.conn.call(
                req, max(timeout_ms, 1) / 1000 + RPC_EXTRA_TIMEOUT_S, ZONE_ROUTE_KEY, version
            )
        except Exception:
            self.versions.failed(version)  # a main not upgraded yet closes the connection
            if version >= 4:
                self.session.reset()  # the main may or may not have taken it
            raise
        self.versions.answered(version)
        self.requests_sent += 1
        packed = bytes(resp.packed_answers or b"")
        try:
            if version >= 5:
                self.session.confirm()  # the answers are packed against its new state
                error, message, answers = unpack_answers_v5(packed, entries, self.session.state)
            else:
                error, message = resp.error_code, resp.error_message
                answers = [] if error else unpack_answers(packed, version >= 4)
        except ValueError as exc:
            if version >= 4:
                self.session.reset()
            raise ConnectionError(f"bad zone route answers: {exc}") from None
        if version >= 4:
            if error:
                self.session.reset()
            else:
                self.session.confirm()
        return error, message, answers
