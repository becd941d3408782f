"""Compaction principals: jobs that rewrite objects without being a broker (pure).

A Spark compaction job registers a name and gets a new epoch, which fences every earlier
instance of the job (a zombie driver of a killed run). It prepares object ids and commits
compactions as `compactor = {name, epoch}` instead of a broker's node epoch; such a commit
must replace committed objects (`compacted_object_ids`) with data inside the streams'
committed offsets, never extend a stream (see `objects.commit_stream_set_object`).
"""

from __future__ import annotations

from controlplane import records as r
from controlplane.errors import ControllerError, ErrorCode
from controlplane.fencing import require_compactor
from controlplane.image import MetadataImage
from controlplane.requests import (
    RegisterCompactorRequest,
    RegisterCompactorResponse,
    SetCleanerCheckpointsRequest,
    SetCleanerCheckpointsResponse,
)


def register_compactor(image: MetadataImage, req: RegisterCompactorRequest, now_ms: int):
    """A new epoch for the name; the same incarnation registering again keeps its epoch."""
    current = image.compactors.get(req.name)
    if current is not None and current.incarnation_id == req.incarnation_id:
        return [], RegisterCompactorResponse(name=req.name, epoch=current.epoch)
    epoch = current.epoch + 1 if current is not None else 0
    rec = r.CompactorRecord(
        name=req.name, epoch=epoch, incarnation_id=req.incarnation_id, registered_ms=now_ms
    )
    return [rec], RegisterCompactorResponse(name=req.name, epoch=epoch)


def set_cleaner_checkpoints(image: MetadataImage, req: SetCleanerCheckpointsRequest, now_ms: int):
    """Record the log cleaner's checkpoints (all or none): only the current epoch of the
    compactor; an offset past a stream's committed end or a repeated stream is refused
    whole; a stream deleted since the run planned is skipped."""
    require_compactor(image, req.compactor.name, req.compactor.epoch)
    seen: set[int] = set()
    recs: list = []
    skipped: list[int] = []
    for cp in req.checkpoints:
        if cp.stream_id in seen:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST, f"stream {cp.stream_id} is given more than once"
            )
        seen.add(cp.stream_id)
        stream = image.streams.get(cp.stream_id)
        if stream is None:
            skipped.append(cp.stream_id)
            continue
        if cp.cleaned_offset > stream.end_offset:
            raise ControllerError(
                ErrorCode.INVALID_OFFSET,
                f"cleaner checkpoint {cp.cleaned_offset} of stream {cp.stream_id} is past "
                f"its committed end {stream.end_offset}",
            )
        recs.append(
            r.CleanerCheckpointRecord(
                stream_id=cp.stream_id, cleaned_offset=cp.cleaned_offset, cleaned_ms=now_ms
            )
        )
    return recs, SetCleanerCheckpointsResponse(
        recorded=[rec.stream_id for rec in recs], skipped=skipped
    )
