"""Erasure-coded partitions behind the Kafka APIs (issue #14), with no servers: the real
state machine in process, 6 brokers whose shard stores are durable HoleStores in a temp dir,
the Kafka API handlers with the ErasurePartitions resolver. Produce is acked with any 4 of 6
stores, fetch decodes at the sparse offsets the writes won; configs, placement and bad
input are checked on the controller's side."""

from __future__ import annotations

import asyncio
import time

import pytest
from kafka.protocol.consumer import ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest

from controlplane.erasure_placement import serving_node
from controlplane.errors import ControllerError, ErrorCode
from controlplane.inprocess import InProcessController
from dataplane.broker.metadata import MetadataFollower
from dataplane.erasure.store import HoleStore, RangeAnswer
from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.api_context import BrokerIdentity
from dataplane.kafka.apis import KafkaApis
from dataplane.kafka.erasure_partition import OFFSET_ALIGNMENT, ErasurePartitions
from tests.unit.test_kafka_apis_inprocess import batch, ctx, fetch_req, produce_req, values_of

ERASURE = {"automq.partition.mode": "erasure", "automq.erasure.read.delay.ms": "100"}


class NoLeaders:
    def get(self, topic_id: str, partition: int):
        return None


class DownStore:
    """A store that is unreachable."""

    def _fail(self, *_a, **_k):
        raise ConnectionRefusedError("store down")

    write = read = read_range = fill_below = _fail


class GarbageStore:
    """A store that keeps what it is given but answers reads with rotten bytes."""

    def __init__(self, inner: HoleStore):
        self.inner = inner

    def write(self, stream_id, offset, data):
        return self.inner.write(stream_id, offset, data)

    def read(self, stream_id, offset):
        data = self.inner.read(stream_id, offset)
        return None if data is None else bytes(b ^ 0x5A for b in data)

    def read_range(self, stream_id, start, end, max_holes, max_bytes):
        r = self.inner.read_range(stream_id, start, end, max_holes, max_bytes)
        rotten = [(o, d[:-1] + bytes([d[-1] ^ 0xFF])) for o, d in r.holes]
        return RangeAnswer(rotten, r.complete_below, r.filled_below)

    def fill_below(self, stream_id, mark):
        return self.inner.fill_below(stream_id, mark)


def register(controller: InProcessController, nodes: range) -> None:
    for node in nodes:
        epoch = controller.call(
            "register_broker",
            {
                "node_id": node,
                "az": f"az{node % 3}",
                "host": "127.0.0.1",
                "kafka_port": 9000 + node,
                "incarnation_id": f"unit-{node}",
                "shard_store_port": 19000 + node,
            },
        )["node_epoch"]
        controller.call("broker_heartbeat", {"node_id": node, "node_epoch": epoch})


@pytest.fixture
def cluster(tmp_path):
    """(apis, controller, stores, follower): 6 brokers; node 1's APIs."""
    controller = InProcessController()
    register(controller, range(1, 7))
    follower = MetadataFollower(controller)
    stores = {n: HoleStore(tmp_path / f"store-{n}") for n in range(1, 7)}
    swapped: dict[int, object] = {}

    def image_now():
        while follower.poll_once():
            pass
        return follower.image

    erasure = ErasurePartitions(
        1, image_now, NoLeaders(), store_for=lambda n: swapped.get(n) or stores[n]
    )
    apis = KafkaApis(
        BrokerIdentity(1, "127.0.0.1", 9001, "az1"),
        image_now,
        lambda offset, timeout_s: image_now().offset >= offset,
        controller,
        erasure,
        lambda: 0,
        io_threads=2,
    )
    try:
        yield apis, controller, stores, swapped, image_now
    finally:
        erasure.stop()
        for s in stores.values():
            s.close()


def produce(apis, topic: str, records: bytes):
    resp = asyncio.run(apis.data.produce(produce_req(topic, records), ctx(0, 9)))
    return resp.responses[0].partition_responses[0]


def fetch(apis, topic: str, offset: int):
    return (
        asyncio.run(apis.data.fetch(fetch_req(topic, offset), ctx(1, 12)))
        .resolved()
        .responses[0]
        .partitions[0]
    )


