"""Sealing erasure-coded partitions into object storage (issue #14), with no servers: the
real state machine in process, 6 durable HoleStores in a temp dir, moto S3 and the storage
engine's read path. Decided records are written as one stream object, the stores drop
them, and fetches below the sealed end read them back at the very offsets they were acked
at; one sealer per range; retention and DeleteRecords trim sealed pieces."""

from __future__ import annotations

import threading
import time

import boto3
import pytest
from moto import mock_aws

from controlplane.errors import ControllerError, ErrorCode
from controlplane.inprocess import InProcessController
from controlplane.records import ObjectState
from controlplane.requests import PrepareObjectsRequest, SealErasureRangeRequest
from dataplane.broker.metadata import MetadataFollower
from dataplane.config import StorageConfig
from dataplane.erasure.reader import SealedRangeError
from dataplane.erasure.store import HoleStore, used_log_bytes
from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.object_format import ObjectWriter, parse_object
from dataplane.formats.seal_format import (
    MAX_SLOTS_PER_BATCH,
    offset_of,
    seal_batches,
    sealed_records,
)
from dataplane.kafka.api_context import BrokerIdentity
from dataplane.kafka.apis import KafkaApis
from dataplane.kafka.erasure_partition import ErasurePartitions
from dataplane.kafka.erasure_seal import ErasureSealer
from dataplane.objectstore import ObjectStorage
from dataplane.s3stream.storage import S3Storage
from tests.unit.test_erasure_partition import (
    NoLeaders,
    fetch,
    holes_settle_at,
    produce,
    read_all,
    register,
)
from tests.unit.test_kafka_apis_inprocess import batch, values_of

BUCKETS = "0@s3://automq-main?region=us-east-1"
ERASURE = {
    "automq.partition.mode": "erasure",
    "automq.erasure.read.delay.ms": "100",
    "automq.erasure.seal.delay.ms": "100",
}


# ---------------------------------------------------------------- the format (pure)


def test_seal_batches_cover_the_range_contiguously_with_sparse_offsets():
    start, end = 10, 10 + 3 * MAX_SLOTS_PER_BATCH
    records = [(offset_of(12), b"a"), (offset_of(13), b"b"), (offset_of(end - 1), b"c")]
    batches = seal_batches(7, start, end, records)
    # contiguous from start to end, as the object format requires; 32-bit counts only
    assert batches[0].base_offset == start and batches[-1].last_offset == end
    for prev, nxt in zip(batches, batches[1:]):
        assert prev.last_offset == nxt.base_offset
    assert all(0 < b.count <= MAX_SLOTS_PER_BATCH for b in batches)
    writer = ObjectWriter()
    writer.add_all(batches)
    parse_object(writer.finish().data)  # a valid object
    assert sealed_records(batches) == records
    with pytest.raises(ValueError):
        seal_batches(7, start, end, [(offset_of(12) + 1, b"x")])  # not aligned
    with pytest.raises(ValueError):
        seal_batches(7, start, end, [(offset_of(end), b"x")])  # outside


# ---------------------------------------------------------------- the store


def test_store_drop_is_durable_and_a_read_below_it_is_refused_not_empty(tmp_path):
    store = HoleStore(tmp_path / "s", compact_min_dead_bytes=1)
    for i in range(10):
        store.write(5, 1000 + i, b"x" * 100)
    store.write(6, 1000, b"other stream")
    assert store.drop_below(5, 1008) == 1008
    assert store.hole_count == 3
    assert store.rewrites == 1  # most of the log was dead: rewritten
    answer = store.read_range(5, 0, 2000, 100, 1 << 20)
    assert answer.dropped_below == 1008 and answer.holes == []
    assert [o for o, _ in store.read_range(5, 1008, 2000, 100, 1 << 20).holes] == [1008, 1009]
    # a shard for a dropped hole is refused (the drop mark fills)
    assert store.write(5, 1001, b"late").result.value == "taken"
    # the new file has zeroed room past its records too; appends after the rewrite land in
    # it and survive a restart
    log = tmp_path / "s" / "holes.log"
    assert log.stat().st_size > used_log_bytes(tmp_path / "s")
    store.write(5, 1010, b"y" * 100)
    store.close()
    again = HoleStore(tmp_path / "s")
    assert again.hole_count == 4
    assert again.read(6, 1000) == b"other stream"
    assert again.read(5, 1010) == b"y" * 100
    assert again.read_range(5, 0, 2000, 100, 1 << 20).dropped_below == 1008
    assert again.read(5, 1009) == b"x" * 100
    again.close()


