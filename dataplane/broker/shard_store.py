"""This broker's shard store (erasure-coded partitions): durable write-once holes under
data_dir/shards, served over HTTP (`shard-store` thread) before the broker registers its
port.

It is started on every broker with object storage, whatever its own config says: the
controller places an erasure-coded partition's k + m shards on any k + m active brokers
(`controlplane/erasure_placement.py`), so every broker's store must be reachable.
"""

from __future__ import annotations

import logging
import threading
import time

from controlplane.image import MetadataDelta, MetadataImage
from controlplane.listeners import insecure_listener_error
from dataplane.config import BrokerConfig
from dataplane.erasure.store import HoleStore
from dataplane.erasure.store_server import ShardStoreHTTPServer, bench_inject_delay_ms

log = logging.getLogger(__name__)

PORT_WAIT_S = 30.0  # how long to wait for the port held by a dying predecessor
PORT_RETRY_S = 0.5
SERVE_POLL_S = 0.2


class ShardStore:
    """The shard store and its HTTP server (a `Component`)."""

    name = "shard-store"

    def __init__(self, config: BrokerConfig):
        self.config = config
        self.store = HoleStore(config.data_dir / "shards")
        self._server: ShardStoreHTTPServer | None = None

    @property
    def port(self) -> int:
        """The port the store serves on (registered with the controller); 0 before start."""
        return self._server.server_address[1] if self._server is not None else 0

    def start(self) -> None:
        """Serve the store; the other brokers authenticate with the cluster secret (none:
        loopback only, unless allow_insecure)."""
        cfg = self.config
        secret = cfg.controller_api_secret
        refused = insecure_listener_error(
            "the shard store", cfg.host, secret is not None, cfg.allow_insecure
        )
        if refused:
            raise RuntimeError(refused)
        deadline = time.monotonic() + PORT_WAIT_S
        while True:
            try:
                server = ShardStoreHTTPServer(
                    (cfg.host, cfg.erasure.shard_store_port),
                    self.store,
                    inject_delay_ms=bench_inject_delay_ms(),
                    secret=secret,
                    delay_active=False,
                )
                break
            except OSError as exc:  # a predecessor just killed may still hold the port
                if not cfg.erasure.shard_store_port or time.monotonic() > deadline:
                    raise
                log.warning("shard store port: %s; retrying", exc)
                time.sleep(PORT_RETRY_S)
        self._server = server
        threading.Thread(
            target=server.serve_forever, args=(SERVE_POLL_S,), name="shard-store", daemon=True
        ).start()
        log.info("shard store on %s:%d", cfg.host, self.port)

    def stop(self) -> None:
        """Stop serving and close the store."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        self.store.close()

    def on_metadata(self, delta: MetadataDelta | None, image: MetadataImage) -> None:
        """The store does not follow metadata."""
