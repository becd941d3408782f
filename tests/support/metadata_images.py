"""Metadata images for unit tests: the real controller state machine with brokers
registered and topics created, as a running cluster's controller would hold them."""

from __future__ import annotations

import uuid

from controlplane.image import MetadataImage
from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine


def register_broker(
    sm: MetadataStateMachine,
    node_id: int,
    az: str,
    now_ms: int = 0,
    *,
    incarnation: str | None = None,
    heartbeat: bool = True,
    wal_uri: str | None = "",
) -> int:
    """Register broker `node_id` in `az` (incarnation `inc-<node>` unless given; WAL
    `file:///wal/<node>` unless `wal_uri` is given, None: no WAL named) and, with
    `heartbeat`, unfence it with a heartbeat; its node epoch."""
    body = {
        "node_id": node_id,
        "az": az,
        "host": "127.0.0.1",
        "kafka_port": 9000 + node_id,
        "incarnation_id": incarnation or f"inc-{node_id}",
    }
    if wal_uri is not None:
        body["wal_uri"] = wal_uri or f"file:///wal/{node_id}"
    out = sm.execute("register_broker", body, now_ms=now_ms)
    assert "error" not in out, out
    epoch = out["result"]["node_epoch"]
    if heartbeat:
        out = sm.execute(
            "broker_heartbeat", {"node_id": node_id, "node_epoch": epoch}, now_ms=now_ms
        )
        assert "error" not in out, out
    return epoch


def image_with(
    brokers: dict[int, str], topic: str, partitions: int, topic_id: str | None = None
) -> MetadataImage:
    """An image with `brokers` (node id -> AZ), all unfenced, and `topic` of `partitions`
    (its id `topic_id`, else a random one) placed by the controller."""
    sm = MetadataStateMachine(ControllerSettings())
    for node_id, az in brokers.items():
        register_broker(sm, node_id, az)
    body = {"name": topic, "partitions": partitions, "topic_id": topic_id or str(uuid.uuid4())}
    out = sm.execute("create_topic", body, now_ms=0)
    assert "error" not in out, out
    return sm.image
