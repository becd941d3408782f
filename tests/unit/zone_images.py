"""Metadata for the zone router's unit tests: brokers registered in their own AZs, and a
topic they lead, from the real controller state machine (no quorum, no sockets)."""

from __future__ import annotations

import uuid

from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine


def register_brokers(sm: MetadataStateMachine, nodes: tuple[int, ...], kafka_port: int) -> None:
    """Register and heartbeat broker `node` in AZ `az<node>` for each of `nodes` (port
    `kafka_port`: 1 where nothing may answer)."""
    for node in nodes:
        sm.execute(
            "register_broker",
            {
                "node_id": node,
                "az": f"az{node}",
                "host": "127.0.0.1",
                "kafka_port": kafka_port,
                "incarnation_id": f"i{node}",
                "wal_uri": "file:///tmp/w",
            },
            now_ms=0,
        )
        sm.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0}, now_ms=0)


def two_brokers_and_a_topic() -> tuple[MetadataStateMachine, str]:
    """Brokers 1 and 2 (nothing listens at their port: a poller's calls fail, tests drive
    `apply` themselves) and topic "t" of one partition; (state machine, topic id)."""
    sm = MetadataStateMachine(ControllerSettings())
    register_brokers(sm, (1, 2), kafka_port=1)
    topic_id = str(uuid.uuid4())
    out = sm.execute("create_topic", {"name": "t", "partitions": 1, "topic_id": topic_id}, now_ms=0)
    assert "error" not in out, out
    return sm, topic_id
