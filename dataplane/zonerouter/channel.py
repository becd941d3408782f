"""The RouterChannels, as every side of the zone router sees them (seed 000).

Each broker's RouterChannel is a `BucketFollowingWAL` (`s3stream/wal/segmented_wal.py`)
under `router-channel/node-<id>`: its appends go to the active bucket (after a bucket
failover too), and a channel offset names the segment, so the bucket, it was written to
(`bucket_segments`). Any node reads a record at a channel offset from there: a proxy
appends a produce's batches to its own channel (`zone_router.ZoneRouter`), a main reads
them back to append them to the partition (`route_handler.ZoneRouteHandler`), and a main's
WAL recovery and the proxies' snapshot reads read them again through `ChannelReaders`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dataplane.config import ObjectWALConfig
from dataplane.formats.link_record import LinkRecord, resolve
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.wal.bucket_segments import SegmentedReader, split_offset
from dataplane.s3stream.wal.object_chain import ObjectWALLocation
from dataplane.s3stream.wal.segmented_wal import BucketFollowingWAL

CHANNEL_BUCKET_ID = 0  # the bucket of a channel's first segment (the main bucket)


def channel_location(node_id: int) -> ObjectWALLocation:
    """Where broker `node_id`'s RouterChannel starts (derived, never taken from a request);
    its later segments are at `<prefix>-g<n>` in the bucket their offsets name."""
    return ObjectWALLocation(CHANNEL_BUCKET_ID, f"router-channel/node-{node_id}")


def channel_bucket_of(channel_offset: int) -> int:
    """The bucket holding the channel record at `channel_offset` (ValueError if negative)."""
    return split_offset(channel_offset)[0].bucket_id


def open_channel(
    objects: ObjectStorage,
    node_id: int,
    node_epoch: int,
    capacity_bytes: int,
    config: ObjectWALConfig,
    active_bucket: Callable[[], int | None],
) -> BucketFollowingWAL:
    """Open (claim) this broker's RouterChannel at `node_epoch`; its appends follow
    `active_bucket()` (None: stay where they are)."""
    return BucketFollowingWAL.open(
        objects,
        channel_location(node_id),
        node_id,
        node_epoch,
        capacity_bytes=capacity_bytes,
        config=config,
        active_bucket=active_bucket,
        # the proxies and own pipelines wait for each append on its own (no order across
        # segments needed), and an append stuck in a stalled bucket is failed at once: the
        # producer retries it into the new segment (it was never routed)
        ordered_acks=False,
        fail_stalled_appends=True,
    )


class ChannelReaders:
    """Readers of every broker's RouterChannel (one per source node); resolves Link
    Records for a main's WAL recovery. Thread-safe."""

    def __init__(self, objects: ObjectStorage):
        self.objects = objects
        self._readers: dict[int, SegmentedReader] = {}
        self._lock = threading.Lock()

    def reader(self, source_node_id: int) -> SegmentedReader:
        with self._lock:
            reader = self._readers.get(source_node_id)
            if reader is None:
                reader = SegmentedReader(self.objects, channel_location(source_node_id).prefix)
                self._readers[source_node_id] = reader
            return reader

    def resolve(self, link_batch: StreamRecordBatch) -> StreamRecordBatch:
        """The data a Link Record points at (raises WALTrimmedError / ValueError)."""
        link = LinkRecord.decode(link_batch.payload)
        record = self.reader(link.source_node_id).read(link.channel_offset)
        return resolve(link_batch, record.data)
