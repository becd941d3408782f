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
import threading
import time
from collections import OrderedDict
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

MAX_CLIENT_RACK_HOSTS = 65_536  # client hosts whose rack is remembered (oldest forgotten)


class ClientRacks:
    """The rack id (`client.rack`, KIP-392) the Fetch requests from each client host
    carried, remembered for every connection from that host: Metadata and FindCoordinator
    carry no rack, and a client opens several connections (one host is in one AZ). Bounded
    (MAX_CLIENT_RACK_HOSTS, least recently set forgotten). Thread-safe (one lock)."""

    def __init__(self, max_hosts: int = MAX_CLIENT_RACK_HOSTS):
        self._racks: OrderedDict[str, str] = OrderedDict()
        self._max_hosts = max_hosts
        self._lock = threading.Lock()

    def note(self, host: str, rack: str | None) -> None:
        """`host` sent a Fetch with `rack` (empty or None: nothing changes)."""
        if not rack or len(rack) > MAX_AZ_CHARS:
            return
        with self._lock:
            if self._racks.get(host) == rack:
                return
            self._racks.pop(host, None)
            self._racks[host] = rack
            while len(self._racks) > self._max_hosts:
                self._racks.popitem(last=False)

    def rack_of(self, host: str | None) -> str | None:
        if host is None:
            return None
        with self._lock:
            return self._racks.get(host)


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
        # the client.rack of each client host, from its Fetch requests
        self.client_racks = ClientRacks()

    async def run_io(self, fn, *args):
        """`fn(*args)` on the I/O pool, awaited from the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    def client_az(self, ctx) -> str | None:
        """The AZ of the client of a request (its client id, the rack the Fetch requests
        from its host carried, or its address), if it has one."""
        peer = getattr(ctx, "peer", None)
        host = peer[0] if peer else None
        return self.routing.client_az(
            getattr(ctx, "client_id", None), host, self.client_racks.rack_of(host)
        )

    def note_client_rack(self, ctx, rack: str | None) -> None:
        """Remember the rack id (`client.rack`) a Fetch carried for its client's host:
        every request from that host (Metadata and FindCoordinator carry none) places the
        client in that AZ from then on (an empty one changes nothing)."""
        peer = getattr(ctx, "peer", None)
        if peer:
            self.client_racks.note(peer[0], rack)

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
