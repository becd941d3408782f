"""The composition root: `Broker` builds every part of a broker with constructor injection,
in dependency order, and starts the optional components only when configured or needed.

Start order: the shard store -> register (new node epoch) -> heartbeats (fenced while
starting) -> open and recover the WAL, uploading what was not committed -> partitions,
retention, erasure-coded partitions, the zone router, the Kafka APIs, groups, transactions
-> serve Kafka -> follow the metadata log (every component gets each delta) -> unfenced.

SIGTERM (controlled shutdown): ask the controller to move our partitions to other brokers
(same AZ first); each one is closed here as soon as it moves (in-flight appends made durable,
its WAL data uploaded) and opened by its new leader; then upload the rest, fence our epoch.

Crash failover: when the controller names this node the failover target of a fenced node's
WAL, it recovers that WAL (`wal_failovers.py`). If this node finds itself fenced for good
(paused past its session timeout), its WAL has been taken over: `restart_requested` is set
and the process re-execs itself (`process.py`).

Components: the shard store is started on every broker with object storage (the controller
places erasure shards on any active broker); the zone router too (its main side answers
other AZs' proxies and any client may carry an AZ in its client id).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass

from controlplane.client import ControllerClient
from controlplane.coordinators import group_coordinator
from controlplane.requests import ControlledShutdownRequest, FenceBrokerRequest
from dataplane.broker.components import Component, ComponentAdapter, CoordinatorSlots
from dataplane.broker.heartbeat import BrokerSession, BucketProbes, HeartbeatStats
from dataplane.broker.lease import ControllerLease
from dataplane.broker.listeners import check_listeners, inter_broker_login, secure_listeners
from dataplane.broker.metadata import MetadataFollower
from dataplane.broker.shard_store import ShardStore
from dataplane.broker.stall import StallWatch
from dataplane.broker.wal_failovers import WalFailovers
from dataplane.config import BrokerConfig
from dataplane.kafka.apis import KafkaApis
from dataplane.kafka.erasure_partition import ErasurePartitions
from dataplane.kafka.groups.consumer_coordinator import (
    ConsumerGroupCoordinator,
    GroupTypes,
    topic_info,
    topic_name,
)
from dataplane.kafka.groups.coordinator import GroupCoordinator
from dataplane.kafka.groups.handlers import GroupHandlers, partition_in_image
from dataplane.kafka.offset_store import KVOffsetStore
from dataplane.kafka.partition_manager import PartitionManager
from dataplane.kafka.server import KafkaServerThread
from dataplane.kafka.share import ShareApis, build_share_apis, share_settings
from dataplane.kafka.txn.coordinator import TransactionCoordinator
from dataplane.kafka.txn.handlers import TxnHandlers
from dataplane.objectstore import ObjectStorage, parse_bucket_uris
from dataplane.runtime import EventLoopLagProbe
from dataplane.s3stream.storage import S3Storage
from dataplane.s3stream.wal.factory import wal_uri_for_path
from dataplane.zonerouter.channel import ChannelReaders
from dataplane.zonerouter.route_handler import ZoneRouteHandler
from dataplane.zonerouter.routing import ZoneRouting
from dataplane.zonerouter.traffic import ZoneTraffic
from dataplane.zonerouter.zone_router import ZoneRouter

log = logging.getLogger(__name__)

SHUTDOWN_MOVE_WAIT_S = 30.0  # how long controlled shutdown waits for partitions to move
SHUTDOWN_POLL_S = 0.02
PORT_WAIT_S = 30.0  # how long to wait for the Kafka port held by a dying predecessor
PORT_RETRY_S = 0.5
IO_THREADS = 16  # the Kafka APIs' I/O pool (`kafka-io` in dataplane/runtime.py)
CONTROLLED_SHUTDOWN_TIMEOUT_S = 10
FENCE_TIMEOUT_S = 5
# each metadata-log read of a controller: connecting, and beyond its long poll
METADATA_REQUEST_TIMEOUT_S = 3.0


async def run_in_pool(pool: Executor, fn, *args):
    """`fn(*args)` on `pool`, awaited from the event loop."""
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


@dataclass
class ZoneRouterParts:
    """The zone router (seed 000): this broker's proxy side, the main's route handler, the
    client routing by AZ and their byte counters."""

    traffic: ZoneTraffic
    router: ZoneRouter
    handler: ZoneRouteHandler
    routing: ZoneRouting


@dataclass
class GroupsAndTransactions:
    """The consumer groups' and transactions' coordinators and their API handlers."""

    coordinator: GroupCoordinator
    offset_store: KVOffsetStore
    groups: GroupHandlers
    consumer_groups: ConsumerGroupCoordinator
    txn_coordinator: TransactionCoordinator
    txns: TxnHandlers


class Broker:
    """One broker: its session with the controllers, storage engine, components and Kafka
    server, built and started by `start()`, stopped by `stop()` (controlled shutdown)."""

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.client = ControllerClient(
            config.controllers,
            api_secret=config.controller_api_secret,
            ca_file=config.controller_ca_file,
        )
        # a long poll of a controller whose host is lost ends within a few seconds
        self.metadata = MetadataFollower(
            self.client.with_timeouts(self.client.timeout_s, METADATA_REQUEST_TIMEOUT_S)
        )
        # a process stopped past its session serves nothing until a later heartbeat
        self.stall = StallWatch()
        # a broker no controller answered for a session fences itself (lease.py)
        self.lease = ControllerLease(self._on_lease_lost, lambda: None)
        self.restart_requested = threading.Event()
        # erasure shards may be placed on any broker: every broker with storage serves them
        self.shard_store = ShardStore(config) if config.bucket_uris else None
        self.login = inter_broker_login(config)  # one login for every inter-broker client
        # the data plane, built by start() (None for a broker without object storage)
        self.storage: S3Storage | None = None
        self.partitions: PartitionManager | None = None
        self.kafka: KafkaServerThread | None = None
        self.heartbeat_stats: HeartbeatStats | None = None
        self.probes: BucketProbes | None = None
        self.components: list[Component] = []  # started in order, stopped in reverse
        self.session: BrokerSession | None = None

    @property
    def wal_uri(self) -> str:
        """This broker's WAL (the URI other brokers take over on a crash failover)."""
        return self.config.wal.uri or wal_uri_for_path(self.config.data_dir / "storage" / "wal")

    @property
    def node_epoch(self) -> int:
        """The current node epoch (0 before registration)."""
        return (self.session.node_epoch if self.session is not None else None) or 0

    def _on_registered(self, node_epoch: int) -> None:
        if self.storage is not None:
            self.storage.node_epoch = node_epoch

    def _serving(self) -> bool:
        """Whether partitions may be served: not stopped past the session, lease held."""
        return self.stall.serving() and self.lease.holds()

    def _on_lease_lost(self) -> None:
        """Self-fenced: clients go elsewhere at once (new connections are refused)."""
        if self.kafka is not None:
            self.kafka.close_connections("no controller answered for a session (self-fenced)")

    def _request_restart(self) -> None:
        self.restart_requested.set()
        if self.session is not None:
            self.session.stop()
        if self.probes is not None:
            self.probes.stop()

    def start(self) -> None:
        """Register, build and start the data plane, follow metadata, unfence."""
        # a listener that must not start is refused before registering: no epoch, no WAL
        check_listeners(self.config)
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        if self.shard_store is not None:
            self.shard_store.start()  # before registering: its port is registered
        self.session = BrokerSession(
            self.config,
            self.client,
            self.metadata,
            self.stall,
            self.lease,
            self.wal_uri,
            self.shard_store.port if self.shard_store is not None else 0,
            stats=lambda: self.heartbeat_stats,
            on_registered=self._on_registered,
            serving_data=lambda: self.storage is not None,
            request_restart=self._request_restart,
        )
        self.session.register()
        self.stall.start()
        self.lease.start()
        self.session.start()  # keeps the session alive (fenced) while starting
        if self.config.bucket_uris:
            self._start_data_plane()
        self.metadata.start()
        self.session.finish_starting()
        self.session.heartbeat()  # unfenced now

    # ------------------------------------------------------------ the data plane

    def _start_data_plane(self) -> None:
        """Build the data plane in dependency order (every part gets what it needs in its
        constructor), start it, subscribe its components to the metadata follower."""
        cfg = self.config
        objects = ObjectStorage(parse_bucket_uris(cfg.bucket_uris), cfg.object_store)
        # the zone router's main keeps Link Records in its WAL: recovery reads their data
        # back from the proxies' RouterChannels
        channel_readers = ChannelReaders(objects)
        self.storage = storage = self._build_storage(objects, channel_readers)
        self.probes = BucketProbes(cfg, objects)
        self.probes.start()
        recovered = storage.start()
        log.info("storage engine started (%d batches recovered from the WAL)", recovered)
        self.partitions = partitions = PartitionManager(
            cfg.node_id, storage, lambda: self.metadata.caught_up, self._serving
        )
        partitions.start()
        self.metadata.subscribe(partitions.on_metadata)
        from dataplane.kafka.retention import RetentionManager

        retention = RetentionManager(
            lambda: self.metadata.image,
            partitions.logs,
            check_interval_ms=cfg.retention_check_interval_ms,
            timestamps=partitions.piece_timestamps,
        )
        self._add(ComponentAdapter("retention", retention.start, retention.stop))
        erasure = self._build_erasure(objects, storage)
        io_pool = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="kafka-io")
        run_io = functools.partial(run_in_pool, io_pool)
        zone = self._build_zone_router(objects, storage, channel_readers, erasure, run_io)
        self.heartbeat_stats = HeartbeatStats(
            storage, partitions, objects, zone.traffic, zone.handler
        )
        self._add(WalFailovers(cfg.node_id, storage, lambda: self.metadata.image))
        self._serve_kafka(erasure, zone, io_pool)

    def _build_storage(self, objects: ObjectStorage, channel_readers: ChannelReaders) -> S3Storage:
        """The storage engine: WAL, uploads, object-storage failover."""
        cfg = self.config
        storage = S3Storage(
            cfg.engine_storage(),
            cfg.node_id,
            self.node_epoch,
            self.client,
            objects,
            data_dir=cfg.data_dir / "storage",
            wal=cfg.wal,
            # object-storage failover: an upload stuck on a bucket writes have left is redone
            # whole in the new active bucket
            active_bucket=lambda: (
                self.metadata.image.active_bucket_id if self.metadata.caught_up else None
            ),
            # the zone router's main keeps Link Records in its WAL: recovery reads their
            # data back from the proxies' RouterChannels
            link_resolver=channel_readers.resolve,
        )
        return storage

    def _build_erasure(self, objects: ObjectStorage, storage: S3Storage) -> ErasurePartitions:
        """Erasure-coded partitions, served by every broker (the rest by their leader)."""
        cfg = self.config
        assert self.shard_store is not None and self.partitions is not None
        erasure = ErasurePartitions(
            cfg.node_id,
            lambda: self.metadata.image,
            self.partitions,
            self.shard_store.store,
            store_secret=cfg.controller_api_secret,
            # decided offsets are sealed into object storage and read back from there
            controller=self.client,
            objects=objects,
            node_epoch_fn=lambda: self.node_epoch,
            read_sealed=storage.read_committed,
            seal_config=cfg.erasure.seal,
        )
        self._add(ComponentAdapter("erasure", stop_fn=erasure.stop))
        return erasure

    def _add(self, component: Component) -> None:
        """Start a component and hand it every later metadata change."""
        component.start()
        self.components.append(component)
        self.metadata.subscribe(component.on_metadata)

    def _build_zone_router(
        self,
        objects: ObjectStorage,
        storage: S3Storage,
        channel_readers: ChannelReaders,
        erasure: ErasurePartitions,
        run_io,
    ) -> ZoneRouterParts:
        """The zone router (seed 000): this broker's RouterChannel and proxy partitions,
        the client routing by AZ, the main's zone-route handler and snapshot reads."""
        from dataplane.formats.client_az import CidrAzMap
        from dataplane.zonerouter.own_channel import own_channel_backend
        from dataplane.zonerouter.snapshot import LinkIndex
        from dataplane.zonerouter.snapshot_read import SnapshotReader, SnapshotServer

        cfg = self.config
        image_fn = lambda: self.metadata.image  # noqa: E731
        traffic = ZoneTraffic(cfg.az)
        # snapshot reads: the main indexes its links, the proxy polls the mains for them
        link_index = LinkIndex()
        # transaction markers sent inline with the snapshots
        snapshot_server = SnapshotServer(self.partitions, link_index, io=run_io)
        handler = ZoneRouteHandler(
            image_fn,
            self.partitions,
            channel_readers,
            traffic,
            run_io,
            link_index=link_index,
            snapshot_server=snapshot_server,
        )
        router: ZoneRouter | None = None  # the reader's own records come from the router

        def own_record(offset: int) -> bytes | None:
            return router.recent_record(offset) if router is not None else None

        snapshots = SnapshotReader(
            image_fn, channel_readers, traffic, cfg.node_id, login=self.login,
            own_records=own_record,
        )  # fmt: skip
        router = ZoneRouter(
            cfg.node_id,
            self.node_epoch,
            objects,
            image_fn,
            storage.read_committed,
            traffic,
            login=self.login,
            channel_config=cfg.zone_router.channel,
            ready_fn=lambda: self.metadata.caught_up,
            snapshots=snapshots,
        )
        self._add(
            ComponentAdapter(
                "zone-router",
                router.start,
                router.close,
                lambda delta, image: router.on_metadata(image),
            )
        )
        routing = ZoneRouting(
            cfg.node_id,
            image_fn,
            erasure,  # erasure-coded partitions first, then the ones this broker leads
            router.proxy_partition,
            CidrAzMap.parse(cfg.zone_router.client_az_cidrs),
            traffic,
            # every produce at a main through its own channel (when other AZs have
            # brokers): a proxy's first snapshot of a partition finds its whole unuploaded tail
            own_channel=lambda topic_id, plog, through_channel: own_channel_backend(
                router, handler, plog, topic_id, through_channel
            ),
            channel_mode=cfg.zone_router.channel_mode,
        )
        return ZoneRouterParts(traffic, router, handler, routing)

    def _build_coordinators(self, next_producer_id) -> GroupsAndTransactions:
        """The group coordinator, its offset store and handlers; the transaction
        coordinator and its handlers (producer ids from `next_producer_id`)."""
        from dataplane.kafka.txn.handlers import complete_group_offsets
        from dataplane.kafka.txn.marker_client import send_write_txn_markers

        cfg = self.config
        image_fn = lambda: self.metadata.image  # noqa: E731
        partitions = self.partitions
        assert partitions is not None

        def coordinates(group: str) -> bool:
            # a coordinator mid-replay could serve offsets older than the previous
            # coordinator's last commit
            return group_coordinator(image_fn(), group) == cfg.node_id and self.metadata.caught_up

        coordinator = GroupCoordinator(cfg.groups)
        offset_store = KVOffsetStore(self.client, image_fn, cfg.node_id, lambda: self.node_epoch)
        consumer_groups = ConsumerGroupCoordinator(
            cfg.groups,
            offset_store,
            coordinator,
            lambda name: topic_info(image_fn(), name),
            lambda: image_fn().topic_ids_by_name.keys(),
            lambda topic_id: topic_name(image_fn(), topic_id),
        )
        groups = GroupHandlers(
            coordinator,
            offset_store,
            coordinates,
            partition_exists=lambda topic, partition: partition_in_image(
                image_fn(), topic, partition
            ),
            consumer_groups=consumer_groups,
        )
        txn_coordinator = TransactionCoordinator(
            cfg.node_id,
            image_fn,
            self.client,
            lambda: self.node_epoch,
            next_producer_id,
            partitions,
            lambda slot, pid, commit: complete_group_offsets(offset_store, slot, pid, commit),
            ready_fn=lambda: self.metadata.caught_up,
            send_markers=functools.partial(send_write_txn_markers, login=self.login),
        )
        txns = TxnHandlers(
            txn_coordinator,
            image_fn,
            partitions,
            GroupTypes(coordinator, consumer_groups),
            offset_store,
            coordinates,
        )
        return GroupsAndTransactions(
            coordinator, offset_store, groups, consumer_groups, txn_coordinator, txns
        )

    def _build_share_groups(
        self, apis: KafkaApis, image_fn, coord: GroupsAndTransactions
    ) -> ShareApis:
        """Share groups (KIP-932): coordinated like classic groups (the group's slot), their
        share-partitions at the partitions' leaders; a group id of another type is refused."""
        cfg = self.config
        return build_share_apis(
            apis,
            self.client,
            lambda: self.node_epoch,
            lambda group: (
                group_coordinator(image_fn(), group) == cfg.node_id and self.metadata.caught_up
            ),
            cfg.share_groups,
            other_group_type=lambda group: (
                "classic"
                if coord.coordinator.group_state(group) is not None
                else "consumer"
                if coord.consumer_groups.state_of(group) is not None
                else None
            ),
        )

    def _serve_kafka(
        self, erasure: ErasurePartitions, zone: ZoneRouterParts, io_pool: Executor
    ) -> None:
        """The Kafka APIs, groups and transactions on the server; the coordinator proxy in
        front of the coordinator APIs; the server started on its listeners."""
        from dataplane.kafka.admin_apis import AdminApis
        from dataplane.kafka.api_context import BrokerIdentity, TopicCreation
        from dataplane.kafka.network_limits import NetworkLimits
        from dataplane.kafka.registry import ApiRegistry
        from dataplane.zonerouter.coordinator_proxy import CoordinatorProxy

        cfg = self.config
        image_fn = lambda: self.metadata.image  # noqa: E731
        partitions = self.partitions
        assert partitions is not None
        apis: KafkaApis | None = None  # the coordinator's producer ids come from its block

        def next_producer_id() -> int:
            assert apis is not None
            return apis.cluster.next_producer_id()

        coord = self._build_coordinators(next_producer_id)
        # produced and fetched bytes per second, producer traffic first (seed 002)
        network = NetworkLimits.from_config(cfg.network)
        self._add(network)
        apis = KafkaApis(
            BrokerIdentity(cfg.node_id, cfg.host, cfg.kafka_port, cfg.az),
            image_fn,
            self.metadata.wait_for_offset,
            self.client,
            erasure,
            lambda: self.node_epoch,
            routing=zone.routing,
            io_pool=io_pool,
            txn=coord.txns,
            topic_creation=TopicCreation(cfg.num_partitions, cfg.auto_create_topics_enable),
            network=network,
            share_defaults=share_settings(cfg.share_groups),
        )
        admin = AdminApis(
            cfg.node_id,
            image_fn,
            self.client,
            partitions,
            io_pool,
            routed=lambda topic_id, partition, ctx: zone.routing.get(
                topic_id, partition, apis.client_az(ctx)
            ),
        )
        # clients of an AZ reach their group / transaction coordinator through its proxy
        # in their AZ
        coordinator_proxy = CoordinatorProxy(
            cfg.node_id, image_fn, apis.client_az, self.login, on_broker_bytes=zone.traffic.broker
        )
        self._add(ComponentAdapter("coordinator-proxy", stop_fn=coordinator_proxy.close))
        registry = ApiRegistry()
        share = self._build_share_groups(apis, image_fn, coord)
        for cls, lo, hi, handler in (
            apis.registrations()
            + share.registrations()
            + coord.groups.registrations()
            + admin.registrations()
            + coord.txns.registrations()
            + zone.handler.registrations()
        ):
            handler = share.wrap(cls, handler)  # ListGroups lists share groups too
            if coordinator_proxy.forwards(cls):
                handler = coordinator_proxy.wrap(handler)
            registry.register(cls, lo, hi, handler)
        listeners = secure_listeners(
            cfg, registry, self.client, image_fn, self.metadata.wait_for_offset
        )
        self.kafka = kafka = KafkaServerThread(
            registry,
            max_request_bytes=cfg.max_request_bytes,
            listeners=listeners,
            accepting=self.lease.holds,
        )
        self._start_server(kafka)
        # how late the loop runs what is due: the broker's own share of a produce's wait
        self._add(EventLoopLagProbe(kafka.loop))
        self._add(
            CoordinatorSlots(
                cfg.node_id,
                coord.offset_store.forget_groups,
                lambda moved: (
                    coord.coordinator.unload_groups(moved),
                    coord.consumer_groups.unload_groups(moved),
                    share.coordinator.unload(moved),
                ),
                lambda fn, *args: kafka.loop.call_soon_threadsafe(fn, *args),
            )
        )
        self._add(
            ComponentAdapter(
                "transactions",
                lambda: kafka.loop.call_soon_threadsafe(coord.txn_coordinator.start),
                lambda: kafka.loop.call_soon_threadsafe(coord.txn_coordinator.stop),
            )
        )

    def _start_server(self, kafka: KafkaServerThread) -> None:
        """Start the Kafka server (waiting for a dying predecessor's port) and metrics."""
        cfg = self.config
        deadline = time.monotonic() + PORT_WAIT_S
        while True:
            try:
                kafka.start()
                break
            except RuntimeError as exc:
                # our predecessor (just killed, still tearing down) may hold the port a while
                if time.monotonic() > deadline or "in use" not in str(exc):
                    raise
                log.warning("%s; retrying", exc)
                time.sleep(PORT_RETRY_S)
        log.info(
            "serving Kafka on %s",
            ", ".join(f"{e.name}://{e.host}:{e.port}" for e in cfg.effective_listeners()),
        )
        if cfg.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(cfg.metrics_port, addr=cfg.host)
            log.info("Prometheus metrics on http://%s:%d/metrics", cfg.host, cfg.metrics_port)

    # ------------------------------------------------------------ shutdown

    def controlled_shutdown(self) -> None:
        """Hand our partitions to other brokers and wait (bounded) until each is closed
        here; the Kafka server keeps answering meanwhile (NOT_LEADER_OR_FOLLOWER for the
        moved ones, so clients refresh their metadata and follow the new leader)."""
        session = self.session
        if session is None or session.node_epoch is None or self.partitions is None:
            return
        assert self.storage is not None
        try:  # upload while still leading, so each moved partition's close has little left
            self.storage.flush()
        except Exception as exc:
            log.warning("upload before controlled shutdown failed: %s", exc)
        try:
            result = self.client.controlled_shutdown(
                ControlledShutdownRequest(
                    node_id=self.config.node_id, node_epoch=session.node_epoch
                ),
                timeout_s=CONTROLLED_SHUTDOWN_TIMEOUT_S,
            )
        except Exception as exc:
            log.warning("controlled shutdown refused: %s", exc)
            return
        log.info(
            "controlled shutdown: %d partitions moving, %d stay", result.moved, result.remaining
        )
        remaining = result.remaining
        deadline = time.monotonic() + SHUTDOWN_MOVE_WAIT_S
        while time.monotonic() < deadline and self.partitions.led_or_closing() > remaining:
            time.sleep(SHUTDOWN_POLL_S)

    def _stop_components(self) -> None:
        """The transaction coordinator first (on the loop), then the server, then the
        other components in reverse start order."""
        components = list(reversed(self.components))
        server_users = {"transactions", "coordinator-slots", EventLoopLagProbe.name}
        for component in [c for c in components if c.name in server_users]:
            try:
                component.stop()
            except RuntimeError:  # the loop is already closed
                pass
        if self.kafka is not None:
            self.kafka.stop()
        for component in [c for c in components if c.name not in server_users]:
            component.stop()

    def stop(self) -> None:
        """Controlled shutdown (see the module docstring), then fence our own epoch so the
        controller need not wait for the session to expire."""
        if not self.restart_requested.is_set():
            self.controlled_shutdown()
        if self.session is not None:
            self.session.stop()
        if self.probes is not None:
            self.probes.stop()
        self.stall.stop()
        self.lease.stop()
        self._stop_components()
        if self.partitions is not None:
            self.partitions.stop()
        if self.shard_store is not None:
            self.shard_store.stop()
        if self.storage is not None:
            try:  # upload the WAL; streams stay ours so a restart reopens them at once
                self.storage.close(close_streams=False)
            except Exception as exc:
                log.warning(
                    "uploading the WAL on shutdown failed (it is recovered on restart): %s", exc
                )
        self._fence_self()
        self.metadata.stop()

    def _fence_self(self) -> None:
        session = self.session
        if session is None or session.node_epoch is None:
            return
        try:
            self.client.fence_broker(
                FenceBrokerRequest(
                    node_id=self.config.node_id,
                    node_epoch=session.node_epoch,
                    reason="controlled shutdown",
                ),
                timeout_s=FENCE_TIMEOUT_S,
            )
        except Exception as exc:
            log.warning("could not fence ourselves on shutdown: %s", exc)
