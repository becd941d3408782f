"""Stream lifecycle with epoch fencing: create, open (new range), close, trim, delete."""

from __future__ import annotations

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import (
    authorize_owner,
    get_stream,
    require_active_broker,
    require_stream_owner,
)
from controlplane.image import MetadataImage, StreamMetaState
from controlplane.records import ObjectState, StreamState
from controlplane.requests import (
    CloseStreamRequest,
    CreateStreamRequest,
    CreateStreamResponse,
    DeleteStreamRequest,
    OpenStreamRequest,
    OpenStreamResponse,
    RecordAbortedTxnsRequest,
    RecordAbortedTxnsResponse,
    TrimStreamRequest,
)


def create_stream(image: MetadataImage, req: CreateStreamRequest, now_ms: int):
    require_active_broker(image, req.node_id, req.node_epoch)
    stream_id = image.next_stream_id
    return (
        [r.CreateStreamRecord(stream_id=stream_id, tags=req.tags)],
        CreateStreamResponse(stream_id=stream_id),
    )


def open_stream_records(
    image: MetadataImage, stream: StreamMetaState, epoch: int, node_id: int
) -> list:
    """Records that open `stream` with `epoch` on `node_id` and start its new range."""
    last_index = stream.ranges[-1].range_index if stream.ranges else -1
    end = stream.end_offset
    return [
        r.StreamEpochRecord(
            stream_id=stream.stream_id, epoch=epoch, state=StreamState.OPENED, node_id=node_id
        ),
        r.RangeRecord(
            stream_id=stream.stream_id,
            range_index=last_index + 1,
            epoch=epoch,
            start_offset=end,
            end_offset=end,
            node_id=node_id,
        ),
    ]


def open_stream(image: MetadataImage, req: OpenStreamRequest, now_ms: int):
    require_active_broker(image, req.node_id, req.node_epoch)
    stream = get_stream(image, req.stream_id)
    response = OpenStreamResponse(
        stream_id=stream.stream_id,
        stream_epoch=req.stream_epoch,
        start_offset=stream.start_offset,
        next_offset=stream.end_offset,
        aborted_txns=list(stream.aborted_txns),
    )
    if req.stream_epoch < stream.epoch:
        raise ControllerError(
            ErrorCode.STREAM_FENCED,
            f"stream {stream.stream_id} epoch {req.stream_epoch} is fenced by epoch {stream.epoch}",
        )
    if req.stream_epoch == stream.epoch:
        if stream.state == StreamState.OPENED and stream.node_id == req.node_id:
            return [], response  # a retried open
        raise ControllerError(
            ErrorCode.STREAM_FENCED,
            f"stream {stream.stream_id} epoch {req.stream_epoch} was already "
            f"used; open with a greater epoch",
        )
    if stream.state == StreamState.OPENED and stream.node_id != req.node_id:
        # Its data may still sit in the other node's WAL: that node (or its failover)
        # must upload and close first, or acknowledged records would be skipped.
        raise ControllerError(
            ErrorCode.STREAM_NOT_CLOSED,
            f"stream {stream.stream_id} is still open on node "
            f"{stream.node_id} (epoch {stream.epoch})",
        )
    return open_stream_records(image, stream, req.stream_epoch, req.node_id), response


def close_stream(image: MetadataImage, req: CloseStreamRequest, now_ms: int):

    owner = authorize_owner(image, req.node_id, req.node_epoch, req.failover_node_id)
    stream = get_stream(image, req.stream_id)
    if (
        stream.state == StreamState.CLOSED
        and stream.epoch == req.stream_epoch
        and stream.node_id == owner
    ):
        return [], {}
    require_stream_owner(stream, req.stream_epoch, owner)
    if req.orphaned_only:
        for topic in image.topics.values():
            for p in topic.partitions.values():
                if (
                    p.stream_id == stream.stream_id
                    and p.leader_node_id == owner
                    and p.leader_epoch == stream.epoch
                ):
                    raise ControllerError(
                        ErrorCode.STREAM_IN_USE,
                        f"stream {stream.stream_id} is {topic.name}-"
                        f"{p.partition}, still led by node {owner} with "
                        f"epoch {stream.epoch}",
                    )
    return [
        r.StreamEpochRecord(
            stream_id=stream.stream_id,
            epoch=stream.epoch,
            state=StreamState.CLOSED,
            node_id=stream.node_id,
        )
    ], {}


