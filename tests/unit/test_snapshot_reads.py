"""Snapshot reads (dataplane/zonerouter/snapshot.py): the main's LinkIndex answers what is new
past a proxy's offset, durable only, bounded; the proxy's SnapshotCache serves contiguous
batches, refuses overlaps, empties on a new leader epoch and stays within its byte bound.
The GetPartitionSnapshot messages round-trip through the Kafka codec."""

from __future__ import annotations

import uuid

import pytest

from dataplane.formats.link_record import LinkRecord
from dataplane.kafka.codec import decode_request, decode_response, encode_request, encode_response
from dataplane.zonerouter.protocol import (
    SNAPSHOT_KEY,
    GetPartitionSnapshotRequest,
    GetPartitionSnapshotResponse,
)
from dataplane.zonerouter.snapshot import CachedBatch, LinkIndex, LinkLocation, SnapshotCache


def _loc(base: int, count: int = 10, epoch: int = 3, channel_offset: int = 0) -> LinkLocation:
    return LinkLocation(base, count, epoch, LinkRecord(2, channel_offset, 0, 100, 1_000))


def test_link_index_answers_links_past_the_offset_up_to_the_high_watermark():
    index = LinkIndex()
    for base in range(0, 50, 10):
        index.record(7, _loc(base, channel_offset=base * 100))
    # what the proxy has (25) is inside the batch 20..30: it is answered again, whole
    got = index.since(7, 25, 40, 100)
    assert [(g.base_offset, g.end_offset) for g in got] == [(20, 30), (30, 40)]
    # the batch 40..50 is not durable yet (the main's high watermark is 40)
    assert all(g.end_offset <= 40 for g in got)
    assert index.since(7, 50, 50, 100) == []
    assert [g.base_offset for g in index.since(7, 0, 50, 2)] == [0, 10]  # bounded
    assert index.since(8, 0, 50, 100) == []  # another stream


def test_link_index_prunes_committed_entries_and_is_bounded():
    index = LinkIndex(max_entries_per_stream=3, max_entries=5)
    for base in range(0, 50, 10):
        index.record(1, _loc(base))
    # only the 3 newest remain: asking from 0 shows the gap (the first is at 20)
    assert [g.base_offset for g in index.since(1, 0, 100, 100)] == [20, 30, 40]
    index.prune(1, 40)
    assert [g.base_offset for g in index.since(1, 0, 100, 100)] == [40]
    assert len(index) == 1
    for base in range(0, 30, 10):
        index.record(2, _loc(base))
    index.record(3, _loc(0))
    assert len(index) == 5
    # over the total bound: the least recently appended stream (1) gives up its entries
    index.record(3, _loc(10))
    assert len(index) == 5 and index.since(1, 0, 100, 100) == []
    index.record(3, _loc(20))  # then the next one (2), oldest first
    assert [g.base_offset for g in index.since(2, 0, 100, 100)] == [10, 20]
    assert len(index.since(3, 0, 100, 100)) == 3
    index.prune(2, 100)
    index.prune(3, 100)
    assert len(index) == 0


def test_link_index_starts_over_when_offsets_go_back():
    index = LinkIndex()
    index.record(1, _loc(0))
    index.record(1, _loc(10))
    index.record(1, _loc(5, epoch=4))  # a new stream epoch reassigned offsets from 5
    assert [(g.base_offset, g.leader_epoch) for g in index.since(1, 0, 100, 100)] == [(5, 4)]


def _batch(base: int, end: int, size: int = 100) -> CachedBatch:
    return CachedBatch(base, end, bytes([base % 256]) * size)


