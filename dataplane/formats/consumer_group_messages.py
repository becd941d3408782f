"""The KIP-848 consumer-group messages in Kafka's wire format (kafka-python `ApiMessage`
classes from the JSON schemas in `consumer_group_schemas/`, Kafka's format):
ConsumerGroupHeartbeat (68, v0-1) and ConsumerGroupDescribe (69, v0). Pure: the broker
registers them with its codec (`dataplane/kafka/groups/consumer_handlers.py`), the CLI
encodes them itself (`automqctl group describe`).
"""

from __future__ import annotations

from kafka.protocol.api_message import ApiMessage

_SCHEMAS = "dataplane.formats.consumer_group_schemas"


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_SCHEMAS):
    """ConsumerGroupHeartbeat request (api key 68)."""


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_SCHEMAS):
    """ConsumerGroupHeartbeat response (api key 68)."""


class ConsumerGroupDescribeRequest(ApiMessage, load_json=_SCHEMAS):
    """ConsumerGroupDescribe request (api key 69)."""


class ConsumerGroupDescribeResponse(ApiMessage, load_json=_SCHEMAS):
    """ConsumerGroupDescribe response (api key 69)."""
