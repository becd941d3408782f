"""The WAL failovers this broker is the target of.

When the controller names this node the failover target of a fenced node's WAL, this node
recovers that WAL (`dataplane.s3stream.wal_failover`): its data not yet uploaded is written
to object storage and the failed node's streams are closed, so their new leaders can open
them. One thread per failed node (`failover-N`), retried with a backoff until done, handed
to another node, or FAILOVER_ATTEMPTS attempts failed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataDelta, MetadataImage
from controlplane.records import StreamState
from dataplane.s3stream.storage import S3Storage

log = logging.getLogger(__name__)

FAILOVER_ATTEMPTS = 20
FIRST_RETRY_DELAY_S = 0.2
MAX_RETRY_DELAY_S = 5.0


class WalFailovers:
    """Starts the recovery of every fenced node's WAL whose failover names this node (a
    `Component`: follows the metadata image)."""

    name = "wal-failovers"

    def __init__(self, node_id: int, storage: S3Storage, image_fn: Callable[[], MetadataImage]):
        self.node_id = node_id
        self.storage = storage
        self.image_fn = image_fn
        self._started: set[tuple[int, int]] = set()  # (failed node, failover epoch)
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def start(self) -> None:
        """Nothing to start: failovers start from metadata."""

    def stop(self) -> None:
        """Running failovers give up at their next attempt."""
        self._stop.set()

    def on_metadata(self, delta: MetadataDelta | None, image: MetadataImage) -> None:
        """Recover the WAL of every fenced node whose failover names this node."""
        if delta is not None and not delta.touched.get("node_wals"):
            return
        for wal in list(image.node_wals.values()):
            if not wal.failover_mode or wal.failover_target_node_id != self.node_id:
                continue
            key = (wal.node_id, wal.node_epoch)
            with self._lock:
                if key in self._started:
                    continue
                self._started.add(key)
            threading.Thread(
                target=self._run,
                args=(wal.node_id, wal.wal_uri, wal.node_epoch),
                name=f"failover-{wal.node_id}",
                daemon=True,
            ).start()

    def _still_ours(self, failed_node_id: int, failover_epoch: int) -> bool:
        current = self.image_fn().node_wals.get(failed_node_id)
        return (
            current is not None
            and current.failover_mode
            and current.node_epoch == failover_epoch
            and current.failover_target_node_id == self.node_id
        )

    def _run(self, failed_node_id: int, wal_uri: str, failover_epoch: int) -> None:
        from dataplane.s3stream.wal_failover import recover_failed_wal

        def open_streams() -> list[tuple[int, int]]:
            image = self.image_fn()
            return sorted(
                (s.stream_id, s.epoch)
                for s in image.streams.values()
                if s.state == StreamState.OPENED and s.node_id == failed_node_id
            )

        delay_s = FIRST_RETRY_DELAY_S
        for attempt in range(1, FAILOVER_ATTEMPTS + 1):
            if self._stop.is_set() or not self._still_ours(failed_node_id, failover_epoch):
                return  # stopping, done, or handed to another node
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
            self._stop.wait(delay_s)
            delay_s = min(delay_s * 2, MAX_RETRY_DELAY_S)
        log.error(
            "giving up recovering the WAL of node %d after %d attempts",
            failed_node_id,
            FAILOVER_ATTEMPTS,
        )
