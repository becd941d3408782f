"""A broker process: session with the controllers, storage engine, Kafka protocol server.

Start order: register (new node epoch) -> open and recover the WAL, uploading what was not
committed -> follow the metadata log (partitions this node leads are opened as streams) ->
serve Kafka on the configured port -> heartbeat. SIGTERM: stop serving, upload the WAL,
fence our own epoch (controlled shutdown).

Run: python -m dataplane.node --config broker.json
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import uuid
from pathlib import Path

from pydantic import BaseModel, Field

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError, ErrorCode
from controlplane.requests import BrokerHeartbeatRequest, RegisterBrokerRequest
from dataplane.metadata import MetadataFollower

log = logging.getLogger("dataplane.node")


class BrokerConfig(BaseModel):
    """One broker process's configuration (written by `automqctl cluster up`)."""

    node_id: int = Field(ge=0)
    az: str
    host: str = "127.0.0.1"
    kafka_port: int = Field(ge=0, le=65535)
    data_dir: Path
    controllers: list[str]  # controller API addresses host:port
    heartbeat_interval_ms: int = Field(default=1_000, ge=50, le=60_000)
    # bucket URIs with credentials (this file is mode 0600); empty: no storage engine
    bucket_uris: str = ""
    wal_capacity_bytes: int = Field(default=512 * 1024 * 1024, ge=16 * 1024 * 1024)
    upload_threshold_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    upload_interval_s: float = Field(default=5.0, gt=0, le=3600)
    block_cache_bytes: int = Field(default=512 * 1024 * 1024, ge=16 * 1024 * 1024)
    max_request_bytes: int = Field(default=100 * 1024 * 1024, ge=1024 * 1024)
    metrics_port: int = Field(default=0, ge=0, le=65535)  # 0: no /metrics endpoint


