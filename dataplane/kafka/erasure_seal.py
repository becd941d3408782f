"""Sealing erasure-coded partitions into object storage, and their retention (issue #14).

Offsets of an erasure-coded partition below the readers' visible end are decided forever
(decoded or void, `erasure/holes.py`). The sealer of a partition (the broker Metadata names
for it, `erasure_placement.serving_node`; any broker may race it, see below) periodically
reads the decided records from the partition's sealed end up to the visible end minus a
seal delay, writes them as one ordinary stream object of the partition's stream
(`formats/seal_format.py`: stream offsets are Kafka offsets >> 16) and commits it with
`seal_erasure_range`. Only once the commit is applied are the shards dropped from the shard
stores (`drop_below`, durable); a store that misses the drop (down) is told again on
every pass, and each broker's pass also raises its own store's marks to the image's sealed
ends (`follow_drop_marks`). Reads below the sealed end then come from the object store,
through the storage engine's read path and BlockCache.

Why nothing is lost or doubled:
- prepare -> put -> commit: a sealer dying before the commit leaves a PREPARED object the
  controller destroys at its deadline; the shards are still in the stores.
- the controller accepts a seal only at the stream's sealed end: of two sealers of one
  range, one commits and the other is refused (STREAM_OFFSET_GAP) and drops nothing; a
  retried commit whose answer was lost is answered as done (same object id).
- every reader and sealer decodes the same decided records (readers agree), so whichever
  sealer wins, the object holds what readers of the stores returned.
- a reader whose metadata is older than a seal and reads from a store below its drop mark
  gets `SealedRangeError` (never a silent empty range) and retries from the object store.

Void-only ranges: a range whose offsets are all void (split writes, no record) is sealed
too, as an object of fillers only, so its holes do not stay in the stores.

Repair (`erasure/repair.py`): each pass also lists the partition's unsealed holes from a
cursor up to the repair delay behind now and gives every decided write that lacks shards
on stores that answer its missing shards (re-encoded; only into holes that hold no bytes),
rate-limited; offsets whose missing holes are on stores that did not answer are looked at
again once one of those stores answers. So a write won with exactly k shards gets its
margin back within about a pass of its stores being reachable, not only when sealed. Its
switch, rate and delay are dynamic broker configs (`automq.erasure.repair.enable`,
`.rate.bytes.per.sec`, `.delay.ms`; `kafka-configs --entity-type brokers`), read each pass.

Retention (`retention.ms`, `retention.bytes`, `cleanup.policy=delete`) and DeleteRecords move
the stream start (`trim_erasure_stream`) over sealed pieces only: unsealed records in the
stores are the active segment. A piece's time is its end offset's clock (offsets are the
writers' clocks in ns). Objects wholly below the start are destroyed like any trimmed object.

Thread-safety: one sealer thread runs the passes; `seal` may also be called from a request
thread (DeleteRecords); a lock serialises seals of one broker. Repair state is touched by
the sealer thread only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import Counter

from controlplane import broker_configs, topic_configs
from controlplane.calls import ControllerCalls
from controlplane.erasure_placement import serving_node
from controlplane.errors import ControllerError, ErrorCode
from controlplane.image import MetadataImage, StreamMetaState
from controlplane.requests import (
    PrepareObjectsRequest,
    SealErasureRangeRequest,
    TrimErasureStreamRequest,
)
from dataplane.config import SealConfig
from dataplane.erasure.reader import (
    CorruptWriteError,
    ErasureReader,
    ReadUnavailableError,
    SealedRangeError,
)
from dataplane.erasure.repair import ErasureRepairer, RepairStats
from dataplane.erasure.store import HoleStore
from dataplane.formats.object_format import ObjectWriter
from dataplane.formats.record_batch import InvalidRecordBatchError, parse_batch_header, patch_batch
from dataplane.formats.seal_format import offset_of, seal_batches, sealed_records, slot_of
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.kafka.retention import retention_start_offset
from dataplane.kafka.time_index import stored_pieces
from dataplane.objectstore import ObjectStorage, object_key

log = logging.getLogger(__name__)

MAX_SEAL_READS = 200  # reader calls per seal (each up to SEAL_READ_RECORDS offsets)
SEAL_READ_RECORDS = 1_000
DROP_ALL = 2**63 - 1  # the drop mark of a deleted stream: every hole goes
REPAIR_THREADS = 12  # listing and repair calls to the stores, shared by a broker's partitions

REPAIRED_SHARDS = Counter(
    "automq_erasure_repaired_shards_total",
    "shards of decided erasure-coded writes re-encoded into holes their stores lacked",
)
REPAIR_REFUSED_SHARDS = Counter(
    "automq_erasure_repair_refused_shards_total",
    "repair shards a store refused: the hole already held other bytes (never overwritten)",
)
VOID_SEALS = Counter(
    "automq_erasure_void_seals_total",
    "erasure-coded ranges holding void offsets only, sealed as filler objects",
)


class ErasurePartition(Protocol):
    """What the sealer needs of a partition (kafka/erasure_partition.ErasurePartition)."""

    topic_id: str
    topic: str
    partition: int
    erasure_stream_id: int
    reader: ErasureReader
    seal_delay_ms: int

    @property
    def leader_epoch(self) -> int: ...


@dataclass(frozen=True)
class RepairSettings:
    """The repair's settings in force on this broker (see `ErasureSealer.repair_settings`)."""

    enabled: bool
    max_bytes_per_s: int
    delay_ms: int


