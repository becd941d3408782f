"""The RouterChannels, as every side of the zone router sees them (seed 000).

Each broker's RouterChannel is an `ObjectWAL` under `router-channel/node-<id>` in bucket 0,
readable by any node at a channel offset: a proxy appends a produce's batches to its own
channel (`zone_router.ZoneRouter`), a main reads them back to append them to the partition
(`route_handler.ZoneRouteHandler`), and a main's WAL recovery and the proxies' snapshot reads
read them again through `ChannelReaders`.
"""

from __future__ import annotations

import threading

from dataplane.formats.link_record import LinkRecord, resolve
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.wal.object_chain import ObjectWALLocation
from dataplane.s3stream.wal.object_readers import ObjectWALReader

CHANNEL_BUCKET_ID = 0


def channel_location(node_id: int) -> ObjectWALLocation:
    """Where broker `node_id`'s RouterChannel lives (derived, never taken from a request)."""
    return ObjectWALLocation(CHANNEL_BUCKET_ID, f"router-channel/node-{node_id}")


class ChannelReaders:
    """Readers of every broker's RouterChannel (one per source node); resolves Link
    Records for a main's WAL recovery. Thread-safe."""

    def __init__(self, objects: ObjectStorage):
        self.objects = objects
        self._readers: dict[int, ObjectWALReader] = {}
        self._lock = threading.Lock()

    def reader(self, source_node_id: int) -> ObjectWALReader:
        with self._lock:
            reader = self._readers.get(source_node_id)
            if reader is None:
                reader = ObjectWALReader(self.objects, channel_location(source_node_id))
                self._readers[source_node_id] = reader
            return reader

    def resolve(self, link_batch: StreamRecordBatch) -> StreamRecordBatch:
        """The data a Link Record points at (raises WALTrimmedError / ValueError)."""
        link = LinkRecord.decode(link_batch.payload)
        record = self.reader(link.source_node_id).read(link.channel_offset)
        return resolve(link_batch, record.data)
