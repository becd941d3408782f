"""S3Storage: the storage engine of one broker, and the Stream API on top of it.

Write path: `Stream.append` -> WAL (group commit, fsync) -> LogCache -> acknowledged.
The uploader turns acknowledged batches into objects once the cache passes a threshold, on an
interval, or on demand: streams with at least `stream_split_bytes` in the upload get their own
stream object, the rest share one stream-set object; ids are prepared, objects are put into
the active bucket, one atomic commit tells the controller, and only then is the WAL trimmed.
Read path: LogCache for the tail, `StreamReader`s over committed objects for the rest.
On start the WAL is recovered and whatever was not committed yet is uploaded first, so a
restart continues with no gap and no duplicate offset.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.calls import ControllerCalls
from controlplane.errors import NODE_FENCING_CODES, ControllerError, ErrorCode
from controlplane.requests import (
    CloseStreamRequest,
    CreateStreamRequest,
    OpenStreamRequest,
    TrimStreamRequest,
)
from dataplane.config import StorageConfig, WALConfig
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.light_future import LightFuture
from dataplane.objectstore import ObjectStorage, SendPace
from dataplane.s3stream import metrics
from dataplane.s3stream.block_cache import BlockCache
from dataplane.s3stream.commit import Committer
from dataplane.s3stream.committed_readers import CommittedReaders
from dataplane.s3stream.controller_locator import ControllerLocator
from dataplane.s3stream.log_cache import LogCache
from dataplane.s3stream.recovery import UncommittedBatches, resolve_all
from dataplane.s3stream.stream_reader import BlockFetcher, IndexCache, ObjectLocator, StreamReader
from dataplane.s3stream.uploader import (
    UNPACED_WAL_USED_FRACTION,
    ObjectUploader,
    StorageError,
    UploadResult,
    data_lost,
    is_retriable_upload_error,
    log_dropped_stream,
    upload_pace,
)
from dataplane.s3stream.wal import WALBackpressureError, WALFullError, WriteAheadLog
from dataplane.s3stream.wal.factory import open_wal, wal_uri_for_path

log = logging.getLogger(__name__)

MAX_DROPPED_STREAMS = 100_000  # (stream, epoch) pairs remembered as uncommittable
MAX_ERROR_CHARS = 1000  # of an upload error in stats and metrics


@dataclass(frozen=True)
class UploadStats:
    """Upload health of one engine (heartbeats, `cluster status`, /metrics)."""

    wal_used_bytes: int
    wal_capacity_bytes: int
    upload_lag_s: float  # age of the oldest acknowledged, not uploaded batch; 0 if none
    last_upload_error: str | None  # the last upload attempt's error; None once one succeeds


def _error_text(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


@dataclass
class _StreamState:
    stream_id: int
    epoch: int
    next_offset: int  # offset the next append gets
    confirmed_offset: int  # end of the acknowledged prefix
    start_offset: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (producer id, first offset, marker offset) of the aborted transactions the controller
    # held for the stream when this epoch opened it (partitions seed their TxnIndex from it)
    recorded_aborted_txns: list[tuple[int, int, int]] = field(default_factory=list)
    error: BaseException | None = None
    closing: bool = False  # no new appends: the stream is being uploaded and closed
    closed: bool = False


class Stream:
    """An open stream: append, fetch, trim, close."""

    def __init__(self, storage: S3Storage, state: _StreamState):
        self._storage = storage
        self._state = state

    @property
    def stream_id(self) -> int:
        return self._state.stream_id

    @property
    def epoch(self) -> int:
        return self._state.epoch

    @property
    def recorded_aborted_txns(self) -> list[tuple[int, int, int]]:
        """The aborted transactions recorded with the stream when this epoch opened it."""
        return self._state.recorded_aborted_txns

    @property
    def start_offset(self) -> int:
        return self._state.start_offset

    @property
    def next_offset(self) -> int:
        """End of the acknowledged records (what a reader may see)."""
        return self._state.confirmed_offset

    def check_writable(self) -> None:
        """Raise StorageError if the stream takes no more appends (closing or closed, a
        failed append, this node fenced)."""
        self._storage._check_writable(self._state)

    def check_room(self, size_bytes: int) -> None:
        """Raise `WALFullError` (after asking for an upload) when the WAL has no room for
        `size_bytes` more now: a caller appending several batches checks once, first, so
        that none of them is appended when not all fit. Never blocks."""
        self._storage.check_room(size_bytes)

    @property
    def room_wait_s(self) -> float:
        """How long a producer may wait for WAL room before it is answered with a
        retriable error (the engine's `wal_full_wait_s`)."""
        return self._storage.config.wal_full_wait_s

    @property
    def append_offset(self) -> int:
        """The offset the next append gets: past every appended record, acknowledged or
        not. Its single writer (a partition log, under its lock) assigns offsets from it."""
        return self._state.next_offset

    def append(self, payload: bytes, count: int = 1) -> Future:
        """Append `count` offsets carried by `payload` at the stream's end; the future gives
        the base offset once the batch is durable in the WAL."""
        return self._storage._append(self._state, None, count, payload)

    def append_at(
        self,
        base_offset: int,
        count: int,
        payload: bytes,
        wal_payload: bytes | None = None,
        payload_crc32c: int | None = None,
    ) -> Future:
        """Append a finished batch whose offsets its writer assigned: `count` offsets from
        `base_offset`, which must be `append_offset` (else StorageError, nothing appended).
        With `wal_payload` (a Link Record pointing at data stored elsewhere: the zone
        router's RouterChannel) the WAL keeps it instead of `payload`, while reads and
        uploads get `payload`. `payload_crc32c`: see `StreamRecordBatch`. The future gives
        the base offset once durable."""
        return self._storage._append(
            self._state, base_offset, count, payload, wal_payload, payload_crc32c
        )

    def fetch(
        self, start_offset: int, end_offset: int | None = None, max_bytes: int = 1024 * 1024
    ) -> list[StreamRecordBatch]:
        return self._storage._fetch(
            self._state, start_offset, end_offset if end_offset is not None else 2**62, max_bytes
        )

    def fetch_cached(
        self, start_offset: int, end_offset: int, max_bytes: int
    ) -> list[StreamRecordBatch] | None:
        """`fetch` when every batch it returns is in the LogCache (the tail): never blocks
        on I/O, so the event loop may call it; None when the range starts below the
        LogCache (`fetch` reads objects: call it off the loop)."""
        state = self._state
        return self._storage._read_log_cache(state, start_offset, end_offset, max_bytes)[0]

    def trim(self, new_start_offset: int) -> None:
        self._storage._trim(self._state, new_start_offset)

    def close(self) -> None:
        self._storage._close_stream(self._state)


class S3Storage:
    """One broker's storage engine (see the module docstring)."""

    def __init__(
        self,
        config: StorageConfig,
        node_id: int,
        node_epoch: int,
        controller: ControllerCalls,
        objects: ObjectStorage,
        locator: ObjectLocator | None = None,
        *,
        data_dir: Path,
        wal: WALConfig | None = None,
        active_bucket: Callable[[], int | None] | None = None,
        link_resolver: Callable[[StreamRecordBatch], StreamRecordBatch] | None = None,
    ):
        """`config`: the broker config's `storage` section; `wal`: its `wal` section (None:
        the defaults); `data_dir`: the engine's directory (a file:// WAL defaults to it).
        `active_bucket()`: the bucket new objects go to as the metadata says now (see
        `ObjectUploader`; None: never switch mid-upload). `link_resolver`: resolves Link
        Records found in the WAL at recovery (the zone router's RouterChannel readers;
        None: the WAL holds none)."""
        self.config = config
        self.data_dir = data_dir
        self.wal_config = wal or WALConfig()
        self.node_id = node_id
        self.node_epoch = node_epoch
        self.controller = controller
        self.objects = objects
        self.locator = locator or ControllerLocator(controller)
        self.log_cache = LogCache(config.log_cache_uploaded_bytes)
        self.block_cache = BlockCache(config.block_cache_bytes)
        self.link_resolver = link_resolver
        self._active_bucket = active_bucket
        self.index_cache = IndexCache(objects)
        self.fetcher = BlockFetcher(objects, self.block_cache)
        self.committed_readers = CommittedReaders(
            self.locator, self.index_cache, self.fetcher, self.block_cache, config
        )
        self._streams: dict[int, _StreamState] = {}
        self._lock = threading.Lock()  # log cache and stream table
        self._upload_lock = threading.Lock()  # one upload at a time, in WAL order
        self._wake = threading.Condition()
        self._flush_requested = False
        self._pace: SendPace | None = None  # the upload in flight's (read by any thread)
        self._stop = threading.Event()
        self.uploader = ObjectUploader(
            controller,
            objects,
            lambda: Committer(self.node_id, self.node_epoch),
            config,
            active_bucket,
        )
        self.wal: WriteAheadLog | None = None
        # the last upload attempt's error, None once one succeeds; written by whichever
        # thread uploads (uploader, flush, close) under `_upload_lock`, read without a lock
        # (a reference swap: readers see the old or the new error)
        self.upload_error: BaseException | None = None
        self.fenced_error: ControllerError | None = None
        # (stream id, epoch) whose data the controller refused for good, with the reason:
        # their batches still in the LogCache are left out of later uploads (under _lock)
        self._dropped: OrderedDict[tuple[int, int], ErrorCode] = OrderedDict()
        self._uploader = threading.Thread(target=self._upload_loop, name="uploader", daemon=True)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> int:
        """Open (and recover) the WAL, upload what was not committed, start the uploader.
        Returns the number of recovered batches that were uploaded."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.wal = open_wal(
            self.wal_uri,
            self.node_id,
            self.node_epoch,
            capacity_bytes=self.wal_config.capacity_bytes,
            config=self.wal_config.file,
            objects=self.objects,  # reaches an s3:// WAL with the broker's bucket config
            object_config=self.wal_config.object,
            # an s3:// WAL writes to the active bucket (a bucket failover moves it too)
            active_bucket=self._active_bucket,
        )
        metrics.bind_upload_stats(self.upload_stats)
        recovered = self._recover()
        self._uploader.start()
        return recovered

    @property
    def wal_uri(self) -> str:
        """Where this engine's WAL lives (the factory picks the implementation by scheme)."""
        return self.wal_config.uri or wal_uri_for_path(self.data_dir / "wal")

    def _recover(self) -> int:
        """Re-upload the acknowledged batches the controller has not committed yet (the
        rule is `recovery.UncommittedBatches`)."""
        assert self.wal is not None
        uncommitted = UncommittedBatches(self.node_id, self.controller.stream)
        keep: list[tuple[StreamRecordBatch, int]] = []
        records_read = 0
        for rec in self.wal.recover():
            records_read += 1
            batch, _ = StreamRecordBatch.decode(rec.data)
            if uncommitted.accept(batch):
                keep.append((batch, rec.next_offset))
        uncommitted.name_lost(self.wal.scan_loss, f"restart of node {self.node_id}")
        if not records_read:
            return 0
        # only now the data of Link Records: committed ones may point at trimmed data
        resolved = resolve_all(self.resolve_link, [batch for batch, _ in keep])
        keep = list(zip(resolved, [wal_next for _, wal_next in keep], strict=True))
        with self._lock:
            for batch, wal_next in keep:
                self.log_cache.put(batch, wal_next)
        self._upload_all()
        log.info("recovered %d batches from the WAL and uploaded them", len(keep))
        return len(keep)

    def close(self, close_streams: bool = True) -> None:
        """Graceful shutdown: upload everything acknowledged, close the open streams (so
        another node may open them at once; `close_streams=False` keeps them owned by this
        node so its restart reopens them with the same epoch), stop."""
        try:
            self._upload_all()
            with self._lock:
                open_streams = list(self._streams.values()) if close_streams else []
            for state, error in zip(open_streams, self.close_streams(open_streams)):
                if error is not None:
                    log.warning("closing stream %d on shutdown failed: %s", state.stream_id, error)
        finally:
            self._stop.set()
            with self._wake:
                self._wake.notify_all()
            if self._uploader.is_alive():
                self._uploader.join(30)
            self.committed_readers.release_all()
            if self.wal is not None:
                self.wal.close()

    # ------------------------------------------------------------ streams

    def create_stream(self, tags: dict[str, str] | None = None) -> int:
        return self.controller.create_stream(
            CreateStreamRequest(node_id=self.node_id, node_epoch=self.node_epoch, tags=tags or {})
        ).stream_id

    def open_stream(self, stream_id: int, epoch: int) -> Stream:
        res = self.controller.open_stream(
            OpenStreamRequest(
                node_id=self.node_id,
                node_epoch=self.node_epoch,
                stream_id=stream_id,
                stream_epoch=epoch,
            )
        )
        state = _StreamState(
            stream_id=stream_id,
            epoch=epoch,
            next_offset=res.next_offset,
            confirmed_offset=res.next_offset,
            start_offset=res.start_offset,
            recorded_aborted_txns=[tuple(a) for a in res.aborted_txns],
        )
        with self._lock:
            self._streams[stream_id] = state
        return Stream(self, state)

    def check_room(self, size_bytes: int) -> None:
        """See `Stream.check_room`."""
        wal = self.wal
        assert wal is not None
        generation = wal.room.generation
        # headers and padding are not counted: a first check, an append that still finds
        # no room raises the same way
        if not wal.has_room(size_bytes):
            self.request_upload()
            raise WALFullError(
                f"no WAL room for {size_bytes} B ({wal.used_bytes} B of {wal.capacity_bytes} B "
                f"used); waiting for uploads (last upload error: {self.upload_error})",
                wal.room,
                generation,
            )

    def _check_writable(self, state: _StreamState) -> None:
        if state.closed or state.closing:
            raise StorageError(f"stream {state.stream_id} is closed")
        if state.error is not None:
            raise StorageError(f"stream {state.stream_id} failed: {state.error}")
        if self.fenced_error is not None:
            raise StorageError(f"this node is fenced: {self.fenced_error}")

    def _append(
        self,
        state: _StreamState,
        base_offset: int | None,
        count: int,
        payload: bytes,
        wal_payload: bytes | None = None,
        payload_crc32c: int | None = None,
    ) -> Future:
        """See `Stream.append_at` (`base_offset` None: at the stream's end). Never blocks
        (callers may be on the event loop): no room in the WAL raises its
        `WALBackpressureError` at once, after asking for an upload (which frees room)."""
        assert self.wal is not None
        with state.lock:
            self._check_writable(state)
            if base_offset is not None and base_offset != state.next_offset:
                raise StorageError(
                    f"stream {state.stream_id}: an append at {base_offset}, but its next "
                    f"offset is {state.next_offset}"
                )
            batch = StreamRecordBatch(
                state.stream_id, state.epoch, state.next_offset, count, payload, payload_crc32c
            )
            logged = (
                batch
                if wal_payload is None
                else StreamRecordBatch(
                    state.stream_id, state.epoch, batch.base_offset, -count, wal_payload
                )
            )
            try:
                # header and payload as pieces, not joined: the WAL writes them with pwritev
                header, body = logged.encode_parts()
                wal_future = self.wal.append((header, body), logged.encoded_crc32c(header))
            except WALBackpressureError:
                self.request_upload()
                raise
            state.next_offset = batch.last_offset
        result: Future = LightFuture()  # one per produced batch: the cheap kind

        def settle(outcome: Callable[[], None]) -> None:
            # the Kafka layer cancels the future of a produce whose client timed out; the
            # batch is durable all the same, there is just nobody left to tell
            try:
                outcome()
            except InvalidStateError:
                pass

        def on_durable(f: Future) -> None:
            error = f.exception()
            if error is not None:
                state.error = error
                settle(lambda: result.set_exception(error))
                return
            with self._lock:
                self.log_cache.put(batch, f.result().next_offset)
                state.confirmed_offset = batch.last_offset
                pending = self.log_cache.pending_upload_bytes
            metrics.WAL_CACHE_BYTES.set(pending)
            if pending >= self.config.upload_threshold_bytes:
                self.request_upload()
            settle(lambda: result.set_result(batch.base_offset))

        wal_future.add_done_callback(on_durable)
        return result

    def _read_log_cache(
        self, state: _StreamState, start: int, end: int, max_bytes: int
    ) -> tuple[list[StreamRecordBatch] | None, int | None]:
        """In one hold of the lock: the batches from `start` when the LogCache holds it
        (else None), and where the LogCache's part of the stream starts (None: nothing)."""
        end = min(end, state.confirmed_offset)
        if start >= end:
            return [], None
        with self._lock:
            cached_from = self.log_cache.start_offset(state.stream_id)
            if cached_from is not None and start >= cached_from:
                return self.log_cache.read(state.stream_id, start, end, max_bytes), cached_from
        return None, cached_from

    def _fetch(
        self, state: _StreamState, start: int, end: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        cached, cached_from = self._read_log_cache(state, start, end, max_bytes)
        if cached is not None:
            return cached
        end = min(end, state.confirmed_offset)
        object_end = end if cached_from is None else min(end, cached_from)
        out = self.committed_readers.read(state.stream_id, start, object_end, max_bytes)
        size = sum(b.size_bytes for b in out)
        next_offset = out[-1].last_offset if out else start
        if (
            cached_from is not None
            and next_offset >= cached_from
            and size < max_bytes
            and next_offset < end
        ):
            with self._lock:
                out += self.log_cache.read(state.stream_id, next_offset, end, max_bytes - size)
        return out

    def resolve_link(self, batch: StreamRecordBatch) -> StreamRecordBatch:
        """The data batch a WAL record stands for: a Link Record is resolved (its data read
        from where it points) by `link_resolver`. Only for records still to be uploaded:
        the data of committed ones may be gone (a RouterChannel trims once committed)."""
        if batch.is_link:
            if self.link_resolver is None:
                raise StorageError(
                    f"stream {batch.stream_id} offset {batch.base_offset}: a Link Record in "
                    "the WAL and no resolver for it"
                )
            batch = self.link_resolver(batch)
        return batch

    def read_committed(
        self, stream_id: int, start: int, end: int, max_bytes: int
    ) -> list[StreamRecordBatch]:
        """Batches of any stream (open here or not) from its objects: offsets in [start, end)
        below its committed end. The zone router's proxies read what mains uploaded this way.
        Blocks on I/O; thread-safe."""
        if start >= end:
            return []
        return self.committed_readers.read(stream_id, start, end, max_bytes)

    @property
    def readers(self) -> list[StreamReader]:
        """The cached readers of committed objects (see `CommittedReaders`)."""
        return self.committed_readers.readers

    def _trim(self, state: _StreamState, new_start: int) -> None:
        if new_start > state.confirmed_offset:
            raise StorageError(
                f"cannot trim stream {state.stream_id} to {new_start} past its "
                f"end {state.confirmed_offset}"
            )
        with self._lock:
            must_upload = self.log_cache.has_pending(state.stream_id)
        if must_upload:
            self._upload_all()
        self.controller.trim_stream(
            TrimStreamRequest(
                node_id=self.node_id,
                node_epoch=self.node_epoch,
                stream_id=state.stream_id,
                stream_epoch=state.epoch,
                new_start_offset=new_start,
            )
        )
        state.start_offset = new_start

    def _close_stream(self, state: _StreamState) -> None:
        error = self.close_streams([state])[0]
        if error is not None:
            raise error

    def close_streams(self, states: list[_StreamState | Stream]) -> list[BaseException | None]:
        """Close several streams with one upload: stop their appends, wait until appends
        already in the WAL queue are acknowledged (else the upload would miss acknowledged
        records), upload, then close each with the controller. Returns per stream None or
        the error that kept it open (its WAL failover uploads it later)."""
        states = [s._state if isinstance(s, Stream) else s for s in states]
        if not states:
            return []
        for state in states:
            with state.lock:  # appends check `closing` under this lock: none starts after it
                state.closing = True
        started = time.monotonic()
        deadline = started + self.config.close_wait_s
        errors: list[BaseException | None] = [None] * len(states)
        for i, state in enumerate(states):
            while state.confirmed_offset < state.next_offset and state.error is None:
                if time.monotonic() > deadline:
                    errors[i] = StorageError(
                        f"stream {state.stream_id}: appends up to {state.next_offset} are not "
                        f"durable after {self.config.close_wait_s}s; not closing"
                    )
                    break
                time.sleep(0.002)
        waited = time.monotonic()
        self._upload_all()
        uploaded = time.monotonic()
        for i, state in enumerate(states):
            if state.closed or errors[i] is not None:
                continue
            try:
                self.controller.close_stream(
                    CloseStreamRequest(
                        node_id=self.node_id,
                        node_epoch=self.node_epoch,
                        stream_id=state.stream_id,
                        stream_epoch=state.epoch,
                    )
                )
            except ControllerError as exc:
                if exc.code != ErrorCode.UNKNOWN_STREAM:
                    errors[i] = exc
                    continue
                # deleted (its topic was): nothing is left to close, and the upload above
                # left its data out, so there is nothing to keep either
                log.info("stream %d was deleted: closed here", state.stream_id)
            state.closed = True
            with self._lock:
                self._streams.pop(state.stream_id, None)
                self.log_cache.drop_stream(state.stream_id)
        log.info(
            "closed %d streams: in-flight appends %.0f ms, upload %.0f ms, closes %.0f ms",
            sum(1 for e in errors if e is None),
            (waited - started) * 1000,
            (uploaded - waited) * 1000,
            (time.monotonic() - uploaded) * 1000,
        )
        return errors

    def open_stream_ids(self) -> set[int]:
        with self._lock:
            return set(self._streams)

    def close_orphan_stream(self, stream_id: int, epoch: int) -> None:
        """Close a stream the controller says this node owns but that is not open in this
        engine (its owner epoch moved on, e.g. a partition moved while we restarted): the
        WAL recovery already uploaded its acknowledged records, anything still pending is
        uploaded first."""
        with self._lock:
            if stream_id in self._streams:
                raise StorageError(f"stream {stream_id} is open here; close it with Stream.close")
        self._upload_all()
        self.controller.close_stream(
            CloseStreamRequest(
                node_id=self.node_id,
                node_epoch=self.node_epoch,
                stream_id=stream_id,
                stream_epoch=epoch,
                orphaned_only=True,
            )
        )

    # ------------------------------------------------------------ uploads

    def request_upload(self) -> None:
        pace = self._pace  # the WAL fills up: the upload in flight goes at full speed
        if pace is not None and self._wal_used_fraction() >= UNPACED_WAL_USED_FRACTION:
            pace.unpace()
        with self._wake:
            self._flush_requested = True
            self._wake.notify_all()

    def flush(self) -> None:
        """Upload and commit everything acknowledged so far (blocks)."""
        self._upload_all()

    def _upload_loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            with self._wake:
                if not self._flush_requested:
                    self._wake.wait(
                        max(0.0, self.config.upload_interval_s - (time.monotonic() - last))
                    )
                self._flush_requested = False
            if self._stop.is_set():
                return
            accumulated_s, last = time.monotonic() - last, time.monotonic()
            try:
                self._upload_all(self._pace_for(accumulated_s))
            except ControllerError as exc:
                if exc.code in NODE_FENCING_CODES:
                    log.error("upload refused, this node is fenced: %s", exc)
                    self.fenced_error = exc
                    return
                log.warning("upload failed, will retry: %s", exc)
                self._stop.wait(1.0)
            except Exception as exc:
                if is_retriable_upload_error(exc):
                    log.warning("upload failed, will retry: %s", exc)
                else:
                    log.exception("upload failed, will retry")
                self._stop.wait(1.0)

    def _wal_used_fraction(self) -> float:
        wal = self.wal
        return wal.used_bytes / wal.capacity_bytes if wal is not None else 1.0

    def _pace_for(self, accumulated_s: float) -> SendPace | None:
        """The pace of a regular upload of what gathered over `accumulated_s`."""
        with self._lock:
            pending = self.log_cache.pending_upload_bytes
        min_rate, used = self.config.upload_send_min_bytes_per_s, self._wal_used_fraction()
        return upload_pace(pending, accumulated_s, min_rate, used)

    def _upload_all(self, pace: SendPace | None = None) -> None:
        """Upload the batches pending when called, object after object, at `pace` (None: at
        once, and so does an upload in flight). Batches acknowledged meanwhile wait for the
        next upload: under steady load, chasing them would never end (nor a close on it)."""
        if pace is None and self._pace is not None:
            self._pace.unpace()
        with self._lock:
            target = self.log_cache.pending_wal_end()
        if target < 0:
            return
        with self._upload_lock:
            self._pace = pace
            try:
                for _ in range(100_000):
                    with self._lock:
                        batches, wal_end = self.log_cache.take_pending(
                            self.config.max_object_bytes, target
                        )
                    if not batches:
                        break
                    self._upload(batches, wal_end, pace)
            except BaseException as exc:
                self._set_upload_error(exc)
                raise
            self._set_upload_error(None)

    def _set_upload_error(self, exc: BaseException | None) -> None:
        self.upload_error = exc
        metrics.set_last_upload_error(None if exc is None else _error_text(exc))

    def _upload(
        self, batches: list[StreamRecordBatch], wal_end: int, pace: SendPace | None = None
    ) -> None:
        """Upload one chunk of pending batches (WAL order), leaving out streams whose data
        the controller refused for good, then release the chunk's WAL space: the left-out
        data is released with it, so a deleted stream never holds the WAL."""
        started = time.monotonic()
        with self._lock:
            live = [b for b in batches if (b.stream_id, b.epoch) not in self._dropped]
        result = (
            self.uploader.upload(
                live,
                on_dropped=lambda bad: self._drop_streams(live, bad),
                pace=pace,
            )
            if live
            else UploadResult()
        )
        left_out = len(batches) - result.batches
        with self._lock:
            # freed when this returns, outside the lock every acknowledgement needs
            _evicted = self.log_cache.mark_uploaded(batches)
            if left_out:
                # no reader may see data that is in no object: forget the left-out streams'
                # cached batches (kept while later chunks still hold some of theirs)
                for sid in {
                    b.stream_id for b in batches if (b.stream_id, b.epoch) in self._dropped
                }:
                    self.log_cache.drop_stream(sid)
            metrics.WAL_CACHE_BYTES.set(self.log_cache.pending_upload_bytes)
        assert self.wal is not None
        self.wal.trim(wal_end)
        metrics.UPLOADS.inc()
        metrics.UPLOAD_BYTES.inc(result.size_bytes)
        if left_out:
            metrics.UPLOAD_DROPPED_BATCHES.inc(left_out)
        metrics.UPLOAD_LATENCY.observe(time.monotonic() - started)
        log.debug(
            "uploaded %d batches (%d bytes), left out %d",
            result.batches,
            result.size_bytes,
            left_out,
        )

    def _drop_streams(
        self, batches: list[StreamRecordBatch], dropped: dict[int, ErrorCode]
    ) -> None:
        """Remember streams whose data the controller refused for good and stop their
        appends here (their later batches would be refused too)."""
        ends: dict[int, tuple[int, int]] = {}  # stream -> (epoch, end of its data here)
        for b in batches:
            if b.stream_id in dropped:
                ends[b.stream_id] = (b.epoch, b.last_offset)
        for sid, (epoch, dropped_end) in ends.items():
            code = dropped[sid]
            gone = code in (
                ErrorCode.UNKNOWN_STREAM,
                ErrorCode.STREAM_FENCED,
                ErrorCode.STREAM_NOT_OPENED,
            )
            committed_end = None if gone else self._committed_end(sid)
            lost = data_lost(code, committed_end, dropped_end)
            if gone or lost:
                # nothing more of this (stream, epoch) can ever be committed from here
                with self._lock:
                    self._dropped[(sid, epoch)] = code
                    self._dropped.move_to_end((sid, epoch))
                    while len(self._dropped) > MAX_DROPPED_STREAMS:
                        self._dropped.popitem(last=False)  # its batches are refused again
                    state = self._streams.get(sid)
                    if state is not None and state.epoch == epoch:
                        state.error = StorageError(
                            f"stream {sid} epoch {epoch} can no longer be committed ({code.value})"
                        )
                        if code == ErrorCode.UNKNOWN_STREAM:
                            self._streams.pop(sid, None)
            log_dropped_stream(sid, epoch, code, committed_end, dropped_end, lost)

    def _committed_end(self, stream_id: int) -> int | None:
        """The controller's committed end of a stream, None if it cannot say now."""
        try:
            return int(self.controller.stream(stream_id)["end_offset"])
        except Exception as exc:  # unknown: the caller assumes the worst
            log.warning("stream %d: cannot read its committed end: %s", stream_id, exc)
            return None

    def upload_stats(self) -> UploadStats:
        """Upload health now (any thread: takes the engine's lock briefly)."""
        with self._lock:
            oldest = self.log_cache.oldest_pending_acked_s()
        error = self.upload_error
        wal = self.wal
        return UploadStats(
            wal_used_bytes=wal.used_bytes if wal is not None else 0,
            wal_capacity_bytes=self.wal_config.capacity_bytes,
            upload_lag_s=round(max(0.0, time.monotonic() - oldest), 3)
            if oldest is not None
            else 0.0,
            last_upload_error=None if error is None else _error_text(error),
        )