def latest_offset(apis, topic: str) -> int:
    L = ListOffsetsRequest
    req = L[7](
        replica_id=-1,
        isolation_level=0,
        topics=[
            L.ListOffsetsTopic(
                name=topic,
                partitions=[
                    L.ListOffsetsTopic.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=-1
                    )
                ],
            )
        ],
    )
    return asyncio.run(apis.data.list_offsets(req, ctx(2, 7))).topics[0].partitions[0].offset


def holes_settle_at(stores, expected: list[int]) -> bool:
    """Whether the stores' hole counts reach `expected` (in node order) within 5 s.

    A write is acknowledged once k holes are accepted; the other shards land in the
    background, so a count read right after the ack may still be short by m.
    """
    deadline = time.monotonic() + 5
    while [s.hole_count for _, s in sorted(stores.items())] != expected:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def read_all(apis, topic: str, expect: int) -> list[tuple[int, bytes]]:
    """Fetch from 0 on, as a consumer does (position = last offset + 1), until `expect`."""
    got: list[tuple[int, bytes]] = []
    position, deadline = 0, time.monotonic() + 5
    while len(got) < expect and time.monotonic() < deadline:
        part = fetch(apis, topic, position)
        assert part.error_code == KafkaError.NONE
        for offset, value in values_of(part.records):
            if offset >= position:  # a fetch starts at the batch holding the position
                got.append((offset, value))
                position = offset + 1
        time.sleep(0.05)
    return got


def test_a_client_of_an_az_is_sent_to_a_broker_of_its_az(cluster):
    """A client declaring its AZ (`client.id` with `automq_az=`; the zone router lists it
    only that AZ's brokers) is sent, for each erasure-coded partition, to a live broker of
    its AZ (any broker can write one), spread over that AZ's brokers; without an AZ the
    choice is unchanged. It was a broker of any AZ, which such a client is not told of:
    LISTENER_NOT_FOUND."""
    from dataplane.kafka.registry import RequestContext
    from dataplane.zonerouter.routing import ZoneRouting

    apis, controller, _, _, image_now = cluster
    controller.call("create_topic", {"name": "events", "partitions": 6, "configs": ERASURE})
    image = image_now()
    apis.routing = ZoneRouting(1, image_now, None, lambda topic_id, partition: None)
    for az in ("az0", "az1", "az2"):
        request = MetadataRequest[9](
            topics=[MetadataRequest.MetadataRequestTopic(name="events")],
            allow_auto_topic_creation=False,
        )
        context = RequestContext(
            api_key=3,
            api_version=9,
            correlation_id=1,
            client_id=f"app&automq_az={az}",
            peer=("127.0.0.1", 1),
        )
        md = asyncio.run(apis.cluster.metadata(request, context))
        in_az = {n for n, b in image.brokers.items() if b.az == az}
        assert {b.node_id for b in md.brokers} == in_az
        leaders = [p.leader_id for p in md.topics[0].partitions]
        assert all(p.error_code == 0 for p in md.topics[0].partitions)
        assert set(leaders) == in_az  # in the AZ, and both of its brokers are used
    # no AZ: the partition's own stores in turn, as before
    for p in image.topic_by_name("events").partitions.values():
        assert serving_node(image, p) == p.shard_stores[p.partition % 6]
    # an AZ whose brokers are all down: the other brokers serve it
    p0 = image.topic_by_name("events").partitions[0]
    down = {
        n: b.model_copy(update={"fenced": True}) if b.az == "az0" else b
        for n, b in image.brokers.items()
    }
    fenced = image.model_copy(update={"brokers": down})
    assert serving_node(fenced, p0, "az0") == serving_node(fenced, p0)


