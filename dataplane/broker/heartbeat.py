"""This broker's session with the controllers: registration, heartbeats, the stats they
carry (upload health, produce rates, zone traffic, bucket health), and bucket probes.

Heartbeats start right after registration and ask to stay fenced until the data plane is
up (opening a large WAL under load outlasted the session timeout). A heartbeat refused for
a stale epoch registers again; a fence for good while serving data (paused past the session
timeout: another node took the WAL over) asks the process to restart.

Once the controllers' session timeout is known (every answer carries it), each heartbeat is
bounded by half a session and each attempt by a quarter, with the controllers tried in turn
and a leader hint followed at once: when the leader's host is lost, the broker finds the new
leader well within its session. Every unfenced answer renews the broker's `ControllerLease`
(lease.py: a broker no controller answers for a session fences itself).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import REGISTERED_REASON
from controlplane.requests import (
    MAX_UPLOAD_ERROR_CHARS,
    MAX_WAL_LOSS_CHARS,
    BrokerHeartbeatRequest,
    BrokerUploadStats,
    BucketWriteHealth,
    RegisterBrokerRequest,
)
from dataplane.broker.lease import ControllerLease
from dataplane.broker.metadata import MetadataFollower
from dataplane.broker.stall import StallWatch
from dataplane.config import BrokerConfig
from dataplane.kafka.partition_manager import PartitionManager
from dataplane.objectstore import ObjectStorage, default_metrics, parse_bucket_uris
from dataplane.s3stream.storage import S3Storage
from dataplane.s3stream.wal.loss import recent_losses
from dataplane.zonerouter.route_handler import ZoneRouteHandler
from dataplane.zonerouter.traffic import ZoneTraffic

log = logging.getLogger(__name__)

REGISTER_WAIT_S = 300.0  # how long to wait for another node to finish our WAL failover
REGISTER_RETRY_S = 0.5
REGISTER_TIMEOUT_S = 60
HEARTBEAT_TIMEOUT_S = 5  # until the session timeout is known
# a heartbeat call is bounded by this share of the session, each attempt by the smaller one
HEARTBEAT_CALL_SHARE = 0.5
HEARTBEAT_ATTEMPT_SHARE = 0.25
BUCKET_PROBE_TIMEOUT_MS = 2_000
MAX_BUCKETS_REPORTED = 16


class HeartbeatStats:
    """What a heartbeat carries about the data plane: the storage engine's upload health,
    produce rates, zone-router traffic and the persisted route epoch, bucket health."""

    def __init__(
        self,
        storage: S3Storage,
        partitions: PartitionManager,
        objects: ObjectStorage,
        zone_traffic: ZoneTraffic | None,
        route_handler: ZoneRouteHandler | None,
    ):
        self.storage = storage
        self.partitions = partitions
        self.objects = objects
        self.zone_traffic = zone_traffic
        self.route_handler = route_handler

    def produce_rates(self) -> dict[int, float]:
        """Produce bytes/s per led stream (the controller's balancer weighs by them)."""
        return self.partitions.produce_rates()

    def _zone_traffic(self, zone_traffic: ZoneTraffic) -> dict[str, int]:
        """The zone router's counters plus the bytes this process PUT to object storage
        (that one counter is read: collecting the whole registry held the GIL for
        milliseconds every heartbeat, the event loop waiting)."""
        out = zone_traffic.snapshot()
        put = 0
        for metric in default_metrics().bytes.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels.get("op") == "put":
                    put += int(sample.value)
        out["object_store_put_bytes"] = put
        return out

    def upload_stats(self) -> BrokerUploadStats:
        """The storage engine's upload health."""
        stats = self.storage.upload_stats()
        return BrokerUploadStats(
            wal_used_bytes=stats.wal_used_bytes,
            wal_capacity_bytes=stats.wal_capacity_bytes,
            upload_lag_s=stats.upload_lag_s,
            last_upload_error=None
            if stats.last_upload_error is None
            else stats.last_upload_error[:MAX_UPLOAD_ERROR_CHARS],
            zone_traffic=None
            if self.zone_traffic is None
            else self._zone_traffic(self.zone_traffic),
            route_epoch_persisted=None
            if self.route_handler is None
            else self.route_handler.persisted_epoch_forcing_commit(self.storage.request_upload),
            wal_losses=[line[:MAX_WAL_LOSS_CHARS] for line in recent_losses()],
        )

    def bucket_health(self) -> list[BucketWriteHealth]:
        """Write health of every bucket this broker wrote to (uploads and probes)."""
        return [
            BucketWriteHealth(
                bucket_id=h.bucket_id,
                failing_for_ms=h.failing_for_ms,
                healthy_for_ms=h.healthy_for_ms,
                last_failure_age_ms=h.last_failure_age_ms,
                write_errors=h.write_errors,
                writes_ok=h.writes_ok,
                last_latency_ms=h.last_latency_ms,
                last_error=h.last_error,
            )
            for h in self.objects.write_health.snapshot()[:MAX_BUCKETS_REPORTED]
        ]


class BrokerSession:
    """Registration and heartbeats of one broker (the `heartbeat` thread).

    `stats` gives the data plane's `HeartbeatStats` once it runs (None before);
    `on_registered(epoch)` is told every new node epoch; `serving_data()` says whether the
    data plane runs (then a fence for good calls `request_restart` instead of registering
    again); `lease` is renewed by every unfenced answer."""

    def __init__(
        self,
        config: BrokerConfig,
        client: ControllerClient,
        metadata: MetadataFollower,
        stall: StallWatch,
        lease: ControllerLease,
        wal_uri: str,
        shard_store_port: int,
        stats: Callable[[], HeartbeatStats | None],
        on_registered: Callable[[int], None],
        serving_data: Callable[[], bool],
        request_restart: Callable[[], None],
    ):
        self.config = config
        self.client = client
        self.metadata = metadata
        self.stall = stall
        self.lease = lease
        self.wal_uri = wal_uri
        self.shard_store_port = shard_store_port
        self.stats = stats
        self.on_registered = on_registered
        self.serving_data = serving_data
        self.request_restart = request_restart
        self.node_epoch: int | None = None
        self.fenced = True
        # heartbeats ask to stay fenced until the data plane is up (`finish_starting`)
        self._starting = True
        self._lock = threading.Lock()  # the loop and the assembly both heartbeat
        # heartbeats' own client, its timeouts a share of the session (rebuilt when the
        # session timeout the controllers answer changes; under `_lock`)
        self._heartbeat_client = client
        self._heartbeat_session_ms = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)

    def register(self) -> int:
        """Register (a new node epoch), waiting while another node finishes our WAL
        failover."""
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
            shard_store_port=self.shard_store_port,
        )
        deadline = time.monotonic() + REGISTER_WAIT_S
        while True:
            try:
                result = self.client.register_broker(req, timeout_s=REGISTER_TIMEOUT_S)
                break
            except ControllerError as exc:
                if exc.code != ErrorCode.WAL_FAILOVER_IN_PROGRESS or time.monotonic() > deadline:
                    raise
                log.info("waiting to register: %s", exc.message)
                time.sleep(REGISTER_RETRY_S)
        self.node_epoch = result.node_epoch
        self.fenced = True
        self.on_registered(self.node_epoch)
        log.info(
            "registered node %d in %s with node epoch %d",
            self.config.node_id,
            self.config.az,
            self.node_epoch,
        )
        return self.node_epoch

    def start(self) -> None:
        """Start the heartbeat thread (keeps the session alive, fenced, while starting)."""
        self._thread.start()

    def finish_starting(self) -> None:
        """The data plane is up: heartbeats no longer ask to stay fenced."""
        self._starting = False

    def stop(self) -> None:
        """Stop heartbeating."""
        self._stop.set()

    def heartbeat(self) -> None:
        """One heartbeat (and what its answer asks: register again, restart)."""
        with self._lock:
            self._heartbeat()

    def _heartbeat(self) -> None:
        assert self.node_epoch is not None
        stats = self.stats()
        req = BrokerHeartbeatRequest(
            node_id=self.config.node_id,
            node_epoch=self.node_epoch,
            metadata_offset=self.metadata.offset,
            stats=stats.upload_stats() if stats is not None else None,
            produce_bytes_per_s=stats.produce_rates() if stats is not None else {},
            bucket_health=stats.bucket_health() if stats is not None else [],
            want_fence=self._starting,
        )
        sent_at_s = time.monotonic()
        client = self._heartbeat_client
        try:
            result = client.broker_heartbeat(
                req,
                timeout_s=client.timeout_s if self._heartbeat_session_ms else HEARTBEAT_TIMEOUT_S,
            )
        except ControllerError as exc:
            if exc.code in (ErrorCode.STALE_NODE_EPOCH, ErrorCode.UNKNOWN_NODE):
                log.warning("heartbeat refused (%s): registering again", exc)
                self.register()
                return
            raise
        was_fenced, self.fenced = self.fenced, result.fenced
        self._follow_session_timeout(result.session_timeout_ms)
        if not result.fenced:
            self.stall.heartbeat_succeeded(sent_at_s, result.session_timeout_ms)
            self.lease.renewed(sent_at_s, result.session_timeout_ms)
        final = self.fenced and result.fence_reason != REGISTERED_REASON
        if final and self.serving_data():
            # fenced for good while serving data (paused past the session timeout): another
            # node has taken our WAL over and our streams are closing; start afresh
            log.warning(
                "node %d epoch %d was fenced (%s): restarting the process",
                self.config.node_id,
                self.node_epoch,
                result.fence_reason,
            )
            self.request_restart()
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

    def _follow_session_timeout(self, session_timeout_ms: int) -> None:
        """Bound heartbeats by shares of the session the controllers answered."""
        if session_timeout_ms <= 0 or session_timeout_ms == self._heartbeat_session_ms:
            return
        self._heartbeat_session_ms = session_timeout_ms
        session_s = session_timeout_ms / 1000
        self._heartbeat_client = self.client.with_timeouts(
            timeout_s=session_s * HEARTBEAT_CALL_SHARE,
            request_timeout_s=session_s * HEARTBEAT_ATTEMPT_SHARE,
        )

    def _loop(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval_s):
            try:
                self.heartbeat()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)


class BucketProbes:
    """A tiny write to each bucket every `bucket_probe_interval_ms`, so its health is known
    with no upload going on (and the main bucket's recovery is seen in failover mode). One
    thread per bucket (`probe-N`): a hung bucket never delays another's probe."""

    def __init__(self, config: BrokerConfig, objects: ObjectStorage):
        self.config = config
        self.objects = objects
        self._stop = threading.Event()

    def start(self) -> None:
        """One probe thread per bucket (none when probes are off)."""
        for bucket_id in self.objects.bucket_ids if self.config.bucket_probe_interval_ms else []:
            threading.Thread(
                target=self._probe_loop, args=(bucket_id,), name=f"probe-{bucket_id}", daemon=True
            ).start()

    def stop(self) -> None:
        """Stop probing."""
        self._stop.set()

    def _probe_loop(self, bucket_id: int) -> None:
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
