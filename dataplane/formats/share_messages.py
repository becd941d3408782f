"""The KIP-932 share-group messages in Kafka's wire format (kafka-python `ApiMessage`
classes from the JSON schemas in `share_schemas/`, Kafka's format; kafka-python 3.0 has none
for these keys): ShareGroupHeartbeat (76), ShareGroupDescribe (77), ShareFetch (78),
ShareAcknowledge (79), version 1 (Kafka 4.1's first stable version; librdkafka 2.16 sends
exactly it), DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91) and
DeleteShareGroupOffsets (92) version 0, and this project's DescribeSharePartitions (602).
Pure: the broker registers them with its codec (`dataplane/kafka/share/protocol.py`), the
CLI encodes them itself.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

_SCHEMAS = "dataplane.formats.share_schemas"


class ShareGroupHeartbeatRequest(ApiMessage, load_json=_SCHEMAS):
    """ShareGroupHeartbeat request (api key 76)."""


class ShareGroupHeartbeatResponse(ApiMessage, load_json=_SCHEMAS):
    """ShareGroupHeartbeat response (api key 76)."""


class ShareGroupDescribeRequest(ApiMessage, load_json=_SCHEMAS):
    """ShareGroupDescribe request (api key 77)."""


class ShareGroupDescribeResponse(ApiMessage, load_json=_SCHEMAS):
    """ShareGroupDescribe response (api key 77)."""


class ShareFetchRequest(ApiMessage, load_json=_SCHEMAS):
    """ShareFetch request (api key 78)."""


class ShareFetchResponse(ApiMessage, load_json=_SCHEMAS):
    """ShareFetch response (api key 78)."""


class ShareAcknowledgeRequest(ApiMessage, load_json=_SCHEMAS):
    """ShareAcknowledge request (api key 79)."""


class ShareAcknowledgeResponse(ApiMessage, load_json=_SCHEMAS):
    """ShareAcknowledge response (api key 79)."""


class DescribeSharePartitionsRequest(ApiMessage, load_json=_SCHEMAS):
    """This project's extension (api key 602): a broker's loaded share-partitions of a
    group, live (start, end, in-flight records by state), for `automqctl group describe`."""


class DescribeSharePartitionsResponse(ApiMessage, load_json=_SCHEMAS):
    """DescribeSharePartitions response (api key 602)."""


class DescribeShareGroupOffsetsRequest(ApiMessage, load_json=_SCHEMAS):
    """DescribeShareGroupOffsets request (api key 90)."""


class DescribeShareGroupOffsetsResponse(ApiMessage, load_json=_SCHEMAS):
    """DescribeShareGroupOffsets response (api key 90)."""


class DeleteShareGroupOffsetsRequest(ApiMessage, load_json=_SCHEMAS):
    """DeleteShareGroupOffsets request (api key 92)."""


class DeleteShareGroupOffsetsResponse(ApiMessage, load_json=_SCHEMAS):
    """DeleteShareGroupOffsets response (api key 92)."""


class AlterShareGroupOffsetsRequest(ApiMessage, load_json=_SCHEMAS):
    """AlterShareGroupOffsets request (api key 91)."""


class AlterShareGroupOffsetsResponse(ApiMessage, load_json=_SCHEMAS):
    """AlterShareGroupOffsets response (api key 91)."""
