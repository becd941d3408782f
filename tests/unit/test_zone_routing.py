"""What a client of an AZ is told and served (dataplane/zonerouter/routing.py), on a real
metadata image: leaders rewritten to the proxy in the client's AZ, only that AZ's brokers
listed, and a produce or fetch at a broker that is not the client's answers None
(NOT_LEADER_OR_FOLLOWER)."""

from __future__ import annotations

from dataplane.zonerouter.routing import CountedBackend, ZoneRouting
from dataplane.zonerouter.traffic import ZoneTraffic
from tests.support.metadata_images import image_with


def _image(partitions: int = 6):
    return image_with({1: "az1", 2: "az2", 3: "az3"}, "t", partitions)


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
        counts_own_wal_bytes = False  # a partition led here: its WAL write is counted

        @property
        def identity(self):
            return self

        def append(self, records, link=None):
            from dataplane.formats.kafka_errors import KafkaError
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
    # two views of one backend are the same partition (one fetch listener for both)
    assert (
        CountedBackend(inner, traffic, "az1").identity
        is CountedBackend(inner, traffic, None).identity
    )


def test_a_proxy_forwards_timestamp_lookups_and_delete_records_to_the_main(monkeypatch):
    """ListOffsets by timestamp / MAX_TIMESTAMP and DeleteRecords at a proxy are the main's
    answers (sent as this broker, no AZ); the main's errors come back as the partition's
    error (OFFSET_OUT_OF_RANGE as the local partition raises it); a main that is not live
    or does not answer is NOT_LEADER_OR_FOLLOWER (the client refreshes)."""
    from types import SimpleNamespace

    import pytest

    from dataplane.formats.client_az import BROKER_CLIENT_ID, CidrAzMap, client_az
    from dataplane.formats.kafka_errors import KafkaError
    from dataplane.kafka.partition_backend import (
        BackendError,
        OffsetAndTimestamp,
        OffsetOutOfRangeError,
    )
    from dataplane.zonerouter import proxy_partition as proxy_module
    from dataplane.zonerouter.proxy_partition import ProxyPartition

    image = _image()
    topic = image.topic_by_name("t")
    partition = next(p for p in topic.partitions.values() if p.leader_node_id == 2)
    counted: list[str] = []  # the AZ of each connection's counter (broker-to-broker bytes)
    router = SimpleNamespace(
        image_fn=lambda: image,
        login=None,
        broker_bytes_counter=lambda az: counted.append(az) or (lambda n: None),
    )
    proxy = ProxyPartition(router, topic.topic_id, partition.partition)  # type: ignore[arg-type]
    sent: list = []
    answers: list = []

    class _Conn:
        def __init__(self, host, port, login, on_bytes=None):
            sent.append((host, port))

        def call(self, req, timeout_s, api_key, version):
            sent.append((api_key, req))
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return answer

        def close(self):
            pass

    monkeypatch.setattr(proxy_module, "BrokerConnection", _Conn)

    def listed(error=0, offset=-1, timestamp=-1):
        part = SimpleNamespace(error_code=error, offset=offset, timestamp=timestamp)
        return SimpleNamespace(topics=[SimpleNamespace(partitions=[part])])

    def deleted(error=0, low=-1):
        part = SimpleNamespace(error_code=error, low_watermark=low)
        return SimpleNamespace(topics=[SimpleNamespace(partitions=[part])])

    answers.append(listed(offset=7, timestamp=1_000))
    assert proxy.offset_for_timestamp(900) == OffsetAndTimestamp(7, 1_000)
    assert sent[0] == ("127.0.0.1", 9002) and sent[1][0] == 2  # ListOffsets to node 2
    assert counted[0] == image.brokers[2].az  # its bytes counted by the main's AZ
    asked = sent[1][1].topics[0]
    assert (asked.name, asked.partitions[0].partition_index) == ("t", partition.partition)
    assert asked.partitions[0].timestamp == 900
    answers.append(listed(offset=9, timestamp=2_000))
    assert proxy.max_timestamp_offset() == OffsetAndTimestamp(9, 2_000)
    assert sent[-1][1].topics[0].partitions[0].timestamp == -3
    answers.append(listed(error=KafkaError.UNKNOWN_TOPIC_OR_PARTITION))
    with pytest.raises(BackendError) as refused:
        proxy.offset_for_timestamp(1)
    assert refused.value.error == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    answers.append(ConnectionError("reset"))
    with pytest.raises(BackendError) as unanswered:
        proxy.offset_for_timestamp(1)
    assert unanswered.value.error == KafkaError.NOT_LEADER_OR_FOLLOWER

    answers.append(deleted(low=5))
    assert proxy.delete_records(5) == 5 and sent[-1][0] == 21  # DeleteRecords
    answers.append(deleted(error=KafkaError.OFFSET_OUT_OF_RANGE))
    with pytest.raises(OffsetOutOfRangeError):
        proxy.delete_records(10**9)
    answers.append(deleted(error=KafkaError.POLICY_VIOLATION))
    with pytest.raises(BackendError):
        proxy.delete_records(3)
    assert proxy.forwards_to_main

    # the main serves the forwarded requests as a client without an AZ, whatever the
    # proxy's address maps to
    cidrs = CidrAzMap.parse({"127.0.0.0/8": "az1"})
    assert client_az(BROKER_CLIENT_ID, "127.0.0.1", cidrs) is None
    assert client_az("other", "127.0.0.1", cidrs) == "az1"


