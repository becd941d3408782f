"""The KIP-932 share-group APIs made decodable by the broker's codec: the message classes
of `dataplane/formats/share_messages.py` registered with `add_api_message`, and the
acknowledgement types."""

from __future__ import annotations

from dataplane.formats.share_messages import (
    AlterShareGroupOffsetsRequest,
    AlterShareGroupOffsetsResponse,
    DeleteShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsResponse,
    DescribeShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsResponse,
    DescribeSharePartitionsRequest,
    DescribeSharePartitionsResponse,
    ShareAcknowledgeRequest,
    ShareAcknowledgeResponse,
    ShareFetchRequest,
    ShareFetchResponse,
    ShareGroupDescribeRequest,
    ShareGroupDescribeResponse,
    ShareGroupHeartbeatRequest,
    ShareGroupHeartbeatResponse,
)
from dataplane.kafka.codec import add_api_message

__all__ = [
    "ACK_ACCEPT",
    "ACK_GAP",
    "ACK_REJECT",
    "ACK_RELEASE",
    "AlterShareGroupOffsetsRequest",
    "AlterShareGroupOffsetsResponse",
    "DeleteShareGroupOffsetsRequest",
    "DeleteShareGroupOffsetsResponse",
    "DescribeShareGroupOffsetsRequest",
    "DescribeShareGroupOffsetsResponse",
    "DescribeSharePartitionsRequest",
    "DescribeSharePartitionsResponse",
    "ShareAcknowledgeRequest",
    "ShareAcknowledgeResponse",
    "ShareFetchRequest",
    "ShareFetchResponse",
    "ShareGroupDescribeRequest",
    "ShareGroupDescribeResponse",
    "ShareGroupHeartbeatRequest",
    "ShareGroupHeartbeatResponse",
]

#: ShareAcknowledge / ShareFetch acknowledgement types (KIP-932)
ACK_GAP = 0
ACK_ACCEPT = 1
ACK_RELEASE = 2
ACK_REJECT = 3

for _request, _response in (
    (ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse),
    (ShareGroupDescribeRequest, ShareGroupDescribeResponse),
    (ShareFetchRequest, ShareFetchResponse),
    (ShareAcknowledgeRequest, ShareAcknowledgeResponse),
    (DescribeSharePartitionsRequest, DescribeSharePartitionsResponse),
    (DescribeShareGroupOffsetsRequest, DescribeShareGroupOffsetsResponse),
    (DeleteShareGroupOffsetsRequest, DeleteShareGroupOffsetsResponse),
    (AlterShareGroupOffsetsRequest, AlterShareGroupOffsetsResponse),
):
    add_api_message(_request, _response)
