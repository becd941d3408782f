"""What a client of an AZ is told and served (dataplane/zonerouter/routing.py), on a real
metadata image: leaders rewritten to the proxy in the client's AZ, only that AZ's brokers
listed, and a produce or fetch at a broker that is not the client's answers None
(NOT_LEADER_OR_FOLLOWER)."""

from __future__ import annotations

import uuid

from controlplane.settings import ControllerSettings
from controlplane.state_machine import MetadataStateMachine
from dataplane.zonerouter.routing import CountedBackend, ZoneRouting
from dataplane.zonerouter.traffic import ZoneTraffic


def _image(partitions: int = 6):
    sm = MetadataStateMachine(ControllerSettings())
    for node, az in ((1, "az1"), (2, "az2"), (3, "az3")):
        sm.execute(
            "register_broker",
            {
                "node_id": node,
                "az": az,
                "host": "127.0.0.1",
                "kafka_port": 9000 + node,
                "incarnation_id": f"i{node}",
                "wal_uri": "file:///tmp/w",
            },
            now_ms=0,
        )
        sm.execute("broker_heartbeat", {"node_id": node, "node_epoch": 0}, now_ms=0)
    body = {"name": "t", "partitions": partitions, "topic_id": str(uuid.uuid4())}
    out = sm.execute("create_topic", body, now_ms=0)
    assert "error" not in out, out
    return sm.image


class _Resolver:
    def get(self, topic_id, partition):
        return ("local", topic_id, partition)


def _routing(node_id: int, image) -> ZoneRouting:
    return ZoneRouting(
        node_id,
        lambda: image,
        _Resolver(),
        lambda topic_id, partition: ("proxy", topic_id, partition),
        traffic=None,
    )


def test_metadata_for_a_client_of_an_az_names_only_its_brokers():
    image = _image()
    topic = image.topic_by_name("t")
    real = {p.partition: p.leader_node_id for p in topic.partitions.values()}
    assert set(real.values()) == {1, 2, 3}
    routing = _routing(1, image)
    for az, node in (("az1", 1), ("az2", 2), ("az3", 3)):
        assert {routing.leader_for(image, leader, az) for leader in real.values()} == {node}
        assert [b.node_id for b in routing.brokers_for(image, az)] == [node]
    assert [routing.leader_for(image, real[p], None) for p in real] == list(real.values())
    assert [b.node_id for b in routing.brokers_for(image, None)] == [1, 2, 3]
    # an AZ with no broker: the real leaders and every broker (fallback)
    assert [routing.leader_for(image, real[p], "az9") for p in real] == list(real.values())
    assert len(routing.brokers_for(image, "az9")) == 3


def test_produce_and_fetch_resolve_by_client_az():
    image = _image()
    topic = image.topic_by_name("t")
    tid = topic.topic_id
    routing = _routing(2, image)
    for p in topic.partitions.values():
        main = p.leader_node_id
        # no AZ: only the main serves it
        assert routing.get(tid, p.partition, None) == (
            ("local", tid, p.partition) if main == 2 else None
        )
        # a client of az2 is served here: by the partition (main here) or a proxy
        assert routing.get(tid, p.partition, "az2")[0] == ("local" if main == 2 else "proxy")
        # a client of az1 or az3 at this broker is at the wrong broker
        assert routing.get(tid, p.partition, "az1") is None
        assert routing.get(tid, p.partition, "az3") is None
    assert routing.get(tid, 99, "az2") is None and routing.get("no-such-topic", 0, "az2") is None


def test_client_bytes_are_counted_by_the_clients_az():
    class Backend:
        def append(self, records):
            from dataplane.kafka.errors import KafkaError
            from dataplane.kafka.partition_backend import AppendOutcome

            return AppendOutcome(KafkaError.NONE, 0)

        def read(self, offset, max_bytes, end=None):
            return b"x" * 7

    traffic = ZoneTraffic("az2")
    inner = Backend()
    CountedBackend(inner, traffic, "az2").append(b"y" * 10)
    CountedBackend(inner, traffic, "az1").read(0, 100)
    CountedBackend(inner, traffic, None).read(0, 100)
    counts = traffic.snapshot()
    assert counts["produced_same_az_bytes"] == 10 and counts["wal_data_bytes"] == 10
    assert counts["consumed_cross_az_bytes"] == 7 and counts["consumed_unknown_az_bytes"] == 7
    assert counts["consumed_bytes"] == 14
    assert CountedBackend(inner, traffic, "az1") == CountedBackend(inner, traffic, None)