def test_cache_serves_contiguous_batches_and_refuses_overlaps():
    cache = SnapshotCache(10_000)
    key = ("t", 0)
    assert cache.put(key, 1, _batch(10, 20))
    assert cache.put(key, 1, _batch(20, 30))
    assert cache.put(key, 1, _batch(40, 50))  # after a gap (30..40 not linked)
    assert not cache.put(key, 1, _batch(15, 25))  # overlaps
    assert not cache.put(key, 1, _batch(35, 45))
    assert cache.contiguous_end(key, 10) == 30
    assert cache.contiguous_end(key, 12) == 30  # inside the first batch
    assert cache.contiguous_end(key, 30) == 30  # the gap: nothing past it
    assert cache.contiguous_end(key, 40) == 50
    assert cache.max_end(key) == 50
    # a read from inside a batch returns it whole (the client skips earlier records)
    assert cache.read(key, 15, 50, 1_000) == _batch(10, 20).data + _batch(20, 30).data
    assert cache.read(key, 15, 25, 1_000) == _batch(10, 20).data  # bounded by the end
    assert cache.read(key, 10, 50, 150) == _batch(10, 20).data  # by max_bytes, >= 1 batch
    assert cache.read(key, 10, 50, 1) == _batch(10, 20).data
    assert cache.read(key, 30, 50, 1_000) == b""  # not cached
    assert cache.read(("t", 1), 10, 50, 1_000) == b""


def test_cache_prunes_committed_and_resets_on_a_new_leader_epoch():
    cache = SnapshotCache(10_000)
    key = ("t", 0)
    for base in range(0, 40, 10):
        cache.put(key, 1, _batch(base, base + 10))
    assert cache.size_bytes == 400
    cache.prune_below(key, 25)  # 0..10 and 10..20 are committed
    assert cache.size_bytes == 200
    assert cache.read(key, 20, 40, 1_000) == _batch(20, 30).data + _batch(30, 40).data
    assert cache.leader_epoch(key) == 1
    assert cache.put(key, 2, _batch(40, 50))  # a new main: its snapshot starts over
    assert cache.leader_epoch(key) == 2
    assert cache.size_bytes == 100
    assert cache.read(key, 20, 50, 1_000) == b""
    cache.reset(key)
    assert cache.size_bytes == 0 and cache.max_end(key) == -1


def test_cache_evicts_oldest_insertions_over_its_bound():
    cache = SnapshotCache(350)
    a, b = ("t", 0), ("t", 1)
    cache.put(a, 1, _batch(0, 10))
    cache.put(b, 1, _batch(0, 10))
    cache.put(a, 1, _batch(10, 20))
    cache.put(b, 1, _batch(10, 20))  # 400 bytes: the first insertion goes
    assert cache.size_bytes == 300
    assert cache.read(a, 0, 100, 1_000) == b""
    assert cache.read(a, 10, 100, 1_000) == _batch(10, 20).data
    assert cache.read(b, 0, 100, 1_000) == _batch(0, 10).data + _batch(10, 20).data
    assert not cache.put(a, 1, CachedBatch(20, 30, b"x" * 351))  # larger than the cache
    with pytest.raises(ValueError):
        SnapshotCache(0)


def test_snapshot_messages_round_trip():
    topic_id = uuid.uuid4()
    Q = GetPartitionSnapshotRequest[0]
    req = Q(
        node_id=2,
        max_wait_ms=200,
        partitions=[Q.PartitionRequest(topic_id=topic_id, partition=3, fetch_offset=42)],
    )
    decoded = decode_request(encode_request(req, 7, client_id="t", version=0)[4:])
    assert decoded.api_key == SNAPSHOT_KEY and decoded.correlation_id == 7
    asked = decoded.body.partitions[0]
    assert (asked.topic_id, asked.partition, asked.fetch_offset) == (topic_id, 3, 42)
    R = GetPartitionSnapshotResponse[0]
    link = R.PartitionSnapshot.LinkLocation(
        base_offset=42,
        record_count=5,
        source_node_id=1,
        channel_offset=4096,
        position=0,
        length=500,
        timestamp_ms=123,
    )
    resp = R(
        error_code=0,
        partitions=[
            R.PartitionSnapshot(
                topic_id=topic_id,
                partition=3,
                error_code=0,
                leader_epoch=4,
                high_watermark=47,
                log_start_offset=0,
                links=[link],
            )
        ],
    )
    frame = encode_response(decoded, resp)
    frame = frame if isinstance(frame, bytes) else b"".join(bytes(b) for b in frame)
    got_id, got = decode_response(frame[4:], SNAPSHOT_KEY, 0)
    assert got_id == 7
    snap = got.partitions[0]
    assert (snap.topic_id, snap.high_watermark, snap.leader_epoch) == (topic_id, 47, 4)
    assert snap.links[0].channel_offset == 4096 and snap.links[0].length == 500


