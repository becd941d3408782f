"""Object lifecycle and the atomic commits of uploads and compactions.

PREPARED (id reserved, deadline) -> COMMITTED (visible to readers) -> MARK_DESTROYED
(compacted or trimmed away; deleted from its bucket after a retention) -> removed.
"""

from __future__ import annotations

from collections import defaultdict

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import (
    authorize_owner,
    get_stream,
    require_active_broker,
    require_compactor,
    require_stream_owner,
)
from controlplane.image import MetadataImage, ObjectMetaState
from controlplane.records import ObjectState
from controlplane.requests import (
    CommitResponse,
    CommitStreamObjectRequest,
    CommitStreamSetObjectRequest,
    DeletedObjectsRequest,
    PrepareObjectsRequest,
    PrepareObjectsResponse,
    StreamObjectCommit,
)
from controlplane.settings import ControllerSettings
from controlplane.streams import mark_destroyed


def prepare_objects(image: MetadataImage, req: PrepareObjectsRequest, now_ms: int):
    if req.compactor is not None:
        require_compactor(image, req.compactor.name, req.compactor.epoch)
    else:
        require_active_broker(image, req.node_id, req.node_epoch)
    first = image.next_object_id
    recs = [
        r.S3ObjectRecord(
            object_id=first + i,
            state=ObjectState.PREPARED,
            bucket_id=image.active_bucket_id,
            prepared_ms=now_ms,
            deadline_ms=now_ms + req.ttl_ms,
        )
        for i in range(req.count)
    ]
    return recs, PrepareObjectsResponse(
        first_object_id=first, count=req.count, bucket_id=image.active_bucket_id
    )


def _require_prepared(image: MetadataImage, object_id: int) -> ObjectMetaState:
    meta = image.objects.get(object_id)
    if meta is None:
        raise ControllerError(
            ErrorCode.UNKNOWN_OBJECT, f"object {object_id} was never prepared (or has been deleted)"
        )
    if meta.state != ObjectState.PREPARED:
        raise ControllerError(
            ErrorCode.OBJECT_NOT_PREPARED, f"object {object_id} is {meta.state.value}, not prepared"
        )
    return meta


# the node id recorded on stream-set objects a compaction principal wrote (no broker's)
COMPACTOR_OWNER_ID = -1


def _committed(meta: ObjectMetaState, size_bytes: int, bucket_id: int, now_ms: int):
    return r.S3ObjectRecord(
        object_id=meta.object_id,
        state=ObjectState.COMMITTED,
        bucket_id=bucket_id,
        size_bytes=size_bytes,
        prepared_ms=meta.prepared_ms,
        deadline_ms=meta.deadline_ms,
        committed_ms=now_ms,
    )


def stream_object_records(
    meta: ObjectMetaState, req: StreamObjectCommit, now_ms: int
) -> list[r.S3ObjectRecord | r.StreamObjectRecord]:
    """The records of a committed stream object: the object committed in its bucket, and
    its stream offsets (compaction's commit_stream_object, the erasure sealer's seal)."""
    return [
        _committed(meta, req.size_bytes, req.bucket_id, now_ms),
        r.StreamObjectRecord(
            object_id=req.object_id,
            stream_id=req.stream_id,
            start_offset=req.start_offset,
            end_offset=req.end_offset,
            committed_ms=now_ms,
        ),
    ]


def _require_bucket(settings: ControllerSettings, bucket_id: int) -> None:
    if bucket_id not in settings.bucket_ids:
        raise ControllerError(
            ErrorCode.UNKNOWN_BUCKET,
            f"bucket {bucket_id} is not configured (known: {settings.bucket_ids})",
        )


def _already_committed(image: MetadataImage, req: CommitStreamSetObjectRequest) -> bool:
    """A retried commit: the same objects are committed already with the same content."""
    if req.object_id < 0 and not req.stream_objects:
        return False
    if req.object_id >= 0:
        sso = image.stream_set_objects.get(req.object_id)
        owner = (
            COMPACTOR_OWNER_ID
            if req.compactor is not None
            else req.failover_node_id
            if req.failover_node_id is not None
            else req.node_id
        )
        if sso is None or sso.node_id != owner or sso.order_id != req.order_id:
            return False
        ranges = [(rg.stream_id, rg.start_offset, rg.end_offset) for rg in sso.ranges]
        if ranges != [(rg.stream_id, rg.start_offset, rg.end_offset) for rg in req.stream_ranges]:
            return False
    for spec in req.stream_objects:
        so = image.stream_objects.get(spec.object_id)
        if so is None or (so.stream_id, so.start_offset, so.end_offset) != (
            spec.stream_id,
            spec.start_offset,
            spec.end_offset,
        ):
            return False
    return True


