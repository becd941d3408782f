"""Sealing erasure-coded partitions into object storage, and trimming them (pure handlers).

An erasure-coded partition (issue #14) keeps recent records as shards in its brokers' shard
stores. Offsets below the readers' visible end are decided forever, so a broker (the
sealer) decodes them and uploads them as one ordinary stream object of the partition's
stream; this command commits it. The stream's offsets are *slots*: a Kafka offset o of such
a partition is aligned to 2^16 and lives at stream offset o >> 16 (dataplane/formats/
seal_format.py), so the gaps between sparse nanosecond offsets fit the stream format's
32-bit counts.

Exactly one sealer per range: the object must start at the stream's sealed end (the first
seal of a stream may start anywhere at or after it: the stream then starts there), so of
two brokers sealing the same range one commits and the other is refused with
STREAM_OFFSET_GAP (its prepared object expires and is destroyed). A retry of a committed
seal (lost answer) is answered as done. The stream stays leaderless: ranges carry epoch 0
and node -1, and no broker owns the stream.
"""

from __future__ import annotations

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import get_stream, require_active_broker
from controlplane.image import MetadataImage, StreamMetaState
from controlplane.objects import _require_bucket, _require_prepared, stream_object_records
from controlplane.requests import (
    CommitResponse,
    SealErasureRangeRequest,
    TrimErasureStreamRequest,
)
from controlplane.settings import ControllerSettings
from controlplane.streams import _destroy_trimmed_objects


def erasure_stream(image: MetadataImage, stream_id: int) -> StreamMetaState:
    """The stream, if it belongs to an erasure-coded partition; refused otherwise."""
    stream = get_stream(image, stream_id)
    for topic in image.topics.values():
        for p in topic.partitions.values():
            if p.stream_id == stream_id and p.erasure_coded:
                return stream
    raise ControllerError(
        ErrorCode.INVALID_REQUEST,
        f"stream {stream_id} is not an erasure-coded partition's stream",
    )


def _never_sealed(stream: StreamMetaState) -> bool:
    return not stream.ranges and not stream.object_ranges


def seal_erasure_range(
    image: MetadataImage, req: SealErasureRangeRequest, now_ms: int, settings: ControllerSettings
):
    require_active_broker(image, req.node_id, req.node_epoch)
    _require_bucket(settings, req.bucket_id)
    existing = image.stream_objects.get(req.object_id)
    if existing is not None and (
        existing.stream_id,
        existing.start_offset,
        existing.end_offset,
    ) == (req.stream_id, req.start_offset, req.end_offset):
        return [], CommitResponse(idempotent=True)
    stream = erasure_stream(image, req.stream_id)
    if req.end_offset <= req.start_offset:
        raise ControllerError(
            ErrorCode.INVALID_OFFSET,
            f"stream {req.stream_id}: empty or negative range [{req.start_offset}, {req.end_offset})",
        )
    meta = _require_prepared(image, req.object_id)
    recs: list = []
    if _never_sealed(stream) and req.start_offset >= stream.end_offset:
        if req.start_offset > stream.start_offset:
            recs.append(r.TrimStreamRecord(stream_id=req.stream_id, start_offset=req.start_offset))
    elif req.start_offset != stream.end_offset:
        raise ControllerError(
            ErrorCode.STREAM_OFFSET_GAP,
            f"stream {req.stream_id}: seal starts at {req.start_offset}, expected "
            f"{stream.end_offset} (sealed end): another broker sealed this range",
        )
    recs += [
        r.RangeRecord(
            stream_id=req.stream_id,
            range_index=0,
            epoch=0,
            start_offset=stream.ranges[0].start_offset if stream.ranges else req.start_offset,
            end_offset=req.end_offset,
            node_id=r.NO_LEADER,
        ),
        *stream_object_records(meta, req, now_ms),
    ]
    return recs, CommitResponse(idempotent=False)


def trim_erasure_stream(image: MetadataImage, req: TrimErasureStreamRequest, now_ms: int):
    """Only sealed offsets can be trimmed (the start never passes the sealed end)."""
    require_active_broker(image, req.node_id, req.node_epoch)
    stream = erasure_stream(image, req.stream_id)
    if req.new_start_offset > stream.end_offset:
        raise ControllerError(
            ErrorCode.INVALID_OFFSET,
            f"cannot trim stream {stream.stream_id} to {req.new_start_offset} past its "
            f"sealed end {stream.end_offset}",
        )
    if req.new_start_offset <= stream.start_offset:
        return [], {}
    recs: list = [
        r.TrimStreamRecord(
            stream_id=stream.stream_id, start_offset=req.new_start_offset, trimmed_ms=now_ms
        )
    ]
    recs += _destroy_trimmed_objects(image, {stream.stream_id: req.new_start_offset}, now_ms)
    return recs, {}
