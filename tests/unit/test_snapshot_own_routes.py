"""A proxy's own routed batches need no snapshot poll (GetPartitionSnapshot version 5, issue
#32): the proxy caches them from its route answers (offsets and epoch patched, its last
stable offset moved past them), its polls ask from what it holds back to back, and the
main leaves them out of what wakes that proxy's long-poll (answered along with anything
else, and as news again once older than the grace time: a lost route answer)."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

from dataplane.formats.link_record import LinkRecord
from dataplane.formats.record_batch import patch_batch
from dataplane.zonerouter import snapshot_server
from dataplane.zonerouter.protocol import GetPartitionSnapshotResponse
from dataplane.zonerouter.snapshot import CachedBatch, LinkIndex, LinkLocation, SnapshotCache
from dataplane.zonerouter.snapshot_read import SnapshotReader, _PollSession
from dataplane.zonerouter.snapshot_server import SnapshotServer
from tests.unit.test_kafka_apis_inprocess import batch


def _txn_batch(values: list[bytes]) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1 << 20,
    )
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000, key=b"k", value=value, headers=[])
    return bytes(builder.build())


def _loc(base: int, count: int, node: int, linked_s: float, txn: bool = False) -> LinkLocation:
    return LinkLocation(base, count, 3, LinkRecord(node, base, 0, 100, 0), txn, linked_s)


def test_link_index_tells_a_range_routed_by_one_proxy():
    now = time.monotonic()
    index = LinkIndex()
    for base, node, txn in ((0, 2, False), (5, 2, False), (10, 4, False), (15, 2, True)):
        index.record(1, _loc(base, 5, node, now, txn))
    index.record(1, _loc(25, 5, 2, now))  # after a hole (20..25: a marker held unlinked)
    index.record(1, _loc(30, 5, 2, now))  # linked, not durable yet (past the end asked)
    assert index.routed_by(1, 0, 10, 2, now - 1)
    assert index.routed_by(1, 5, 10, 2, now - 1)
    assert index.routed_by(1, 7, 7, 4, now - 1)  # nothing in the range
    assert not index.routed_by(1, 0, 10, 2, now)  # linked too long ago
    assert not index.routed_by(1, 0, 15, 2, now - 1)  # 10..15: another proxy's
    assert index.routed_by(1, 10, 15, 4, now - 1)
    assert not index.routed_by(1, 15, 20, 2, now - 1)  # a transaction's data
    assert not index.routed_by(1, 20, 30, 2, now - 1)  # the hole
    assert index.routed_by(1, 25, 30, 2, now - 1)
    assert not index.routed_by(2, 0, 5, 2, now - 1)  # a stream the index does not hold
    index.prune(1, 10)
    assert not index.routed_by(1, 0, 10, 2, now - 1)  # pruned: not known


class _Log:
    """A partition led here, as the snapshot server sees it."""

    def __init__(self, stream_id: int, hw: int):
        self.stream_id = stream_id
        self.high_watermark = self.last_stable_offset = hw
        self.leader_epoch, self.log_start_offset = 3, 0
        self.listeners: list = []

    def aborted_since(self, marker_offset: int) -> list:
        return []

    def add_listener(self, cb) -> None:
        self.listeners.append(cb)

    def remove_listener(self, cb) -> None:
        self.listeners.remove(cb)

    def append(self, index: LinkIndex, count: int, node: int, linked_s: float | None = None):
        """A durable append of `count` offsets routed through `node`'s channel."""
        now = time.monotonic() if linked_s is None else linked_s
        index.record(self.stream_id, _loc(self.high_watermark, count, node, now))
        self.high_watermark += count
        self.last_stable_offset = self.high_watermark
        for cb in list(self.listeners):
            cb()


def _ask(server, session, asked, version=5, wait_ms=0):
    """One poll of the proxy (node 2), answered; the session learns the answer."""
    from dataplane.zonerouter.snapshot_codec import answer_view

    req = session.request(2, wait_ms, asked, version)
    resp = asyncio.run(server.get_partition_snapshot(req, SimpleNamespace(api_version=version)))
    view = answer_view(resp, session.topics)
    assert view.error_code == 0
    session.sent(asked)
    for snap in view.partitions:
        session.answered((str(snap.topic_id), snap.partition), snap.high_watermark, [])
    return view.partitions


