"""The broker's cluster metadata APIs: Metadata (auto-creating missing topics when asked),
DescribeCluster, FindCoordinator, and InitProducerId without a transactional id (producer
ids come from the controller in blocks; one with a transactional id goes to the transaction
handlers, dataplane/kafka/txn/handlers.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from kafka.protocol.admin import DescribeClusterResponse
from kafka.protocol.metadata import FindCoordinatorResponse, MetadataResponse
from kafka.protocol.producer import InitProducerIdResponse

from controlplane import requests as cmd
from controlplane.calls import build_request
from controlplane.coordinators import group_coordinator, txn_coordinator
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from controlplane.topics import validate_topic_name
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.api_context import BrokerApiContext
from dataplane.kafka.security.authorizer import supported_operation_codes

if TYPE_CHECKING:
    from dataplane.kafka.txn.handlers import TxnHandlers

log = logging.getLogger(__name__)

CLUSTER_ID = "automq-local-cluster"
PRODUCER_ID_BLOCK = 1000


def legal_topic_name(name: str) -> bool:
    """Whether `name` passes Kafka's topic-name rules (the controller's own check)."""
    try:
        validate_topic_name(name)
    except ControllerError:
        return False
    return True


def coordinator_for(key: str, image: MetadataImage) -> int | None:
    """The broker that coordinates a group: the live owner of the group's coordinator slot
    (`controlplane/coordinators.py`), the same answer on every broker for one image; None
    while the slot is unassigned or its owner is fenced."""
    return group_coordinator(image, key)


def _topic_name(image: MetadataImage, requested) -> str | None:
    """The name a Metadata request topic asks for: its name, or (v10+, name null) the name
    of the topic with its id (KIP-848 consumers look assigned topics up by id)."""
    name = getattr(requested, "name", None)
    topic_id = getattr(requested, "topic_id", None)
    if name is None and topic_id is not None and topic_id.int != 0:
        topic = image.topics.get(str(topic_id))
        return None if topic is None else topic.name
    return name


class MetadataApis:
    """Handlers of the cluster metadata, coordinator and producer-id APIs."""

    def __init__(
        self,
        broker: BrokerApiContext,
        node_epoch_fn: Callable[[], int],
        txn_fn: Callable[[], TxnHandlers | None],
    ):
        self.broker = broker
        self.node_epoch_fn = node_epoch_fn
        # the transaction APIs (dataplane/kafka/txn/handlers.py) once the broker's wiring set
        # them: InitProducerId with a transactional id goes there
        self.txn_fn = txn_fn
        self._pid_lock = threading.Lock()
        self._pid_next = 0
        self._pid_end = 0

    async def metadata(self, req, ctx):
        """Brokers and topics (partition leaders, replicas, ISR) as the client's listener and
        AZ see them; missing topics are auto-created when the request allows it, except
        illegal names, answered INVALID_TOPIC_EXCEPTION at once (Kafka's auto-creation
        manager; without auto-creation they are UNKNOWN_TOPIC_OR_PARTITION, as there)."""
        v = ctx.api_version
        wanted, illegal, image = await self._auto_create_missing(req, v)
        R = MetadataResponse
        # asked-for authorized operations: every operation (no authorizer here; with ACLs
        # the ACL rule narrows them to the principal's); None: "not provided"
        topic_ops = (
            supported_operation_codes("TOPIC")
            if v >= 8 and getattr(req, "include_topic_authorized_operations", False)
            else None
        )
        # like Kafka: the endpoints of the listener the client connected on; a broker
        # without that listener is left out, and its partitions answer LISTENER_NOT_FOUND.
        # A client that declares its AZ is told only that AZ's brokers (zone router)
        listener = ctx.extras.get("listener")
        az = self.broker.client_az(ctx)
        brokers = []
        for b in self.broker.routing.brokers_for(image, az):
            endpoint = b.endpoint(listener)
            if endpoint is not None:
                brokers.append(
                    R.MetadataResponseBroker(
                        node_id=b.node_id, host=endpoint[0], port=endpoint[1], rack=b.az
                    )
                )
        listed = {b.node_id for b in brokers}
        topics = []
        live_ids = {b.node_id for b in brokers}
        names = wanted if wanted is not None else sorted(t.name for t in image.topics.values())
        for name in names:
            topic = image.topic_by_name(name) if name else None
            if topic is None:
                topics.append(
                    R.MetadataResponseTopic(
                        error_code=(
                            KafkaError.INVALID_TOPIC_EXCEPTION
                            if name in illegal
                            else KafkaError.UNKNOWN_TOPIC_OR_PARTITION
                        ),
                        name=name,
                        topic_id=uuid.UUID(int=0),
                        is_internal=False,
                        partitions=[],
                    )
                )
                continue
            parts = []
            for p in sorted(topic.partitions.values(), key=lambda p: p.partition):
                placed = self.broker.routing.placement(image, p, az, live_ids)
                serving = placed.leader
                if serving is None:
                    error = KafkaError.LEADER_NOT_AVAILABLE
                elif serving not in listed:
                    error, serving = KafkaError.LISTENER_NOT_FOUND, None
                else:
                    error = KafkaError.NONE
                parts.append(
                    R.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=error,
                        partition_index=p.partition,
                        leader_id=serving if serving is not None else -1,
                        leader_epoch=p.leader_epoch,
                        replica_nodes=placed.replicas,
                        isr_nodes=placed.isr,
                        offline_replicas=[],
                    )
                )
            topics.append(
                R.MetadataResponseTopic(
                    error_code=KafkaError.NONE,
                    name=topic.name,
                    topic_id=uuid.UUID(topic.topic_id),
                    is_internal=False,
                    partitions=parts,
                    authorized_operations=topic_ops,
                )
            )
        controller_id = brokers[0].node_id if brokers else -1
        cluster_ops = (
            supported_operation_codes("CLUSTER")
            if 8 <= v <= 10 and getattr(req, "include_cluster_authorized_operations", False)
            else None
        )
        return R[v](
            throttle_time_ms=0,
            brokers=brokers,
            cluster_id=CLUSTER_ID,
            controller_id=controller_id,
            topics=topics,
            authorized_operations=cluster_ops,
        )

    async def _auto_create_missing(
        self, req, v: int
    ) -> tuple[list[str] | None, set[str], MetadataImage]:
        """(the topic names asked, None for all; the illegal ones refused; the image after
        auto-creating the missing legal ones when the request and the broker allow it)."""
        image = self.broker.image_fn()
        wanted = None if req.topics is None else [_topic_name(image, t) for t in req.topics]
        if wanted is not None and v == 0 and not wanted:
            wanted = None  # v0: an empty list means all topics
        auto = self.broker.topic_creation.auto_create and bool(
            getattr(req, "allow_auto_topic_creation", True)
        )
        missing = [
            n for n in (wanted or []) if n is not None and (not n or image.topic_by_name(n) is None)
        ]
        illegal = {n for n in missing if not legal_topic_name(n)} if auto else set()
        creatable = [n for n in missing if n not in illegal]
        if creatable and auto:
            await self.broker.run_io(self._auto_create, creatable)
            image = self.broker.image_fn()
        return wanted, illegal, image

    async def describe_cluster(self, req, ctx):
        """The brokers (Kafka's AdminClient.describeCluster), each with its endpoint on the
        listener the client connected on, as Metadata; fenced ones only when v2 asks."""
        v = ctx.api_version
        R = DescribeClusterResponse
        fields: dict = {}
        if v >= 1:
            fields["endpoint_type"] = 1
            if getattr(req, "endpoint_type", 1) != 1:  # 2: controllers, not served by brokers
                return R[v](
                    throttle_time_ms=0,
                    error_code=KafkaError.UNSUPPORTED_ENDPOINT_TYPE,
                    error_message="brokers describe brokers only (endpoint type 1)",
                    cluster_id=CLUSTER_ID,
                    controller_id=-1,
                    brokers=[],
                    **fields,
                )
        image = self.broker.image_fn()
        fenced_too = v >= 2 and bool(getattr(req, "include_fenced_brokers", False))
        listener = ctx.extras.get("listener")
        brokers = []
        for b in sorted(image.brokers.values(), key=lambda b: b.node_id):
            endpoint = b.endpoint(listener)
            if endpoint is None or (b.fenced and not fenced_too):
                continue
            extra = {"is_fenced": b.fenced} if v >= 2 else {}
            brokers.append(
                R.DescribeClusterBroker(
                    broker_id=b.node_id, host=endpoint[0], port=endpoint[1], rack=b.az, **extra
                )
            )
        active = [b.broker_id for b in brokers if not (v >= 2 and b.is_fenced)]
        if getattr(req, "include_cluster_authorized_operations", False):
            fields["authorized_operations"] = supported_operation_codes("CLUSTER")
        return R[v](
            throttle_time_ms=0,
            error_code=KafkaError.NONE,
            error_message=None,
            cluster_id=CLUSTER_ID,
            controller_id=active[0] if active else -1,
            brokers=brokers,
            **fields,
        )

    def _auto_create(self, names: list[str]) -> None:
        for name in names:
            try:
                self.broker.controller.create_topic(
                    build_request(
                        cmd.CreateTopicRequest,
                        name=name,
                        partitions=self.broker.topic_creation.default_partitions,
                    )
                )
            except ControllerError as exc:
                if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                    log.info("auto-creating topic %r failed: %s", name, exc)
        self.broker.await_topics(names)

    async def find_coordinator(self, req, ctx):
        """The broker coordinating each group (key type 0) or transactional id (1), as the
        client's listener and AZ reach it."""
        v = ctx.api_version
        R = FindCoordinatorResponse
        image = self.broker.image_fn()
        keys = list(req.coordinator_keys) if v >= 4 else [req.key]
        key_type = getattr(req, "key_type", 0)
        found = []
        for key in keys:
            if key_type not in (0, 1) or (key_type == 1 and not key):
                found.append((key, KafkaError.INVALID_REQUEST, -1, "", -1))
                continue
            if key_type == 0:
                node = coordinator_for(key, image)
            else:  # 1: a transactional id
                node = txn_coordinator(image, key)
            if node is not None:
                # a client of an AZ: the broker its routing names (the zone router's proxy
                # forwards the coordinator requests to the coordinator)
                node = self.broker.routing.leader_for(image, node, self.broker.client_az(ctx))
            broker = image.brokers.get(node) if node is not None else None
            # the coordinator's endpoint on the listener the client connected on
            endpoint = broker.endpoint(ctx.extras.get("listener")) if broker else None
            if broker is None or endpoint is None:
                log.info(
                    "no coordinator for %r (key type %d) yet: %d slots, image offset %d",
                    key,
                    key_type,
                    len(image.coordinator_slots),
                    image.offset,
                )
                found.append((key, KafkaError.COORDINATOR_NOT_AVAILABLE, -1, "", -1))
            else:
                found.append((key, KafkaError.NONE, broker.node_id, endpoint[0], endpoint[1]))
        if v >= 4:
            return R[v](
                throttle_time_ms=0,
                coordinators=[
                    R.Coordinator(
                        key=k, node_id=n, host=h, port=p, error_code=e, error_message=None
                    )
                    for k, e, n, h, p in found
                ],
            )
        _, e, n, h, p = found[0]
        return R[v](throttle_time_ms=0, error_code=e, error_message=None, node_id=n, host=h, port=p)

    def next_producer_id(self) -> int:
        """A new producer id, from the block this broker holds (a new block from the
        controller when it is used up; blocking)."""
        with self._pid_lock:
            if self._pid_next >= self._pid_end:
                res = self.broker.controller.allocate_producer_ids(
                    cmd.AllocateProducerIdsRequest(
                        node_id=self.broker.me.node_id,
                        node_epoch=self.node_epoch_fn(),
                        count=PRODUCER_ID_BLOCK,
                    )
                )
                self._pid_next = res.first_producer_id
                self._pid_end = self._pid_next + res.count
            pid = self._pid_next
            self._pid_next += 1
            return pid

    async def init_producer_id(self, req, ctx):
        """A producer id (epoch 0) for an idempotent producer; a transactional id goes to the
        transaction handlers."""
        v = ctx.api_version
        txn = self.txn_fn()
        if req.transactional_id is not None and txn is not None:
            return await txn.init_producer_id(req, ctx)
        if req.transactional_id is not None:
            return InitProducerIdResponse[v](
                throttle_time_ms=0,
                error_code=KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                producer_id=-1,
                producer_epoch=-1,
            )
        try:
            pid = await self.broker.run_io(self.next_producer_id)
        except ControllerError as exc:
            log.warning("producer id allocation failed: %s", exc)
            return InitProducerIdResponse[v](
                throttle_time_ms=0,
                error_code=KafkaError.COORDINATOR_NOT_AVAILABLE,
                producer_id=-1,
                producer_epoch=-1,
            )
        return InitProducerIdResponse[v](
            throttle_time_ms=0, error_code=KafkaError.NONE, producer_id=pid, producer_epoch=0
        )
