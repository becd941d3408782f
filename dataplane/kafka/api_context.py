"""What the broker's Kafka API handlers share: the broker's identity, its metadata image, the
controller, its partitions, the client routing, the I/O pool and the network limits
(`BrokerApiContext`), and the mapping of controller errors to Kafka error codes.

The handlers live by concept in `data_apis.py` (Produce, Fetch, ListOffsets,
OffsetForLeaderEpoch), `metadata_apis.py` (Metadata, DescribeCluster, FindCoordinator,
InitProducerId) and `topic_admin_apis.py` (Create/DeleteTopics, CreatePartitions,
Describe/Alter configs); `apis.py` composes them into the `KafkaApis` the broker constructs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from controlplane.calls import ControllerCalls
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage
from dataplane.config import DEFAULT_PARTITIONS
from dataplane.formats.client_az import MAX_AZ_CHARS
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.network_limits import NetworkLimits
from dataplane.kafka.partition_backend import ClientRouting, PartitionResolver

# ctx.extras key: the rack id (`client.rack`) a connection's Fetch requests carried
CLIENT_RACK_KEY = "client_rack"

log = logging.getLogger(__name__)

METADATA_WAIT_S = 10.0

_CONTROLLER_TO_KAFKA = {
    ErrorCode.TOPIC_ALREADY_EXISTS: KafkaError.TOPIC_ALREADY_EXISTS,
    ErrorCode.INVALID_TOPIC_NAME: KafkaError.INVALID_TOPIC_EXCEPTION,
    ErrorCode.UNKNOWN_TOPIC: KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    ErrorCode.INVALID_PARTITIONS: KafkaError.INVALID_PARTITIONS,
    ErrorCode.NOT_ENOUGH_BROKERS: KafkaError.INVALID_REPLICATION_FACTOR,
    ErrorCode.INVALID_REQUEST: KafkaError.INVALID_REQUEST,
    ErrorCode.INVALID_CONFIG: KafkaError.INVALID_CONFIG,
}


def kafka_error(exc: ControllerError) -> KafkaError:
    """The Kafka error code a client is answered for a controller error."""
    return _CONTROLLER_TO_KAFKA.get(
        exc.code,
        KafkaError.REQUEST_TIMED_OUT
        if exc.code in (ErrorCode.NO_LEADER, ErrorCode.TIMEOUT)
        else KafkaError.UNKNOWN_SERVER_ERROR,
    )


@dataclass(frozen=True)
class TopicCreation:
    """How topics are created without their own settings: the partition count when none is
    given (Kafka's num.partitions) and whether Metadata may create missing topics (Kafka's
    auto.create.topics.enable)."""

    default_partitions: int = DEFAULT_PARTITIONS
    auto_create: bool = True


@dataclass
class BrokerIdentity:
    """This broker as its clients reach it: node id, Kafka host and port, and its AZ."""

    node_id: int
    host: str
    port: int
    az: str


class BrokerApiContext:
    """The broker state every API handler reads: never replaced by the handlers (a test may
    swap `io` or `routing`; handlers read them at each call). Engine calls may block on S3 or
    the controller: `run_io` keeps them off the event loop."""

    def __init__(
        self,
        me: BrokerIdentity,
        image_fn: Callable[[], MetadataImage],
        wait_for_offset: Callable[[int, float], bool],
        controller: ControllerCalls,
        partitions: PartitionResolver,
        routing: ClientRouting,
        io: Executor,
        topic_creation: TopicCreation = TopicCreation(),
        network: NetworkLimits | None = None,
    ):
        self.me = me
        self.topic_creation = topic_creation
        self.image_fn = image_fn
        self.wait_for_offset = wait_for_offset
        self.controller = controller
        self.partitions = partitions
        # what a client is told and served, by its AZ (the zone router) or not
        self.routing = routing
        self.io = io
        # ingress / egress limits of produced and fetched bytes (network_limits.py)
        self.network = network or NetworkLimits.unlimited()

    async def run_io(self, fn, *args):
        """`fn(*args)` on the I/O pool, awaited from the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    def client_az(self, ctx) -> str | None:
        """The AZ of the client of a request (its client id, the rack its Fetch requests
        carried on this connection, or its address), if it has one."""
        peer = getattr(ctx, "peer", None)
        extras = getattr(ctx, "extras", None)
        rack = extras.get(CLIENT_RACK_KEY) if extras else None
        return self.routing.client_az(
            getattr(ctx, "client_id", None), peer[0] if peer else None, rack
        )

    @staticmethod
    def note_client_rack(ctx, rack: str | None) -> None:
        """Remember the rack id (`client.rack`) a Fetch carried for the rest of its
        connection: Metadata and FindCoordinator carry none, and a client that sent one
        is placed in that AZ from then on (an empty one changes nothing)."""
        extras = getattr(ctx, "extras", None)
        if rack and extras is not None and len(rack) <= MAX_AZ_CHARS:
            extras[CLIENT_RACK_KEY] = rack

    def await_topics(self, names: list[str], present: bool = True) -> None:
        """Wait (blocking, up to METADATA_WAIT_S) until this broker's image holds the topics
        (and it opened the partitions it leads), or, `present=False`, no longer holds them."""
        deadline = time.monotonic() + METADATA_WAIT_S
        while time.monotonic() < deadline:
            image = self.image_fn()
            if all((image.topic_by_name(n) is not None) == present for n in names):
                if not present:
                    return
                # and this broker opened the partitions it leads
                ok = True
                for n in names:
                    t = image.topic_by_name(n)
                    for p in t.partitions.values():
                        if (
                            p.leader_node_id == self.me.node_id
                            and self.partitions.get(t.topic_id, p.partition) is None
                        ):
                            ok = False
                if ok:
                    return
            time.sleep(0.02)