def test_produce_is_acked_at_a_sparse_offset_and_fetch_decodes_it(cluster):
    apis, controller, stores, _, image_now = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    image = image_now()
    p = image.topic_by_name("events").partitions[0]
    assert p.leader_node_id == -1 and sorted(p.shard_stores) == [1, 2, 3, 4, 5, 6]
    # Metadata names a live broker as the leader; all 6 keep shards
    md = asyncio.run(
        apis.cluster.metadata(
            MetadataRequest[9](
                topics=[MetadataRequest.MetadataRequestTopic(name="events")],
                allow_auto_topic_creation=False,
            ),
            ctx(3, 9),
        )
    )
    mp = md.topics[0].partitions[0]
    assert mp.error_code == 0 and mp.leader_id == serving_node(image, p) in range(1, 7)
    assert sorted(mp.replica_nodes) == [1, 2, 3, 4, 5, 6]

    before = time.time_ns()
    first = produce(apis, "events", batch([b"a", b"b", b"c"]))
    second = produce(apis, "events", batch([b"d"]))
    assert first.error_code == second.error_code == KafkaError.NONE
    # offsets are the writer's clock in ns, aligned: batches never overlap
    assert first.base_offset >= before - OFFSET_ALIGNMENT
    assert first.base_offset % OFFSET_ALIGNMENT == 0 == second.base_offset % OFFSET_ALIGNMENT
    assert second.base_offset >= first.base_offset + OFFSET_ALIGNMENT
    assert holes_settle_at(stores, [2] * 6)  # one hole per batch on every store (all were up)
    got = read_all(apis, "events", 4)
    b = first.base_offset
    assert got == [(b, b"a"), (b + 1, b"b"), (b + 2, b"c"), (second.base_offset, b"d")]
    # a consumer seeking into the middle of a batch gets that batch (Kafka's rule)
    mid = values_of(fetch(apis, "events", b + 1).records)
    assert mid[0] == (b, b"a")
    # a fetch just past a batch does not get that batch again (librdkafka would take a
    # response with no record at or after its offset for a truncated, too large message)
    after = values_of(fetch(apis, "events", b + 3).records)
    assert after == [(second.base_offset, b"d")]
    assert latest_offset(apis, "events") > second.base_offset


def test_two_stores_down_writes_are_acked_and_read_from_the_four_others(cluster):
    apis, controller, stores, swapped, _ = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    swapped[5] = swapped[6] = DownStore()
    acked = produce(apis, "events", batch([b"x", b"y"]))
    assert acked.error_code == KafkaError.NONE
    assert [s.hole_count for n, s in sorted(stores.items())] == [1, 1, 1, 1, 0, 0]
    assert read_all(apis, "events", 2) == [(acked.base_offset, b"x"), (acked.base_offset + 1, b"y")]


def test_a_store_answering_garbage_is_never_decoded(cluster):
    apis, controller, stores, swapped, _ = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    swapped[2] = GarbageStore(stores[2])
    swapped[4] = GarbageStore(stores[4])
    acked = produce(apis, "events", batch([b"kept"]))
    assert acked.error_code == KafkaError.NONE
    # 2 rotten shards fail their checksums; the 4 good ones decode the batch
    assert read_all(apis, "events", 1) == [(acked.base_offset, b"kept")]


def test_an_idempotent_retry_to_the_same_broker_is_not_stored_twice(cluster):
    apis, controller, stores, _, _ = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    records = batch([b"once"], producer=(7, 0, 0))
    first = produce(apis, "events", records)
    again = produce(apis, "events", records)  # the answer was lost: the client resends
    assert first.error_code == again.error_code == KafkaError.NONE
    assert again.base_offset == first.base_offset
    # a second copy would be acked with k holes more: seen at once (the rest land later)
    assert max(s.hole_count for s in stores.values()) == 1
    assert holes_settle_at(stores, [1] * 6)
    nxt = produce(apis, "events", batch([b"next"], producer=(7, 0, 1)))
    assert nxt.base_offset > first.base_offset
    assert [v for _, v in read_all(apis, "events", 2)] == [b"once", b"next"]


def test_an_idempotent_retry_on_another_broker_gets_the_first_attempts_offset(cluster):
    """Broker 1 wrote the batch, its answer was lost (it died): the producer resends the
    same bytes to broker 2, which finds the first attempt in the stores (by payload CRC),
    waits until readers decide it, and answers with its offset instead of a second copy.
    A different batch of that producer, or of another one, is written as usual."""
    apis, controller, stores, _, image_now = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    other = ErasurePartitions(2, image_now, NoLeaders(), store_for=lambda n: stores[n])
    try:
        topic_id = image_now().topic_by_name("events").topic_id
        on_2 = other.get(topic_id, 0)
        records = batch([b"once"], producer=(7, 0, 5))
        first = produce(apis, "events", records)
        assert first.error_code == KafkaError.NONE
        retried = on_2.append(records).base_offset_future.result(10)
        assert retried == first.base_offset
        assert max(s.hole_count for s in stores.values()) == 1  # not written again
        assert holes_settle_at(stores, [1] * 6)
        # the producer goes on on broker 2: its next batch continues there, no look-up
        nxt = on_2.append(batch([b"next"], producer=(7, 0, 6))).base_offset_future.result(10)
        fresh = on_2.append(batch([b"fresh"], producer=(8, 0, 0))).base_offset_future.result(10)
        assert first.base_offset < nxt < fresh
        got = read_all(apis, "events", 3)
        assert got == [(first.base_offset, b"once"), (nxt, b"next"), (fresh, b"fresh")]
    finally:
        other.stop()