def sealed_end(stream: StreamMetaState | None) -> int | None:
    """The stream's sealed end in slots, None when nothing is sealed yet."""
    if stream is None or not stream.ranges:
        return None
    return stream.end_offset


class ErasureSealer:
    """Seals the erasure-coded partitions this broker serves (see the module docstring)."""

    def __init__(
        self,
        node_id: int,
        node_epoch_fn: Callable[[], int],
        image_fn: Callable[[], MetadataImage],
        controller: ControllerCalls,
        objects: ObjectStorage,
        partitions_fn: Callable[[str, int], ErasurePartition | None],
        config: SealConfig | None = None,
        clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        local_store: HoleStore | None = None,
    ):
        self.node_id = node_id
        self.node_epoch_fn = node_epoch_fn
        self.image_fn = image_fn
        self.controller = controller
        self.objects = objects
        self.partitions_fn = partitions_fn
        self.config = config or SealConfig()
        self.clock_ms = clock_ms
        self.local_store = local_store  # this broker's shard store (deleted topics' holes)
        self.seals = 0  # objects committed by this sealer
        self.void_seals = 0  # of which ranges of void offsets only
        self.repair_stats = RepairStats()  # totals of this broker's repairs
        self._repairers: dict[int, ErasureRepairer] = {}  # stream -> its repairer
        self._repair_cursor: dict[int, int] = {}  # stream -> offset the next pass starts at
        # stream -> (lowest offset with holes missing on unanswering stores, those stores)
        self._repair_waiting: dict[int, tuple[int, frozenset[int]]] = {}
        self._repair_pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._dropped: dict[tuple[int, int], int] = {}  # (stream, store index) -> drop mark
        self._scanned: dict[int, int] = {}  # stream -> offset below which no record is left
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="erasure-sealer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            pool, self._repair_pool = self._repair_pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(self.config.interval_ms / 1000):
            try:
                self.run_once()
            except Exception:
                log.exception("erasure seal pass failed")

    def run_once(self) -> int:
        """One pass over the erasure-coded partitions this broker serves; returns how many
        objects were committed."""
        image = self.image_fn()
        sealed = 0
        try:
            self.follow_drop_marks(image)
        except Exception as exc:  # noqa: BLE001 - its store closed or failing: the rest goes on
            log.warning("raising this broker's store's drop marks: %s", exc)
        for stream_id in [sid for sid in self._repairers if sid not in image.streams]:
            self._repairers.pop(stream_id, None)  # a deleted topic's: forget its state
            self._repair_cursor.pop(stream_id, None)
            self._repair_waiting.pop(stream_id, None)
        for topic in list(image.topics.values()):
            for state in list(topic.partitions.values()):
                if self._stop.is_set():
                    return sealed
                if not state.erasure_coded or serving_node(image, state) != self.node_id:
                    continue
                partition = self.partitions_fn(topic.topic_id, state.partition)
                if partition is None:
                    continue
                try:
                    sealed += self.seal(partition)
                    self.apply_retention(partition)
                except (ReadUnavailableError, SealedRangeError, CorruptWriteError) as exc:
                    log.info("seal of %s-%d waits: %s", topic.name, state.partition, exc)
                except Exception as exc:  # noqa: BLE001 - controller or bucket: next pass
                    log.warning("seal of %s-%d: %s", topic.name, state.partition, exc)
                try:  # also while sealing waits (stores down)
                    self.repair_if_enabled(partition)
                except Exception as exc:  # noqa: BLE001 - next pass
                    log.warning("repair of %s-%d: %s", topic.name, state.partition, exc)
        return sealed

    # ------------------------------------------------------------ sealing

    def seal(self, partition: ErasurePartition, up_to: int | None = None) -> int:
        """Seal the partition's decided records from its sealed end up to Kafka offset
        `up_to` (default: the visible end minus the seal delay); returns the objects
        committed (0 or 1). Raises the reader's errors when the stores cannot decide."""
        with self._lock:
            stream = self.image_fn().streams.get(partition.erasure_stream_id)
            if stream is None:
                return 0
            start_slot = sealed_end(stream)
            if start_slot is not None:
                self._drop(partition, offset_of(start_slot))  # stores that missed the drop
            # records stay in the stores `seal.delay.ms` past the visible end (tailing
            # consumers read them there), and an object spans at least that long
            delay_ns = partition.seal_delay_ms * 1_000_000
            limit = up_to if up_to is not None else partition.reader.visible_end() - delay_ns
            start = offset_of(start_slot) if start_slot is not None else 0
            # below `scanned` this sealer found no record already (decided: none can appear)
            scan_from = max(start, self._scanned.get(partition.erasure_stream_id, 0))
            if limit <= scan_from or (up_to is None and scan_from and limit - scan_from < delay_ns):
                return 0
            records, end, first_void = self._decided(partition, scan_from, limit)
            end_slot = slot_of(end)
            records = [(o, b) for o, b in records if o < offset_of(end_slot)]
            if first_void is not None and first_void >= offset_of(end_slot):
                first_void = None
            if not records and first_void is None:
                # nothing to seal; the next look starts here, one seal delay later: an idle
                # partition costs no read (no fill) per pass
                self._scanned[partition.erasure_stream_id] = max(scan_from, offset_of(end_slot))
                return 0
            if start_slot is None:
                # a first seal starts at its first held offset (record or void): the
                # stream starts there
                firsts = [records[0][0]] if records else []
                firsts += [first_void] if first_void is not None else []
                start_slot = slot_of(min(firsts))
            if end_slot <= start_slot:
                return 0
            # void offsets only: an object of fillers, so their holes leave the stores too
            batches = seal_batches(partition.erasure_stream_id, start_slot, end_slot, records)
            if not self._commit(partition, batches, start_slot, end_slot):
                return 0
            self.seals += 1
            if not records:
                self.void_seals += 1
                VOID_SEALS.inc()
            self._drop(partition, offset_of(end_slot))
            return 1

    def _decided(
        self, partition: ErasurePartition, start: int, limit: int
    ) -> tuple[list[tuple[int, bytes]], int, int | None]:
        """The decided Kafka batches (patched with their offsets) from `start`, the offset
        below which everything was read (at most `limit`), and the first void offset met."""
        records: list[tuple[int, bytes]] = []
        size = 0
        position = start
        first_void: int | None = None
        for _ in range(MAX_SEAL_READS):
            result = partition.reader.read(position, max_records=SEAL_READ_RECORDS)
            if first_void is None and result.first_void is not None and result.first_void < limit:
                first_void = result.first_void
            for offset, payload in result.records:
                if offset >= limit:
                    return records, limit, first_void
                try:
                    parse_batch_header(payload)
                    batch = patch_batch(payload, offset, partition.leader_epoch)
                except (InvalidRecordBatchError, ValueError):
                    # not one Kafka batch: no Kafka record there (as reads skip it); sealed
                    # away like a void offset
                    if first_void is None:
                        first_void = offset
                    continue
                records.append((offset, batch))
                size += len(batch)
            if result.blocked_at is not None:
                return records, min(result.blocked_at, limit), first_void
            if result.next_offset <= position or result.next_offset >= limit:
                return records, min(result.next_offset, limit), first_void
            position = result.next_offset
            if size >= self.config.max_object_bytes:
                break
        return records, min(position, limit), first_void

    def _commit(
        self,
        partition: ErasurePartition,
        batches: Sequence[StreamRecordBatch],
        start_slot: int,
        end_slot: int,
    ) -> bool:
        writer = ObjectWriter(max_object_bytes=2 * self.config.max_object_bytes + (1 << 20))
        writer.add_all(batches)
        obj = writer.finish()
        epoch = self.node_epoch_fn()
        prepared = self.controller.prepare_objects(
            PrepareObjectsRequest(
                node_id=self.node_id,
                node_epoch=epoch,
                count=1,
                ttl_ms=self.config.prepared_ttl_ms,
            )
        )
        object_id, bucket_id = prepared.first_object_id, prepared.bucket_id
        self.objects.put_object(bucket_id, object_key(object_id), obj.data)
        try:
            self.controller.seal_erasure_range(
                SealErasureRangeRequest(
                    node_id=self.node_id,
                    node_epoch=epoch,
                    object_id=object_id,
                    stream_id=partition.erasure_stream_id,
                    start_offset=start_slot,
                    end_offset=end_slot,
                    size_bytes=len(obj.data),
                    bucket_id=bucket_id,
                )
            )
        except ControllerError as exc:
            if exc.code is ErrorCode.STREAM_OFFSET_GAP:
                # another broker sealed this range first: ours expires unused
                log.info("%s-%d: %s", partition.topic, partition.partition, exc.message)
                return False
            raise
        log.info(
            "%s-%d: sealed offsets [%d, %d) into object %d (%d B)",
            partition.topic,
            partition.partition,
            offset_of(start_slot),
            offset_of(end_slot),
            object_id,
            len(obj.data),
        )
        return True

    # ------------------------------------------------------------ repair

    def repair_settings(self) -> RepairSettings:
        """The repair's switch, rate and delay in force: the dynamic broker configs
        (`automq.erasure.repair.*`, this broker's, else the cluster default's) where set,
        else this sealer's `SealConfig`."""
        image = self.image_fn()
        layers = (
            broker_configs.configs_of(image, str(self.node_id)),
            broker_configs.configs_of(image, ""),
        )

        def setting(key: str, static: str) -> str:
            if any(key in layer for layer in layers):
                return topic_configs.broker_setting(layers[1], layers[0], key)
            return static

        return RepairSettings(
            enabled=setting(topic_configs.ERASURE_REPAIR_ENABLE, str(self.config.repair).lower())
            == "true",
            max_bytes_per_s=int(
                setting(topic_configs.ERASURE_REPAIR_RATE, str(self.config.repair_max_bytes_per_s))
            ),
            delay_ms=int(
                setting(topic_configs.ERASURE_REPAIR_DELAY_MS, str(self.config.repair_delay_ms))
            ),
        )

    def _repairer(self, partition: ErasurePartition, max_bytes_per_s: int) -> ErasureRepairer:
        with self._lock:
            if self._repair_pool is None:
                self._repair_pool = ThreadPoolExecutor(
                    REPAIR_THREADS, thread_name_prefix="erasure-repair"
                )
            pool = self._repair_pool
        repairer = self._repairers.get(partition.erasure_stream_id)
        if repairer is None or repairer.stores != partition.reader.stores:
            repairer = ErasureRepairer(
                partition.reader.stores,
                partition.erasure_stream_id,
                partition.reader.codec,
                pool,
                max_bytes_per_s,
                self.repair_stats,
            )
            self._repairers[partition.erasure_stream_id] = repairer
        return repairer

    def repair_if_enabled(self, partition: ErasurePartition) -> int:
        """A repair pass (`repair`) unless the repair is switched off; the shards written."""
        settings = self.repair_settings()
        return self.repair(partition, settings) if settings.enabled else 0

    def repair(self, partition: ErasurePartition, settings: RepairSettings | None = None) -> int:
        """One bounded repair pass over the partition's unsealed offsets (from its cursor to
        the repair delay ago); returns the shards written. Called on the sealer thread."""
        settings = settings or self.repair_settings()
        repairer = self._repairer(partition, settings.max_bytes_per_s)
        stream_id = partition.erasure_stream_id
        sealed = sealed_end(self.image_fn().streams.get(stream_id))
        floor = offset_of(sealed) if sealed is not None else 0
        start = max(self._repair_cursor.get(stream_id, 0), floor)
        repairer.max_bytes_per_s = settings.max_bytes_per_s  # an operator may change it
        end = partition.reader.clock_ns() - settings.delay_ms * 1_000_000
        deadline_s = repairer.clock_s() + self.config.repair_pass_max_ms / 1000
        result = repairer.repair_range(start, end, deadline_s=deadline_s)
        cursor = max(start, result.next_offset)
        waiting = self._repair_waiting.pop(stream_id, None)
        if waiting is not None:
            if waiting[1] & result.listed:  # a store it waited for answers: look again
                cursor = min(cursor, max(waiting[0], floor))
            else:
                self._repair_waiting[stream_id] = waiting
        if result.waiting_from is not None:
            old = self._repair_waiting.get(stream_id)
            self._repair_waiting[stream_id] = (
                min(result.waiting_from, old[0]) if old else result.waiting_from,
                result.waiting_on | (old[1] if old else frozenset()),
            )
        self._repair_cursor[stream_id] = cursor
        if result.repaired_shards:
            REPAIRED_SHARDS.inc(result.repaired_shards)
            log.info(
                "%s-%d: repaired %d shards of decided writes in [%d, %d)",
                partition.topic,
                partition.partition,
                result.repaired_shards,
                start,
                result.next_offset,
            )
        return result.repaired_shards

    def _drop(self, partition: ErasurePartition, mark: int) -> None:
        """Tell every store that has not confirmed it yet to forget the holes below `mark`
        (best effort: a store that is down is told on a later pass)."""
        for index, store in enumerate(partition.reader.stores):
            key = (partition.erasure_stream_id, index)
            if self._dropped.get(key, -1) >= mark:
                continue
            try:
                self._dropped[key] = store.drop_below(partition.erasure_stream_id, mark)
            except Exception as exc:  # noqa: BLE001 - down or slow: next pass
                log.debug(
                    "drop on store %d of stream %d: %s", index, partition.erasure_stream_id, exc
                )

    def follow_drop_marks(self, image: MetadataImage) -> int:
        """Bring this broker's own store's drop marks up to the image; returns the streams
        whose mark rose. A deleted stream's holes all go: stream ids are never reused, so
        an id below the image's next stream id that the image no longer has is deleted for
        good (a newer stream that this image does not know yet has an id at or above it).
        A sealed stream's holes below its sealed end go: the image holds the seal's commit,
        the same condition as the sealer's own drop. So a store that was down when its
        partition's sealer told the stores learns it from its own broker's next pass, not
        only from that sealer's next visit to the partition."""
        if self.local_store is None:
            return 0
        raised = 0
        for stream_id, mark in self.local_store.streams().items():
            if mark >= DROP_ALL or stream_id >= image.next_stream_id:
                continue
            stream = image.streams.get(stream_id)
            if stream is None:
                target = DROP_ALL
            else:
                end_slot = sealed_end(stream)
                if end_slot is None or offset_of(end_slot) <= mark:
                    continue
                target = offset_of(end_slot)
            self.local_store.drop_below(stream_id, target)
            raised += 1
        return raised

    # ------------------------------------------------------------ retention

    def apply_retention(self, partition: ErasurePartition) -> bool:
        """Trim sealed pieces out of retention.ms / retention.bytes (cleanup.policy delete);
        returns whether the stream start moved."""
        image = self.image_fn()
        topic = image.topics.get(partition.topic_id)
        stream = image.streams.get(partition.erasure_stream_id)
        if topic is None or sealed_end(stream) is None:
            return False
        configs = topic.configs
        policy = topic_configs.effective(configs, "cleanup.policy")
        if "delete" not in [p.strip() for p in policy.split(",")]:
            return False
        assert stream is not None
        new_start = retention_start_offset(
            stored_pieces(image, partition.erasure_stream_id),
            stream.start_offset,
            self.clock_ms(),
            topic_configs.effective_int(configs, "retention.ms"),
            topic_configs.effective_int(configs, "retention.bytes"),
            lambda piece: offset_of(piece.end_offset) // 1_000_000,
        )
        if new_start is None or new_start <= stream.start_offset:
            return False
        self.trim(partition, new_start)
        log.info(
            "retention: %s-%d now starts at %d",
            partition.topic,
            partition.partition,
            offset_of(new_start),
        )
        return True

    def trim(self, partition: ErasurePartition, new_start_slot: int) -> None:
        self.controller.trim_erasure_stream(
            TrimErasureStreamRequest(
                node_id=self.node_id,
                node_epoch=self.node_epoch_fn(),
                stream_id=partition.erasure_stream_id,
                new_start_offset=new_start_slot,
            )
        )


__all__ = ["ErasureSealer", "sealed_end", "sealed_records"]