# ---------------------------------------------------------------- the partition


@pytest.fixture
def sealed_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        controller = InProcessController()
        register(controller, range(1, 7))
        follower = MetadataFollower(controller)

        def image_now():
            while follower.poll_once():
                pass
            return follower.image

        objects = ObjectStorage(BUCKETS)
        storage = S3Storage(
            StorageConfig(block_cache_bytes=16 << 20),
            1,
            image_now().brokers[1].node_epoch,
            controller,
            objects,
            data_dir=tmp_path / "engine",
        )
        stores = {n: HoleStore(tmp_path / f"store-{n}") for n in range(1, 7)}
        erasure = ErasurePartitions(
            1,
            image_now,
            NoLeaders(),
            store_for=lambda n: stores[n],
            controller=controller,
            objects=objects,
            node_epoch_fn=lambda: image_now().brokers[1].node_epoch,
            read_sealed=storage.read_committed,
        )
        erasure.sealer.stop()  # passes run on the test's thread
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
            yield apis, controller, stores, erasure, image_now, objects
        finally:
            apis.io.shutdown(wait=True)
            erasure.stop()
            for s in stores.values():
                s.close()
            objects.close()


def read_from(apis, topic: str, position: int, expect: int) -> list[tuple[int, bytes]]:
    """Fetch from `position` on as a consumer does (position = last offset + 1)."""
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 5
    while len(got) < expect and time.monotonic() < deadline:
        part = fetch(apis, topic, position)
        assert part.error_code == KafkaError.NONE
        for offset, value in values_of(part.records):
            if offset >= position:
                got.append((offset, value))
                position = offset + 1
        time.sleep(0.02)
    return got


def _partition(erasure, image_now, topic: str):
    t = image_now().topic_by_name(topic)
    return erasure.get(t.topic_id, 0), t.partitions[0].stream_id


def test_decided_records_are_sealed_dropped_from_the_stores_and_read_back(sealed_cluster):
    apis, controller, stores, erasure, image_now, objects = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    acked = []
    for i in range(5):
        r = produce(apis, "events", batch([f"v{i}-{j}".encode() for j in range(3)]))
        assert r.error_code == KafkaError.NONE
        acked += [(r.base_offset + j, f"v{i}-{j}".encode()) for j in range(3)]
    assert read_all(apis, "events", 15) == acked  # from the stores
    partition, stream_id = _partition(erasure, image_now, "events")
    time.sleep(0.3)  # past the read and seal delays
    assert erasure.sealer.seal(partition) == 1
    image = image_now()
    stream = image.streams[stream_id]
    [so] = [o for o in image.stream_objects.values() if o.stream_id == stream_id]
    assert (so.start_offset, so.end_offset) == (stream.start_offset, stream.end_offset)
    assert objects.list_keys(0)  # the object is in the bucket
    # every store forgot the sealed holes
    assert all(s.hole_count == 0 for s in stores.values())
    # the log starts at the first sealed batch; every acked record is read back from the
    # object store at its acked offset
    assert partition.log_start_offset == acked[0][0]
    assert fetch(apis, "events", 0).error_code == KafkaError.OFFSET_OUT_OF_RANGE
    start = partition.log_start_offset
    assert read_from(apis, "events", start, 15) == acked
    # records written after the seal come from the stores, after the sealed ones
    r = produce(apis, "events", batch([b"late"]))
    assert read_from(apis, "events", start, 16) == [*acked, (r.base_offset, b"late")]
    # past the seal delay the next range continues the first
    time.sleep(0.3)
    assert erasure.sealer.seal(partition) == 1
    assert image_now().streams[stream_id].end_offset > r.base_offset >> 16
    assert all(s.hole_count == 0 for s in stores.values())
    assert read_from(apis, "events", start, 16) == [*acked, (r.base_offset, b"late")]