def test_a_payload_that_is_not_a_record_batch_is_passed_by_readers(cluster):
    """An embedded writer (no broker) may put its own payloads into the stream: Kafka
    readers pass them (no record there) and read on."""
    apis, controller, stores, _, image_now = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    part = apis.partitions.get(image_now().topic_by_name("events").topic_id, 0)
    part.writer.append(b"not a kafka batch")
    acked = produce(apis, "events", batch([b"after"]))
    assert read_all(apis, "events", 1) == [(acked.base_offset, b"after")]


def test_bad_batches_are_refused_and_nothing_is_stored(cluster):
    apis, controller, stores, _, _ = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    good = batch([b"v"])
    corrupt = good[:-1] + bytes([good[-1] ^ 0xFF])  # fails the batch CRC
    assert produce(apis, "events", corrupt).error_code == KafkaError.CORRUPT_MESSAGE
    assert produce(apis, "events", b"\x00" * 30).error_code == KafkaError.CORRUPT_MESSAGE
    controller.call(
        "alter_topic_configs",
        {"name": "events", "ops": [{"key": "max.message.bytes", "op": "set", "value": "100"}]},
    )
    big = batch([b"x" * 200])
    assert produce(apis, "events", big).error_code == KafkaError.MESSAGE_TOO_LARGE
    assert all(s.hole_count == 0 for s in stores.values())


def test_erasure_configs_are_validated_and_fixed_at_creation():
    controller = InProcessController()
    register(controller, range(1, 6))  # 5 brokers: one too few for RS(4,2)
    with pytest.raises(ControllerError) as e:
        controller.call("create_topic", {"name": "t", "partitions": 1, "configs": ERASURE})
    assert e.value.code == ErrorCode.NOT_ENOUGH_BROKERS and "6 active brokers" in e.value.message
    assert controller.machine.image.topic_by_name("t") is None
    # RS(3,2) fits on 5 brokers
    small = {**ERASURE, "automq.erasure.data.shards": "3"}
    controller.call("create_topic", {"name": "t", "partitions": 2, "configs": small})
    t = controller.machine.image.topic_by_name("t")
    stores = [p.shard_stores for p in t.partitions.values()]
    assert all(len(set(s)) == 5 for s in stores) and stores[0] != stores[1]  # rotated
    for bad, why in (
        ({**ERASURE, "automq.erasure.data.shards": "2"}, "must be greater than"),
        ({**ERASURE, "automq.partition.mode": "mirror"}, "automq.partition.mode"),
    ):
        with pytest.raises(ControllerError) as e:
            controller.call("create_topic", {"name": "u", "partitions": 1, "configs": bad})
        assert e.value.code == ErrorCode.INVALID_CONFIG and why in e.value.message
    with pytest.raises(ControllerError) as e:
        controller.call(
            "alter_topic_configs",
            {
                "name": "t",
                "ops": [{"key": "automq.partition.mode", "op": "set", "value": "leader"}],
            },
        )
    assert "only be set when the topic is created" in e.value.message
    # an AlterConfigs (replace) that does not name the mode keeps it
    controller.call(
        "alter_topic_configs",
        {"name": "t", "replace": True, "ops": [{"key": "retention.ms", "op": "set", "value": "1"}]},
    )
    configs = controller.machine.image.topic_by_name("t").configs
    assert configs["automq.partition.mode"] == "erasure"
    assert configs["automq.erasure.data.shards"] == "3"
    # a leaderless partition cannot be reassigned
    with pytest.raises(ControllerError) as e:
        controller.call(
            "reassign_partitions", {"moves": [{"topic": "t", "partition": 0, "node_id": 1}]}
        )
    assert "erasure-coded" in e.value.message