def _commit_owner(image: MetadataImage, req: CommitStreamSetObjectRequest) -> int:
    """Check who commits; the node whose streams the new ranges extend: the committer, in
    WAL failover the failed node whose WAL the committer (its failover target) uploads, or
    COMPACTOR_OWNER_ID for a compaction job."""
    if req.compactor is not None:
        # a compaction job: rewrites committed data only (checked per stream below)
        require_compactor(image, req.compactor.name, req.compactor.epoch)
        if not req.compacted_object_ids or req.failover_node_id is not None:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST,
                "a compactor commits compactions only: compacted_object_ids is required",
            )
        return COMPACTOR_OWNER_ID
    return authorize_owner(image, req.node_id, req.node_epoch, req.failover_node_id)


def _prepared_metas(
    image: MetadataImage, req: CommitStreamSetObjectRequest
) -> dict[int, ObjectMetaState]:
    """The PREPARED objects the commit makes visible, by id (each named once)."""
    if req.object_id < 0 and req.stream_ranges:
        raise ControllerError(
            ErrorCode.INVALID_REQUEST, "stream ranges need a stream-set object id"
        )
    object_ids = ([req.object_id] if req.object_id >= 0 else []) + [
        so.object_id for so in req.stream_objects
    ]
    if len(set(object_ids)) != len(object_ids):
        raise ControllerError(ErrorCode.INVALID_REQUEST, "an object id appears twice")
    return {oid: _require_prepared(image, oid) for oid in object_ids}


def _advance_streams(
    image: MetadataImage,
    per_stream: dict[int, list[tuple[int, int, int]]],
    compaction: bool,
    owner_node_id: int,
) -> list:
    """Check every stream's new ranges; the records advancing their committed ends. Every
    stream is checked even after one failed, so the refusal names all the streams this
    commit cannot carry: the committer leaves them all out in one more round."""
    recs: list = []
    stream_errors: dict[int, ControllerError] = {}
    for stream_id in sorted(per_stream):
        try:
            rec = _advance_stream(
                image, stream_id, sorted(per_stream[stream_id]), compaction, owner_node_id
            )
        except ControllerError as exc:
            stream_errors[stream_id] = exc
            continue
        if rec is not None:
            recs.append(rec)
    if stream_errors:
        first = next(iter(stream_errors.values()))
        message = (
            first.message
            if len(stream_errors) == 1
            else f"{first.message} (and {len(stream_errors) - 1} more streams refused)"
        )
        raise ControllerError(
            first.code, message, {sid: exc.code for sid, exc in stream_errors.items()}
        )
    return recs


def _new_object_records(
    req: CommitStreamSetObjectRequest,
    metas: dict[int, ObjectMetaState],
    owner_node_id: int,
    now_ms: int,
) -> list:
    """The records of the committed objects: the stream-set object (if any) with its
    ranges, and each stream object with its offsets."""
    recs: list = []
    if req.object_id >= 0:
        recs.append(_committed(metas[req.object_id], req.size_bytes, req.bucket_id, now_ms))
        recs.append(
            r.StreamSetObjectRecord(
                object_id=req.object_id,
                node_id=owner_node_id,
                order_id=req.order_id,
                ranges=tuple(
                    r.StreamOffsetRange(
                        stream_id=rg.stream_id,
                        start_offset=rg.start_offset,
                        end_offset=rg.end_offset,
                    )
                    for rg in req.stream_ranges
                ),
                committed_ms=now_ms,
            )
        )
    for so in req.stream_objects:
        recs.append(_committed(metas[so.object_id], so.size_bytes, req.bucket_id, now_ms))
        recs.append(
            r.StreamObjectRecord(
                object_id=so.object_id,
                stream_id=so.stream_id,
                start_offset=so.start_offset,
                end_offset=so.end_offset,
                committed_ms=now_ms,
            )
        )
    return recs