def test_a_stale_reader_below_a_drop_mark_is_refused_then_reads_the_object(sealed_cluster):
    apis, controller, stores, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    r = produce(apis, "events", batch([b"a"]))
    partition, _ = _partition(erasure, image_now, "events")
    time.sleep(0.3)
    assert erasure.sealer.seal(partition) == 1
    with pytest.raises(SealedRangeError):
        partition.reader.read(0)
    assert values_of(fetch(apis, "events", r.base_offset).records) == [(r.base_offset, b"a")]


def test_only_one_sealer_commits_a_range_and_a_retry_is_idempotent(sealed_cluster):
    apis, controller, _, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    _, stream_id = _partition(erasure, image_now, "events")
    epochs = {n: image_now().brokers[n].node_epoch for n in (1, 2)}
    ids = {
        n: controller.prepare_objects(
            PrepareObjectsRequest(node_id=n, node_epoch=epochs[n], count=1, ttl_ms=60_000)
        ).first_object_id
        for n in (1, 2)
    }

    def seal(n: int, start: int, end: int):
        return controller.seal_erasure_range(
            SealErasureRangeRequest(
                node_id=n,
                node_epoch=epochs[n],
                object_id=ids[n],
                stream_id=stream_id,
                start_offset=start,
                end_offset=end,
                size_bytes=100,
                bucket_id=0,
            )
        )

    assert seal(1, 1000, 2000).idempotent is False
    assert seal(1, 1000, 2000).idempotent is True  # a lost answer's retry
    for start, end in ((1000, 2000), (1000, 3000), (1500, 3000)):
        with pytest.raises(ControllerError) as exc:
            seal(2, start, end)
        assert exc.value.code is ErrorCode.STREAM_OFFSET_GAP
    assert seal(2, 2000, 3000).idempotent is False  # continues the sealed end
    stream = image_now().streams[stream_id]
    assert (stream.start_offset, stream.end_offset) == (1000, 3000)
    # a leader partition's stream is refused
    controller.call("create_topic", {"name": "plain", "partitions": 1})
    plain = image_now().topic_by_name("plain").partitions[0].stream_id
    with pytest.raises(ControllerError) as exc:
        controller.seal_erasure_range(
            SealErasureRangeRequest(
                node_id=1,
                node_epoch=epochs[1],
                object_id=ids[1],
                stream_id=plain,
                start_offset=0,
                end_offset=10,
                size_bytes=1,
                bucket_id=0,
            )
        )
    assert exc.value.code is ErrorCode.INVALID_REQUEST