def test_a_proxys_own_appends_do_not_wake_its_polls(monkeypatch):
    topic = uuid.uuid4()
    log = _Log(0, hw=0)
    index = LinkIndex()
    server = SnapshotServer(SimpleNamespace(get=lambda t, p: log), index)  # type: ignore[arg-type]
    session = _PollSession()
    key = (str(topic), 0)
    assert len(_ask(server, session, [(key, 0, -1)])) == 1  # new: answered at once
    # the proxy (node 2) routed 0..5 itself: no news for it, the poll waits it out and
    # leaves the partition out of the answer
    log.append(index, 5, node=2)
    started = time.monotonic()
    assert _ask(server, session, [(key, 0, -1)], wait_ms=100) == []
    assert time.monotonic() - started >= 0.09
    # once the proxy holds them (it asks from 5) the same holds for its next routes...
    log.append(index, 5, node=2)
    assert _ask(server, session, [(key, 5, -1)], wait_ms=0) == []
    # ... while another proxy's append wakes the poll: the answer names every link past
    # the proxy's offset, its own included (its view stays contiguous)
    # (held up to 60 s: answered well before, it was woken)
    monkeypatch.setattr(snapshot_server, "MAX_WAIT_MS", 60_000)
    loop_answer: list = []

    async def poll_then_append():
        req = session.request(2, 60_000, [(key, 5, -1)], 5)
        task = asyncio.ensure_future(
            server.get_partition_snapshot(req, SimpleNamespace(api_version=5))
        )
        await asyncio.sleep(0.05)
        log.append(index, 2, node=2)  # its own: still waiting
        await asyncio.sleep(0.05)
        assert not task.done()
        log.append(index, 3, node=4)
        loop_answer.append(await asyncio.wait_for(task, 30))

    asyncio.run(poll_then_append())
    from dataplane.zonerouter.snapshot import unpack_links
    from dataplane.zonerouter.snapshot_codec import answer_view

    (snap,) = answer_view(loop_answer[0], session.topics).partitions
    session.sent([(key, 5, -1)])
    session.answered(key, snap.high_watermark, [])
    assert snap.high_watermark == 15
    links = unpack_links(snap.packed_links, start_offset=15, timestamps=False)
    assert [(p.base_offset, p.source_node_id) for p in links] == [(5, 2), (10, 2), (12, 4)]
    monkeypatch.setattr(snapshot_server, "MAX_WAIT_MS", 500)
    # a route answer the proxy never got: its own batch is news once older than the grace
    log.append(index, 2, node=2, linked_s=time.monotonic() - snapshot_server.OWN_GRACE_S - 1)
    assert [s.high_watermark for s in _ask(server, session, [(key, 15, -1)])] == [17]
    # a proxy not upgraded (version 4) is not told about them otherwise: its own appends
    # are news for it
    log.append(index, 2, node=2)
    old = _PollSession()
    assert len(_ask(server, old, [(key, 17, -1)], version=4)) == 1
    assert [s.high_watermark for s in _ask(server, old, [(key, 17, -1)], version=4)] == [19]


def test_cache_plain_end_and_puts_kept_to_the_cached_epoch():
    cache = SnapshotCache(1 << 20)
    key = ("t", 0)
    plain = [patch_batch(batch([b"a", b"b"]), 0, 1), patch_batch(batch([b"c"]), 2, 1)]
    txn = patch_batch(_txn_batch([b"t"]), 3, 1)
    assert cache.put(key, 1, CachedBatch(0, 2, plain[0]), start_over=False)
    assert cache.put(key, 1, CachedBatch(2, 3, plain[1]), start_over=False)
    # another epoch: refused instead of starting the partition over
    assert not cache.put(key, 2, CachedBatch(4, 5, plain[1]), start_over=False)
    assert cache.leader_epoch(key) == 1 and cache.max_end(key) == 3
    assert cache.plain_end(key, 0) == 3
    assert cache.plain_end(key, 2) == 3
    assert cache.put(key, 1, CachedBatch(3, 4, txn))
    assert cache.plain_end(key, 0) == 3  # a transaction's data stops it
    assert cache.plain_end(key, 3) == 3
    assert cache.plain_end(key, 9) == 9
    assert cache.plain_end(("t", 1), 0) == 0


def _reader_with_image():
    """A SnapshotReader (node 1) following partition 0 of a topic led by node 2."""
    from dataplane.zonerouter.traffic import ZoneTraffic
    from tests.unit.zone_images import two_brokers_and_a_topic

    sm, topic_id = two_brokers_and_a_topic()
    image = sm.image
    channel: dict[int, bytes] = {}  # this broker's channel records it still holds
    reader = SnapshotReader(
        lambda: image, None, ZoneTraffic("az1"), node_id=1, own_records=channel.get
    )  # type: ignore[arg-type]
    return reader, image, topic_id, channel


class _Proxy:
    def __init__(self, topic_id: str):
        self.topic_id, self.partition, self.woken = topic_id, 0, 0

    def wake(self) -> None:
        self.woken += 1


