"""Dynamic broker configs (Kafka's `kafka-configs.sh --entity-type brokers`), pure.

Stored in the metadata KV under `broker-configs/<resource>`: resource "" is the cluster
default (`--entity-default`), a broker id is that broker's own. The keys are the topic
defaults' broker synonyms (`topic_configs.BROKER_SYNONYMS`: `log.retention.ms`,
`message.max.bytes`, ...); a topic's own value wins over them (`with_broker_defaults`); and
the brokers' own settings (`topic_configs.BROKER_SCHEMA`: the erasure repair's switch, rate
and delay; `topic_configs.broker_setting`).
"""

from __future__ import annotations

import json

from controlplane import records as r
from controlplane import topic_configs
from controlplane.image import MetadataImage
from controlplane.requests import AlterBrokerConfigsRequest, AlterBrokerConfigsResponse

KEY_PREFIX = "broker-configs/"


def configs_of(image: MetadataImage, resource: str) -> dict[str, str]:
    """The dynamic configs set on `resource` ("" = every broker)."""
    raw = image.kv.get(KEY_PREFIX + resource)
    return json.loads(raw) if raw else {}


def topic_configs_in_force(image: MetadataImage, configs: dict[str, str], node_id: int) -> dict:
    """A topic's configs as broker `node_id` applies them (its dynamic defaults included)."""
    return topic_configs.with_broker_defaults(
        configs, configs_of(image, ""), configs_of(image, str(node_id))
    )


def alter_broker_configs(image: MetadataImage, req: AlterBrokerConfigsRequest, now_ms: int):
    """Validate every entry, then store the resource's whole new config map (one KV
    record), or nothing when an entry is refused or nothing changes."""
    current = configs_of(image, req.resource)
    configs = topic_configs.apply_broker_ops(
        current, ((o.key, o.op, o.value) for o in req.ops), req.replace
    )
    if configs == current:
        return [], AlterBrokerConfigsResponse(configs=configs, metadata_offset=image.offset)
    value = json.dumps(configs, sort_keys=True) if configs else None
    rec = r.KVRecord(key=KEY_PREFIX + req.resource, value=value)
    return [rec], AlterBrokerConfigsResponse(configs=configs, metadata_offset=image.offset + 1)