def test_retention_and_delete_records_trim_sealed_pieces(sealed_cluster):
    apis, controller, _, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")
    first = produce(apis, "events", batch([b"old"]))
    time.sleep(0.3)
    assert erasure.sealer.seal(partition) == 1
    second = produce(apis, "events", batch([b"mid"]))
    time.sleep(0.3)
    assert erasure.sealer.seal(partition) == 1
    third = produce(apis, "events", batch([b"new"]))
    old_object = min(
        o.object_id for o in image_now().stream_objects.values() if o.stream_id == stream_id
    )
    # DeleteRecords below the second batch: the first piece goes, its object is destroyed
    assert partition.delete_records(second.base_offset) == second.base_offset
    assert partition.log_start_offset == second.base_offset
    assert image_now().objects[old_object].state == ObjectState.MARK_DESTROYED
    part = fetch(apis, "events", first.base_offset)
    assert part.error_code == KafkaError.OFFSET_OUT_OF_RANGE
    # DeleteRecords of an unsealed offset seals first
    time.sleep(0.15)  # the third batch is below the visible end
    assert partition.delete_records(third.base_offset) == third.base_offset
    assert values_of(fetch(apis, "events", third.base_offset).records) == [
        (third.base_offset, b"new")
    ]
    # retention.ms: every sealed piece older than 1 ms goes
    fourth = produce(apis, "events", batch([b"newest"]))
    time.sleep(0.3)
    assert erasure.sealer.seal(partition) == 1
    controller.call(
        "alter_topic_configs",
        {"name": "events", "ops": [{"key": "retention.ms", "value": "1", "op": "set"}]},
    )
    assert erasure.sealer.apply_retention(partition)
    stream = image_now().streams[stream_id]
    assert stream.start_offset == stream.end_offset  # nothing sealed is left
    assert partition.log_start_offset > fourth.base_offset
    alive = [o for o in image_now().stream_objects.values() if o.stream_id == stream_id]
    assert alive == []


def test_a_sealer_dying_before_its_commit_loses_nothing_and_the_next_seal_commits_once(
    sealed_cluster, monkeypatch
):
    apis, controller, stores, erasure, image_now, objects = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")
    acked = []
    for i in range(3):
        r = produce(apis, "events", batch([f"v{i}".encode()]))
        acked.append((r.base_offset, f"v{i}".encode()))
    time.sleep(0.3)

    def crash(*_a, **_k):
        raise RuntimeError("killed between put and commit")

    monkeypatch.setattr(controller, "seal_erasure_range", crash)
    with pytest.raises(RuntimeError):
        erasure.sealer.seal(partition)
    monkeypatch.undo()
    # the object was put but never committed: the stores keep every shard, reads go on
    assert len(objects.list_keys(0)) == 1
    assert image_now().streams[stream_id].ranges == []
    assert holes_settle_at(stores, [3] * 6)  # acked at k holes: the rest land in the background
    assert read_from(apis, "events", 0, 3) == acked
    # the next pass seals the same records once; the orphan stays PREPARED (destroyed at
    # its deadline by the controller)
    assert erasure.sealer.seal(partition) == 1
    image = image_now()
    committed = [o for o in image.stream_objects.values() if o.stream_id == stream_id]
    assert len(committed) == 1
    prepared = [o for o in image.objects.values() if o.state == ObjectState.PREPARED]
    assert len(prepared) == 1
    assert read_from(apis, "events", partition.log_start_offset, 3) == acked


def test_two_brokers_sealing_one_partition_at_once_commit_each_offset_once(
    sealed_cluster,
):
    apis, controller, stores, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")
    # broker 2's view of the same partition, with a sealer of its own
    other = ErasurePartitions(
        2,
        image_now,
        NoLeaders(),
        store_for=lambda n: stores[n],
        controller=controller,
        objects=erasure.sealer.objects,
        node_epoch_fn=lambda: image_now().brokers[2].node_epoch,
        read_sealed=erasure.read_sealed,
    )
    other.sealer.stop()
    try:
        mine = other.get(image_now().topic_by_name("events").topic_id, 0)
        acked = []
        for round_ in range(3):
            for i in range(3):
                r = produce(apis, "events", batch([f"r{round_}-{i}".encode()]))
                acked.append((r.base_offset, f"r{round_}-{i}".encode()))
            time.sleep(0.3)
            results: list = []

            def seal(sealer, p, out=results):
                try:
                    out.append(sealer.seal(p))
                except SealedRangeError:  # the other one sealed and dropped meanwhile
                    out.append(0)

            threads = [
                threading.Thread(target=seal, args=(s, p))
                for s, p in ((erasure.sealer, partition), (other.sealer, mine))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(results) == 2 and sum(results) >= 1, results
        image = image_now()
        pieces = sorted(
            (o.start_offset, o.end_offset)
            for o in image.stream_objects.values()
            if o.stream_id == stream_id
        )
        # contiguous, never overlapping: no offset sealed twice
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:])), pieces
        assert read_from(apis, "events", partition.log_start_offset, 9) == acked
    finally:
        other.stop()


