"""Compaction principals: jobs that rewrite objects without being a broker (pure).

A Spark compaction job registers a name and gets a new epoch, which fences every earlier
instance of the job (a zombie driver of a killed run). It prepares object ids and commits
compactions as `compactor = {name, epoch}` instead of a broker's node epoch; such a commit
must replace committed objects (`compacted_object_ids`) with data inside the streams'
committed offsets, never extend a stream (see `objects.commit_stream_set_object`).
"""

from __future__ import annotations

from controlplane import records as r
from controlplane.image import MetadataImage
from controlplane.requests import RegisterCompactorRequest, RegisterCompactorResponse


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
