"""Object I/O of the compaction job, on the driver and in Spark worker processes.

One boto3 client per bucket per process, created lazily on first use inside the partition
function (a client cannot be pickled to executors). Bucket URIs carry no secrets here:
credentials come from the process environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY,
set as executor environment by the driver), never from a command line.

Thread-safety: boto3 clients are thread-safe; the client table is guarded by a lock.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from dataplane.formats.object_format import (
    FOOTER_SIZE_BYTES,
    IndexEntry,
    parse_footer,
    parse_index,
    slice_index_from_tail,
)
from dataplane.objectstore import BucketURI, object_key

TAIL_READ_BYTES = 64 * 1024  # footer + (usually) the whole index in one GET
MAX_GET_BYTES = 8 * 1024 * 1024  # adjacent blocks are read together up to this
IO_THREADS = 8

_lock = threading.Lock()
_clients: dict[str, Any] = {}


def client(bucket_uri: str) -> Any:
    """The process's boto3 client of a bucket (created on first use)."""
    with _lock:
        found = _clients.get(bucket_uri)
        if found is not None:
            return found
        bucket = BucketURI.parse(bucket_uri)
        made = boto3.client(
            "s3",
            endpoint_url=bucket.endpoint,
            config=BotoConfig(
                region_name=bucket.region,
                connect_timeout=5,
                read_timeout=60,
                retries={"total_max_attempts": 5, "mode": "standard"},
                max_pool_connections=IO_THREADS * 2,
                s3={"addressing_style": "path" if bucket.path_style else "virtual"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
            **bucket.credentials(),
        )
        _clients[bucket_uri] = made
        return made


def bucket_name(bucket_uri: str) -> str:
    return BucketURI.parse(bucket_uri).bucket


class SourceGoneError(OSError):
    """A planned source object is no longer in its bucket: the controller deleted it since
    the plan (its streams were deleted, or another run compacted it)."""

    def __init__(self, object_id: int) -> None:
        super().__init__(f"object {object_id} is gone from its bucket")
        self.object_id = object_id


def get_range(bucket_uri: str, object_id: int, start: int, end: int) -> bytes:
    """Bytes [start, end) of an object (one ranged GET). Raises SourceGoneError when the
    object does not exist."""
    try:
        resp = client(bucket_uri).get_object(
            Bucket=bucket_name(bucket_uri),
            Key=object_key(object_id),
            Range=f"bytes={start}-{end - 1}",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            raise SourceGoneError(object_id) from None
        raise
    data = resp["Body"].read()
    if len(data) != end - start:
        raise OSError(f"object {object_id}: got {len(data)} B of range [{start}, {end})")
    return data


def put(bucket_uri: str, object_id: int, data: bytes) -> None:
    client(bucket_uri).put_object(
        Bucket=bucket_name(bucket_uri), Key=object_key(object_id), Body=data
    )


def delete(bucket_uri: str, object_ids: list[int]) -> None:
    """Delete objects (missing ones are fine), 1000 per request."""
    for i in range(0, len(object_ids), 1000):
        keys = [{"Key": object_key(oid)} for oid in object_ids[i : i + 1000]]
        client(bucket_uri).delete_objects(
            Bucket=bucket_name(bucket_uri), Delete={"Objects": keys, "Quiet": True}
        )


def read_index(bucket_uri: str, object_id: int, size_bytes: int) -> list[IndexEntry]:
    """The parsed index of an object: one tail GET, a second when the index is larger."""
    tail_len = min(size_bytes, TAIL_READ_BYTES)
    tail = get_range(bucket_uri, object_id, size_bytes - tail_len, size_bytes)
    footer = parse_footer(tail[-FOOTER_SIZE_BYTES:], size_bytes)
    index_bytes = slice_index_from_tail(tail, size_bytes, footer)
    if index_bytes is None:
        index_bytes = get_range(
            bucket_uri,
            object_id,
            footer.index_position,
            footer.index_position + footer.index_length,
        )
    return parse_index(index_bytes, footer)


def read_indexes(
    buckets: dict[int, str], sources: list[tuple[int, int, int]]
) -> dict[int, list[IndexEntry]]:
    """Indexes of (object_id, bucket_id, size_bytes) sources, read concurrently."""
    with ThreadPoolExecutor(IO_THREADS) as pool:
        futures = {
            oid: pool.submit(read_index, buckets[bucket_id], oid, size)
            for oid, bucket_id, size in sources
        }
        return {oid: f.result() for oid, f in futures.items()}


def spans(entries: list[IndexEntry]) -> list[tuple[int, int]]:
    """Byte ranges covering the blocks: touching blocks merged, up to MAX_GET_BYTES (pure)."""
    out: list[tuple[int, int]] = []
    for e in sorted(entries, key=lambda e: e.position):
        if out and out[-1][1] == e.position and e.end_position - out[-1][0] <= MAX_GET_BYTES:
            out[-1] = (out[-1][0], e.end_position)
        else:
            out.append((e.position, e.end_position))
    return out