def test_erasure_topics_refuse_log_compaction_and_a_too_short_seal_delay():
    controller = InProcessController()
    register(controller, range(1, 7))
    for bad, why in (
        ({**ERASURE, "cleanup.policy": "compact"}, "not supported on erasure-coded"),
        ({**ERASURE, "cleanup.policy": "delete,compact"}, "not supported on erasure-coded"),
        ({**ERASURE, "automq.erasure.seal.delay.ms": "50"}, "automq.erasure.seal.delay.ms"),
    ):
        with pytest.raises(ControllerError) as e:
            controller.call("create_topic", {"name": "t", "partitions": 1, "configs": bad})
        assert e.value.code == ErrorCode.INVALID_CONFIG and why in e.value.message
    controller.call("create_topic", {"name": "t", "partitions": 1, "configs": ERASURE})
    with pytest.raises(ControllerError) as e:
        controller.call(
            "alter_topic_configs",
            {"name": "t", "ops": [{"key": "cleanup.policy", "op": "set", "value": "compact"}]},
        )
    assert e.value.code == ErrorCode.INVALID_CONFIG
    assert controller.machine.image.topic_by_name("t").configs.get("cleanup.policy") is None


def test_a_brokers_store_forgets_the_holes_of_deleted_topics_only(sealed_cluster):
    apis, controller, stores, erasure, image_now, objects = sealed_cluster
    controller.call("create_topic", {"name": "gone", "partitions": 1, "configs": ERASURE})
    controller.call("create_topic", {"name": "kept", "partitions": 1, "configs": ERASURE})
    for topic in ("gone", "kept"):
        assert produce(apis, topic, batch([b"x"])).error_code == KafkaError.NONE
    # acked at k holes: the counts below need every store's shard landed first
    assert holes_settle_at(stores, [2] * 6)
    gone = image_now().topic_by_name("gone").partitions[0].stream_id
    # a stream this image does not know yet (created since): never dropped
    newer = image_now().next_stream_id + 5
    stores[1].write(newer, 1 << 16, b"a shard of a newer stream")
    controller.call("delete_topic", {"name": "gone"})
    sealer = erasure.sealer
    sealer.local_store = stores[1]
    assert sealer.follow_drop_marks(image_now()) == 1
    assert stores[1].read_range(gone, 0, 2**62, 10, 1 << 20).holes == []
    assert stores[1].hole_count == 2  # "kept" and the newer stream
    assert sealer.follow_drop_marks(image_now()) == 0  # once
    assert stores[2].hole_count == 2  # other brokers' stores are their own sealer's work


def test_a_store_that_missed_its_drop_gets_it_from_its_own_brokers_pass(sealed_cluster):
    apis, controller, stores, erasure, image_now, objects = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    assert produce(apis, "events", batch([b"sealed"])).error_code == KafkaError.NONE
    assert holes_settle_at(stores, [1] * 6)
    partition, stream_id = _partition(erasure, image_now, "events")
    shard_stores = image_now().topic_by_name("events").partitions[0].shard_stores
    away = shard_stores[-1]
    index = shard_stores.index(away)
    # the store is down while the partition's sealer seals and tells the stores
    partition.reader.stores[index] = _DownStore()
    try:
        time.sleep(0.3)  # past the read and seal delays
        assert erasure.sealer.seal(partition) == 1
    finally:
        partition.reader.stores[index] = stores[away]
    end = offset_of(image_now().streams[stream_id].end_offset)
    assert stores[away].read_range(stream_id, 0, end, 10, 1 << 20).holes  # it missed it
    # written after the seal: above the sealed end, it stays in the stores
    later = produce(apis, "events", batch([b"unsealed"]))
    assert later.error_code == KafkaError.NONE and later.base_offset >= end
    assert holes_settle_at(stores, [2 if n == away else 1 for n in sorted(stores)])
    # its own broker's pass (the partition's sealer is elsewhere, busy or not) raises the
    # mark to the sealed end the image holds
    own = ErasureSealer(
        away,
        lambda: image_now().brokers[away].node_epoch,
        image_now,
        controller,
        objects,
        lambda *_: None,
        local_store=stores[away],
    )
    own.run_once()
    answer = stores[away].read_range(stream_id, 0, end, 10, 1 << 20)
    assert answer.dropped_below == end and answer.holes == []
    assert [o for o, _ in stores[away].read_range(stream_id, end, 2**62, 10, 1 << 20).holes] == [
        later.base_offset
    ]
    assert own.follow_drop_marks(image_now()) == 0  # once