@pytest.fixture
def objects(monkeypatch):
    boto3 = pytest.importorskip("boto3")
    from moto import mock_aws

    from dataplane.objectstore import ObjectStorage

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="automq-main")
        with ObjectStorage("0@s3://automq-main?region=us-east-1", merge_window_ms=0) as store:
            yield store


class _Proxy:
    def __init__(self, topic_id: str):
        self.topic_id, self.partition, self.woken = topic_id, 0, 0

    def wake(self) -> None:
        self.woken += 1


def test_apply_reads_new_batches_from_the_channel_and_stops_at_a_gap(objects):
    """A main's snapshot names batches in node 2's RouterChannel: the proxy reads them from
    the object store into its cache (byte for byte the main's batches), extends what a
    fetch may read up to the main's high watermark, wakes the fetches, and stops at a link
    whose channel record it cannot read (a gap: served once uploaded)."""
    from dataplane.formats.record_batch import patch_batch
    from dataplane.s3stream.wal.object_wal import ObjectWAL
    from dataplane.zonerouter.channel import ChannelReaders, channel_location
    from dataplane.zonerouter.snapshot_read import SnapshotReader
    from dataplane.zonerouter.traffic import ZoneTraffic
    from tests.unit.test_kafka_apis_inprocess import batch
    from tests.unit.zone_images import two_brokers_and_a_topic

    sm, topic_id = two_brokers_and_a_topic()
    image = sm.image
    state = image.topics[topic_id].partitions[0]
    first, second = batch([b"a", b"b"]), batch([b"c"])
    channel = ObjectWAL.open(objects, channel_location(2), 2, 0, capacity_bytes=64 << 20)
    try:
        at = channel.append(first + second).result(10).offset
    finally:
        channel.close()
    traffic = ZoneTraffic("az2")
    reader = SnapshotReader(lambda: image, ChannelReaders(objects), traffic, node_id=3)
    proxy = _Proxy(topic_id)
    try:
        assert reader.high_watermark(proxy, state.leader_node_id, 0) == 0
        R = GetPartitionSnapshotResponse[0]
        L = R.PartitionSnapshot.LinkLocation

        def snapshot(hw: int, links: list, epoch: int = 0):
            return R(
                error_code=0,
                partitions=[
                    R.PartitionSnapshot(
                        topic_id=uuid.UUID(topic_id),
                        partition=0,
                        error_code=0,
                        leader_epoch=epoch,
                        high_watermark=hw,
                        log_start_offset=0,
                        links=links,
                    )
                ],
            )

        def link(base, count, position, length, channel_offset=at):
            return L(
                base_offset=base,
                record_count=count,
                source_node_id=2,
                channel_offset=channel_offset,
                position=position,
                length=length,
                timestamp_ms=0,
            )

        links = [
            link(0, 2, 0, len(first)),
            link(2, 1, len(first), len(second)),
            link(3, 1, 0, len(first), channel_offset=at + 10**6),  # no such record: a gap
            link(5, 1, 0, len(first)),
        ]
        reader.apply(snapshot(6, links), image)
        assert proxy.woken == 1
        assert reader.high_watermark(proxy, state.leader_node_id, 0) == 3
        key = (topic_id, 0)
        assert reader.cache.read(key, 0, 3, 1 << 20) == patch_batch(first, 0, 0) + patch_batch(
            second, 2, 0
        )
        assert traffic.snapshot()["proxy_read_bytes"] == len(first) + len(second)
        # the main's high watermark caps what is served, whatever the cache holds
        reader._polled[key].main_hw = 2
        assert reader.high_watermark(proxy, state.leader_node_id, 0) == 2
        # a new leader epoch (a new main's snapshot) starts over
        reader.apply(snapshot(3, [], epoch=1), image)
        assert reader.cache.max_end(key) == -1
        assert reader.high_watermark(proxy, state.leader_node_id, 0) == 0
        # read_committed: nothing is stable before a snapshot told the main's LSO; then
        # the LSO (at most what the proxy serves) and the aborts it learned
        main = state.leader_node_id
        assert reader.last_stable_offset(proxy, main, 3, 0) == 0
        R1 = GetPartitionSnapshotResponse[1]
        snap = snapshot(3, [], epoch=1)
        snap.partitions[0].last_stable_offset = 2
        snap.partitions[0].aborted_transactions = [
            R1.PartitionSnapshot.AbortedTransaction(producer_id=9, first_offset=0, marker_offset=1)
        ]
        reader.apply(snap, image)
        assert reader.last_stable_offset(proxy, main, 3, 0) == 2
        assert reader.last_stable_offset(proxy, main, 1, 0) == 1
        assert reader.aborted_transactions(proxy, main, 0, 2) == [(9, 0)]
        assert reader._asked(main, image)[0][2] == 2  # next: the aborts from marker 2 on
        # a marker sent inline (the main holds it without a link) is served from the cache
        from dataplane.kafka.txn.markers import build_marker

        marker = patch_batch(build_marker(9, 0, False, 0, 1_000), 0, 1)
        snap = snapshot(3, [], epoch=1)
        snap.partitions[0].control_batches = [
            R1.PartitionSnapshot.ControlBatch(base_offset=0, data=marker)
        ]
        reader.apply(snap, image)
        assert reader.high_watermark(proxy, main, 0) == 1
        assert reader.cache.read(key, 0, 1, 1 << 20) == marker
    finally:
        reader.close()


