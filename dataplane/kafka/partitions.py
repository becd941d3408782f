"""Partitions this broker leads: each is a stream of the storage engine.

`PartitionManager` follows the metadata image: a partition whose leader is this node is
opened (its stream opened with the partition's leader epoch as stream epoch); one that moved
away is dropped. `PartitionLog` is what the Kafka APIs use: append Kafka record batches
(offsets assigned by patching baseOffset and partitionLeaderEpoch), idempotent-producer
duplicate detection, fetch, and a way to wait for new data.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

from controlplane.errors import ControllerError
from controlplane.image import MetadataImage
from dataplane.s3stream.storage import S3Storage, Stream

log = logging.getLogger(__name__)

PRODUCER_BATCHES_KEPT = 5  # Kafka keeps the last 5 batches per producer and partition
MAX_PRODUCERS_PER_PARTITION = 10_000


@dataclass
class _ProducerEntry:
    epoch: int
    # (first_seq, last_seq, base_offset) of the last batches, oldest first
    batches: deque = field(default_factory=lambda: deque(maxlen=PRODUCER_BATCHES_KEPT))


class ProducerStateTable:
    """Idempotent producers of one partition: sequence checks and duplicate detection."""

    DUPLICATE = "duplicate"
    APPEND = "append"

    def __init__(self) -> None:
        self._producers: dict[int, _ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int,
              last_seq: int) -> tuple[str, int]:
        """("append", 0), ("duplicate", base_offset) or ("error", kafka error code)."""
        entry = self._producers.get(producer_id)
        if entry is None:
            return self.APPEND, 0  # unknown producer (new, or state lost): accept
        if epoch < entry.epoch:
            return "error", 47  # INVALID_PRODUCER_EPOCH
        if epoch > entry.epoch:
            return (self.APPEND, 0) if first_seq == 0 else ("error", 45)
        for f, l, base in entry.batches:
            if f == first_seq and l == last_seq:
                return self.DUPLICATE, base
        last = entry.batches[-1][1] if entry.batches else -1
        if first_seq != (last + 1) % (2**31):
            return "error", 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        return self.APPEND, 0

    def record(self, producer_id: int, epoch: int, first_seq: int, last_seq: int,
               base_offset: int) -> None:
        entry = self._producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            if entry is None and len(self._producers) >= MAX_PRODUCERS_PER_PARTITION:
                self._producers.pop(next(iter(self._producers)))
            entry = self._producers[producer_id] = _ProducerEntry(epoch)
        entry.batches.append((first_seq, last_seq, base_offset))


class PartitionLog:
    """One led partition: its stream, producer state and new-data notification."""

    def __init__(self, topic_id: str, topic: str, partition: int, leader_epoch: int,
                 stream: Stream):
        self.topic_id = topic_id
        self.topic = topic
        self.partition = partition
        self.leader_epoch = leader_epoch
        self.stream = stream
        self.producers = ProducerStateTable()
        self.lock = threading.Lock()  # sequence check + append are atomic per partition
        self._listeners: list = []
        self._listeners_lock = threading.Lock()

    @property
    def high_watermark(self) -> int:
        return self.stream.next_offset

    @property
    def log_start_offset(self) -> int:
        return self.stream.start_offset

    def add_listener(self, callback) -> None:
        with self._listeners_lock:
            self._listeners.append(callback)

    def remove_listener(self, callback) -> None:
        with self._listeners_lock:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def notify(self) -> None:
        with self._listeners_lock:
            listeners = list(self._listeners)
        for cb in listeners:
            cb()

    def append_batch(self, build, count: int) -> Future:
        """Append one Kafka batch; `build(base_offset)` returns the patched bytes."""
        fut = self.stream.append_with(build, count)
        fut.add_done_callback(lambda _: self.notify())
        return fut


class PartitionManager:
    """Opens the partitions this node leads, following the metadata image."""

    def __init__(self, node_id: int, storage: S3Storage):
        self.node_id = node_id
        self.storage = storage
        self._logs: dict[tuple[str, int], PartitionLog] = {}  # (topic_id, partition)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._image: MetadataImage | None = None
        self._thread = threading.Thread(target=self._run, name="partitions", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def on_metadata(self, image: MetadataImage, records: list) -> None:
        self._image = image
        self._wake.set()

    def get(self, topic_id: str, partition: int) -> PartitionLog | None:
        with self._lock:
            return self._logs.get((topic_id, partition))

    def logs(self) -> list[PartitionLog]:
        with self._lock:
            return list(self._logs.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            if self._stop.is_set() or self._image is None:
                continue
            try:
                self.reconcile(self._image)
            except Exception:
                log.exception("reconciling partitions failed")

    def reconcile(self, image: MetadataImage) -> None:
        """Open led partitions that are not open; drop the ones led elsewhere now."""
        wanted: dict[tuple[str, int], tuple[str, int, int]] = {}
        for topic in list(image.topics.values()):
            for p in list(topic.partitions.values()):
                if p.leader_node_id == self.node_id:
                    wanted[(topic.topic_id, p.partition)] = (topic.name, p.leader_epoch, p.stream_id)
        with self._lock:
            current = dict(self._logs)
        for key, plog in current.items():
            spec = wanted.get(key)
            if spec is None or spec[1] != plog.leader_epoch:
                with self._lock:
                    self._logs.pop(key, None)
                log.info("no longer leading %s-%d", plog.topic, plog.partition)
        for key, (name, epoch, stream_id) in wanted.items():
            if key in current and current[key].leader_epoch == epoch:
                continue
            try:
                stream = self.storage.open_stream(stream_id, epoch)
            except ControllerError as exc:
                log.warning("cannot open %s-%d (stream %d epoch %d): %s", name, key[1],
                            stream_id, epoch, exc)
                continue
            with self._lock:
                self._logs[key] = PartitionLog(key[0], name, key[1], epoch, stream)
            log.info("leading %s-%d (stream %d, epoch %d, next offset %d)", name, key[1],
                     stream_id, epoch, stream.next_offset)