def test_retention_bytes_keeps_the_newest_sealed_pieces(sealed_cluster):
    apis, controller, _, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")
    offsets = []
    for i in range(3):
        offsets.append(produce(apis, "events", batch([f"p{i}".encode() * 100])).base_offset)
        time.sleep(0.3)
        assert erasure.sealer.seal(partition) == 1
    pieces = sorted(
        (o.start_offset, o.object_id)
        for o in image_now().stream_objects.values()
        if o.stream_id == stream_id
    )
    newest = image_now().objects[pieces[-1][1]].size_bytes
    assert not erasure.sealer.apply_retention(partition)  # nothing out of retention yet
    controller.call(
        "alter_topic_configs",
        {"name": "events", "ops": [{"key": "retention.bytes", "value": str(newest), "op": "set"}]},
    )
    assert erasure.sealer.apply_retention(partition)
    # the two older pieces went: the log starts where the newest piece does (its first
    # slots may be empty), and its first record is the third batch
    assert offsets[1] < partition.log_start_offset <= offsets[2]
    assert read_from(apis, "events", partition.log_start_offset, 1) == [(offsets[2], b"p2" * 100)]


def test_an_idle_partition_is_looked_at_once_per_seal_delay(sealed_cluster):
    apis, controller, stores, erasure, image_now, _ = sealed_cluster
    # a seal delay far above the passes' ~0.4 s: a machine stalled for 0.6 s made the last
    # pass fall past a 1 s delay, where it is right to look again
    configs = {**ERASURE, "automq.erasure.seal.delay.ms": "10000"}
    controller.call("create_topic", {"name": "idle", "partitions": 1, "configs": configs})
    partition, _ = _partition(erasure, image_now, "idle")
    time.sleep(0.1)
    assert erasure.sealer.seal(partition) == 0  # nothing written: read once (fills)
    syncs = [s.fsync_count for s in stores.values()]
    for _ in range(5):  # passes within the seal delay neither read nor fill
        time.sleep(0.06)  # past the reader's least fill interval: a read would fill
        assert erasure.sealer.seal(partition) == 0
    assert [s.fsync_count for s in stores.values()] == syncs


def test_drop_find_and_drop_marks_over_the_stores_http_service(tmp_path):
    import threading as _threading

    from dataplane.erasure.shard_format import Shard, encode_shard
    from dataplane.erasure.store_client import ShardStoreClient
    from dataplane.erasure.store_server import ShardStoreHTTPServer

    store = HoleStore(tmp_path / "s")
    server = ShardStoreHTTPServer(("127.0.0.1", 0), store, secret="s3cret")
    thread = _threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        client = ShardStoreClient(f"127.0.0.1:{server.server_address[1]}", secret="s3cret")
        for offset in (1 << 16, 2 << 16):
            shard = Shard(1, 5, offset, 0, 4, 2, 3, 4242, b"abc")
            assert client.write(5, offset, encode_shard(shard)).result.value == "accepted"
        assert client.find(5, 4242) == [1 << 16, 2 << 16]
        assert client.find(5, 1) == []
        assert client.drop_below(5, 2 << 16) == 2 << 16
        answer = client.read_range(5, 0, 3 << 16, 10, 1 << 20)
        assert answer.dropped_below == 2 << 16 and answer.holes == []
        assert [o for o, _ in client.read_range(5, 2 << 16, 3 << 16, 10, 1 << 20).holes] == [
            2 << 16
        ]
        # a dropped write is still found (its offset is sealed, readable from the object)
        assert client.find(5, 4242) == [1 << 16, 2 << 16]
    finally:
        server.shutdown()
        server.server_close()
        store.close()