def test_metadata_wakes_every_proxied_partition_and_drops_moved_own_pipelines():
    """Each metadata batch wakes the fetches of every proxied partition (a main's commit
    may have made more readable), and a partition no longer led here stops taking
    produce through the own channel."""
    from types import SimpleNamespace

    from dataplane.zonerouter.own_channel import OwnPipeline
    from dataplane.zonerouter.traffic import ZoneTraffic
    from dataplane.zonerouter.zone_router import ZoneRouter

    image = SimpleNamespace(
        topics={"t": SimpleNamespace(partitions={0: SimpleNamespace(leader_node_id=2)})},
        streams={},
    )
    router = ZoneRouter(1, 0, None, lambda: image, lambda *a: [], ZoneTraffic("az1"))  # type: ignore[arg-type]
    woken: list[int] = []
    for partition in (0, 1, 2):
        router._proxies[("t", partition)] = SimpleNamespace(  # type: ignore[assignment]
            wake=lambda p=partition: woken.append(p), worker=None
        )
    moved = router._own_workers[("t", 0)] = OwnPipeline(0)
    router.on_metadata(image)  # type: ignore[arg-type]
    assert sorted(woken) == [0, 1, 2]
    assert not router._own_workers
    with pytest.raises(RuntimeError):
        moved.worker.submit(lambda: None)
    # own pipelines and no proxy at all
    router._proxies.clear()
    router._own_workers[("t", 0)] = OwnPipeline(0)
    router.on_metadata(image)  # type: ignore[arg-type]
    assert not router._own_workers


class _Log:
    """A partition led here, as the snapshot server sees it."""

    def __init__(self, stream_id: int, hw: int):
        from dataplane.kafka.producer_state import TxnIndex

        self.stream_id = stream_id
        self.high_watermark, self.leader_epoch, self.log_start_offset = hw, 3, 0
        self.listeners: list = []
        self.txns = TxnIndex()

    def aborted_since(self, marker_offset: int) -> list[tuple[int, int, int]]:
        return self.txns.aborted_since(marker_offset)

    def add_listener(self, cb) -> None:
        self.listeners.append(cb)

    def remove_listener(self, cb) -> None:
        self.listeners.remove(cb)