class BrokerNode:
    """The broker's control-plane side: session, node epoch and metadata image."""

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.client = ControllerClient(config.controllers)
        self.metadata = MetadataFollower(self.client)
        self.node_epoch: int | None = None
        self.fenced = True
        self.storage = None
        self.partitions = None
        self.kafka = None
        self._stop = threading.Event()
        self._heartbeat_thread = threading.Thread(target=self._heartbeat_loop,
                                                  name="heartbeat", daemon=True)

    def register(self) -> int:
        req = RegisterBrokerRequest(
            node_id=self.config.node_id, az=self.config.az, host=self.config.host,
            kafka_port=self.config.kafka_port, incarnation_id=uuid.uuid4().hex,
            wal_uri=f"file://{self.config.data_dir / 'wal'}")
        result = self.client.call("register_broker", req, timeout_s=60)
        self.node_epoch = int(result["node_epoch"])
        self.fenced = True
        if self.storage is not None:
            self.storage.node_epoch = self.node_epoch
        log.info("registered node %d in %s with node epoch %d", self.config.node_id,
                 self.config.az, self.node_epoch)
        return self.node_epoch

    def heartbeat(self) -> None:
        assert self.node_epoch is not None
        req = BrokerHeartbeatRequest(node_id=self.config.node_id, node_epoch=self.node_epoch,
                                     metadata_offset=self.metadata.offset)
        try:
            result = self.client.call("broker_heartbeat", req, timeout_s=5)
        except ControllerError as exc:
            if exc.code in (ErrorCode.STALE_NODE_EPOCH, ErrorCode.UNKNOWN_NODE):
                log.warning("heartbeat refused (%s): registering again", exc)
                self.register()
                return
            raise
        was_fenced, self.fenced = self.fenced, bool(result["fenced"])
        final = self.fenced and result.get("fence_reason", "registered") != "registered"
        if final or (self.fenced and not was_fenced):
            # fenced for good (session expired while we were paused, or shutdown): our
            # writes of this epoch are refused from now on; come back with a new epoch
            log.warning("node %d epoch %d was fenced: registering again", self.config.node_id,
                        self.node_epoch)
            self.register()
        elif not self.fenced and was_fenced:
            log.info("node %d epoch %d is unfenced", self.config.node_id, self.node_epoch)

    def _heartbeat_loop(self) -> None:
        interval_s = self.config.heartbeat_interval_ms / 1000
        while not self._stop.wait(interval_s):
            try:
                self.heartbeat()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)

    def start(self) -> None:
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self.register()
        if self.config.bucket_uris:
            self._start_data_plane()
        self.metadata.start()
        self.heartbeat()
        self._heartbeat_thread.start()

    def _start_data_plane(self) -> None:
        from dataplane.kafka.apis import BrokerIdentity, KafkaApis, coordinator_for
        from dataplane.kafka.groups.coordinator import GroupCoordinator
        from dataplane.kafka.groups.handlers import GroupHandlers
        from dataplane.kafka.offset_store import KVOffsetStore
        from dataplane.kafka.partitions import PartitionManager
        from dataplane.kafka.registry import ApiRegistry
        from dataplane.kafka.server import KafkaServerThread
        from dataplane.objectstore import ObjectStorage, parse_bucket_uris
        from dataplane.s3stream.storage import S3Storage, StorageConfig

        cfg = self.config
        objects = ObjectStorage(parse_bucket_uris(cfg.bucket_uris), max_concurrency=64)
        assert self.node_epoch is not None
        self.storage = S3Storage(StorageConfig(
            data_dir=cfg.data_dir / "storage", wal_capacity_bytes=cfg.wal_capacity_bytes,
            upload_threshold_bytes=cfg.upload_threshold_bytes,
            upload_interval_s=cfg.upload_interval_s, block_cache_bytes=cfg.block_cache_bytes),
            cfg.node_id, self.node_epoch, self.client, objects)
        recovered = self.storage.start()
        log.info("storage engine started (%d batches recovered from the WAL)", recovered)
        self.partitions = PartitionManager(cfg.node_id, self.storage)
        self.partitions.start()
        apis = KafkaApis(BrokerIdentity(cfg.node_id, cfg.host, cfg.kafka_port, cfg.az),
                         lambda: self.metadata.image, self.metadata.wait_for_offset,
                         self.client, self.partitions, lambda: self.node_epoch or 0)
        image_fn = lambda: self.metadata.image  # noqa: E731
        coordinator = GroupCoordinator()
        offset_store = KVOffsetStore(self.client, image_fn)
        groups = GroupHandlers(coordinator, offset_store,
                               lambda g: coordinator_for(g, image_fn()) == cfg.node_id)
        live_brokers: list[tuple] = [()]

        def on_metadata(image, records) -> None:
            self.partitions.on_metadata(image, records)
            live = tuple(sorted(b.node_id for b in image.brokers.values() if not b.fenced))
            if live != live_brokers[0]:
                # group coordinators moved: drop what we cached for groups we may have lost
                # (and re-read the documents of groups we get back)
                live_brokers[0] = live
                offset_store.forget_all()
                try:
                    self.kafka.loop.call_soon_threadsafe(
                        coordinator.unload_groups,
                        lambda g: coordinator_for(g, image) != cfg.node_id)
                except (AttributeError, RuntimeError):  # the server is not running
                    pass

        self.metadata.on_records = on_metadata
        registry = ApiRegistry()
        for request_class, lo, hi, handler in apis.registrations() + groups.registrations():
            registry.register(request_class, lo, hi, handler)
        self.kafka = KafkaServerThread(registry, host=cfg.host, port=cfg.kafka_port,
                                       max_request_bytes=cfg.max_request_bytes)
        self.kafka.start()
        log.info("serving Kafka on %s:%d", cfg.host, cfg.kafka_port)
        if cfg.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(cfg.metrics_port, addr=cfg.host)
            log.info("Prometheus metrics on http://%s:%d/metrics", cfg.host, cfg.metrics_port)

    def stop(self) -> None:
        """Controlled shutdown: fence our own epoch so the controller need not wait for the
        session to expire before it moves our work elsewhere."""
        self._stop.set()
        if self.kafka is not None:
            self.kafka.stop()
        if self.partitions is not None:
            self.partitions.stop()
        if self.storage is not None:
            try:  # upload the WAL; streams stay ours so a restart reopens them at once
                self.storage.close(close_streams=False)
            except Exception as exc:
                log.warning("uploading the WAL on shutdown failed (it is recovered on "
                            "restart): %s", exc)
        if self.node_epoch is not None:
            try:
                self.client.call("fence_broker", {"node_id": self.config.node_id,
                                                  "node_epoch": self.node_epoch,
                                                  "reason": "controlled shutdown"}, timeout_s=5)
            except Exception as exc:
                log.warning("could not fence ourselves on shutdown: %s", exc)
        self.metadata.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="automq broker")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = BrokerConfig.model_validate(json.loads(args.config.read_text()))
    node = BrokerNode(config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    node.start()
    stop.wait()
    log.info("broker %d stopping", config.node_id)
    node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