# ---------------------------------------------------------------- repair, void-only ranges


class _DownStore:
    def __getattr__(self, name):
        def fail(*_):
            raise ConnectionRefusedError("down")

        return fail


def test_the_sealer_repairs_a_write_won_with_four_shards_and_counts_it(sealed_cluster):
    from prometheus_client import REGISTRY

    from dataplane.erasure.embedded import EmbeddedErasureProducer
    from dataplane.erasure.holes import HoleKind, classify

    apis, controller, stores, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")
    erasure.sealer.config = erasure.sealer.config.model_copy(update={"repair_delay_ms": 0})
    metric = "automq_erasure_repaired_shards_total"
    before = REGISTRY.get_sample_value(metric) or 0.0
    # brokers 5 and 6 are down for this writer: the write wins with exactly 4 shards
    with EmbeddedErasureProducer(
        image_now,
        "events",
        0,
        store_for=lambda n: _DownStore() if n in (5, 6) else stores[n],
    ) as producer:
        offset = producer.send([(b"k", b"four shards")])
    assert stores[5].read(stream_id, offset) is None and stores[6].read(stream_id, offset) is None
    assert erasure.sealer.repair(partition) == 2
    assert erasure.sealer.repair_stats.repaired_shards == 2
    assert REGISTRY.get_sample_value(metric) == before + 2
    shard_stores = image_now().topic_by_name("events").partitions[0].shard_stores
    for index, node in enumerate(shard_stores):
        hole = classify(stores[node].read(stream_id, offset), stream_id, offset, index)
        assert hole.kind is HoleKind.SHARD
    assert erasure.sealer.repair(partition) == 0  # the next pass starts after it
    assert read_all(apis, "events", 1)[0][1] == b"four shards"


def test_repair_follows_the_dynamic_broker_configs(sealed_cluster):
    """`automq.erasure.repair.enable=false` (cluster default) stops repairs; this broker's
    own `true` wins over it; the rate and delay come from the same configs."""
    from dataplane.erasure.embedded import EmbeddedErasureProducer

    apis, controller, stores, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")

    def alter(resource: str, configs: dict) -> None:
        controller.call(
            "alter_broker_configs",
            {
                "resource": resource,
                "ops": [{"key": k, "op": "set", "value": v} for k, v in configs.items()],
            },
        )

    alter("", {"automq.erasure.repair.enable": "false", "automq.erasure.repair.delay.ms": "0"})
    with EmbeddedErasureProducer(
        image_now, "events", 0, store_for=lambda n: _DownStore() if n in (5, 6) else stores[n]
    ) as producer:
        offset = producer.send([(b"k", b"four shards")])
    settings = erasure.sealer.repair_settings()
    assert (settings.enabled, settings.delay_ms) == (False, 0)
    assert erasure.sealer.repair_if_enabled(partition) == 0
    assert stores[5].read(stream_id, offset) is None  # not repaired
    alter(
        "1",
        {
            "automq.erasure.repair.enable": "true",
            "automq.erasure.repair.rate.bytes.per.sec": "65536",
        },
    )
    settings = erasure.sealer.repair_settings()
    assert (settings.enabled, settings.max_bytes_per_s) == (True, 65536)
    assert erasure.sealer.repair_if_enabled(partition) == 2
    assert stores[5].read(stream_id, offset) is not None
    assert stores[6].read(stream_id, offset) is not None
    assert erasure.sealer._repairers[stream_id].max_bytes_per_s == 65536