def test_snapshot_server_long_polls_and_answers_durable_links_only(monkeypatch):
    import asyncio
    import threading
    import time

    from dataplane.formats.kafka_errors import KafkaError
    from dataplane.zonerouter import snapshot_server
    from dataplane.zonerouter.snapshot_server import MAX_WAIT_MS, SnapshotServer

    topic_id = uuid.uuid4()
    log = _Log(7, hw=10)
    index = LinkIndex()
    for base in (0, 5, 10):
        index.record(7, _loc(base, count=5, channel_offset=base))
    server = SnapshotServer(
        type("P", (), {"get": lambda self, t, p: log if (t, p) == (str(topic_id), 0) else None})(),
        index,
    )
    Q = GetPartitionSnapshotRequest[0]

    def ask(fetch_offset: int, max_wait_ms: int, partition: int = 0):
        req = Q(
            node_id=2,
            max_wait_ms=max_wait_ms,
            partitions=[
                Q.PartitionRequest(
                    topic_id=topic_id, partition=partition, fetch_offset=fetch_offset
                )
            ],
        )
        return asyncio.run(server.get_partition_snapshot(req, None))

    # new durable data: at once, the links past the offset up to the high watermark (10)
    start = time.monotonic()
    snap = ask(0, 5_000).partitions[0]
    assert time.monotonic() - start < 1.0
    assert (snap.error_code, snap.high_watermark, snap.leader_epoch) == (0, 10, 3)
    assert [(lk.base_offset, lk.record_count, lk.channel_offset) for lk in snap.links] == [
        (0, 5, 0),
        (5, 5, 5),
    ]
    # not a partition led here: answered at once, NOT_LEADER_OR_FOLLOWER
    start = time.monotonic()
    snap = ask(0, 5_000, partition=1).partitions[0]
    assert snap.error_code == KafkaError.NOT_LEADER_OR_FOLLOWER
    assert time.monotonic() - start < 1.0
    # nothing new: waits (bounded by MAX_WAIT_MS whatever is asked) ...
    start = time.monotonic()
    snap = ask(10, 60_000).partitions[0]
    waited = time.monotonic() - start
    assert MAX_WAIT_MS / 1000 * 0.8 <= waited < MAX_WAIT_MS / 1000 + 1.0
    assert snap.links == [] and not log.listeners

    # ... until an append becomes durable (its listener fires from another thread)
    def append_later() -> None:
        deadline = time.monotonic() + 10
        while not log.listeners and time.monotonic() < deadline:
            time.sleep(0.005)  # the server is waiting now
        log.high_watermark = 15
        for cb in list(log.listeners):
            cb()

    # a long poll bound here, so that "woken, not timed out" does not hinge on the thread
    # and a fresh event loop starting within 0.5 s on a loaded machine
    long_wait_ms = 30_000
    monkeypatch.setattr(snapshot_server, "MAX_WAIT_MS", long_wait_ms)
    thread = threading.Thread(target=append_later)
    start = time.monotonic()
    thread.start()
    snap = ask(10, long_wait_ms).partitions[0]
    thread.join()
    assert time.monotonic() - start < long_wait_ms / 1000 / 2  # woken, not timed out
    assert snap.high_watermark == 15 and [lk.base_offset for lk in snap.links] == [10]


# ---------------------------------------------------------------- read_committed via a proxy


def test_page_aborted_lowers_the_lso_to_every_abort_left_out():
    from dataplane.zonerouter.snapshot import page_aborted

    new = [(1, 10, 20), (2, 5, 30), (3, 40, 41)]
    assert page_aborted(new, 50, 10) == (new, 50)
    # the second and third are left out: nothing from offset 5 (the second's first) is
    # stable for the proxy until it has them (a long transaction opened before the first)
    assert page_aborted(new, 50, 1) == ([(1, 10, 20)], 5)
    assert page_aborted([], 7, 1) == ([], 7)


