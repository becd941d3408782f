"""The broker metrics `automqctl cluster top` and the Grafana dashboard read: bytes in and
out by topic (counted by the partition, dropped when the topic is deleted), request latency
by api and open connections (counted by the Kafka server)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from prometheus_client import REGISTRY

from dataplane.kafka.codec import encode_request
from dataplane.kafka.registry import ApiRegistry
from dataplane.kafka.server import KafkaServerThread
from tests.unit.test_kafka_apis_inprocess import batch, ctx, fetch_req, produce_req


def _value(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_topic_bytes_in_and_out_count_produce_and_fetch_and_go_with_the_topic(broker):
    apis, controller, sync = broker
    topic = "top-bytes"
    controller.call("create_topic", {"name": topic, "partitions": 1})
    sync()
    records = batch([b"x" * 1000, b"y" * 1000])

    async def produce_and_fetch():
        await apis.data.produce(produce_req(topic, records), ctx(0, 9))
        return (await apis.data.fetch(fetch_req(topic, 0), ctx(1, 12))).resolved()

    fetched = asyncio.run(produce_and_fetch())
    served = len(fetched.responses[0].partitions[0].records)
    assert _value("automq_topic_bytes_in_total", {"topic": topic}) == len(records)
    assert served > 0
    assert _value("automq_topic_bytes_out_total", {"topic": topic}) == served
    assert _value("automq_partitions_led") >= 1

    apis.partitions.storage.flush()  # uploaded before the delete (as a live broker's would be)
    controller.call("delete_topic", {"name": topic})
    sync()
    assert REGISTRY.get_sample_value("automq_topic_bytes_in_total", {"topic": topic}) is None
    assert REGISTRY.get_sample_value("automq_topic_bytes_out_total", {"topic": topic}) is None


def _wait_until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.01)


def _read_frame(sock: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "closed"
            buf += chunk
        return buf

    return exact(struct.unpack(">i", exact(4))[0])


def test_request_latency_by_api_and_open_connections():
    async def slow_metadata(body, ctx):
        await asyncio.sleep(0.05)
        return MetadataResponse[1](brokers=[], controller_id=1, topics=[])

    registry = ApiRegistry()
    registry.register(MetadataRequest, 1, 1, slow_metadata)
    server = KafkaServerThread(registry, "127.0.0.1", 0)
    server.start()
    labels = {"api": "Metadata"}
    count_before = _value("automq_request_latency_seconds_count", labels)
    sum_before = _value("automq_request_latency_seconds_sum", labels)
    open_before = _value("automq_kafka_connections")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            _wait_until(lambda: _value("automq_kafka_connections") == open_before + 1)
            sock.sendall(encode_request(MetadataRequest[1](topics=[]), 7, client_id="unit"))
            _read_frame(sock)
            assert _value("automq_request_latency_seconds_count", labels) == count_before + 1
            assert _value("automq_request_latency_seconds_sum", labels) - sum_before >= 0.05
        _wait_until(lambda: _value("automq_kafka_connections") == open_before)
    finally:
        server.stop()