def commit_stream_set_object(
    image: MetadataImage,
    req: CommitStreamSetObjectRequest,
    now_ms: int,
    settings: ControllerSettings,
):
    """An upload's or a compaction's one atomic commit: new objects become visible, the
    streams' committed ends advance (an upload) or compacted objects are replaced (a
    compaction); a repeat of an applied commit answers `idempotent`."""
    owner_node_id = _commit_owner(image, req)
    _require_bucket(settings, req.bucket_id)
    if _already_committed(image, req):
        return [], CommitResponse(idempotent=True)
    metas = _prepared_metas(image, req)

    # every new range of every stream, checked together for continuity
    per_stream: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for rg in req.stream_ranges:
        per_stream[rg.stream_id].append((rg.start_offset, rg.end_offset, rg.stream_epoch))
    for so in req.stream_objects:
        per_stream[so.stream_id].append((so.start_offset, so.end_offset, so.stream_epoch))

    compaction = bool(req.compacted_object_ids)
    recs = _advance_streams(image, per_stream, compaction, owner_node_id)
    if compaction:
        check_compaction(image, req.compacted_object_ids, per_stream)
    recs += _new_object_records(req, metas, owner_node_id, now_ms)
    recs += _remove_objects(image, req.compacted_object_ids, now_ms)
    return recs, CommitResponse(idempotent=False)