def test_a_range_of_void_offsets_only_is_sealed_and_leaves_the_stores(sealed_cluster):
    from dataplane.erasure.writer import ErasureWriter
    from dataplane.kafka.erasure_partition import OFFSET_ALIGNMENT

    apis, controller, stores, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")
    # two writers split an offset's holes 3/3: void, no record
    offset = (time.time_ns() // OFFSET_ALIGNMENT + 1) * OFFSET_ALIGNMENT
    view = partition.reader.stores
    with (
        ErasureWriter(view, stream_id, writer_id=1) as a,
        ErasureWriter(view, stream_id, writer_id=2) as b,
    ):
        for i, frame in enumerate(a.shards(offset, b"from-a")[:3]):
            view[i].write(stream_id, offset, frame)
        for i, frame in enumerate(b.shards(offset, b"from-b")[3:], start=3):
            view[i].write(stream_id, offset, frame)
    assert sum(s.hole_count for s in stores.values()) == 6
    time.sleep(0.3)  # past the read and seal delays
    assert erasure.sealer.seal(partition) == 1
    assert erasure.sealer.void_seals == 1
    assert all(s.hole_count == 0 for s in stores.values())  # nothing pins the stores
    stream = image_now().streams[stream_id]
    assert stream.start_offset == offset >> 16 and stream.end_offset > offset >> 16
    # nothing appears there; a record written later is read after it and sealed next
    assert fetch(apis, "events", offset).error_code == KafkaError.NONE
    r = produce(apis, "events", batch([b"after"]))
    assert read_from(apis, "events", offset, 1) == [(r.base_offset, b"after")]
    time.sleep(0.3)
    assert erasure.sealer.seal(partition) == 1 and erasure.sealer.void_seals == 1
    assert read_from(apis, "events", offset, 1) == [(r.base_offset, b"after")]


class _Toggle:
    """A store that is unreachable while `down`."""

    def __init__(self, inner: HoleStore):
        self.inner = inner
        self.down = True

    def __getattr__(self, name):
        if self.down:
            return _DownStore().__getattr__(name)
        return getattr(self.inner, name)


def test_the_sealer_repairs_a_store_it_could_not_reach_once_it_answers(sealed_cluster):
    from dataplane.erasure.embedded import EmbeddedErasureProducer

    apis, controller, stores, erasure, image_now, _ = sealed_cluster
    controller.call("create_topic", {"name": "events", "partitions": 1, "configs": ERASURE})
    partition, stream_id = _partition(erasure, image_now, "events")
    erasure.sealer.config = erasure.sealer.config.model_copy(update={"repair_delay_ms": 0})
    shard_stores = image_now().topic_by_name("events").partitions[0].shard_stores
    a, b = shard_stores[-2:]  # out of the writer's reach; b also of the sealer's at first
    with EmbeddedErasureProducer(
        image_now, "events", 0, store_for=lambda n: _DownStore() if n in (a, b) else stores[n]
    ) as producer:
        offset = producer.send([(b"k", b"v")])
    toggle = _Toggle(stores[b])
    index = shard_stores.index(b)
    partition.reader.stores[index] = toggle
    try:
        assert erasure.sealer.repair(partition) == 1  # only a's hole
        assert stores[a].read(stream_id, offset) is not None
        assert stores[b].read(stream_id, offset) is None
        # newer writes come in while b is away; the cursor passes the offset
        produce(apis, "events", batch([b"later"]))
        erasure.sealer.repair(partition)
        toggle.down = False
        # the first pass that reaches b goes back to the offset it waits for; the next one
        # (at the latest) repairs it
        erasure.sealer.repair(partition)
        erasure.sealer.repair(partition)
        assert stores[b].read(stream_id, offset) is not None
        assert erasure.sealer.repair_stats.repaired_shards >= 2
    finally:
        partition.reader.stores[index] = stores[b]