def test_two_brokers_writing_at_the_same_instant_never_lose_or_duplicate_an_ack(cluster):
    """Two brokers' writers forced onto the very same offsets (a frozen clock) race for
    the holes: one wins each offset or a split leaves it void, and the loser retries at a
    new offset; every acked batch is read exactly once, at the offset its produce was
    answered with."""
    apis, controller, stores, _, image_now = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    other = ErasurePartitions(2, image_now, NoLeaders(), store_for=lambda n: stores[n])
    try:
        topic_id = image_now().topic_by_name("events").topic_id
        mine, theirs = apis.partitions.get(topic_id, 0), other.get(topic_id, 0)
        frozen = time.time_ns()
        mine.writer.clock_ns = theirs.writer.clock_ns = lambda: frozen
        outcomes = []
        for i in range(10):
            a = mine.append(batch([f"a{i}".encode()]))
            b = theirs.append(batch([f"b{i}".encode()]))
            outcomes += [(f"a{i}", a.base_offset_future), (f"b{i}", b.base_offset_future)]
        acked = {f.result(10): value.encode() for value, f in outcomes}
        assert len(acked) == 20  # 20 distinct offsets: no offset was won twice
        got = read_all(apis, "events", 20)
        assert dict(got) == acked and len(got) == 20
    finally:
        other.stop()


def test_offsets_for_times_finds_the_first_batch_at_or_after_a_timestamp(cluster):
    apis, controller, _, _, image_now = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    offsets = []
    for value in (b"early", b"late"):
        now_ms = time.time_ns() // 1_000_000
        offsets.append((produce(apis, "events", stamped(value, now_ms)).base_offset, now_ms))
        time.sleep(0.02)
    read_all(apis, "events", 2)  # both readable
    topic_id = image_now().topic_by_name("events").topic_id
    part = apis.partitions.get(topic_id, 0)
    (first, t1), (second, t2) = offsets
    assert part.offset_for_timestamp(t1).offset == first
    assert part.offset_for_timestamp(t2).offset == second
    assert part.offset_for_timestamp(t2 + 1).offset == -1  # nothing at or after it


def stamped(value: bytes, timestamp_ms: int) -> bytes:
    from kafka.record.memory_records import MemoryRecordsBuilder

    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    builder.append(timestamp=timestamp_ms, key=b"k", value=value, headers=[])
    builder.close()
    return bytes(builder.buffer())


def test_a_brokers_shard_store_answers_only_with_the_cluster_secret(tmp_path):
    import threading

    from dataplane.erasure.store_client import ShardStoreClient, StoreUnavailableError
    from dataplane.erasure.store_server import ShardStoreHTTPServer

    store = HoleStore(tmp_path / "store")
    server = ShardStoreHTTPServer(("127.0.0.1", 0), store, secret="s3cret")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.server_address[1]}"
    try:
        for wrong in (None, "guess"):
            with pytest.raises(StoreUnavailableError, match="cluster secret"):
                ShardStoreClient(address, secret=wrong).write(1, 5, b"junk")
        assert store.hole_count == 0  # nothing written by a refused request
        answer = ShardStoreClient(address, secret="s3cret").write(1, 5, b"shard")
        assert answer.content == b"shard" and store.hole_count == 1
    finally:
        server.shutdown()
        server.server_close()
        store.close()


def test_an_embedded_producer_writes_without_a_broker_and_kafka_reads_it(cluster):
    from dataplane.erasure.embedded import EmbeddedErasureProducer

    apis, controller, stores, _, image_now = cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    controller.call("create_topic", {"name": "plain", "partitions": 1})
    with pytest.raises(ValueError, match="not an erasure-coded partition"):
        EmbeddedErasureProducer(image_now, "plain", 0, store_for=lambda n: stores[n])
    with EmbeddedErasureProducer(image_now, "events", 0, store_for=lambda n: stores[n]) as producer:
        base = producer.send([(b"k1", b"v1"), (None, b"v2")])
        after = producer.send([(b"k3", None)])
    assert base % OFFSET_ALIGNMENT == 0 and after > base
    got = read_all(apis, "events", 3)
    assert got == [(base, b"v1"), (base + 1, b"v2"), (after, None)]
