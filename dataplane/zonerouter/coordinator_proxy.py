"""Transaction coordinator requests through a proxy (zone router).

A client of an AZ knows only its AZ's brokers (Metadata lists no other), and some clients
(librdkafka) cannot reach a transaction coordinator their metadata does not list. So
FindCoordinator for a transactional id names the coordinator's proxy in the client's AZ
(`ClientRouting.leader_for`, as for partition leaders), and that broker forwards the
client's InitProducerId (transactional), AddPartitionsToTxn, AddOffsetsToTxn and EndTxn to
the real coordinator and relays its answer (small control requests; the transaction state
stays at the coordinator, which writes the markers to the partitions' mains). A request the
coordinator cannot be asked (gone, unreachable) is answered here: NOT_COORDINATOR, so the
client finds the coordinator again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable

from kafka.protocol.producer import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
)

from controlplane.coordinators import txn_coordinator
from controlplane.image import BrokerState, MetadataImage
from dataplane.kafka.txn.marker_client import InterBrokerLogin
from dataplane.zonerouter.proxy import _MainConnection

log = logging.getLogger(__name__)

FORWARDED_REQUESTS = (
    InitProducerIdRequest,
    AddPartitionsToTxnRequest,
    AddOffsetsToTxnRequest,
    EndTxnRequest,
)
FORWARD_TIMEOUT_S = 30.0  # EndTxn waits for the markers at the coordinator


class TxnCoordinatorProxy:
    """Wraps the transaction handlers of this broker: a request of a client of an AZ for a
    transactional id coordinated elsewhere is forwarded there (one connection per
    coordinator, requests serialized on it). Thread-safe."""

    def __init__(
        self,
        node_id: int,
        image_fn: Callable[[], MetadataImage],
        client_az: Callable[[object], str | None],
        io: Callable[..., Awaitable],
        login: InterBrokerLogin | None = None,
    ):
        self.node_id = node_id
        self.image_fn = image_fn
        self.client_az = client_az  # (request context) -> the client's AZ or None
        self.io = io  # run a blocking call off the event loop: await io(fn, *args)
        self.login = login
        self._lock = threading.Lock()
        self._connections: dict[tuple[str, int], _MainConnection] = {}

    @staticmethod
    def forwards(request_class: type) -> bool:
        return request_class in FORWARDED_REQUESTS

    def close(self) -> None:
        with self._lock:
            conns = list(self._connections.values())
            self._connections.clear()
        for conn in conns:
            conn.close()

    def _coordinator(self, req, ctx) -> BrokerState | None:
        """The live coordinator elsewhere to forward `req` to, or None (handled here)."""
        transactional_id = getattr(req, "transactional_id", None) or getattr(
            req,
            "v3_and_below_transactional_id",
            None,  # AddPartitionsToTxn v0-3
        )
        if not transactional_id or self.client_az(ctx) is None:
            return None
        image = self.image_fn()
        node = txn_coordinator(image, transactional_id)
        broker = image.brokers.get(node) if node is not None else None
        if broker is None or broker.node_id == self.node_id or broker.fenced:
            return None
        return broker

    def _forward(self, broker: BrokerState, req, api_key: int, version: int):
        with self._lock:
            key = (broker.host, broker.kafka_port)
            conn = self._connections.get(key)
            if conn is None:
                conn = self._connections[key] = _MainConnection(*key, self.login)
        return conn.call(req, FORWARD_TIMEOUT_S, api_key, version)

    def wrap(self, handler: Callable) -> Callable:
        """`handler`, forwarding what a coordinator elsewhere must answer."""

        async def forwarding(req, ctx):
            broker = self._coordinator(req, ctx)
            if broker is None:
                return await handler(req, ctx)
            try:
                return await self.io(self._forward, broker, req, int(req.API_KEY), ctx.api_version)
            except (OSError, ConnectionError, ValueError) as exc:
                log.info("forwarding to coordinator %d failed: %s", broker.node_id, exc)
                return await handler(req, ctx)  # not the coordinator here: NOT_COORDINATOR

        return forwarding