def _answer(topic_id: str, hw: int, lso: int, links: list, epoch: int = 0):
    R = GetPartitionSnapshotResponse[1]
    L = R.PartitionSnapshot.LinkLocation
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
                last_stable_offset=lso,
                aborted_transactions=[],
                control_batches=[],
                links=[
                    L(
                        base_offset=base,
                        record_count=count,
                        source_node_id=1,
                        channel_offset=at,
                        position=0,
                        length=length,
                        timestamp_ms=0,
                    )
                    for base, count, at, length in links
                ],
            )
        ],
    )


def test_routed_batches_are_served_without_a_poll_and_stay_in_order():
    reader, image, topic_id, channel = _reader_with_image()
    proxy = _Proxy(topic_id)
    key = (topic_id, 0)
    main = image.topics[topic_id].partitions[0].leader_node_id
    first, second, third = batch([b"a", b"b"]), batch([b"c"]), batch([b"d", b"e"])
    try:
        assert reader.high_watermark(proxy, main, 0) == 0  # followed from now on
        # before any answer the proxy knows no leader epoch: nothing cached
        reader.routed(proxy, main, 0, 0, 3, first + second)
        assert reader.cache.max_end(key) == -1
        reader.apply(_answer(topic_id, 0, 0, []), image)
        # a route answered: both batches of the request cached as the main appended them,
        # served at once (read_committed too: no transaction can start inside them)
        reader.routed(proxy, main, 0, 0, 3, first + second)
        assert reader.high_watermark(proxy, main, 0) == 3
        assert reader.last_stable_offset(proxy, main, 3, 0) == 3
        assert reader.read(proxy, 0, 3, 1 << 20) == patch_batch(first, 0, 0) + patch_batch(
            second, 2, 0
        )
        assert proxy.woken >= 1
        assert reader._asked(main, image)[0][1] == 3  # its polls ask from there
        assert reader._asked(main, image)[0][3] == 3  # and tell the LSO it moved
        # answers that do not match the batches (some deduplicated) or another epoch: nothing
        reader.routed(proxy, main, 0, 3, 9, third)
        reader.routed(proxy, main, 1, 3, 5, third)
        assert reader.cache.max_end(key) == 3
        # a later route answered before the main's answer naming another proxy's batch
        # below it (3..5): not served past the hole, and the polls still ask from 3
        reader.routed(proxy, main, 0, 5, 7, third)
        assert reader.high_watermark(proxy, main, 0) == 3
        assert reader._asked(main, image)[0][1] == 3
        # the answer names both: the missing one is read, the routed one is not read again
        # (its channel record is not there: reading it would leave a gap)
        channel[40] = first
        reader.apply(_answer(topic_id, 7, 7, [(3, 2, 40, len(first)), (5, 2, 41, 9)]), image)
        assert reader.high_watermark(proxy, main, 0) == 7
        assert reader.cache.read(key, 3, 7, 1 << 20) == patch_batch(first, 3, 0) + patch_batch(
            third, 5, 0
        )
        # a transaction's batch routed: cached, but the last stable offset stays before it
        reader.cache.reset(key)
        reader.apply(_answer(topic_id, 7, 7, []), image)
        reader.routed(proxy, main, 0, 7, 8, _txn_batch([b"t"]))
        assert reader.high_watermark(proxy, main, 7) == 8
        assert reader.last_stable_offset(proxy, main, 8, 0) == 7
    finally:
        reader.close()


def test_the_last_stable_offset_a_proxy_tells_keeps_its_own_appends_quiet():
    """The proxy moves its LSO past the batches it cached and tells it with its poll
    (version 5): once the main uploaded and forgot the links below it, its own appends
    past it are still no news (else every upload would answer every partition)."""
    topic = uuid.uuid4()
    log = _Log(0, hw=0)
    index = LinkIndex()
    server = SnapshotServer(SimpleNamespace(get=lambda t, p: log), index)  # type: ignore[arg-type]
    session = _PollSession()
    key = (str(topic), 0)
    assert len(_ask(server, session, [(key, 0, -1)])) == 1  # answered: LSO 0
    for _ in range(3):
        log.append(index, 5, node=2)
    index.prune(0, 10)  # uploaded up to 10: those links are gone
    log.append(index, 5, node=2)
    # told only its offset, the main cannot tell the LSO moved by the proxy's own batches
    assert [s.last_stable_offset for s in _ask(server, session, [(key, 15, -1)])] == [20]
    log.append(index, 5, node=2)
    index.prune(0, 20)
    log.append(index, 5, node=2)
    # told the LSO too (it moved it past what it cached): nothing to answer
    assert _ask(server, session, [(key, 25, -1, 25)]) == []
    # an LSO left behind (a batch it could not cache, uploaded since) is answered
    log.append(index, 5, node=2)
    index.prune(0, 30)
    log.append(index, 5, node=2)
    assert [s.last_stable_offset for s in _ask(server, session, [(key, 35, -1, 25)])] == [40]