def trim_stream(image: MetadataImage, req: TrimStreamRequest, now_ms: int):
    require_active_broker(image, req.node_id, req.node_epoch)
    stream = get_stream(image, req.stream_id)
    require_stream_owner(stream, req.stream_epoch, req.node_id)
    if req.new_start_offset < stream.start_offset:
        raise ControllerError(
            ErrorCode.INVALID_OFFSET,
            f"stream {stream.stream_id} already starts at "
            f"{stream.start_offset} > {req.new_start_offset}",
        )
    if req.new_start_offset > stream.end_offset:
        raise ControllerError(
            ErrorCode.INVALID_OFFSET,
            f"cannot trim stream {stream.stream_id} to {req.new_start_offset} "
            f"past its committed end {stream.end_offset}",
        )
    if req.new_start_offset == stream.start_offset:
        return [], {}
    recs: list = [
        r.TrimStreamRecord(
            stream_id=stream.stream_id, start_offset=req.new_start_offset, trimmed_ms=now_ms
        )
    ]
    recs += _destroy_trimmed_objects(image, {stream.stream_id: req.new_start_offset}, now_ms)
    return recs, {}


def delete_stream(image: MetadataImage, req: DeleteStreamRequest, now_ms: int):
    require_active_broker(image, req.node_id, req.node_epoch)
    stream = get_stream(image, req.stream_id)
    if req.stream_epoch < stream.epoch:
        raise ControllerError(
            ErrorCode.STREAM_FENCED, f"stream {stream.stream_id} epoch {req.stream_epoch} is fenced"
        )
    return delete_stream_records(image, [stream.stream_id], now_ms), {}


def delete_stream_records(image: MetadataImage, stream_ids: list[int], now_ms: int) -> list:
    """Delete streams and mark every object only they referenced as destroyed."""
    recs: list = _destroy_trimmed_objects(image, {sid: None for sid in stream_ids}, now_ms)
    recs += [r.DeleteStreamRecord(stream_id=sid) for sid in stream_ids]
    return recs


def _destroy_trimmed_objects(
    image: MetadataImage, new_starts: dict[int, int | None], now_ms: int
) -> list:
    """Objects no longer needed once streams start at `new_starts` (None: stream deleted)."""

    def dead(stream_id: int, end_offset: int) -> bool:
        if stream_id in new_starts:
            start = new_starts[stream_id]
            return start is None or end_offset <= start
        stream = image.streams.get(stream_id)
        return stream is None or end_offset <= stream.start_offset

    recs: list = []
    candidate_sso: set[int] = set()
    for stream_id in new_starts:
        stream = image.streams.get(stream_id)
        if stream is None:
            continue
        for obj in stream.object_ranges:
            if obj.kind == "so":
                if dead(stream_id, obj.end_offset):
                    recs.append(
                        r.RemoveStreamObjectRecord(object_id=obj.object_id, stream_id=stream_id)
                    )
                    recs += mark_destroyed(image, [obj.object_id], now_ms)
            else:
                candidate_sso.add(obj.object_id)
    for object_id in sorted(candidate_sso):
        sso = image.stream_set_objects.get(object_id)
        if sso is not None and all(dead(rg.stream_id, rg.end_offset) for rg in sso.ranges):
            recs.append(r.RemoveStreamSetObjectRecord(object_id=object_id))
            recs += mark_destroyed(image, [object_id], now_ms)
    return recs


def mark_destroyed(image: MetadataImage, object_ids: list[int], now_ms: int) -> list:
    recs: list = []
    for object_id in object_ids:
        meta = image.objects.get(object_id)
        if meta is None or meta.state == ObjectState.MARK_DESTROYED:
            continue
        recs.append(
            r.S3ObjectRecord(
                object_id=object_id,
                state=ObjectState.MARK_DESTROYED,
                bucket_id=meta.bucket_id,
                size_bytes=meta.size_bytes,
                prepared_ms=meta.prepared_ms,
                deadline_ms=meta.deadline_ms,
                committed_ms=meta.committed_ms,
                mark_destroyed_ms=now_ms,
            )
        )
    return recs


def record_aborted_txns(image: MetadataImage, req: RecordAbortedTxnsRequest, now_ms: int):
    """Append a partition's aborted transactions to its stream (see the request): the
    stream's owner only; entries not past the last recorded marker, or whose marker lies
    below the stream's start (trimmed away), are skipped; each entry's first offset must
    not be past its marker."""
    require_active_broker(image, req.node_id, req.node_epoch)
    stream = get_stream(image, req.stream_id)
    require_stream_owner(stream, req.stream_epoch, req.node_id)
    last = stream.aborted_txns[-1][2] if stream.aborted_txns else -1
    entries: list[tuple[int, int, int]] = []
    for a in req.aborted:
        if a.first_offset > a.marker_offset:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST,
                f"aborted transaction of producer {a.producer_id} starts at {a.first_offset}, "
                f"past its marker {a.marker_offset}",
            )
        if a.marker_offset <= last or a.marker_offset < stream.start_offset:
            continue
        last = a.marker_offset
        entries.append((a.producer_id, a.first_offset, a.marker_offset))
    if not entries:
        return [], RecordAbortedTxnsResponse(recorded=0)
    rec = r.AbortedTxnsRecord(stream_id=stream.stream_id, entries=entries)
    return [rec], RecordAbortedTxnsResponse(recorded=len(entries))