def test_txn_view_learns_aborts_incrementally_and_its_lso_only_grows():
    from dataplane.zonerouter.snapshot import TxnView

    view = TxnView(max_aborted=3)
    # no snapshot yet: nothing is stable (a read_committed fetch waits)
    assert view.last_stable_offset(100, 0) == 0 and view.aborted_from == -1
    view.apply(30, [(1, 10, 20)])
    assert view.last_stable_offset(100, 0) == 30
    assert view.last_stable_offset(25, 0) == 25  # at most what the proxy serves
    assert view.aborted_from == 21  # next time: the aborts from marker offset 21 on
    assert view.aborted_between(0, 30) == [(1, 10)]
    assert view.aborted_between(21, 30) == [] and view.aborted_between(0, 10) == []
    view.apply(25, [(1, 10, 20), (2, 22, 40)])  # a repeat is kept once; a lower LSO is stale
    assert view.last_stable_offset(100, 0) == 30
    assert view.aborted_between(0, 100) == [(1, 10), (2, 22)] and view.aborted_from == 41
    view.apply(90, [(3, 50, 60), (4, 70, 80)])  # bounded: the oldest abort goes
    assert view.aborted_between(0, 100) == [(2, 22), (3, 50), (4, 70)]
    with pytest.raises(ValueError):
        TxnView(max_aborted=0)


def test_txn_index_aborted_since_walks_only_the_new_aborts():
    from dataplane.kafka.producer_state import TxnIndex

    txns = TxnIndex()
    for pid, first, marker, commit in ((1, 0, 5, False), (2, 6, 8, True), (3, 9, 12, False)):
        txns.data(pid, first)
        txns.marker(pid, commit, marker)
    assert txns.aborted_since(-1) == [(1, 0, 5), (3, 9, 12)]
    assert txns.aborted_since(6) == [(3, 9, 12)] and txns.aborted_since(13) == []


def test_snapshot_server_answers_the_lso_and_aborted_transactions_incrementally(monkeypatch):
    """Version 1: the main's last stable offset and its aborted transactions from the
    proxy's marker offset on, bounded per answer (the LSO lowered to what is left out), and
    an abort the proxy has not got answers at once (no long poll)."""
    import asyncio
    import time

    from dataplane.kafka.producer_state import TxnIndex
    from dataplane.zonerouter import snapshot_server
    from dataplane.zonerouter.snapshot_server import SnapshotServer

    topic_id = uuid.uuid4()
    log = _Log(7, hw=40)
    log.txns = TxnIndex()
    for pid, first, marker in ((1, 0, 10), (2, 12, 20), (3, 22, 30)):
        log.txns.data(pid, first)
        log.txns.marker(pid, False, marker)
    log.txns.data(4, 35)  # open: the LSO is 35
    log.last_stable_offset = 35
    server = SnapshotServer(type("P", (), {"get": lambda self, t, p: log})(), LinkIndex())
    monkeypatch.setattr(snapshot_server, "MAX_ABORTED_PER_PARTITION", 2)
    Q = GetPartitionSnapshotRequest[1]

    def ask(fetch_offset: int, aborted_from: int):
        req = Q(
            node_id=2,
            max_wait_ms=500,
            partitions=[
                Q.PartitionRequest(
                    topic_id=topic_id,
                    partition=0,
                    fetch_offset=fetch_offset,
                    aborted_from=aborted_from,
                )
            ],
        )
        ctx = type("C", (), {"api_version": 1})()
        start = time.monotonic()
        snap = asyncio.run(server.get_partition_snapshot(req, ctx)).partitions[0]
        return snap, time.monotonic() - start

    snap, _ = ask(0, -1)
    got = [(a.producer_id, a.first_offset, a.marker_offset) for a in snap.aborted_transactions]
    assert got == [(1, 0, 10), (2, 12, 20)]
    assert snap.last_stable_offset == 22  # the third abort is not in this answer
    # the proxy is at the high watermark but lacks an abort: answered at once
    snap, waited = ask(40, 21)
    assert waited < 0.3 and snap.last_stable_offset == 35
    assert [a.producer_id for a in snap.aborted_transactions] == [3]
    # all known: a long poll, and nothing repeated
    snap, waited = ask(40, 31)
    assert waited >= 0.4 and snap.aborted_transactions == [] and snap.last_stable_offset == 35
    # the open transaction ends and appends land while the answer is built: the LSO is
    # never past the answer's high watermark (nor below it with no transaction open: the
    # proxy asks from that high watermark, and would wait for the next append)
    log.txns.marker(4, True, 40)

    class _Racing(_Log):
        @property
        def last_stable_offset(self):
            lso = self.high_watermark
            self.high_watermark += 4  # an append right after
            return lso

    racing = _Racing(7, hw=41)
    racing.txns = log.txns
    original, server.partitions = (
        server.partitions,
        type("P", (), {"get": lambda s, t, p: racing})(),
    )
    snap, _ = ask(40, 41)
    assert snap.high_watermark == 41 and snap.last_stable_offset == 41
    server.partitions = original
    # a version-0 proxy gets neither
    snap0 = asyncio.run(
        server.get_partition_snapshot(
            GetPartitionSnapshotRequest[0](
                node_id=2,
                max_wait_ms=0,
                partitions=[
                    GetPartitionSnapshotRequest[0].PartitionRequest(
                        topic_id=topic_id, partition=0, fetch_offset=0
                    )
                ],
            ),
            type("C", (), {"api_version": 0})(),
        )
    ).partitions[0]
    assert snap0.high_watermark == 40


