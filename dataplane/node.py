"""A broker process: session with the controllers, storage engine, Kafka protocol server.

Start order: register (new node epoch) -> open and recover the WAL, uploading what was not
committed -> follow the metadata log (partitions this node leads are opened as streams) ->
serve Kafka on the configured port -> heartbeat.

SIGTERM (controlled shutdown): ask the controller to move our partitions to other brokers
(same AZ first); each one is closed here as soon as it moves (in-flight appends made durable,
its WAL data uploaded) and opened by its new leader; then upload the rest, fence our epoch.

Crash failover: when the controller names this node the failover target of a fenced
node's WAL, it recovers that WAL (dataplane.s3stream.wal_failover). If this node finds itself
fenced for good (paused past its session timeout), its WAL has been taken over: it re-execs
itself, so a fresh process registers with a new epoch and recovers from a clean state.

Run: python -m dataplane.node --config broker.json
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import threading
import time
import uuid
from pathlib import Path

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import REGISTERED_REASON
from controlplane.records import StreamState
from controlplane.requests import (
    MAX_UPLOAD_ERROR_CHARS,
    BrokerHeartbeatRequest,
    BrokerUploadStats,
    BucketWriteHealth,
    ControlledShutdownRequest,
    FenceBrokerRequest,
    RegisterBrokerRequest,
)
from controlplane.signal_watcher import SignalWatcher
from dataplane.config import BrokerConfig
from dataplane.kafka.interbroker import InterBrokerLogin
from dataplane.metadata import MetadataFollower
from dataplane.runtime import freeze_startup_heap, install_gc_pause_metric, keep_freed_memory
from dataplane.s3stream.wal.factory import wal_uri_for_path
from dataplane.stall import StallWatch

log = logging.getLogger("dataplane.node")

REGISTER_WAIT_S = 300.0  # how long to wait for another node to finish our WAL failover
SHUTDOWN_MOVE_WAIT_S = 30.0  # how long controlled shutdown waits for partitions to move
FAILOVER_ATTEMPTS = 20
PORT_WAIT_S = 30.0  # how long to wait for the Kafka port held by a dying predecessor
BUCKET_PROBE_TIMEOUT_MS = 2_000
ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"  # Kafka's principal of unauthenticated listeners


def inter_broker_login(cfg: BrokerConfig) -> InterBrokerLogin:
    """The `InterBrokerLogin` of a broker of `cfg`: it follows the listener brokers talk to
    each other on, their first (registered as host:kafka_port): the broker principal's SASL
    login on SASL_*, the cluster CA and this broker's client certificate (mutual TLS) on
    *SSL. Warns when the config lacks what that listener needs."""
    from controlplane.listeners import SASL_PROTOCOLS, TLS_PROTOCOLS

    protocol = cfg.effective_listeners()[0].security_protocol
    if protocol in SASL_PROTOCOLS and not cfg.inter_broker_sasl_username:
        log.warning(
            "SASL listener without an inter-broker login (inter_broker_sasl_username): "
            "other brokers will refuse this one's requests"
        )
    if protocol in TLS_PROTOCOLS and cfg.tls_ca_file is None:
        log.warning("TLS listener without tls_ca_file: requests to other brokers will fail")
    if protocol == "SSL" and cfg.ssl_client_auth == "required" and not cfg.tls_client_cert_file:
        log.warning(
            "ssl_client_auth=required without tls_client_cert_file: other brokers will "
            "refuse this one's requests"
        )
    return InterBrokerLogin.for_listener(
        protocol,
        sasl_username=cfg.inter_broker_sasl_username,
        sasl_password=cfg.inter_broker_sasl_password,
        sasl_mechanism=cfg.inter_broker_sasl_mechanism,
        ssl_ca_file=cfg.tls_ca_file,
        ssl_cert_file=cfg.tls_client_cert_file,
        ssl_key_file=cfg.tls_client_key_file,
    )


class BrokerNode:
    """The broker's control-plane side: session, node epoch and metadata image."""

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.client = ControllerClient(
            config.controllers,
            api_secret=config.controller_api_secret,
            ca_file=config.controller_ca_file,
        )
        self.metadata = MetadataFollower(self.client)
        self.node_epoch: int | None = None
        self.fenced = True
        self.storage = None
        self.objects = None  # ObjectStorage once the data plane runs
        self.partitions = None
        self.retention = None
        self.zone_router = None  # the zone router's proxy side (dataplane/zonerouter/)
        self.coordinator_proxy = None  # forwards AZ clients' coordinator requests
        self.zone_traffic = None  # its byte counters, reported with heartbeats
        self.zone_route_handler = None  # the main's side; its persisted route epoch
        self.kafka = None
        self.shard_store = None  # HoleStore of erasure-coded partitions' shards
        self.shard_server = None
        self.erasure = None  # ErasurePartitions
        self._stop = threading.Event()
        self.restart_requested = threading.Event()
        # a process stopped past its session serves nothing until a later heartbeat
        self.stall = StallWatch()
        self._failovers: set[tuple[int, int]] = set()  # (failed node, failover epoch) started
        self._failovers_lock = threading.Lock()
        self._heartbeat_thread = threading.Thread(
            target=self._heartbeat_loop, name="heartbeat", daemon=True
        )
        # heartbeats start right after registration and ask to stay fenced until the data
        # plane is up: opening a large WAL under load outlasted the session timeout
        self._starting = True
        self._heartbeat_lock = threading.Lock()  # the loop and start() both heartbeat

    @property
    def wal_uri(self) -> str:
        """This broker's WAL (the URI other brokers take over on a crash failover)."""
        return self.config.wal.uri or wal_uri_for_path(self.config.data_dir / "storage" / "wal")

    def register(self) -> int:
        endpoints = self.config.registered_endpoints()  # as advertised to clients
        req = RegisterBrokerRequest(
            node_id=self.config.node_id,
            az=self.config.az,
            # the first listener is the one other brokers connect to
            host=endpoints[0].host,
            kafka_port=endpoints[0].port,
            incarnation_id=uuid.uuid4().hex,
            wal_uri=self.wal_uri,
            endpoints=endpoints,
            shard_store_port=self.shard_server.server_address[1] if self.shard_server else 0,
        )
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                result = self.client.register_broker(req, timeout_s=60)
                break
            except ControllerError as exc:
                if exc.code != ErrorCode.WAL_FAILOVER_IN_PROGRESS or time.monotonic() > deadline:
                    raise
                log.info("waiting to register: %s", exc.message)
                time.sleep(0.5)
        self.node_epoch = result.node_epoch
        self.fenced = True
        if self.storage is not None:
            self.storage.node_epoch = self.node_epoch
        log.info(
            "registered node %d in %s with node epoch %d",
            self.config.node_id,
            self.config.az,
            self.node_epoch,
        )
        return self.node_epoch

    def heartbeat(self) -> None:
        with self._heartbeat_lock:
            self._heartbeat()

    def _heartbeat(self) -> None:
        assert self.node_epoch is not None
        rates = self.partitions.produce_rates() if self.partitions is not None else {}
        req = BrokerHeartbeatRequest(
            node_id=self.config.node_id,
            node_epoch=self.node_epoch,
            metadata_offset=self.metadata.offset,
            stats=self._upload_stats(),
            produce_bytes_per_s=rates,
            bucket_health=self._bucket_health(),
            want_fence=self._starting,
        )
        sent_at_s = time.monotonic()
        try:
            result = self.client.broker_heartbeat(req, timeout_s=5)
        except ControllerError as exc:
            if exc.code in (ErrorCode.STALE_NODE_EPOCH, ErrorCode.UNKNOWN_NODE):
                log.warning("heartbeat refused (%s): registering again", exc)
                self.register()
                return
            raise
        was_fenced, self.fenced = self.fenced, result.fenced
        if not result.fenced:
            self.stall.heartbeat_succeeded(sent_at_s, result.session_timeout_ms)
        final = self.fenced and result.fence_reason != REGISTERED_REASON
        if final and self.storage is not None:
            # fenced for good while serving data (paused past the session timeout): another
            # node has taken our WAL over and our streams are closing; start afresh
            log.warning(
                "node %d epoch %d was fenced (%s): restarting the process",
                self.config.node_id,
                self.node_epoch,
                result.fence_reason,
            )
            self.restart_requested.set()
            self._stop.set()
        elif final or (self.fenced and not was_fenced):
            # fenced for good (session expired while we were paused, or shutdown): our
            # writes of this epoch are refused from now on; come back with a new epoch
            log.warning(
                "node %d epoch %d was fenced: registering again",
                self.config.node_id,
                self.node_epoch,
            )
            self.register()
        elif not self.fenced and was_fenced:
            log.info("node %d epoch %d is unfenced", self.config.node_id, self.node_epoch)

    def _zone_traffic(self) -> dict[str, int]:
        """The zone router's counters plus the bytes this process PUT to object storage."""
        from prometheus_client import REGISTRY

        out = self.zone_traffic.snapshot()
        put = 0
        for metric in REGISTRY.collect():
            if metric.name == "automq_object_store_bytes":
                for sample in metric.samples:
                    if sample.name.endswith("_total") and sample.labels.get("op") == "put":
                        put += int(sample.value)
        out["object_store_put_bytes"] = put
        return out

    def _upload_stats(self) -> BrokerUploadStats | None:
        """The storage engine's upload health for the heartbeat (None without an engine)."""
        if self.storage is None:
            return None
        stats = self.storage.upload_stats()
        return BrokerUploadStats(
            wal_used_bytes=stats.wal_used_bytes,
            wal_capacity_bytes=stats.wal_capacity_bytes,
            upload_lag_s=stats.upload_lag_s,
            last_upload_error=None
            if stats.last_upload_error is None
            else stats.last_upload_error[:MAX_UPLOAD_ERROR_CHARS],
            zone_traffic=None if self.zone_traffic is None else self._zone_traffic(),
            route_epoch_persisted=None
            if self.zone_route_handler is None
            else self.zone_route_handler.persisted_epoch_forcing_commit(
                self.storage.request_upload
            ),
        )

    def _bucket_health(self) -> list[BucketWriteHealth]:
        """Write health of every bucket this broker wrote to (uploads and probes)."""
        if self.objects is None:
            return []
        return [
            BucketWriteHealth(
                bucket_id=h.bucket_id,
                failing_for_ms=h.failing_for_ms,
                healthy_for_ms=h.healthy_for_ms,
                write_errors=h.write_errors,
                writes_ok=h.writes_ok,
                last_latency_ms=h.last_latency_ms,
                last_error=h.last_error,
            )
            for h in self.objects.write_health.snapshot()[:16]
        ]

    def _probe_loop(self, bucket_id: int) -> None:
        """A tiny write to one bucket every `bucket_probe_interval_ms`, so its health is known
        with no upload going on (and the main bucket's recovery is seen in failover mode).
        One thread per bucket: a hung bucket never delays another's probe."""
        from dataplane.objectstore import ObjectStorage, parse_bucket_uris

        assert self.objects is not None
        probe = ObjectStorage(
            parse_bucket_uris(self.config.bucket_uris),
            write_health=self.objects.write_health,
            connect_timeout_ms=BUCKET_PROBE_TIMEOUT_MS,
            read_timeout_ms=BUCKET_PROBE_TIMEOUT_MS,
            max_attempts=1,
            max_concurrency=1,
        )
        key = f"_health/node-{self.config.node_id}"
        try:
            while not self._stop.wait(self.config.bucket_probe_interval_ms / 1000):
                try:
                    probe.put_object(bucket_id, key, b"ok")
                except Exception as exc:  # recorded in write_health by the store
                    log.debug("probe of bucket %d failed: %s", bucket_id, exc)
        finally:
            probe.close()

    def _heartbeat_loop(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval_s):
            try:
                self.heartbeat()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)

    def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        if self.config.bucket_uris:
            self._start_shard_store()
        self.register()
        self.stall.start()
        self._heartbeat_thread.start()  # keeps the session alive (fenced) while starting
        if self.config.bucket_uris:
            self._start_data_plane()
        self.metadata.start()
        self._starting = False
        self.heartbeat()  # unfenced now

    def _start_shard_store(self) -> None:
        """This broker's shard store (erasure-coded partitions): durable write-once holes
        under data_dir/shards, served over HTTP before the broker registers its port."""
        from controlplane.listeners import insecure_listener_error
        from dataplane.erasure.store import HoleStore
        from dataplane.erasure.store_server import ShardStoreHTTPServer, bench_inject_delay_ms

        cfg = self.config
        secret = cfg.controller_api_secret
        refused = insecure_listener_error(
            "the shard store", cfg.host, secret is not None, cfg.allow_insecure
        )
        if refused:
            raise RuntimeError(refused)
        self.shard_store = HoleStore(cfg.data_dir / "shards")
        deadline = time.monotonic() + PORT_WAIT_S
        while True:
            try:
                # the other brokers authenticate with the cluster secret (none: loopback)
                self.shard_server = ShardStoreHTTPServer(
                    (cfg.host, cfg.erasure.shard_store_port),
                    self.shard_store,
                    inject_delay_ms=bench_inject_delay_ms(),
                    secret=secret,
                    delay_active=False,
                )
                break
            except OSError as exc:  # a predecessor just killed may still hold the port
                if not cfg.erasure.shard_store_port or time.monotonic() > deadline:
                    raise
                log.warning("shard store port: %s; retrying", exc)
                time.sleep(0.5)
        threading.Thread(
            target=self.shard_server.serve_forever, args=(0.2,), name="shard-store", daemon=True
        ).start()
        log.info("shard store on %s:%d", cfg.host, self.shard_server.server_address[1])

    def _start_data_plane(self) -> None:
        from controlplane.coordinators import group_coordinator, group_slot, owned_slots
        from dataplane.kafka.admin_apis import AdminApis
        from dataplane.kafka.apis import BrokerIdentity, KafkaApis
        from dataplane.kafka.erasure_partition import ErasurePartitions
        from dataplane.kafka.groups.coordinator import GroupCoordinator
        from dataplane.kafka.groups.handlers import GroupHandlers
        from dataplane.kafka.offset_store import KVOffsetStore
        from dataplane.kafka.partition_manager import PartitionManager
        from dataplane.kafka.registry import ApiRegistry
        from dataplane.kafka.retention import RetentionManager
        from dataplane.kafka.server import KafkaServerThread
        from dataplane.kafka.txn.coordinator import TransactionCoordinator
        from dataplane.kafka.txn.handlers import TxnHandlers, complete_group_offsets
        from dataplane.objectstore import ObjectStorage, parse_bucket_uris
        from dataplane.s3stream.storage import S3Storage

        cfg = self.config
        objects = ObjectStorage(parse_bucket_uris(cfg.bucket_uris), cfg.object_store)
        self.objects = objects
        assert self.node_epoch is not None
        from dataplane.zonerouter.channel import ChannelReaders

        # the zone router's main keeps Link Records in its WAL: recovery reads their data
        # back from the proxies' RouterChannels
        self.channel_readers = ChannelReaders(objects)
        self.storage = S3Storage(
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
            link_resolver=self.channel_readers.resolve,
        )
        for bucket_id in objects.bucket_ids if cfg.bucket_probe_interval_ms else []:
            threading.Thread(
                target=self._probe_loop, args=(bucket_id,), name=f"probe-{bucket_id}", daemon=True
            ).start()
        recovered = self.storage.start()
        log.info("storage engine started (%d batches recovered from the WAL)", recovered)
        self.partitions = PartitionManager(
            cfg.node_id, self.storage, lambda: self.metadata.caught_up, self.stall.serving
        )
        self.partitions.start()
        self.retention = RetentionManager(
            lambda: self.metadata.image,
            self.partitions.logs,
            check_interval_ms=cfg.retention_check_interval_ms,
            timestamps=self.partitions.piece_timestamps,
        )
        self.retention.start()
        # erasure-coded partitions are served by every broker; the rest by their leader
        self.erasure = ErasurePartitions(
            cfg.node_id,
            lambda: self.metadata.image,
            self.partitions,
            self.shard_store,
            store_secret=cfg.controller_api_secret,
            # decided offsets are sealed into object storage and read back from there
            controller=self.client,
            objects=objects,
            node_epoch_fn=lambda: self.node_epoch or 0,
            read_sealed=self.storage.read_committed,
            seal_config=cfg.erasure.seal,
        )
        image_fn = lambda: self.metadata.image  # noqa: E731
        routing, zone_handler = self._start_zone_router(objects, image_fn)
        apis = KafkaApis(
            BrokerIdentity(cfg.node_id, cfg.host, cfg.kafka_port, cfg.az),
            lambda: self.metadata.image,
            self.metadata.wait_for_offset,
            self.client,
            self.erasure,
            lambda: self.node_epoch or 0,
            routing=routing,
        )
        zone_handler.io = apis._io
        zone_handler.snapshot_server.io = apis._io  # transaction markers sent inline
        coordinator = GroupCoordinator(cfg.groups)
        offset_store = KVOffsetStore(
            self.client, image_fn, cfg.node_id, lambda: self.node_epoch or 0
        )
        groups = GroupHandlers(
            coordinator,
            offset_store,
            # a coordinator mid-replay could serve offsets older than
            # the previous coordinator's last commit
            lambda g: group_coordinator(image_fn(), g) == cfg.node_id and self.metadata.caught_up,
        )
        txn_coordinator = TransactionCoordinator(
            cfg.node_id,
            image_fn,
            self.client,
            lambda: self.node_epoch or 0,
            apis._next_producer_id,
            self.partitions,
            lambda slot, pid, commit: complete_group_offsets(offset_store, slot, pid, commit),
            ready_fn=lambda: self.metadata.caught_up,
            send_markers=self._marker_sender(),
        )
        txns = TxnHandlers(
            txn_coordinator,
            image_fn,
            self.partitions,
            coordinator,
            offset_store,
            lambda g: group_coordinator(image_fn(), g) == cfg.node_id and self.metadata.caught_up,
        )
        apis.txn = txns
        owned: list[dict[int, int]] = [{}]  # slot -> coordinator epoch, at the last image

        def on_metadata(image, records) -> None:
            """Runs on the metadata follower thread (the only user of `owned`); group state
            lives on the Kafka event loop, so unloading is handed to it."""
            self.partitions.on_metadata(image, records)
            if self.zone_router is not None:
                self.zone_router.on_metadata(image)
            self._start_failovers(image)
            now_owned = owned_slots(image, cfg.node_id)
            if now_owned == owned[0]:
                return
            # slots moved away (or away and back): drop those groups' state and cached
            # offsets; groups of slots that stayed are untouched (no rebalance)
            moved = frozenset(s for s, epoch in owned[0].items() if now_owned.get(s) != epoch)
            owned[0] = now_owned
            if not moved:
                return
            count = image.coordinator_slot_count
            in_moved = lambda g: group_slot(g, count) in moved  # noqa: E731
            offset_store.forget_groups(in_moved)
            try:
                self.kafka.loop.call_soon_threadsafe(coordinator.unload_groups, in_moved)
            except (AttributeError, RuntimeError):  # the server is not running
                pass
            log.info(
                "coordinator slots %s moved away; node %d now owns %d slots",
                sorted(moved),
                cfg.node_id,
                len(now_owned),
            )

        self.metadata.on_records = on_metadata
        registry = ApiRegistry()
        admin = AdminApis(
            cfg.node_id,
            image_fn,
            self.client,
            self.partitions,
            apis.io,
            routed=lambda topic_id, partition, ctx: routing.get(
                topic_id, partition, apis._client_az(ctx)
            ),
        )
        handlers = (
            apis.registrations()
            + groups.registrations()
            + admin.registrations()
            + txns.registrations()
            + zone_handler.registrations()
        )
        from dataplane.zonerouter.coordinator_proxy import CoordinatorProxy

        # clients of an AZ reach their group / transaction coordinator through its proxy
        # in their AZ
        coordinator_proxy = CoordinatorProxy(
            cfg.node_id,
            image_fn,
            apis._client_az,
            self._inter_broker_login,
            # the counters exist once the zone router is set up below
            on_broker_bytes=lambda az, n: self.zone_traffic and self.zone_traffic.broker(az, n),
        )
        self.coordinator_proxy = coordinator_proxy
        handlers = [
            (cls, lo, hi, coordinator_proxy.wrap(h) if coordinator_proxy.forwards(cls) else h)
            for cls, lo, hi, h in handlers
        ]
        for request_class, lo, hi, handler in handlers:
            registry.register(request_class, lo, hi, handler)
        listeners = self._secure_listeners(registry, image_fn)
        self.kafka = KafkaServerThread(
            registry, max_request_bytes=cfg.max_request_bytes, listeners=listeners
        )
        deadline = time.monotonic() + PORT_WAIT_S
        while True:
            try:
                self.kafka.start()
                break
            except RuntimeError as exc:
                # our predecessor (just killed, still tearing down) may hold the port a while
                if time.monotonic() > deadline or "in use" not in str(exc):
                    raise
                log.warning("%s; retrying", exc)
                time.sleep(0.5)
        self.kafka.loop.call_soon_threadsafe(txn_coordinator.start)
        self._stop_txn_coordinator = lambda: self.kafka.loop.call_soon_threadsafe(
            txn_coordinator.stop
        )
        log.info(
            "serving Kafka on %s",
            ", ".join(f"{e.name}://{e.host}:{e.port}" for e in cfg.effective_listeners()),
        )
        if cfg.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(cfg.metrics_port, addr=cfg.host)
            log.info("Prometheus metrics on http://%s:%d/metrics", cfg.host, cfg.metrics_port)

    def _tls_context(self, client_auth: str = "none"):
        """A listener's TLS context when a certificate is configured, else None;
        `client_auth` (ssl.client.auth) asks clients for a certificate of tls_ca_file."""
        cfg = self.config
        if cfg.tls_cert_file is None or cfg.tls_key_file is None:
            return None
        from dataplane.kafka.security.tls import server_ssl_context

        return server_ssl_context(cfg.tls_cert_file, cfg.tls_key_file, client_auth, cfg.tls_ca_file)

    def _start_zone_router(self, objects, image_fn):
        """The zone router (seed 000): this broker's RouterChannel and proxy partitions,
        the client routing by AZ, and the main's zone-route handler."""
        from dataplane.formats.client_az import CidrAzMap
        from dataplane.zonerouter.own_channel import OwnChannelPartition
        from dataplane.zonerouter.route_handler import ZoneRouteHandler
        from dataplane.zonerouter.routing import ZoneRouting
        from dataplane.zonerouter.snapshot import LinkIndex
        from dataplane.zonerouter.snapshot_read import SnapshotReader, SnapshotServer
        from dataplane.zonerouter.traffic import ZoneTraffic
        from dataplane.zonerouter.zone_router import ZoneRouter

        cfg = self.config
        assert self.node_epoch is not None and self.storage is not None
        self.zone_traffic = ZoneTraffic(cfg.az)
        self.zone_router = ZoneRouter(
            cfg.node_id,
            self.node_epoch,
            objects,
            image_fn,
            self.storage.read_committed,
            self.zone_traffic,
            login=self._inter_broker_login,
            channel_config=cfg.zone_router.channel,
            ready_fn=lambda: self.metadata.caught_up,
        )
        self.zone_router.start()
        handler = ZoneRouteHandler(
            image_fn, self.partitions, self.channel_readers, self.zone_traffic, None
        )
        # snapshot reads: the main indexes its links, the proxy polls the mains for them
        handler.link_index = LinkIndex()
        snapshot_server = SnapshotServer(self.partitions, handler.link_index)
        handler.snapshot_server = snapshot_server
        self.zone_router.snapshots = SnapshotReader(
            image_fn,
            self.channel_readers,
            self.zone_traffic,
            cfg.node_id,
            login=self.zone_router.login,
            own_records=self.zone_router.recent_record,
        )
        router = self.zone_router
        routing = ZoneRouting(
            cfg.node_id,
            image_fn,
            self.erasure,  # erasure-coded partitions first, then the ones this broker leads
            self.zone_router.proxy_partition,
            CidrAzMap.parse(cfg.zone_router.client_az_cidrs),
            self.zone_traffic,
            # produce through the own channel only to partitions that proxies read
            own_channel=lambda topic_id, plog: OwnChannelPartition(
                router,
                handler,
                plog,
                topic_id,
                lambda: snapshot_server.polled_recently(topic_id, plog.partition),
            ),
        )
        self.zone_route_handler = handler
        return routing, handler

    @functools.cached_property
    def _inter_broker_login(self):
        """How this broker logs in to the others, built once for every inter-broker client
        (transaction markers, the zone router, the coordinator proxy, snapshot reads)."""
        return inter_broker_login(self.config)

    def _marker_sender(self):
        """WriteTxnMarkers to the other brokers, logged in as the inter-broker login."""
        from dataplane.kafka.txn.marker_client import send_write_txn_markers

        return functools.partial(send_write_txn_markers, login=self._inter_broker_login)

    def _secure_listeners(self, registry, image_fn):
        """The server's listeners (one socket each, Kafka's `listeners`): SASL and the
        security admin APIs registered when configured, ACLs enforced on every listener of
        a SASL cluster (a PLAINTEXT or SSL listener's clients are User:ANONYMOUS, as in
        Kafka). Refuses invalid listeners, and an unauthenticated one on a non-loopback
        address unless `allow_insecure`."""
        from controlplane.listeners import SASL_PROTOCOLS, TLS_PROTOCOLS, listeners_error
        from dataplane.kafka.security.admin_apis import SecurityAdminApis
        from dataplane.kafka.server import ServerListener

        cfg = self.config
        endpoints = cfg.effective_listeners()
        refused = listeners_error(
            endpoints,
            sasl_enabled=cfg.sasl_enabled,
            tls_configured=cfg.tls_cert_file is not None and cfg.tls_key_file is not None,
            allow_insecure=cfg.allow_insecure,
            ssl_client_auth=cfg.ssl_client_auth == "required",
        )
        if refused:
            raise RuntimeError(refused)
        if cfg.ssl_client_auth != "none" and cfg.tls_ca_file is None:
            raise RuntimeError("ssl_client_auth needs tls_ca_file (the CA of client certificates)")
        enforcer = None
        if cfg.acls_enforced:
            from dataplane.kafka.security.authorizer import Authorizer
            from dataplane.kafka.security.enforcement import AclEnforcer

            enforcer = AclEnforcer(Authorizer(cfg.super_users), image_fn)
        admin = SecurityAdminApis(
            self.client,
            image_fn,
            self.metadata.wait_for_offset,
            enforcer.allowed_cluster if enforcer is not None else None,
        )
        for request_class, lo, hi, handler in admin.registrations():
            registry.register(request_class, lo, hi, handler)
        sasl = None
        if cfg.sasl_enabled:
            from dataplane.kafka.security.sasl import SaslAuthenticator

            sasl = SaslAuthenticator(image_fn)
            for request_class, lo, hi, handler in sasl.registrations():
                registry.register(request_class, lo, hi, handler)
            log.info("SASL mechanisms: %s", ", ".join(sasl.mechanisms))
        if enforcer is not None:
            enforcer.install(registry)  # after every registration: nothing stays unchecked
            log.info("ACLs enforced; super users: %s", ", ".join(cfg.super_users) or "none")
        from dataplane.kafka.security.tls import principal_of_certificate

        tls = (
            self._tls_context()
            if any(e.security_protocol in TLS_PROTOCOLS for e in endpoints)
            else None
        )
        # SSL listeners ask for client certificates when ssl_client_auth says so (their CN is
        # the principal); SASL_SSL ones take the principal from the SASL login
        mutual_tls = (
            self._tls_context(cfg.ssl_client_auth) if cfg.ssl_client_auth != "none" else tls
        )
        listeners = []
        for e in endpoints:
            extras: dict = {"security_protocol": e.security_protocol}
            admit = None
            if e.security_protocol in SASL_PROTOCOLS:
                assert sasl is not None  # listeners_error refuses SASL without sasl_enabled
                admit = sasl.admit
            elif enforcer is not None:
                extras["principal"] = ANONYMOUS_PRINCIPAL
            ssl_context = None
            if e.security_protocol == "SSL":
                ssl_context = mutual_tls
            elif e.security_protocol == "SASL_SSL":
                ssl_context = tls
            listeners.append(
                ServerListener(
                    host=e.host,
                    port=e.port,
                    name=e.name,
                    ssl_context=ssl_context,
                    admit=admit,
                    extras=extras,
                    principal_of_peer=(
                        principal_of_certificate
                        if e.security_protocol == "SSL" and cfg.ssl_client_auth != "none"
                        else None
                    ),
                )
            )
            log.info("listener %s: %s on %s:%d", e.name, e.security_protocol, e.host, e.port)
        return listeners

    # ------------------------------------------------------------ WAL failover

    def _start_failovers(self, image) -> None:
        """Recover the WAL of every fenced node whose failover names this node."""
        for wal in list(image.node_wals.values()):
            if not wal.failover_mode or wal.failover_target_node_id != self.config.node_id:
                continue
            key = (wal.node_id, wal.node_epoch)
            with self._failovers_lock:
                if key in self._failovers:
                    continue
                self._failovers.add(key)
            threading.Thread(
                target=self._run_failover,
                args=(wal.node_id, wal.wal_uri, wal.node_epoch),
                name=f"failover-{wal.node_id}",
                daemon=True,
            ).start()

    def _run_failover(self, failed_node_id: int, wal_uri: str, failover_epoch: int) -> None:
        from dataplane.s3stream.wal_failover import recover_failed_wal

        def open_streams() -> list[tuple[int, int]]:
            image = self.metadata.image
            return sorted(
                (s.stream_id, s.epoch)
                for s in image.streams.values()
                if s.state == StreamState.OPENED and s.node_id == failed_node_id
            )

        delay_s = 0.2
        for attempt in range(1, FAILOVER_ATTEMPTS + 1):
            if self._stop.is_set() or self.storage is None:
                return
            current = self.metadata.image.node_wals.get(failed_node_id)
            if (
                current is None
                or not current.failover_mode
                or current.node_epoch != failover_epoch
                or current.failover_target_node_id != self.config.node_id
            ):
                return  # done, or handed to another node
            try:
                recover_failed_wal(
                    self.storage, failed_node_id, wal_uri, failover_epoch, open_streams
                )
                return
            except ControllerError as exc:
                if exc.code == ErrorCode.NOT_FAILOVER_TARGET:
                    log.warning("failover of node %d: %s", failed_node_id, exc)
                    return
                log.warning(
                    "failover of node %d (attempt %d) failed: %s", failed_node_id, attempt, exc
                )
            except Exception:
                log.exception("failover of node %d (attempt %d) failed", failed_node_id, attempt)
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, 5.0)
        log.error(
            "giving up recovering the WAL of node %d after %d attempts",
            failed_node_id,
            FAILOVER_ATTEMPTS,
        )

    # ------------------------------------------------------------ shutdown

    def controlled_shutdown(self) -> None:
        """Hand our partitions to other brokers and wait (bounded) until each is closed
        here; the Kafka server keeps answering meanwhile (NOT_LEADER_OR_FOLLOWER for the
        moved ones, so clients refresh their metadata and follow the new leader)."""
        if self.node_epoch is None or self.partitions is None:
            return
        try:  # upload while still leading, so each moved partition's close has little left
            self.storage.flush()
        except Exception as exc:
            log.warning("upload before controlled shutdown failed: %s", exc)
        try:
            result = self.client.controlled_shutdown(
                ControlledShutdownRequest(node_id=self.config.node_id, node_epoch=self.node_epoch),
                timeout_s=10,
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
            time.sleep(0.02)

    def stop(self) -> None:
        """Controlled shutdown (see the module docstring), then fence our own epoch so the
        controller need not wait for the session to expire."""
        if not self.restart_requested.is_set():
            self.controlled_shutdown()
        self._stop.set()
        self.stall.stop()
        if self.kafka is not None:
            stop_txn = getattr(self, "_stop_txn_coordinator", None)
            if stop_txn is not None:
                try:
                    stop_txn()
                except RuntimeError:  # the loop is already closed
                    pass
            self.kafka.stop()
        if self.retention is not None:
            self.retention.stop()
        if self.erasure is not None:
            self.erasure.stop()
        if self.zone_router is not None:
            self.zone_router.close()
        if self.coordinator_proxy is not None:
            self.coordinator_proxy.close()
        if self.partitions is not None:
            self.partitions.stop()
        if self.shard_server is not None:
            self.shard_server.shutdown()
            self.shard_server.server_close()
            self.shard_store.close()
        if self.storage is not None:
            try:  # upload the WAL; streams stay ours so a restart reopens them at once
                self.storage.close(close_streams=False)
            except Exception as exc:
                log.warning(
                    "uploading the WAL on shutdown failed (it is recovered on restart): %s", exc
                )
        if self.node_epoch is not None:
            try:
                self.client.fence_broker(
                    FenceBrokerRequest(
                        node_id=self.config.node_id,
                        node_epoch=self.node_epoch,
                        reason="controlled shutdown",
                    ),
                    timeout_s=5,
                )
            except Exception as exc:
                log.warning("could not fence ourselves on shutdown: %s", exc)
        self.metadata.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="automq broker")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    config = BrokerConfig.model_validate(json.loads(args.config.read_text()))
    install_gc_pause_metric()
    keep_freed_memory()
    node = BrokerNode(config)
    stop = SignalWatcher.install().stop_event
    node.start()
    freeze_startup_heap()
    while not stop.wait(0.2):
        if node.restart_requested.is_set():
            # our WAL was taken over: nothing of this process may write any more; a new
            # process (same pid, same arguments) registers with a new epoch
            logging.shutdown()
            os.execv(sys.executable, [sys.executable, "-m", "dataplane.node", *sys.argv[1:]])
    log.info("broker %d stopping", config.node_id)
    node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