def _union(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, merged [start, end) intervals (pure)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _covers(outer: list[tuple[int, int]], inner: list[tuple[int, int]]) -> bool:
    """Every interval of `inner` lies inside one interval of the merged `outer`."""
    return all(any(s >= os and e <= oe for os, oe in outer) for s, e in inner)


def check_compaction(
    image: MetadataImage,
    compacted_object_ids: list[int],
    per_stream: dict[int, list[tuple[int, int, int]]],
) -> None:
    """A compaction replaces committed objects by new ones holding the same live data.

    Refused whole (nothing applied) when it lost a race: a compacted object is no longer
    committed and indexed (another job compacted it, or a trim/delete destroyed it), a new
    range belongs to a deleted stream or holds only trimmed offsets; and refused when the
    new objects would hold offsets the old ones did not, or drop live offsets they held.
    """
    if len(set(compacted_object_ids)) != len(compacted_object_ids):
        raise ControllerError(ErrorCode.INVALID_REQUEST, "a compacted object id appears twice")
    old: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for object_id in compacted_object_ids:
        meta = image.objects.get(object_id)
        if meta is None or meta.state != ObjectState.COMMITTED:
            state = "gone" if meta is None else meta.state.value
            raise ControllerError(
                ErrorCode.UNKNOWN_OBJECT,
                f"compacted object {object_id} is {state}, not committed"
                " (compacted or destroyed meanwhile)",
            )
        sso = image.stream_set_objects.get(object_id)
        so = image.stream_objects.get(object_id)
        if sso is None and so is None:
            raise ControllerError(
                ErrorCode.UNKNOWN_OBJECT, f"compacted object {object_id} holds no stream data"
            )
        if sso is not None:
            for rg in sso.ranges:
                old[rg.stream_id].append((rg.start_offset, rg.end_offset))
        if so is not None:
            old[so.stream_id].append((so.start_offset, so.end_offset))
    for stream_id in sorted(set(old) | set(per_stream)):
        stream = image.streams.get(stream_id)
        new = _union([(s, e) for s, e, _ in per_stream.get(stream_id, [])])
        if stream is None:
            if new:  # checked by _advance_stream already; kept for a direct caller
                raise ControllerError(
                    ErrorCode.UNKNOWN_STREAM, f"stream {stream_id} does not exist"
                )
            continue
        held = _union(old.get(stream_id, []))
        if not _covers(held, new):
            raise ControllerError(
                ErrorCode.INVALID_OFFSET,
                f"stream {stream_id}: the new objects hold offsets {new} the compacted"
                f" objects do not ({held})",
            )
        for start, end in new:
            if end <= stream.start_offset:
                raise ControllerError(
                    ErrorCode.INVALID_OFFSET,
                    f"stream {stream_id}: compacted range [{start}, {end}) lies below the"
                    f" stream start {stream.start_offset} (trimmed meanwhile)",
                )
        live = [
            (max(s, stream.start_offset), min(e, stream.end_offset))
            for s, e in held
            if min(e, stream.end_offset) > max(s, stream.start_offset)
        ]
        if not _covers(new, live):
            raise ControllerError(
                ErrorCode.INVALID_OFFSET,
                f"stream {stream_id}: the compaction drops live offsets {live}"
                f" (new objects hold {new})",
            )


def _advance_stream(
    image: MetadataImage,
    stream_id: int,
    spans: list[tuple[int, int, int]],
    compaction: bool,
    owner_node_id: int,
):
    """Check one stream's new ranges (sorted (start, end, epoch)); the RangeRecord that
    advances its committed end, or None for a compaction (which moves no end)."""
    stream = get_stream(image, stream_id)
    for start, end, _ in spans:
        if end <= start:
            raise ControllerError(
                ErrorCode.INVALID_OFFSET,
                f"stream {stream_id}: empty or negative range [{start}, {end})",
            )
    if compaction:
        # compaction rewrites committed data: it must lie inside the stream's offsets
        for start, end, _ in spans:
            if end > stream.end_offset:
                raise ControllerError(
                    ErrorCode.INVALID_OFFSET,
                    f"stream {stream_id}: compacted range [{start}, {end})"
                    f" is past the committed end {stream.end_offset}",
                )
        return None
    for _, _, epoch in spans:
        require_stream_owner(stream, epoch, owner_node_id)
    expected = stream.end_offset
    for start, end, _ in spans:
        if start != expected:
            raise ControllerError(
                ErrorCode.STREAM_OFFSET_GAP,
                f"stream {stream_id}: range starts at {start}, expected {expected} (committed end)",
            )
        expected = end
    last = stream.ranges[-1]
    return r.RangeRecord(
        stream_id=stream_id,
        range_index=last.range_index,
        epoch=last.epoch,
        start_offset=last.start_offset,
        end_offset=expected,
        node_id=last.node_id,
    )


def _remove_objects(image: MetadataImage, object_ids: list[int], now_ms: int) -> list:
    """Unlink compacted objects from the read index and mark them destroyed."""
    recs: list = []
    for object_id in object_ids:
        if object_id in image.stream_set_objects:
            recs.append(r.RemoveStreamSetObjectRecord(object_id=object_id))
        so = image.stream_objects.get(object_id)
        if so is not None:
            recs.append(r.RemoveStreamObjectRecord(object_id=object_id, stream_id=so.stream_id))
    return recs + mark_destroyed(image, object_ids, now_ms)


def commit_stream_object(
    image: MetadataImage, req: CommitStreamObjectRequest, now_ms: int, settings: ControllerSettings
):
    """Stream-object compaction: sources (stream objects of one stream, contiguous) are
    replaced by one object covering the same offsets."""
    require_active_broker(image, req.node_id, req.node_epoch)
    _require_bucket(settings, req.bucket_id)
    existing = image.stream_objects.get(req.object_id)
    if (
        existing is not None
        and existing.stream_id == req.stream_id
        and existing.start_offset == req.start_offset
        and existing.end_offset == req.end_offset
    ):
        return [], CommitResponse(idempotent=True)
    meta = _require_prepared(image, req.object_id)
    get_stream(image, req.stream_id)
    if req.end_offset <= req.start_offset:
        raise ControllerError(ErrorCode.INVALID_OFFSET, "empty or negative range")
    sources = []
    for object_id in req.source_object_ids:
        so = image.stream_objects.get(object_id)
        if so is None or so.stream_id != req.stream_id:
            raise ControllerError(
                ErrorCode.UNKNOWN_OBJECT,
                f"source {object_id} is not a stream object of stream {req.stream_id}",
            )
        sources.append(so)
    sources.sort(key=lambda s: s.start_offset)
    if sources:
        expected = req.start_offset
        for so in sources:
            if so.start_offset != expected:
                raise ControllerError(
                    ErrorCode.STREAM_OFFSET_GAP, f"source objects are not contiguous at {expected}"
                )
            expected = so.end_offset
        if expected != req.end_offset:
            raise ControllerError(
                ErrorCode.STREAM_OFFSET_GAP, f"sources end at {expected}, not {req.end_offset}"
            )
    recs: list = stream_object_records(meta, req, now_ms)
    recs += _remove_objects(image, [s.object_id for s in sources], now_ms)
    return recs, CommitResponse(idempotent=False)


def expire_prepared_objects(image: MetadataImage, now_ms: int) -> list:
    """PREPARED objects past their deadline were abandoned (their writer died): destroy."""
    expired = [
        o.object_id
        for o in image.objects.values()
        if o.state == ObjectState.PREPARED and o.deadline_ms <= now_ms
    ]
    return mark_destroyed(image, sorted(expired), now_ms)


def objects_to_delete(
    image: MetadataImage, now_ms: int, retention_ms: int, limit: int = 1000
) -> list[ObjectMetaState]:
    """MARK_DESTROYED objects whose retention has passed, oldest first (pure query)."""
    due = [
        o
        for o in image.objects.values()
        if o.state == ObjectState.MARK_DESTROYED and o.mark_destroyed_ms + retention_ms <= now_ms
    ]
    due.sort(key=lambda o: (o.mark_destroyed_ms, o.object_id))
    return due[:limit]


def objects_deleted(image: MetadataImage, req: DeletedObjectsRequest, now_ms: int):
    recs = [
        r.RemoveS3ObjectRecord(object_id=oid)
        for oid in req.object_ids
        if oid in image.objects and image.objects[oid].state == ObjectState.MARK_DESTROYED
    ]
    return recs, {}
