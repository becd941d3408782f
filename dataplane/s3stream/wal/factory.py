"""The WAL factory: a WAL URI picks the implementation; callers see only the interfaces.

`open_wal(uri, node_id, node_epoch)` opens a node's own WAL for appends; `take_over_wal(uri,
node_id, failover_epoch)` reserves a failed node's WAL and returns a recovery handle (crash
failover). The engine (`storage.py`) and WAL failover (`wal_failover.py`) depend on these and on
`WriteAheadLog` / `WALRecovery` only, so a second implementation (an object-storage WAL, the
zone router's RouterChannel) plugs in by its scheme without touching them.

Schemes:

* `file:///abs/path` is the local-file WAL (`FileWAL`), reachable by other brokers of the
  same host (standing in for a multi-attach cloud disk);
* `s3://<bucket>/<prefix>` is the object-storage WAL (`ObjectWAL`, AutoMQ's default): objects
  under `<prefix>` in one of the broker's configured buckets, named by its bucket name (or
  its bucket id), with the credentials of the broker's bucket config - so the URI a broker
  registers holds no secret, and any broker with the same buckets can take it over. These
  calls need the broker's `ObjectStorage` (`objects=`). A broker's own s3:// WAL follows
  the active bucket (`segmented_wal.BucketFollowingWAL`): its later segments live at
  `<prefix>-g<n>` in the bucket their offsets name (`bucket_segments`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlparse

from dataplane.config import FileWALConfig, ObjectWALConfig
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.wal import object_readers
from dataplane.s3stream.wal.base import RecoveredRecord, WALError, WriteAheadLog
from dataplane.s3stream.wal.bucket_segments import SegmentId, list_segments, take_over_segments
from dataplane.s3stream.wal.file_takeover import take_over
from dataplane.s3stream.wal.file_wal import FileWAL
from dataplane.s3stream.wal.loss import WALLoss
from dataplane.s3stream.wal.object_chain import ObjectWALLocation
from dataplane.s3stream.wal.object_wal import ObjectWAL
from dataplane.s3stream.wal.segmented_wal import BucketFollowingWAL


class WALRecovery(Protocol):
    """A failed node's WAL, reserved by the recovering node: read, trim what was uploaded.
    ``scan_loss``: what `recover` found cut off by corruption (`wal.loss`), once it ended."""

    scan_loss: WALLoss | None

    def recover(self) -> Iterator[RecoveredRecord]: ...

    def trim(self, up_to_offset: int) -> None: ...

    def close(self) -> None: ...


class UnsupportedWALError(WALError):
    """The WAL URI names a scheme this build has no implementation for, or is malformed."""


def wal_uri_for_path(path: str | os.PathLike[str]) -> str:
    """The `file://` URI of a local WAL file (absolute, so other brokers can reach it)."""
    return Path(path).resolve().as_uri()


def _is_s3(uri: str) -> bool:
    return urlparse(uri).scheme == "s3"


def _file_path(uri: str) -> Path:
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        known = "file:///abs/path or s3://bucket/prefix"
        raise UnsupportedWALError(f"unsupported WAL URI {uri!r}: expected {known}")
    if parsed.netloc not in ("", "localhost"):
        raise UnsupportedWALError(
            f"WAL URI {uri!r} names host {parsed.netloc!r}: a file:// WAL must be on this host"
        )
    path = Path(unquote(parsed.path))
    if not path.is_absolute():
        raise UnsupportedWALError(f"WAL URI {uri!r} must hold an absolute path")
    return path


def _object_location(uri: str, objects: ObjectStorage | None) -> ObjectWALLocation:
    """Resolve `s3://<bucket name or id>/<prefix>` against the broker's buckets."""
    parsed = urlparse(uri)
    if parsed.query or parsed.fragment or parsed.params or "@" in parsed.netloc:
        raise UnsupportedWALError(
            f"WAL URI {uri!r}: expected s3://bucket/prefix (credentials and options come "
            "from the broker's bucket config)"
        )
    if objects is None:
        raise UnsupportedWALError(
            f"WAL URI {uri!r} is in object storage, but no bucket config was given to reach it"
        )
    name = parsed.netloc
    ids = [i for i in objects.bucket_ids if objects.bucket(i).bucket == name]
    if not ids and name.isdigit() and int(name) in objects.bucket_ids:
        ids = [int(name)]
    if not ids:
        configured = sorted(objects.bucket(i).bucket for i in objects.bucket_ids)
        raise UnsupportedWALError(
            f"WAL URI {uri!r} names bucket {name!r}, which is not configured here "
            f"(buckets: {configured})"
        )
    try:
        return ObjectWALLocation(ids[0], unquote(parsed.path).strip("/"))
    except ValueError as exc:
        raise UnsupportedWALError(f"WAL URI {uri!r}: {exc}") from None


def wal_exists(uri: str, *, objects: ObjectStorage | None = None) -> bool:
    """Whether the WAL behind `uri` has been created (failover of a node that never wrote;
    an s3:// WAL: a segment in any bucket, `bucket_segments`)."""
    if _is_s3(uri):
        where = _object_location(uri, objects)
        assert objects is not None  # _object_location refused None
        return object_readers.object_wal_exists(objects, where) or bool(
            list_segments(objects, where.prefix)
        )
    return _file_path(uri).exists()


def open_wal(
    uri: str,
    node_id: int,
    node_epoch: int,
    *,
    capacity_bytes: int | None = None,
    config: FileWALConfig | None = None,
    objects: ObjectStorage | None = None,
    object_config: ObjectWALConfig | None = None,
    active_bucket: Callable[[], int | None] | None = None,
) -> WriteAheadLog:
    """Open (or create) the WAL at `uri` as owner (node_id, node_epoch).

    `active_bucket` (an s3:// WAL): the bucket new objects go to as the metadata says now;
    given, the WAL follows it (`segmented_wal.BucketFollowingWAL`: a bucket failover moves
    its appends too); None: one `ObjectWAL` in the URI's bucket."""
    if _is_s3(uri):
        where = _object_location(uri, objects)
        assert objects is not None
        if capacity_bytes is None:
            raise ValueError("an s3:// WAL needs capacity_bytes (the most untrimmed bytes)")
        if active_bucket is not None:
            return BucketFollowingWAL.open(
                objects,
                where,
                node_id,
                node_epoch,
                capacity_bytes=capacity_bytes,
                config=object_config,
                active_bucket=active_bucket,
            )
        return ObjectWAL.open(
            objects, where, node_id, node_epoch, capacity_bytes=capacity_bytes, config=object_config
        )
    path = _file_path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    return FileWAL.open(path, node_id, node_epoch, capacity_bytes=capacity_bytes, config=config)


def take_over_wal(
    uri: str, node_id: int, failover_epoch: int, *, objects: ObjectStorage | None = None
) -> WALRecovery:
    """Reserve the WAL at `uri` for recovery by `node_id` with `failover_epoch`: from the
    moment this returns its previous owner can no longer acknowledge an append."""
    if _is_s3(uri):
        where = _object_location(uri, objects)
        assert objects is not None
        segments = list_segments(objects, where.prefix)
        if any(s != SegmentId(0, where.bucket_id) for s in segments):
            # it followed a bucket switch: every segment, its offsets naming their bucket
            return take_over_segments(objects, where.prefix, node_id, failover_epoch)
        return object_readers.take_over(objects, where, node_id, failover_epoch)
    return take_over(_file_path(uri), node_id, failover_epoch)
