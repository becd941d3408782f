"""Group and transaction coordinator requests through a proxy (zone router).

A client of an AZ knows only its AZ's brokers (Metadata lists no other); some clients
cannot reach a transaction coordinator their metadata does not list (librdkafka), and the
others would open a connection to another AZ for their group coordinator. So
FindCoordinator names, for a client of an AZ, the coordinator's proxy in the client's AZ
(`ClientRouting.leader_for`, as for partition leaders), and that broker forwards the
client's coordinator requests (groups: JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
OffsetCommit, OffsetFetch, TxnOffsetCommit, DescribeGroups of one group, KIP-848's
ConsumerGroupHeartbeat and ConsumerGroupDescribe of one group, KIP-932's
ShareGroupHeartbeat, ShareGroupDescribe and DescribeShareGroupOffsets of one group,
AlterShareGroupOffsets and DeleteShareGroupOffsets; transactions:
InitProducerId with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) to
the real coordinator and relays its answer. These are small control requests; the state
stays at the coordinator. A request the coordinator cannot be asked (gone, unreachable, too
many in flight) is answered here, where the coordinator is not: NOT_COORDINATOR, so the
client finds the coordinator again. ShareFetch and ShareAcknowledge are not coordinator
requests: they go to the partition's leader (its share-partition holds the record locks),
and an AZ's proxy refuses them (`dataplane/kafka/share/handlers.py`): through a proxy a
share consumer joins its group and is assigned partitions, but reads nothing. The coordinator sees the proxy as the member's host
and this broker's client id (DescribeGroups shows those).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)

from controlplane.coordinators import group_coordinator, txn_coordinator
from controlplane.image import BrokerState, MetadataImage
from dataplane.kafka.groups.consumer_handlers import (
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
)
from dataplane.kafka.interbroker import BrokerConnection, InterBrokerLogin
from dataplane.kafka.share.protocol import (
    AlterShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequest,
    ShareGroupDescribeRequest,
    ShareGroupHeartbeatRequest,
)

log = logging.getLogger(__name__)

TXN_REQUESTS = (
    InitProducerIdRequest,
    AddPartitionsToTxnRequest,
    AddOffsetsToTxnRequest,
    EndTxnRequest,
)
GROUP_REQUESTS = (
    JoinGroupRequest,
    SyncGroupRequest,
    HeartbeatRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    TxnOffsetCommitRequest,
    DescribeGroupsRequest,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupDescribeRequest,
    ShareGroupHeartbeatRequest,
    ShareGroupDescribeRequest,
    DescribeShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequest,
    AlterShareGroupOffsetsRequest,
)
FORWARD_TIMEOUT_S = 30.0  # EndTxn waits for the markers at the coordinator
MAX_FORWARD_TIMEOUT_S = 600.0  # a JoinGroup waits for the rebalance (its timeout)
MAX_CONNECTIONS_PER_COORDINATOR = 64  # requests in flight to one coordinator
# forwards in flight in all (each holds a thread of the proxy's own pool, never one of the
# Kafka APIs' I/O threads: a JoinGroup may wait minutes)
MAX_IN_FLIGHT = 64


def coordinator_key(req) -> tuple[int, str] | None:
    """(FindCoordinator key type, key) of a coordinator request: 0 and the group id, 1 and
    the transactional id; None when it names none (an idempotent InitProducerId) or
    several groups (OffsetFetch v8+ / DescribeGroups of more than one) — pure."""
    if isinstance(req, TXN_REQUESTS):
        tid = getattr(req, "transactional_id", None) or getattr(
            req,
            "v3_and_below_transactional_id",
            None,  # AddPartitionsToTxn v0-3
        )
        return (1, tid) if tid else None
    group = getattr(req, "group_id", None)  # "" where the version has none
    if not group:
        groups = getattr(req, "groups", None) or getattr(req, "group_ids", None) or []
        ids = {getattr(g, "group_id", g) for g in groups}
        group = next(iter(ids)) if len(ids) == 1 else None
    return (0, group) if isinstance(group, str) and group else None


def forward_timeout_s(req) -> float:
    """How long a forwarded request may take: a JoinGroup its rebalance timeout."""
    if isinstance(req, JoinGroupRequest):
        wait_ms = getattr(req, "rebalance_timeout_ms", -1)
        if wait_ms is None or wait_ms < 0:
            wait_ms = getattr(req, "session_timeout_ms", 0)
        return min(max(wait_ms / 1000 + 5.0, FORWARD_TIMEOUT_S), MAX_FORWARD_TIMEOUT_S)
    return FORWARD_TIMEOUT_S


class CoordinatorProxy:
    """Wraps this broker's coordinator handlers: a request of a client of an AZ for a
    group or transactional id coordinated elsewhere is forwarded there, on a pooled
    connection and a thread of its own pool (one per request in flight, at most
    MAX_IN_FLIGHT: a JoinGroup may wait minutes; past it, answered here). Thread-safe."""

    def __init__(
        self,
        node_id: int,
        image_fn: Callable[[], MetadataImage],
        client_az: Callable[[object], str | None],
        login: InterBrokerLogin | None = None,
        on_broker_bytes: Callable[[str, int], None] | None = None,
    ):
        self.node_id = node_id
        self.image_fn = image_fn
        self.client_az = client_az  # (request context) -> the client's AZ or None
        self.login = login
        # (the coordinator's AZ, bytes of a forwarded request and its answer): accounting
        self.on_broker_bytes = on_broker_bytes
        self._pool = ThreadPoolExecutor(MAX_IN_FLIGHT, thread_name_prefix="coordinator-proxy")
        self._in_flight = 0
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, int], list[BrokerConnection]] = {}
        self._busy: dict[tuple[str, int], int] = {}

    @staticmethod
    def forwards(request_class: type) -> bool:
        return request_class in TXN_REQUESTS or request_class in GROUP_REQUESTS

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()

    def _coordinator(self, req, ctx) -> BrokerState | None:
        """The live coordinator elsewhere to forward `req` to, or None (handled here)."""
        key = coordinator_key(req)
        if key is None or self.client_az(ctx) is None:
            return None
        image = self.image_fn()
        find = txn_coordinator if key[0] == 1 else group_coordinator
        node = find(image, key[1])
        broker = image.brokers.get(node) if node is not None else None
        if broker is None or broker.node_id == self.node_id or broker.fenced:
            return None
        return broker

    def _forward(self, broker: BrokerState, req, api_key: int, version: int):
        where = (broker.host, broker.kafka_port)
        with self._lock:
            idle = self._idle.setdefault(where, [])
            if idle:
                conn = idle.pop()
            elif self._busy.get(where, 0) >= MAX_CONNECTIONS_PER_COORDINATOR:
                raise ConnectionError(f"{MAX_CONNECTIONS_PER_COORDINATOR} requests in flight")
            else:
                count = self.on_broker_bytes
                conn = BrokerConnection(
                    *where,
                    self.login,
                    None if count is None else (lambda n, az=broker.az: count(az, n)),
                )
            self._busy[where] = self._busy.get(where, 0) + 1
        ok = False
        try:
            resp = conn.call(req, forward_timeout_s(req), api_key, version)
            ok = True
            return resp
        finally:
            with self._lock:
                self._busy[where] -= 1
                if ok:
                    self._idle.setdefault(where, []).append(conn)
            if not ok:
                conn.close()

    def wrap(self, handler: Callable) -> Callable:
        """`handler`, forwarding what a coordinator elsewhere must answer."""

        async def forwarding(req, ctx):
            broker = self._coordinator(req, ctx)
            if broker is None:
                return await handler(req, ctx)
            with self._lock:
                full = self._in_flight >= MAX_IN_FLIGHT
                if not full:
                    self._in_flight += 1
            if full:
                return await handler(req, ctx)  # NOT_COORDINATOR: the client retries
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    self._pool, self._forward, broker, req, int(req.API_KEY), ctx.api_version
                )
            except (OSError, ConnectionError, ValueError, RuntimeError) as exc:
                log.info("forwarding to coordinator %d failed: %s", broker.node_id, exc)
                return await handler(req, ctx)  # not the coordinator here: NOT_COORDINATOR
            finally:
                with self._lock:
                    self._in_flight -= 1

        return forwarding