def test_holes_between_links_bounded():
    from dataplane.zonerouter.snapshot import holes

    linked = [(0, 10), (11, 20), (30, 40)]
    # a marker at 10, 10 offsets of unlinked client data at 20, a marker at the end (40)
    assert holes(0, 41, linked, 8, 16) == [(10, 11), (40, 41)]
    assert holes(0, 41, linked, 10, 16) == [(10, 11), (20, 30), (40, 41)]
    assert holes(0, 41, linked, 8, 1) == [(10, 11)]
    assert holes(5, 20, linked, 8, 16) == [(10, 11)] and holes(40, 40, linked, 8, 16) == []
    assert holes(0, 3, [], 8, 16) == [(0, 3)]


def test_markers_the_main_holds_without_a_link_are_sent_inline():
    """A transaction's marker is appended at the main without a link: the snapshot carries
    its bytes (a control batch, ~80 bytes), never unlinked client data, so a proxy's
    read_committed consumers see the transaction end without waiting for the upload."""
    import asyncio

    from dataplane.formats.record_batch import patch_batch
    from dataplane.kafka.txn.markers import build_marker
    from dataplane.zonerouter.snapshot_server import SnapshotServer
    from tests.unit.test_kafka_apis_inprocess import batch

    marker = patch_batch(build_marker(5, 0, True, 0, 1_000), 10, 3)
    client = patch_batch(batch([b"no az"]), 11, 3)
    log = _Log(7, hw=12)
    log.last_stable_offset = 12
    stored = {10: marker, 11: client}
    log.read = lambda start, max_bytes, end: b"".join(
        stored[o] for o in range(start, end) if o in stored
    )
    index = LinkIndex()
    index.record(7, _loc(0, count=10))

    async def io(fn, *args):
        return fn(*args)

    topic_id = uuid.uuid4()
    server = SnapshotServer(type("P", (), {"get": lambda self, t, p: log})(), index, io=io)
    Q = GetPartitionSnapshotRequest[1]
    req = Q(
        node_id=2,
        max_wait_ms=0,
        partitions=[Q.PartitionRequest(topic_id=topic_id, partition=0, fetch_offset=0)],
    )
    snap = asyncio.run(
        server.get_partition_snapshot(req, type("C", (), {"api_version": 1})())
    ).partitions[0]
    assert [(c.base_offset, c.data) for c in snap.control_batches] == [(10, marker)]
    assert [lk.base_offset for lk in snap.links] == [0]