def test_delete_records_at_a_proxy_goes_through_the_clients_routing():
    """AdminApis.delete_records: a partition not led here is resolved through the client's
    routing; only a backend that forwards to the main is used (its answer, or its error)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from kafka.protocol.admin import DeleteRecordsRequest

    from dataplane.formats.kafka_errors import KafkaError
    from dataplane.kafka.admin_apis import AdminApis
    from dataplane.kafka.partition_backend import BackendError

    image = _image(2)

    class _Forwarding:
        forwards_to_main = True

        def __init__(self, outcome):
            self.outcome = outcome

        def delete_records(self, offset):
            if isinstance(self.outcome, Exception):
                raise self.outcome
            return self.outcome

    def delete(routed):
        admin = AdminApis(
            1,
            lambda: image,
            None,  # type: ignore[arg-type]
            SimpleNamespace(get=lambda t, p: None),  # type: ignore[arg-type]
            ThreadPoolExecutor(1),
            routed=lambda topic_id, partition, ctx: routed,
        )
        P = DeleteRecordsRequest.DeleteRecordsTopic.DeleteRecordsPartition
        req = DeleteRecordsRequest[2](
            topics=[
                DeleteRecordsRequest.DeleteRecordsTopic(
                    name="t", partitions=[P(partition_index=0, offset=4)]
                )
            ],
            timeout_ms=1000,
        )
        res = asyncio.run(admin.delete_records(req, SimpleNamespace(api_version=2)))
        p = res.topics[0].partitions[0]
        return p.error_code, p.low_watermark

    assert delete(_Forwarding(4)) == (KafkaError.NONE, 4)
    refused = BackendError(KafkaError.NOT_LEADER_OR_FOLLOWER, "main gone")
    assert delete(_Forwarding(refused)) == (KafkaError.NOT_LEADER_OR_FOLLOWER, -1)
    # the routing names the real partition elsewhere, or nothing: not led here
    assert delete(SimpleNamespace(forwards_to_main=False, delete_records=lambda o: 4))[0] == (
        KafkaError.NOT_LEADER_OR_FOLLOWER
    )
    assert delete(None)[0] == KafkaError.NOT_LEADER_OR_FOLLOWER


def test_a_main_connection_counts_the_bytes_of_each_request_and_answer():
    """The zone router's broker-to-broker accounting: request frame + answer frame bytes."""
    import socket
    import struct
    import threading

    from kafka.protocol.metadata import MetadataRequest, MetadataResponse

    from dataplane.kafka.codec import decode_request, encode_response
    from dataplane.kafka.interbroker import BrokerConnection

    listener = socket.create_server(("127.0.0.1", 0))
    on_wire: list[int] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            (size,) = struct.unpack(">i", conn.recv(4, socket.MSG_WAITALL))
            request = decode_request(conn.recv(size, socket.MSG_WAITALL))
            frame = encode_response(
                request, MetadataResponse[1](brokers=[], controller_id=1, topics=[])
            )
            answer = frame if isinstance(frame, bytes) else b"".join(frame)
            conn.sendall(answer)
            on_wire.append(4 + size + len(answer))

    counted: list[int] = []
    main = BrokerConnection("127.0.0.1", listener.getsockname()[1], None, counted.append)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        main.call(MetadataRequest[1](topics=[]), 5.0, 3, 1)
    finally:
        main.close()
        thread.join(5)
        listener.close()
    assert counted == on_wire and counted[0] > 0


def test_the_channel_mode_chooses_which_produce_at_a_main_goes_through_its_channel():
    """zone_router.channel_mode (issue #32): "all" (the default) routes every client's
    produce at a main through its own RouterChannel; "az_clients" only a client whose AZ is
    declared or detected, a client without one goes straight to the partition (the WAL)."""
    import pytest

    from dataplane.zonerouter.routing import CHANNEL_ALL, CHANNEL_AZ_CLIENTS

    image = _image()
    topic = image.topic_by_name("t")
    tid = topic.topic_id
    led = [p.partition for p in topic.partitions.values() if p.leader_node_id == 2]
    assert led

    def routing(mode: str | None) -> ZoneRouting:
        extra = {} if mode is None else {"channel_mode": mode}
        return ZoneRouting(
            2,
            lambda: image,
            _Resolver(),
            lambda topic_id, partition: ("proxy", topic_id, partition),
            traffic=None,
            own_channel=lambda topic_id, plog, through: ("own-channel", plog, through),
            **extra,
        )

    through = [("own-channel", ("local", tid, p), True) for p in led]
    for mode in (None, CHANNEL_ALL):  # the default is "all"
        for az in (None, "az2"):
            assert [routing(mode).get(tid, p, az) for p in led] == through
    az_clients = routing(CHANNEL_AZ_CLIENTS)
    assert [az_clients.get(tid, p, "az2") for p in led] == through
    assert [az_clients.get(tid, p, None) for p in led] == [("local", tid, p) for p in led]
    with pytest.raises(ValueError, match="channel mode"):
        routing("sometimes")
