"""The zone router's broker-to-broker API (proxy → main), in Kafka's wire format.

`ZoneRouteRequest` (api key 600, this project's extension, served on the Kafka listener)
names a produce request's record batches by their place in the proxy's RouterChannel and
carries the route epoch they were written in; the main answers after its append is durable.
`GetPartitionSnapshotRequest` (api key 601) is the proxy's incremental poll of a main for
snapshot reads: per partition the high watermark, leader epoch and the places (never the
data) of the durable batches past the proxy's fetch offset (`snapshot.py`); from version 1
also the last stable offset and, incrementally, the aborted transactions (read_committed).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from dataplane.kafka.codec import add_api_message

# 1: batched routes (several partitions and produce requests); 2: compact (the channel is
# the source node's, entries and answers packed as varints, `route_codec.py`)
ZONE_ROUTE_VERSION = 2


class ZoneRouteRequest(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


class ZoneRouteResponse(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


add_api_message(ZoneRouteRequest, ZoneRouteResponse)
ZONE_ROUTE_KEY = int(ZoneRouteRequest.API_KEY)


# 1: the last stable offset and the aborted transactions (read_committed via a proxy); 2:
# snapshot sessions (incremental polls and answers, packed links); 3: the answer's
# partitions packed as varints (`snapshot_codec.py`)
SNAPSHOT_VERSION = 3


class GetPartitionSnapshotRequest(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


class GetPartitionSnapshotResponse(ApiMessage, load_json="dataplane.zonerouter.schemas"):
    pass


add_api_message(GetPartitionSnapshotRequest, GetPartitionSnapshotResponse)
SNAPSHOT_KEY = int(GetPartitionSnapshotRequest.API_KEY)
