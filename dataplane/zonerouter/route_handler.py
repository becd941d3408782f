"""The main's side of the zone route (seed 000): a proxy's produce arrives as a
`ZoneRouteRequest` (route epoch, source node, channel offset).

`ZoneRouteHandler` refuses a fenced route epoch, reads the batches from the proxy's
RouterChannel (`channel.py`; version 1 carries the routes of several partitions and produce
requests, their records read in one trip), appends them to the partition with a Link Record per batch in
the WAL (`formats/link_record.py`: the data stays in the channel until the main's upload),
and answers once its append is durable. It also appends the main's own produce routed
through its own channel (`own_channel.py`), indexes every link for the proxies' snapshot
reads, and reports the persisted route epoch (every accepted request's links committed)
with heartbeats, so the controller can advance the committed route epoch and proxies can
trim their channels.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from controlplane.image import MetadataImage
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.link_record import LINK_PAYLOAD_BYTES, LinkRecord
from dataplane.formats.record_batch import parse_batch_header
from dataplane.formats.stream_records import HEADER_SIZE_BYTES
from dataplane.kafka.partition_backend import AppendOutcome, PartitionResolver, append_when_room
from dataplane.runtime import outcome_within
from dataplane.s3stream.wal.object_readers import WALTrimmedError
from dataplane.zonerouter.channel import ChannelReaders, channel_bucket_of, channel_location
from dataplane.zonerouter.protocol import ZONE_ROUTE_VERSION, ZoneRouteRequest, ZoneRouteResponse
from dataplane.zonerouter.route_codec import (
    RouteSessionMismatch,
    RouteSessions,
    RouteSessionState,
    pack_answers,
    pack_answers_v5,
    pack_refusal_v5,
    unpack_entries,
    unpack_request,
)
from dataplane.zonerouter.snapshot import LinkIndex, LinkLocation
from dataplane.zonerouter.traffic import ZoneTraffic

if TYPE_CHECKING:
    from dataplane.zonerouter.snapshot_read import SnapshotServer

MAX_ROUTE_ENTRIES = 1024  # routes in one batched request
# an entry's answer: error, message, base offset, log start, stream id, end of its links
_Result = tuple[KafkaError, str | None, int, int, int, int]


@dataclass(frozen=True, slots=True)
class _PackedRoute:
    """A version 3+ request's packed fields, named as versions 0-2 name them (version 4+:
    and its route session's state, which version 5's answers are packed against)."""

    route_epoch: int
    source_node_id: int
    timeout_ms: int
    session: RouteSessionState | None = None


class ZoneRouteHandler:
    """The main's side of `ZoneRouteRequest` (a Kafka API handler). Thread-safe; the append
    happens on the event loop as a client's produce does."""

    def __init__(
        self,
        image_fn: Callable[[], MetadataImage],
        partitions: PartitionResolver,
        channels: ChannelReaders,
        traffic: ZoneTraffic,
        io: Callable | None,
        link_index: LinkIndex | None = None,
        snapshot_server: SnapshotServer | None = None,
    ):
        self.image_fn = image_fn
        self.partitions = partitions
        self.channels = channels
        self.traffic = traffic
        self.io = io  # run a blocking call off the event loop: await io(fn, *args)
        # accepted requests whose links may not be committed yet (the persisted epoch)
        self._pending: dict[int, dict] = {}
        self._pending_lock = threading.Lock()
        self._next_token = 0
        # where recent links' data lies, for the proxies' snapshot reads; None: not indexed
        self.link_index = link_index
        self.snapshot_server = snapshot_server  # its GetPartitionSnapshot handler, or None
        self.route_sessions = RouteSessions()  # version 4's, per proxy and session id

    def registrations(self) -> list:
        extra = self.snapshot_server.registrations() if self.snapshot_server else []
        return [(ZoneRouteRequest, 0, ZONE_ROUTE_VERSION, self.zone_route), *extra]

    def _track(self, route_epoch: int) -> tuple[int, dict]:
        """Count a request of `route_epoch` as pending (under `_pending_lock`)."""
        token = self._next_token
        self._next_token += 1
        entry = {"epoch": route_epoch, "done": False, "stream_id": -1, "end": -1}
        entry["stream_epoch"] = -1
        self._pending[token] = entry
        return token, entry

    def _untrack_if_unlinked(self, token: int, entry: dict) -> None:
        with self._pending_lock:
            entry["done"] = True
            if entry["end"] < 0:  # nothing linked
                self._pending.pop(token, None)

    def _link_append(
        self, source: int, channel_offset: int, data: bytes, plog, entry: dict
    ) -> tuple[AppendOutcome, int, int]:
        """Append `data` (the channel record at `channel_offset` of node `source`) to the
        partition with Link Records in the WAL; records every link in the snapshot index.
        Returns the outcome, the stream id and the end offset of the last link (-1: none).
        Thread-safe (the partition's lock orders appends)."""
        now_ms = int(time.time() * 1000)
        ends: list[int] = []  # the end offset of every batch written as a Link Record
        stream_id = plog.stream_id
        leader_epoch = plog.leader_epoch
        index = self.link_index

        def link(position: int, length: int) -> Callable[[int], bytes]:
            self.traffic.add("wal_data_bytes", HEADER_SIZE_BYTES + LINK_PAYLOAD_BYTES)
            header = parse_batch_header(data, position, copy=False)
            count = header.last_offset_delta + 1
            transactional = header.is_transactional

            def build(base: int) -> bytes:  # under the stream's lock, before append returns
                ends.append(base + count)
                record = LinkRecord(source, channel_offset, position, length, now_ms)
                if index is not None and stream_id >= 0:
                    index.record(
                        stream_id,
                        LinkLocation(
                            base, count, leader_epoch, record, transactional, time.monotonic()
                        ),
                    )
                return record.encode()

            return build

        outcome = plog.append(data, link=link)
        if index is not None and stream_id >= 0:
            committed = self.image_fn().streams.get(stream_id)
            if committed is not None:
                index.prune(stream_id, committed.end_offset)
        # the proxy keeps the channel record until the stream's committed end reaches the
        # end of what links to it (-1: no link was written)
        end = max(ends, default=-1)
        with self._pending_lock:
            entry["stream_id"], entry["end"] = stream_id, end
            entry["stream_epoch"] = plog.leader_epoch
        return outcome, stream_id, end

    def append_own(
        self, node_id: int, channel_offset: int, data: bytes, plog
    ) -> tuple[AppendOutcome, int, int]:
        """The main's own produce routed through its own RouterChannel (a client of an AZ
        producing to a partition led here): `data` is the channel record at
        `channel_offset`; appended with Link Records, tracked in the current route epoch
        as a proxy's request is. Thread-safe; called off the event loop."""
        with self._pending_lock:
            token, entry = self._track(self.image_fn().route_epoch.current_epoch)
        try:
            return self._link_append(node_id, channel_offset, data, plog, entry)
        finally:
            self._untrack_if_unlinked(token, entry)

    def persisted_epoch(self) -> int:
        """The largest route epoch P (at most the fenced one, which this main refuses from
        now on) such that every request it accepted in an epoch <= P is committed: its Link
        Records uploaded (the stream's committed end reached them, or the stream moved to a
        new epoch after a failover). Reported with heartbeats; the controller's minimum over
        the brokers is the committed route epoch."""
        with self._pending_lock:
            image = self.image_fn()
            fenced = image.route_epoch.fenced_epoch
            for token, entry in list(self._pending.items()):
                if not entry["done"] or entry["end"] < 0:
                    continue
                stream = image.streams.get(entry["stream_id"])
                if (
                    stream is None
                    or stream.epoch != entry["stream_epoch"]
                    or stream.end_offset >= entry["end"]
                ):
                    del self._pending[token]
            blocking = [entry["epoch"] for entry in self._pending.values()]
        return min(fenced, min(blocking) - 1) if blocking else fenced

    def persisted_epoch_forcing_commit(self, request_upload: Callable[[], None]) -> int:
        """`persisted_epoch()`, and when it lags the fenced epoch (links accepted in a
        fenced epoch are not uploaded yet) ask the storage engine to upload now: the
        ConfirmWAL is committed up to the fenced epoch at least once per route epoch
        (`route_epoch_interval_ms`, 10 s) whatever the upload interval, so the committed
        epoch advances and proxies can trim their channels. Called with every heartbeat."""
        persisted = self.persisted_epoch()
        if persisted < self.image_fn().route_epoch.fenced_epoch:
            request_upload()
        return persisted

    @staticmethod
    def _answer(
        error: KafkaError,
        message: str | None = None,
        base: int = -1,
        start: int = -1,
        stream_id: int = -1,
        end: int = -1,
    ):
        """A version 0 answer (one partition)."""
        return ZoneRouteResponse[0](
            error_code=error,
            error_message=message,
            base_offset=base,
            log_start_offset=start,
            stream_id=stream_id,
            end_offset=end,
        )

    @staticmethod
    def _refused(version: int, error: KafkaError, message: str):
        """The whole request refused (a fenced epoch, a bad channel)."""
        if version == 0:
            return ZoneRouteHandler._answer(error, message)
        if version >= 5:
            return ZoneRouteResponse[version](packed_answers=pack_refusal_v5(error, message))
        if version >= 2:
            return ZoneRouteResponse[version](
                error_code=error, error_message=message, packed_answers=b""
            )
        return ZoneRouteResponse[version](error_code=error, error_message=message, entries=[])

    @staticmethod
    def _response(version: int, results: list[_Result], entries: list, req):
        """The answers of `entries` (version 5: packed against `req`'s route session)."""
        if version == 0:
            return ZoneRouteHandler._answer(*results[0])
        R = ZoneRouteResponse[version]
        if version >= 5:
            answers = [(r[0], r[1], r[2], r[4], r[5]) for r in results]
            return R(packed_answers=pack_answers_v5(answers, entries, req.session))
        if version >= 2:
            answers = [(r[0], r[1], r[2], r[4], r[5]) for r in results]
            packed = pack_answers(answers, end_from_base=version >= 4)
            return R(error_code=KafkaError.NONE, error_message=None, packed_answers=packed)
        return R(
            error_code=KafkaError.NONE,
            error_message=None,
            entries=[
                R.EntryResult(
                    error_code=r[0],
                    error_message=r[1],
                    base_offset=r[2],
                    stream_id=r[4],
                    end_offset=r[5],
                )
                for r in results
            ],  # fmt: skip
        )

    async def zone_route(self, req, ctx):
        """A proxy's routes (version 0: one partition; 1: a batch of partitions and produce
        requests, answered together once every append is durable or failed)."""
        version = getattr(ctx, "api_version", 0)
        if version == 0:
            entries = [(req.topic_id, req.partition, req.channel_offset)]
        else:
            if version >= 3:
                packed = bytes(req.packed_entries or b"")
                try:
                    if version >= 4:
                        session, source, entries = self.route_sessions.unpack_session(packed)
                        req = _PackedRoute(session.epoch, source, session.timeout_ms, session)
                    else:
                        epoch, source, timeout_ms, entries = unpack_request(packed)
                        req = _PackedRoute(epoch, source, timeout_ms)
                except RouteSessionMismatch as exc:  # nothing appended: the proxy starts over
                    return self._refused(version, KafkaError.FETCH_SESSION_ID_NOT_FOUND, str(exc))
                except ValueError as exc:
                    return self._refused(version, KafkaError.INVALID_REQUEST, str(exc))
            elif version >= 2:
                try:
                    entries = unpack_entries(bytes(req.packed_entries or b""))
                except ValueError as exc:
                    return self._refused(version, KafkaError.INVALID_REQUEST, str(exc))
            else:
                entries = [(e.topic_id, e.partition, e.channel_offset) for e in req.entries]
            if not entries or len(entries) > MAX_ROUTE_ENTRIES:
                return self._refused(
                    version,
                    KafkaError.INVALID_REQUEST,
                    f"{len(entries)} entries (1 to {MAX_ROUTE_ENTRIES})",
                )
        with self._pending_lock:
            # checked and tracked at once against a fresh image: a persisted epoch reported
            # meanwhile either sees this request or is below its epoch
            image = self.image_fn()
            fenced = image.route_epoch.fenced_epoch
            if req.route_epoch <= fenced:
                return self._refused(
                    version,
                    KafkaError.STALE_BROKER_EPOCH,
                    f"route epoch {req.route_epoch} is fenced (fenced route epoch {fenced})",
                )
            tracked = [self._track(req.route_epoch) for _ in entries]
        try:
            source = req.source_node_id
            expected = channel_location(source)
            # each entry's offset names its segment, so its bucket (a batch may span a
            # switch of buckets); v0's single offset must agree with its bucket field
            if (
                source not in image.brokers
                or any(offset < 0 for _, _, offset in entries)
                or (version == 0 and req.channel_bucket_id != channel_bucket_of(entries[0][2]))
                or (version < 2 and req.channel_prefix != expected.prefix)
            ):
                return self._refused(
                    version,
                    KafkaError.INVALID_REQUEST,
                    f"no RouterChannel of node {source}"
                    + (
                        f" at {req.channel_bucket_id}/{req.channel_prefix!r}" if version < 2 else ""
                    ),
                )
            pending = [entry for _, entry in tracked]
            results = await self._route_all(req, entries, pending)
            return self._response(version, results, entries, req)
        finally:
            for token, entry in tracked:
                self._untrack_if_unlinked(token, entry)

    def _read_all(self, source: int, offsets: list[int]) -> list:
        """The channel records at `offsets` (or the exception of each), in one trip off the
        event loop: records of one channel object share its listing and its GET."""
        reader = self.channels.reader(source)
        out: list = []
        for offset in offsets:
            try:
                out.append(reader.read(offset))
            except Exception as exc:  # noqa: BLE001 - answered per entry
                out.append(exc)
        return out

    async def _route_all(self, req, entries: list, pending: list[dict]) -> list[_Result]:
        """Read every entry's channel record, append each to its partition with Link
        Records, then wait until all are durable (bounded by the request's timeout)."""
        assert self.io is not None
        source = req.source_node_id
        timeout_s = max(req.timeout_ms, 1) / 1000
        deadline = time.monotonic() + timeout_s
        records = await self.io(self._read_all, source, [e[2] for e in entries])
        started: list = []
        for (topic_id, partition, offset), record, entry in zip(
            entries, records, pending, strict=True
        ):
            plog = self.partitions.get(str(topic_id), partition)
            if plog is None:
                started.append((KafkaError.NOT_LEADER_OR_FOLLOWER, "not the partition's main"))
            elif isinstance(record, WALTrimmedError):
                started.append((KafkaError.INVALID_REQUEST, f"channel offset trimmed: {record}"))
            elif isinstance(record, ValueError):
                started.append((KafkaError.INVALID_REQUEST, f"bad channel offset: {record}"))
            elif isinstance(record, Exception):  # the store failed: the proxy retries
                started.append((KafkaError.KAFKA_STORAGE_ERROR, f"channel read failed: {record}"))
            else:
                started.append(
                    await self._append_linked(source, offset, record, plog, entry, timeout_s)
                )
        return [await self._settle(item, deadline) for item in started]

    async def _append_linked(self, source: int, offset: int, record, plog, entry, timeout_s):
        linked: list[int] = [-1, -1]  # the stream id and the end of the last link

        def append() -> AppendOutcome:
            outcome, linked[0], linked[1] = self._link_append(
                source, offset, record.data, plog, entry
            )
            return outcome

        # a full WAL is waited for without blocking the loop (then REQUEST_TIMED_OUT)
        outcome = await append_when_room(append, timeout_s)
        return outcome, plog, linked[0], linked[1]

    @staticmethod
    async def _settle(item, deadline: float) -> _Result:
        """An entry's answer once its append is durable (or its error)."""
        if len(item) == 2:  # refused before any append
            return item[0], item[1], -1, -1, -1, -1
        outcome, plog, stream_id, end = item
        start = plog.log_start_offset
        if outcome.error != KafkaError.NONE:
            return outcome.error, None, -1, start, stream_id, end
        for fut in outcome.durable:
            try:
                await outcome_within(fut, max(deadline - time.monotonic(), 0.001))
            except TimeoutError:
                error, message = KafkaError.REQUEST_TIMED_OUT, "append not durable in time"
                return error, message, -1, start, stream_id, end
            except Exception as exc:  # noqa: BLE001 - fenced, WAL failed
                return KafkaError.NOT_LEADER_OR_FOLLOWER, str(exc)[:200], -1, start, stream_id, end
        return KafkaError.NONE, None, outcome.base_offset, start, stream_id, end
