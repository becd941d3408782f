"""`PartitionManager`: opens and closes the partitions this broker leads.

It follows the metadata image: a partition whose leader is this node is opened (its stream
opened with the partition's leader epoch as stream epoch, and the idempotent-producer state
rebuilt from the stream's tail, so a producer retrying a batch the previous leader wrote gets
it deduplicated); one that moved away is closed at once (no new appends, in-flight ones made
durable, its WAL data uploaded, the stream closed) so its new leader can open it. Streams this
node still owns but no longer leads (e.g. moved while it restarted) are closed too.

It acts on the metadata delta: only the topics and streams a batch touched are looked at
(a loaded snapshot, or a reconcile that failed, looks at everything). Partitions whose open
or close failed, and orphaned streams whose close failed, wait in a retry set tried again
about once a second until they succeed or the image moves them on.

Opens run on the move pool and a reconcile pass does not wait for them: a slow open (a long
producer-state replay, a slow controller) does not hold up the partitions later deltas give
this node. A partition whose open is in flight is left alone by later passes (no second open,
no close, no orphan close of its stream); when the open ends, its topic is looked at again if
the image changed meanwhile, so a move that came during the open is acted on then.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from types import MappingProxyType

from prometheus_client import Gauge

from controlplane import broker_configs
from controlplane.errors import ControllerError
from controlplane.image import MetadataDelta, MetadataImage, RangeState, StreamMetaState
from controlplane.records import StreamState
from controlplane.requests import AbortedTxn, RecordAbortedTxnsRequest
from dataplane.kafka import time_index
from dataplane.kafka.partition_log import PartitionLog, forget_topic_metrics
from dataplane.kafka.producer_state import rebuild_producer_state
from dataplane.kafka.time_index import PieceTimestamps
from dataplane.s3stream.storage import S3Storage, Stream

log = logging.getLogger(__name__)

RECORD_ABORTED_TIMEOUT_S = 10.0
MOVE_WORKERS = 8  # partitions opened in parallel (each is a controller round trip + a tail read)
RETRY_INTERVAL_S = 1.0  # partitions (or orphaned streams) whose open or close failed: retried

PARTITIONS_LED = Gauge("automq_partitions_led", "partitions this broker leads and serves now")


class ProduceRateMeter:
    """Smoothed produce rate (bytes/s) per stream from cumulative byte counters sampled now
    and then (each heartbeat); what the controller's balancer weighs partitions by.

    A stream's first sample only starts its clock (no rate yet: an unknown rate is better
    than a false 0 for a partition that just moved here); its first full interval gives the
    rate as is, later ones are blended in with an exponential moving average of time
    constant `tau_s`, so a burst of one second does not look like a hot partition.
    """

    def __init__(self, tau_s: float = 5.0):
        self.tau_s = tau_s
        self._state: dict[int, tuple[int, float, float | None]] = {}  # bytes, at s, rate

    def sample(self, counters: dict[int, int], now_s: float) -> dict[int, float]:
        """Rates of the streams in `counters` (stream id -> bytes appended so far) that
        have had a full interval; forgets streams no longer in `counters`."""
        out: dict[int, float] = {}
        state: dict[int, tuple[int, float, float | None]] = {}
        for stream_id, total in counters.items():
            prev = self._state.get(stream_id)
            if prev is None or total < prev[0]:
                # new here, or its counter restarted (reopened at a new epoch)
                state[stream_id] = (total, now_s, None)
                continue
            last_bytes, last_s, rate = prev
            if now_s > last_s:
                instant = (total - last_bytes) / (now_s - last_s)
                alpha = 1.0 - math.exp(-(now_s - last_s) / self.tau_s)
                rate = instant if rate is None else rate + alpha * (instant - rate)
                prev = (total, now_s, rate)
            state[stream_id] = prev
            if rate is not None:
                out[stream_id] = rate
        self._state = state
        return out


class PartitionManager:
    """Opens the partitions this node leads, following the metadata image."""

    def __init__(
        self,
        node_id: int,
        storage: S3Storage,
        image_ready: Callable[[], bool] = lambda: True,
        serving: Callable[[], bool] = lambda: True,
    ):
        self.node_id = node_id
        self.storage = storage
        self.image_ready = image_ready  # False while the metadata image is mid-replay
        # False while this process may be stale (stopped past its session: dataplane/stall.py):
        # then no partition is served, whatever this node believes it leads
        self.serving = serving
        self._closing = 0
        self._logs: dict[tuple[str, int], PartitionLog] = {}  # (topic_id, partition)
        # opened streams not served yet (their producer state could not be rebuilt yet):
        # (leader epoch, stream), closed if the partition moves on before they are served
        self._unserved: dict[tuple[str, int], tuple[int, Stream]] = {}
        # partitions whose open is in flight on the pool: key -> stream id (bounded by the
        # partitions of the image)
        self._opening: dict[tuple[str, int], int] = {}
        # retries of aborts whose recording failed, one at a time per partition (the manager's
        # thread only): key -> its task on the pool
        self._abort_retries: dict[tuple[str, int], Future[None]] = {}
        self._pool = ThreadPoolExecutor(MOVE_WORKERS, thread_name_prefix="partition-move")
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._image: MetadataImage | None = None
        # the topics' configs in force, computed once per image (a produce asks for them
        # on every append): (the image they were computed from, topic id -> configs)
        self._configs_of_image: tuple[MetadataImage | None, dict[str, Mapping[str, str]]] = (
            None,
            {},
        )
        # what the deltas touched since the last run: topic ids, stream ids; `_full`: look at
        # everything (the first image, a snapshot, a failed reconcile)
        self._full = True
        self._touched_topics: set[str] = set()
        self._touched_streams: set[int] = set()
        # the retry set: partitions whose open or close failed, streams whose orphan close
        # failed (bounded by the partitions and streams of the image)
        self._retry_partitions: set[tuple[str, int]] = set()
        self._retry_streams: set[int] = set()
        self._touched_lock = threading.Lock()
        self._rates = ProduceRateMeter()
        self._rates_lock = threading.Lock()
        # every led partition's time index and the retention check share it
        self.piece_timestamps = PieceTimestamps()
        self._thread = threading.Thread(target=self._run, name="partitions", daemon=True)
        # read at scrape time (one manager per broker process; a later one takes it over)
        PARTITIONS_LED.set_function(lambda: len(self._logs))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def on_metadata(self, delta: MetadataDelta | None, image: MetadataImage) -> None:
        """A new image: reconcile the topics and streams its batch touched (`delta` None: a
        snapshot was loaded, which may have changed anything)."""
        with self._touched_lock:
            self._image = image
            if delta is None:
                self._full = True
            else:
                self._touched_topics |= delta.touched.get("topics", set())
                self._touched_streams |= delta.touched.get("streams", set())
            if self._full or self._touched_topics or self._touched_streams:
                self._wake.set()

    def get(self, topic_id: str, partition: int) -> PartitionLog | None:
        if not self.serving():
            return None
        with self._lock:
            return self._logs.get((topic_id, partition))

    def logs(self) -> list[PartitionLog]:
        with self._lock:
            return list(self._logs.values())

    def produce_rates(self, now_s: float | None = None) -> dict[int, float]:
        """Produce bytes/s of each led partition's stream (see ProduceRateMeter); rounded,
        partitions below 1 B/s left out so an idle broker's heartbeat stays small."""
        with self._lock:
            counters = {plog.stream.stream_id: plog.appended_bytes for plog in self._logs.values()}
        with self._rates_lock:
            rates = self._rates.sample(counters, time.monotonic() if now_s is None else now_s)
        return {sid: round(rate, 1) for sid, rate in rates.items() if rate >= 1.0}

    def led_or_closing(self) -> int:
        """Partitions led here, being opened, or still being closed (uploaded) after a move."""
        with self._lock:
            return len(self._logs) + len(self._opening) + self._closing

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(RETRY_INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set() or self._image is None or not self.image_ready():
                continue
            self._retry_unrecorded_aborts()
            with self._touched_lock:
                image, full = self._image, self._full
                topics = self._touched_topics | {key[0] for key in self._retry_partitions}
                streams = self._touched_streams | self._retry_streams
                self._full = False
                self._touched_topics, self._touched_streams = set(), set()
                self._retry_partitions, self._retry_streams = set(), set()
            if not (full or topics or streams):
                continue
            try:
                if full:
                    self.reconcile(image)
                else:
                    self.reconcile(image, topics, streams)
            except Exception:
                with self._touched_lock:
                    self._full = True  # look at everything next time
                log.exception("reconciling partitions failed")

    def _retry_partition(self, key: tuple[str, int]) -> None:
        with self._touched_lock:
            self._retry_partitions.add(key)

    def retrying(self) -> frozenset[tuple[str, int]]:
        """The partitions (topic id, partition) whose open or close is to be tried again."""
        with self._touched_lock:
            return frozenset(self._retry_partitions)

    def reconcile(
        self,
        image: MetadataImage,
        topic_ids: set[str] | None = None,
        stream_ids: set[int] | None = None,
    ) -> list[Future[None]]:
        """Close partitions led elsewhere now, start opening led ones that are not open,
        close orphaned streams of this node: of the topics `topic_ids` and streams
        `stream_ids` (what deltas touched), or of the whole image when `topic_ids` is None.
        Returns when the closes are done; the opens it started, on the move pool, are the
        futures returned (an open's error is handled inside it; a future that `stop`
        cancelled raises CancelledError). Runs on one thread at a time (the manager's)."""
        if topic_ids is None:
            topics = list(image.topics.values())
        else:
            topics = [t for tid in topic_ids if (t := image.topics.get(tid)) is not None]
        in_scope = (lambda key: True) if topic_ids is None else (lambda key: key[0] in topic_ids)
        wanted: dict[tuple[str, int], tuple[str, int, int]] = {}
        for topic in topics:
            for p in list(topic.partitions.values()):
                if p.leader_node_id == self.node_id:
                    wanted[(topic.topic_id, p.partition)] = (
                        topic.name,
                        p.leader_epoch,
                        p.stream_id,
                    )
        with self._lock:
            current = {key: plog for key, plog in self._logs.items() if in_scope(key)}
            stale = {
                key: entry
                for key, entry in self._unserved.items()
                if in_scope(key)
                and key not in self._opening  # its retry is in flight: looked at after it
                and (key not in wanted or wanted[key][1] != entry[0])
            }
            for key in stale:
                del self._unserved[key]
        if stale:
            self._close_unserved(stale)
        leaving = []
        for key, plog in current.items():
            spec = wanted.get(key)
            if spec is None or spec[1] != plog.leader_epoch:
                with self._lock:
                    self._logs.pop(key, None)  # produce gets NOT_LEADER_OR_FOLLOWER from now on
                    self._closing += 1
                leaving.append(plog)
        # closes first: a partition that moved away and back must have its old epoch's WAL
        # data uploaded before the new epoch's range starts at the committed end
        if leaving:
            self._close_all(leaving)
            self._forget_deleted_topics(image, leaving)
        opens: list[Future[None]] = []
        for key, (name, epoch, stream_id) in wanted.items():
            if key in current and current[key].leader_epoch == epoch:
                continue
            with self._lock:
                if key in self._opening or (key in self._logs and key not in current):
                    # an open in flight, or one that ended during this pass: looked at again
                    # when it ended if the image changed since it started
                    continue
                self._opening[key] = stream_id
            try:
                opens.append(
                    self._pool.submit(self._open_tracked, image, key, name, epoch, stream_id)
                )
            except RuntimeError:  # the pool was shut down: stopping
                with self._lock:
                    self._opening.pop(key, None)
                break
        if topic_ids is None:
            self._close_orphans(image, list(image.streams.values()))
        else:
            streams = [s for sid in stream_ids or () if (s := image.streams.get(sid)) is not None]
            self._close_orphans(image, streams)
        return opens

    def _forget_deleted_topics(self, image: MetadataImage, closed: list[PartitionLog]) -> None:
        """Drop the byte counters of deleted topics none of whose partitions is led here."""
        deleted = {plog.topic for plog in closed if plog.topic_id not in image.topics}
        if not deleted:
            return
        with self._lock:
            led = {plog.topic for plog in self._logs.values()}
        for topic in deleted - led:
            forget_topic_metrics(topic)

    def _close_unserved(self, stale: dict[tuple[str, int], tuple[int, Stream]]) -> None:
        """Close the streams of partitions opened here but never served that moved on (to
        another node, or to a newer epoch here): their new leader's open waits for it."""
        streams = [stream for _epoch, stream in stale.values()]
        try:
            errors = self.storage.close_streams(streams)
        except Exception as exc:
            errors = [exc] * len(streams)
        for (key, entry), error in zip(stale.items(), errors, strict=True):
            if error is None:
                log.info("closed stream %d, opened here but never served", entry[1].stream_id)
                continue
            self._retry_partition(key)
            with self._lock:
                self._unserved.setdefault(key, entry)  # tried again with the retry set
            log.warning("closing unserved stream %d failed: %s", entry[1].stream_id, error)

    def _retry_unrecorded_aborts(self) -> None:
        """Aborts whose recording failed are tried again (about once a second), one retry
        of a partition at a time: against a slow controller they would fill the pool the
        opens need."""
        with self._lock:
            logs = {key: plog for key, plog in self._logs.items() if plog.has_unrecorded_aborts}
        running = {key: task for key, task in self._abort_retries.items() if not task.done()}
        for key, plog in logs.items():
            if key not in running:
                running[key] = self._pool.submit(plog.record_pending_aborts)
        self._abort_retries = running

    def _close_all(self, leaving: list[PartitionLog]) -> None:
        """One upload for all partitions that moved away, then their closes."""
        for plog in leaving:  # while this node still owns the streams
            plog.record_pending_aborts()
        try:
            errors = self.storage.close_streams([plog.stream for plog in leaving])
        except Exception as exc:  # the upload failed: failover (or a retry) covers them
            errors = [exc] * len(leaving)
        finally:
            with self._lock:
                self._closing -= len(leaving)
        for plog, error in zip(leaving, errors):
            if error is None:
                log.info(
                    "no longer leading %s-%d: stream %d uploaded and closed",
                    plog.topic,
                    plog.partition,
                    plog.stream.stream_id,
                )
            else:
                log.warning(
                    "closing %s-%d (stream %d) failed: %s",
                    plog.topic,
                    plog.partition,
                    plog.stream.stream_id,
                    error,
                )

    def _open_tracked(
        self, image: MetadataImage, key: tuple[str, int], name: str, epoch: int, stream_id: int
    ) -> None:
        """`_open` on the move pool, for a reconcile of `image` that did not wait: an open
        that failed (or is not served yet) puts the partition in the retry set once it has
        left `_opening` (a pass that took the retry set meanwhile left it alone, as in
        flight); once it ends, the partition's topic and stream are looked at again if the
        image changed meanwhile (the passes in between left them alone: a move is acted on,
        a stream opened but not served is closed as an orphan)."""
        retry = False
        try:
            if self._still_led(key, epoch):  # it may have waited in the pool's queue
                retry = not self._open(key, name, epoch, stream_id)
        except Exception:
            retry = True
            log.exception("opening %s-%d (stream %d) failed", name, key[1], stream_id)
        finally:
            with self._lock:
                self._opening.pop(key, None)
            if retry:
                self._retry_partition(key)
            # read after the key left `_opening`: a pass that skipped it saw an image set
            # before that, so it is seen here
            with self._touched_lock:
                if self._image is not image:
                    self._touched_topics.add(key[0])
                    self._touched_streams.add(stream_id)
                    self._wake.set()

    def _still_led(self, key: tuple[str, int], epoch: int) -> bool:
        """The newest image (if any) still has this node lead `key` at `epoch`."""
        image = self._image
        if image is None:
            return True
        topic = image.topics.get(key[0])
        state = topic.partitions.get(key[1]) if topic is not None else None
        return (
            state is not None
            and state.leader_node_id == self.node_id
            and state.leader_epoch == epoch
        )

    def _open(self, key: tuple[str, int], name: str, epoch: int, stream_id: int) -> bool:
        """Open and serve the partition: True once served; False when it is to be tried
        again (the caller puts it in the retry set)."""
        try:
            stream = self.storage.open_stream(stream_id, epoch)
        except ControllerError as exc:
            log.info(
                "cannot open %s-%d yet (stream %d epoch %d): %s",
                name,
                key[1],
                stream_id,
                epoch,
                exc,
            )
            return False
        plog = PartitionLog(
            key[0],
            name,
            key[1],
            epoch,
            stream,
            ranges_fn=lambda: self._stream_ranges(stream_id),
            configs_fn=lambda: self._topic_configs(key[0]),
            pieces_fn=lambda: time_index.stored_pieces(self._image, stream_id),
            piece_timestamps=self.piece_timestamps,
            record_aborted=lambda entries: self._record_aborted(stream, entries),
            run_later=self._pool.submit,
        )
        # as the controller had them when it opened the stream for this epoch: everything
        # the previous leader recorded (the image here may not have caught up yet)
        recorded = stream.recorded_aborted_txns
        plog.txns.seed_aborted(recorded)
        try:
            producers = rebuild_producer_state(stream, plog.producers, plog.txns)
        except Exception as exc:
            # serving with an empty idempotence table would append a producer's retry of a
            # batch the previous leader wrote a second time: not serving yet (clients get
            # NOT_LEADER_OR_FOLLOWER and retry); the retry set opens it again
            with self._lock:
                self._unserved[key] = (epoch, stream)
            log.warning(
                "%s-%d: could not rebuild producer state, not serving it yet: %s",
                name,
                key[1],
                exc,
            )
            return False
        plog.queue_unrecorded_aborts(recorded[-1][2] if recorded else -1)
        with self._touched_lock:
            self._retry_partitions.discard(key)
        with self._lock:
            self._unserved.pop(key, None)
            self._logs[key] = plog
        log.info(
            "leading %s-%d (stream %d, epoch %d, next offset %d, %d idempotent batches replayed)",
            name,
            key[1],
            stream_id,
            epoch,
            stream.next_offset,
            producers,
        )
        return True

    def _record_aborted(self, stream: Stream, entries: list[tuple[int, int, int]]) -> None:
        """Store a led partition's aborted transactions with its stream (blocking)."""
        self.storage.controller.record_aborted_txns(
            RecordAbortedTxnsRequest(
                node_id=self.storage.node_id,
                node_epoch=self.storage.node_epoch,
                stream_id=stream.stream_id,
                stream_epoch=stream.epoch,
                aborted=[
                    AbortedTxn(producer_id=p, first_offset=f, marker_offset=m)
                    for p, f, m in entries
                ],
            ),
            timeout_s=RECORD_ABORTED_TIMEOUT_S,
        )

    def _topic_configs(self, topic_id: str) -> Mapping[str, str]:
        """The topic's configs in force here in the newest image: its own, else this
        broker's dynamic defaults (controlplane/broker_configs.py), else Kafka's."""
        image = self._image
        cached_image, by_topic = self._configs_of_image
        if cached_image is not image:  # images are never changed: a new one, new configs
            by_topic = {}
            self._configs_of_image = (image, by_topic)  # one reference swap (any thread)
        configs = by_topic.get(topic_id)
        if configs is None:
            topic = image.topics.get(topic_id) if image is not None else None
            if topic is None:
                return {}
            configs = MappingProxyType(
                broker_configs.topic_configs_in_force(image, topic.configs, self.node_id)
            )
            by_topic[topic_id] = configs  # bounded: one per topic of the image
        return configs

    def _stream_ranges(self, stream_id: int) -> list[RangeState]:
        image = self._image
        stream = image.streams.get(stream_id) if image is not None else None
        return list(stream.ranges) if stream is not None else []

    def _leads_stream_at(self, image: MetadataImage, stream: StreamMetaState) -> bool:
        """This node leads the partition of `stream` (by its tags) at the stream's epoch."""
        topic = image.topics.get(stream.tags.get("topic_id", ""))
        try:
            state = topic.partitions.get(int(stream.tags.get("partition", "-1"))) if topic else None
        except ValueError:
            return False
        return (
            state is not None
            and state.leader_node_id == self.node_id
            and state.stream_id == stream.stream_id
            and state.leader_epoch == stream.epoch
        )

    def _close_orphans(self, image: MetadataImage, streams: list[StreamMetaState]) -> None:
        """Of `streams`, those the image says this node has open, that this engine did not
        open and this node does not lead with that epoch: close them so their new leader
        can open them."""
        with self._lock:  # before open_here: an open leaves `_opening` after it registered
            opening = set(self._opening.values())
        open_here = self.storage.open_stream_ids()
        for stream in streams:
            if stream.state != StreamState.OPENED or stream.node_id != self.node_id:
                continue
            if stream.stream_id in open_here or self._leads_stream_at(image, stream):
                continue
            if stream.stream_id in opening:
                continue  # being opened here: looked at again when the open ends
            if "topic" not in stream.tags:
                continue  # not a partition's stream: its user closes it
            try:
                self.storage.close_orphan_stream(stream.stream_id, stream.epoch)
                log.info("closed orphaned stream %d (epoch %d)", stream.stream_id, stream.epoch)
            except ControllerError as exc:  # the controller knows better: not orphaned
                log.info(
                    "orphaned stream %d (epoch %d) not closed: %s",
                    stream.stream_id,
                    stream.epoch,
                    exc,
                )
            except Exception as exc:
                with self._touched_lock:
                    self._retry_streams.add(stream.stream_id)
                log.warning("closing orphaned stream %d failed: %s", stream.stream_id, exc)
