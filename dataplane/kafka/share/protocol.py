"""The KIP-932 share-group APIs in Kafka's wire format, made decodable by the codec.

ShareGroupHeartbeat (76), ShareGroupDescribe (77), ShareFetch (78) and ShareAcknowledge (79),
version 1 (Kafka 4.1's first stable version; librdkafka 2.16 sends exactly it). The schemas
are in `schemas/` (Kafka's JSON format); kafka-python 3.0 has none for these keys.
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

from dataplane.kafka.codec import add_api_message

_SCHEMAS = "dataplane.kafka.share.schemas"

#: ShareAcknowledge / ShareFetch acknowledgement types (KIP-932)
ACK_GAP = 0
ACK_ACCEPT = 1
ACK_RELEASE = 2
ACK_REJECT = 3


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


for _request, _response in (
    (ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse),
    (ShareGroupDescribeRequest, ShareGroupDescribeResponse),
    (ShareFetchRequest, ShareFetchResponse),
    (ShareAcknowledgeRequest, ShareAcknowledgeResponse),
    (DescribeSharePartitionsRequest, DescribeSharePartitionsResponse),
):
    add_api_message(_request, _response)
