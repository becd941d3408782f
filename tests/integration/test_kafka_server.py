"""The Kafka protocol server on 127.0.0.1 with real clients and raw sockets: ApiVersions and
Metadata for confluent-kafka (librdkafka) and kafka-python, pipelining with ordered
responses, acks=0, bad input closing only its own connection, limits, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from kafka.protocol.consumer import JoinGroupRequest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest, MetadataResponse
from kafka.protocol.producer import ProduceRequest, ProduceResponse

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import decode_response, encode_request
from dataplane.kafka.registry import (
    ApiRegistry,
    CloseConnection,
    RequestContext,
    in_connection_order,
)
from dataplane.kafka.server import KafkaServer, KafkaServerThread

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
CLUSTER_ID = "test-cluster"
# the server accepts connections, each connection logs why it closes
SERVER_LOGS = ("dataplane.kafka.server", "dataplane.kafka.connection")


# --------------------------------------------------------------------------- helpers


class Cluster:
    """A one-broker 'cluster': Metadata says the broker is the server itself."""

    def __init__(self) -> None:
        self.port = 0
        self.calls: list[tuple[int, int]] = []  # (api version, correlation id)

    async def metadata(self, body, ctx: RequestContext) -> MetadataResponse:
        self.calls.append((ctx.api_version, ctx.correlation_id))
        names = [t.name for t in body.topics or []]
        if "boom" in names:
            raise RuntimeError("handler bug (expected by the test)")
        if "close-me" in names:
            raise CloseConnection("asked to close")
        broker = MetadataResponse.MetadataResponseBroker(
            node_id=1, host=HOST, port=self.port, rack=None
        )
        topics = [
            MetadataResponse.MetadataResponseTopic(
                error_code=KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                name=name,
                is_internal=False,
                partitions=[],
            )
            for name in names
        ]
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[broker],
            cluster_id=CLUSTER_ID,
            controller_id=1,
            topics=topics,
        )


def make_registry(cluster: Cluster) -> ApiRegistry:
    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, cluster.metadata)
    return registry


@contextlib.contextmanager
def running(
    registry: ApiRegistry, cluster: Cluster | None = None, **kwargs
) -> Iterator[KafkaServerThread]:
    server = KafkaServerThread(registry, HOST, 0, **kwargs)
    server.start()
    try:
        if cluster is not None:
            cluster.port = server.port
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster() -> Cluster:
    return Cluster()


@pytest.fixture
def server(cluster: Cluster) -> Iterator[KafkaServerThread]:
    with running(make_registry(cluster), cluster) as srv:
        yield srv


class Raw:
    """A raw TCP client speaking frames."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
            buf += chunk
        return buf

    def frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._exact(4))
        return self._exact(size)

    def response(self, api_key: int, version: int):
        return decode_response(self.frame(), api_key, version)

    def metadata(self, correlation_id: int, topics: list[str] | None = None, version: int = 9):
        self.send(metadata_request(correlation_id, topics or [], version))
        got_id, resp = self.response(3, version)
        assert got_id == correlation_id
        return resp

    def assert_closed(self, timeout: float = 5.0) -> None:
        """The server closed the connection (after any data it still sends)."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not self.sock.recv(65536):
                    return
        except ConnectionResetError:
            return
        except TimeoutError:
            pass
        pytest.fail("connection still open")

    def assert_silent(self, seconds: float = 0.3) -> None:
        self.sock.settimeout(seconds)
        with pytest.raises(TimeoutError):
            self.sock.recv(1)
        self.sock.settimeout(5.0)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def raw_clients() -> Iterator[list[Raw]]:
    clients: list[Raw] = []
    yield clients
    for c in clients:
        c.close()


def connect(clients: list[Raw], port: int) -> Raw:
    client = Raw(port)
    clients.append(client)
    return client


def metadata_request(correlation_id: int, topics: list[str], version: int = 1) -> bytes:
    req = MetadataRequest[version](
        topics=[MetadataRequest.MetadataRequestTopic(name=t) for t in topics],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return encode_request(req, correlation_id, client_id="raw")


def produce_request(correlation_id: int, acks: int) -> bytes:
    part = ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=None)
    req = ProduceRequest[9](
        transactional_id=None,
        acks=acks,
        timeout_ms=1000,
        topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[part])],
    )
    return encode_request(req, correlation_id, client_id="raw")


def wait_until(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.01)


# --------------------------------------------------------------------------- real clients


def test_confluent_kafka_admin_client(server: KafkaServerThread) -> None:
    admin_mod = pytest.importorskip("confluent_kafka.admin")
    admin = admin_mod.AdminClient(
        {"bootstrap.servers": f"{HOST}:{server.port}", "socket.timeout.ms": 5000}
    )
    md = admin.list_topics(timeout=10)
    assert md.cluster_id == CLUSTER_ID
    assert {b.id: (b.host, b.port) for b in md.brokers.values()} == {1: (HOST, server.port)}
    assert md.topics == {}


def test_kafka_python_admin_client(server: KafkaServerThread, cluster: Cluster) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=f"{HOST}:{server.port}", request_timeout_ms=5000)
    try:
        assert admin.list_topics() == []
        described = admin.describe_cluster()
        assert described["cluster_id"] == CLUSTER_ID
        assert [(b["broker_id"], b["port"]) for b in described["brokers"]] == [(1, server.port)]
    finally:
        admin.close()
    assert cluster.calls and all(v == 13 for v, _ in cluster.calls)  # it negotiated our max version


def test_api_versions_over_the_wire(server: KafkaServerThread, raw_clients: list[Raw]) -> None:
    client = connect(raw_clients, server.port)
    for version in range(5):
        client.send(
            encode_request(
                ApiVersionsRequest[version](
                    client_software_name="raw", client_software_version="1"
                ),
                version,
            )
        )
        correlation_id, resp = client.response(18, version)
        assert correlation_id == version and resp.error_code == 0
        assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [
            (3, 0, 13),
            (18, 0, 4),
        ]

    # A newer client's ApiVersions v9 (flexible header): v0 answer with UNSUPPORTED_VERSION and
    # our list, and the connection stays open so the client can retry with v4.
    client.send(_frame(struct.pack(">hhih", 18, 9, 77, 3) + b"new" + b"\x00" + b"\x02a\x021\x00"))
    correlation_id, resp = client.response(18, 4)
    assert correlation_id == 77 and resp.error_code == KafkaError.UNSUPPORTED_VERSION
    assert [k.api_key for k in resp.api_keys] == [3, 18]
    assert client.metadata(78).cluster_id == CLUSTER_ID


def test_request_context(raw_clients: list[Raw]) -> None:
    seen: list[RequestContext] = []

    async def record(body, ctx):
        seen.append(ctx)
        ctx.extras["mine"] = True  # a free slot, private to this request
        return MetadataResponse(brokers=[], topics=[])

    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, record)
    with running(registry) as srv:
        first, second = connect(raw_clients, srv.port), connect(raw_clients, srv.port)
        first.metadata(11, ["abc"], version=12)
        second.metadata(12, [], version=1)
        local_ports = [c.sock.getsockname()[1] for c in (first, second)]
    a, b = seen
    assert (a.api_key, a.api_version, a.correlation_id, a.client_id) == (3, 12, 11, "raw")
    assert (b.api_version, b.correlation_id) == (1, 12)
    assert [a.peer, b.peer] == [(HOST, p) for p in local_ports]
    assert a.connection_id != b.connection_id
    assert a.request_size == len(metadata_request(11, ["abc"], 12)) - 4
    assert 0 < a.received_at <= b.received_at <= time.monotonic()
    assert a.extras == {"mine": True} and a.extras is not b.extras


# --------------------------------------------------------------------------- ordering


def test_pipelined_responses_in_request_order(raw_clients: list[Raw]) -> None:
    n = 20
    started: list[int] = []
    completed: list[int] = []

    async def slow_metadata(body, ctx):
        started.append(ctx.correlation_id)  # before the first await: start order
        await asyncio.sleep((n - ctx.correlation_id) * 0.004)  # later requests finish first
        completed.append(ctx.correlation_id)
        topic = MetadataResponse.MetadataResponseTopic(
            error_code=0, name=body.topics[0].name, partitions=[]
        )
        return MetadataResponse(brokers=[], controller_id=1, topics=[topic])

    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, slow_metadata)
    with running(registry) as srv:
        client = connect(raw_clients, srv.port)
        client.send(b"".join(metadata_request(i, [f"topic-{i}"]) for i in range(n)))
        for i in range(n):
            correlation_id, resp = client.response(3, 1)
            assert correlation_id == i and resp.topics[0].name == f"topic-{i}"
    assert started == list(range(n))
    assert completed != sorted(completed)  # the handlers really finished out of order


@pytest.mark.parametrize("mode", ["in order, turn passed early", "in order", "unordered"])
def test_in_order_registration_orders_a_connections_handlers(
    raw_clients: list[Raw], mode: str
) -> None:
    """In order: each request's first step ("append") runs after the previous request's,
    in request order; a handler that passes its turn after that step lets the next one
    start while it still runs (pipelined), one that does not runs alone."""
    active = 0
    max_active = 0
    appended: list[int] = []

    async def produce(body, ctx):
        nonlocal active, max_active
        active += 1
        max_active = max(max_active, active)
        # the "append": odd requests reach it sooner than the even one before them
        await asyncio.sleep(0.02 if ctx.correlation_id % 2 == 0 else 0.001)
        appended.append(ctx.correlation_id)
        if mode == "in order, turn passed early":
            ctx.pass_turn()
        await asyncio.sleep(0.02)  # the "durability wait"
        active -= 1
        return ProduceResponse(responses=[], throttle_time_ms=0)

    registry = ApiRegistry()
    registry.register(ProduceRequest, 3, 13, produce, in_order=mode != "unordered")
    with running(registry) as srv:
        client = connect(raw_clients, srv.port)
        client.send(b"".join(produce_request(i, acks=1) for i in range(8)))
        assert [client.response(0, 9)[0] for _ in range(8)] == list(range(8))
    if mode == "in order":
        assert max_active == 1 and appended == list(range(8))
    elif mode == "in order, turn passed early":
        assert max_active > 1 and appended == list(range(8))
    else:
        assert max_active > 1 and appended != list(range(8))


def test_an_in_order_handler_marked_on_its_function_is_registered_in_order() -> None:
    @in_connection_order
    async def marked(body, ctx):
        return None

    async def unmarked(body, ctx):
        return None

    registry = ApiRegistry()
    assert registry.register(ProduceRequest, 3, 13, marked).in_order
    assert not registry.register(MetadataRequest, 0, 12, unmarked).in_order


def test_acks_zero_gets_no_response_and_keeps_order(
    server: KafkaServerThread, raw_clients: list[Raw]
) -> None:
    calls: list[tuple[int, int]] = []

    async def produce(body, ctx):
        calls.append((ctx.correlation_id, body.acks))
        await asyncio.sleep(0.01)
        if body.acks == 0:
            return None
        part = ProduceResponse.TopicProduceResponse.PartitionProduceResponse(
            index=0, error_code=0, base_offset=ctx.correlation_id
        )
        return ProduceResponse(
            responses=[ProduceResponse.TopicProduceResponse(name="t", partition_responses=[part])]
        )

    cluster = Cluster()
    registry = make_registry(cluster)
    registry.register(ProduceRequest, 3, 13, produce)
    with running(registry, cluster) as srv:
        client = connect(raw_clients, srv.port)
        client.send(
            produce_request(1, acks=0)
            + metadata_request(2, ["a"])
            + produce_request(3, acks=-1)
            + produce_request(4, acks=0)
            + produce_request(5, acks=0)
            + metadata_request(6, ["b"])
        )
        assert client.response(3, 1)[0] == 2
        correlation_id, resp = client.response(0, 9)
        assert correlation_id == 3 and resp.responses[0].partition_responses[0].base_offset == 3
        correlation_id, resp = client.response(3, 1)
        assert correlation_id == 6 and resp.topics[0].name == "b"
        client.assert_silent()
    assert sorted(calls) == [(1, 0), (3, -1), (4, 0), (5, 0)]


def test_inflight_per_connection_is_bounded(raw_clients: list[Raw]) -> None:
    started: list[int] = []
    release = threading.Event()

    async def blocking(body, ctx):
        started.append(ctx.correlation_id)
        for _ in range(1000):  # at most 10 s
            if release.is_set():
                break
            await asyncio.sleep(0.01)
        return MetadataResponse(brokers=[], topics=[])

    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, blocking)
    with running(registry, max_inflight_per_connection=2) as srv:
        client = connect(raw_clients, srv.port)
        client.send(b"".join(metadata_request(i, []) for i in range(6)))
        wait_until(lambda: len(started) == 2)
        time.sleep(0.3)
        assert started == [0, 1]  # the reader stopped reading: the budget is used up
        release.set()
        assert [client.response(3, 1)[0] for _ in range(6)] == list(range(6))
    assert started == list(range(6))


# --------------------------------------------------------------------------- bad input


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


BAD_INPUTS = {
    "truncated-frame": struct.pack(">i", 100) + b"\x00\x03\x00\x01" + b"\x00" * 6,
    "oversize-frame": struct.pack(">i", 1 << 20) + b"\x00" * 100,
    "negative-size": struct.pack(">i", -5),
    "unknown-api-key": _frame(struct.pack(">hhih", 1000, 0, 9, -1)),
    "unserved-api-key": encode_request(
        JoinGroupRequest[5](
            group_id="g",
            session_timeout_ms=1,
            rebalance_timeout_ms=1,
            member_id="",
            group_instance_id=None,
            protocol_type="consumer",
            protocols=[],
        ),
        9,
    ),
    "unsupported-version": _frame(struct.pack(">hhih", 0, 2, 9, -1) + b"\x00" * 20),
    "garbage-body": _frame(struct.pack(">hhih", 3, 12, 9, -1) + b"\x00" + b"\xff" * 20),
    "garbage-header": _frame(b"\x00\x03\x00\x01\x00\x00\x00\x09\x7f\xff"),
    "empty-frame": _frame(b""),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_bad_input_closes_only_that_connection(name: str, raw_clients: list[Raw]) -> None:
    cluster = Cluster()
    with running(make_registry(cluster), cluster, max_request_bytes=64 * 1024) as srv:
        healthy = connect(raw_clients, srv.port)
        assert healthy.metadata(1).cluster_id == CLUSTER_ID
        bad = connect(raw_clients, srv.port)
        bad.send(BAD_INPUTS[name])
        if name == "truncated-frame":
            bad.sock.shutdown(socket.SHUT_WR)
        bad.assert_closed()
        assert healthy.metadata(2, ["still-served"]).topics[0].name == "still-served"
        assert connect(raw_clients, srv.port).metadata(3).cluster_id == CLUSTER_ID


def test_close_comes_after_earlier_responses(
    server: KafkaServerThread, raw_clients: list[Raw]
) -> None:
    client = connect(raw_clients, server.port)
    client.send(
        metadata_request(1, ["x"])
        + metadata_request(2, ["y"])
        + BAD_INPUTS["garbage-body"]
        + metadata_request(3, [])
    )
    assert client.response(3, 1)[0] == 1
    assert client.response(3, 1)[0] == 2
    client.assert_closed()


def test_handler_exception_closes_connection_not_server(
    server: KafkaServerThread, raw_clients: list[Raw], caplog: pytest.LogCaptureFixture
) -> None:
    for logger in SERVER_LOGS:
        caplog.set_level(logging.INFO, logger=logger)
    client = connect(raw_clients, server.port)
    client.send(
        metadata_request(1, ["ok"]) + metadata_request(2, ["boom"]) + metadata_request(3, ["ok"])
    )
    assert client.response(3, 1)[0] == 1
    client.assert_closed()
    failures = [r for r in caplog.records if "handler failed" in r.getMessage()]
    assert (
        len(failures) == 1
        and failures[0].exc_info
        and "handler bug" in str(failures[0].exc_info[1])
    )

    other = connect(raw_clients, server.port)
    other.send(metadata_request(4, ["a"]) + metadata_request(5, ["close-me"]))
    assert other.response(3, 1)[0] == 4
    other.assert_closed()
    assert any("closing on handler request" in r.getMessage() for r in caplog.records)
    assert connect(raw_clients, server.port).metadata(6).cluster_id == CLUSTER_ID


def test_max_connections(raw_clients: list[Raw]) -> None:
    cluster = Cluster()
    with running(make_registry(cluster), cluster, max_connections=1) as srv:
        first = connect(raw_clients, srv.port)
        assert first.metadata(1).cluster_id == CLUSTER_ID
        second = connect(raw_clients, srv.port)
        second.assert_closed()
        assert first.metadata(2).cluster_id == CLUSTER_ID
        first.close()
        wait_until(lambda: srv.server.connection_count == 0)
        assert connect(raw_clients, srv.port).metadata(3).cluster_id == CLUSTER_ID


def test_idle_connections_are_closed_but_not_while_requests_are_in_flight(
    raw_clients: list[Raw],
) -> None:
    async def slow(body, ctx):
        await asyncio.sleep(1.0)
        return MetadataResponse(brokers=[], topics=[])

    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, slow)
    with running(registry, idle_timeout_s=0.4) as srv:
        busy = connect(raw_clients, srv.port)
        busy.send(metadata_request(1, []))
        idle = connect(raw_clients, srv.port)
        started = time.monotonic()
        idle.assert_closed(timeout=5)
        assert 0.3 < time.monotonic() - started < 4
        assert busy.response(3, 1)[0] == 1  # waited 1 s > idle timeout without being closed


def test_client_that_does_not_read_is_closed(
    raw_clients: list[Raw], caplog: pytest.LogCaptureFixture
) -> None:
    for logger in SERVER_LOGS:
        caplog.set_level(logging.INFO, logger=logger)
    big = bytes(MetadataResponse(brokers=[], topics=[]).encode(version=1)) + b"\x00" * (4 << 20)

    async def large(body, ctx):
        return big  # an encoded body (padded: the client never parses it)

    registry = ApiRegistry()
    registry.register(MetadataRequest, 0, 13, large)
    with running(registry, idle_timeout_s=0.5) as srv:
        client = connect(raw_clients, srv.port)
        client.send(b"".join(metadata_request(i, []) for i in range(5)))  # 20 MiB > socket buffers
        wait_until(lambda: any("not reading responses" in r.getMessage() for r in caplog.records))
        client.assert_closed()
        wait_until(lambda: srv.server.connection_count == 0)


# --------------------------------------------------------------------------- lifecycle


def test_async_server_stop_cancels_blocked_handlers() -> None:
    entered = asyncio.Event()
    cancelled: list[bool] = []

    async def forever(body, ctx):
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        registry = ApiRegistry()
        registry.register(MetadataRequest, 0, 13, forever)
        server = KafkaServer(registry, HOST, 0)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(
                encode_request(
                    ApiVersionsRequest[3](client_software_name="a", client_software_version="1"), 1
                )
            )
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            correlation_id, resp = decode_response(await reader.readexactly(size), 18, 3)
            assert correlation_id == 1 and resp.error_code == 0
            writer.write(metadata_request(2, []))
            await asyncio.wait_for(entered.wait(), 5)
            assert server.connection_count == 1
        finally:
            started = time.monotonic()
            await server.stop()
            assert time.monotonic() - started < 3
        assert cancelled == [True] and server.connection_count == 0
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the client sees the close
        writer.close()

    asyncio.run(main())


def test_thread_runner_reports_bind_errors() -> None:
    with socket.socket() as taken:
        taken.bind((HOST, 0))
        taken.listen()
        runner = KafkaServerThread(ApiRegistry(), HOST, taken.getsockname()[1])
        with pytest.raises(RuntimeError):
            runner.start()
        runner.stop()


def test_thread_runner_restart_and_arguments() -> None:
    with pytest.raises(ValueError):
        KafkaServerThread(ApiRegistry(), HOST, 0, max_request_bytes=0)
    with pytest.raises(TypeError):
        KafkaServerThread(object(), HOST, 0)  # type: ignore[arg-type]
    cluster = Cluster()
    with running(make_registry(cluster), cluster) as srv:
        port = srv.port
        client = Raw(port)
        try:
            assert client.metadata(1).cluster_id == CLUSTER_ID
        finally:
            client.close()
    with pytest.raises(OSError):
        socket.create_connection((HOST, port), timeout=1).close()


def run_on(loop_kind: str, main) -> None:
    """Run `main()` to its end on a new event loop of `loop_kind` (asyncio or uvloop)."""
    if loop_kind == "uvloop":
        from dataplane.kafka.server import new_event_loop

        loop = new_event_loop()
    else:
        loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()


def produce_of(correlation_id: int, size: int) -> bytes:
    """A Produce v9 frame of one record set of `size` bytes, each the correlation id."""
    part = ProduceRequest.TopicProduceData.PartitionProduceData(
        index=0, records=bytes([correlation_id % 256]) * size
    )
    req = ProduceRequest[9](
        transactional_id=None,
        acks=1,
        timeout_ms=1000,
        topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[part])],
    )
    return encode_request(req, correlation_id, client_id="raw")


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_frames_of_any_size_and_split_pipelined_on_both_event_loops(loop_kind: str) -> None:
    # the listener's framing over a real socket: a large frame (read into its own buffer),
    # many small frames in one write, a frame written in pieces; responses in order
    seen: list[tuple[int, int]] = []

    async def produce(body, ctx):
        records = body.topic_data[0].partition_data[0].records
        seen.append((ctx.correlation_id, len(records)))
        return ProduceResponse(responses=[], throttle_time_ms=0)

    sizes = {1: 3 * 1024 * 1024, **{i: 10 + i for i in range(2, 52)}, 52: 200_000, 53: 5}

    async def main() -> None:
        registry = ApiRegistry()
        registry.register(ProduceRequest, 3, 13, produce)
        server = KafkaServer(registry, HOST, 0)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            writer.write(produce_of(1, sizes[1]))
            writer.write(b"".join(produce_of(i, sizes[i]) for i in range(2, 52)))
            tail = produce_of(52, sizes[52]) + produce_of(53, sizes[53])
            pieces = [tail[:3], tail[3:70_000], tail[70_000:150_000], tail[150_000:]]
            for piece in pieces:  # with pauses: each arrives in its own reads
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0.02)
            got = []
            for _ in range(53):
                size = struct.unpack(">i", await reader.readexactly(4))[0]
                got.append(decode_response(await reader.readexactly(size), 0, 9)[0])
            assert got == list(range(1, 54))
            assert seen == sorted(sizes.items())
            writer.close()
        finally:
            await server.stop()

    run_on(loop_kind, main)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_large_frames_buffer_is_used_again_only_once_its_records_are_let_go(
    loop_kind: str,
) -> None:
    """Large frames are read into pooled buffers and their record sets are views of them: a
    request that keeps its records (as an append still under way does) keeps them intact
    while later frames arrive, and the buffers of requests done with theirs serve later
    frames."""
    kept: dict[int, memoryview] = {}
    buffers: set[int] = set()
    released = 0

    async def produce(body, ctx):
        nonlocal released
        records = body.topic_data[0].partition_data[0].records
        buffers.add(id(records.obj))
        if ctx.correlation_id % 2:  # odd ones hold their records to the end
            kept[ctx.correlation_id] = records
        else:
            released += 1
        return ProduceResponse(responses=[], throttle_time_ms=0)

    sizes = {i: 100_000 + (i * 77_777) % 900_000 for i in range(1, 41)}

    async def main() -> None:
        registry = ApiRegistry()
        registry.register(ProduceRequest, 3, 13, produce)
        server = KafkaServer(registry, HOST, 0)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection(HOST, server.port)
            for cid, size in sizes.items():  # one at a time: each answered before the next
                writer.write(produce_of(cid, size))
                await writer.drain()
                length = struct.unpack(">i", await reader.readexactly(4))[0]
                assert decode_response(await reader.readexactly(length), 0, 9)[0] == cid
            writer.close()
        finally:
            await server.stop()

    run_on(loop_kind, main)
    assert released == 20 and len(kept) == 20
    for cid, records in kept.items():  # no later frame was read into a held buffer
        assert records == bytes([cid]) * sizes[cid], cid
    # the 20 requests that let go of their records left buffers the later frames reused
    assert len(buffers) < len(sizes)


@pytest.mark.parametrize("handler_delay_s", [0.0, 0.3])
def test_client_gone_before_its_response_is_not_an_error(
    handler_delay_s: float, raw_clients: list[Raw], caplog: pytest.LogCaptureFixture
) -> None:
    # the response is ready as (or after) the client's EOF arrives: nothing to write to,
    # which is no error (the connection just closes)
    for logger in SERVER_LOGS:
        caplog.set_level(logging.INFO, logger=logger)

    async def produce(body, ctx):
        await asyncio.sleep(handler_delay_s)
        return ProduceResponse(responses=[], throttle_time_ms=0)

    registry = ApiRegistry()
    registry.register(ProduceRequest, 3, 13, produce)
    with running(registry) as srv:
        for i in range(30 if handler_delay_s == 0 else 3):
            leaving = connect(raw_clients, srv.port)
            leaving.send(produce_request(i, acks=1))
            leaving.sock.shutdown(socket.SHUT_WR)
            if i % 2:
                leaving.close()
        time.sleep(handler_delay_s + 0.2)  # every response is due by now
        staying = connect(raw_clients, srv.port)
        staying.send(produce_request(100, acks=1))
        assert staying.response(0, 9)[0] == 100
        wait_until(lambda: srv.server.connection_count == 1)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
