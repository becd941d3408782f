"""Incremental snapshot reads (GetPartitionSnapshot version 2, issue #32): a proxy's poll
lists only the partitions it changed, the main answers only the partitions with something
new, its links packed as varints; the session's offsets advance with each answer; a lost
session or an out-of-order poll is refused and the proxy sends its full list again."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.link_record import LinkRecord
from dataplane.kafka.codec import decode_request, decode_response, encode_request, encode_response
from dataplane.kafka.interbroker import CLIENT_ID
from dataplane.zonerouter.protocol import (
    SNAPSHOT_KEY,
    SNAPSHOT_VERSION,
    GetPartitionSnapshotRequest,
)
from dataplane.zonerouter.snapshot import (
    LinkIndex,
    LinkLocation,
    LinkPlace,
    SnapshotSessions,
    pack_links,
    unpack_links,
)
from dataplane.zonerouter.snapshot_codec import answer_view, unpack_poll, unpack_poll_v6
from dataplane.zonerouter.snapshot_read import _links, _PollSession
from dataplane.zonerouter.snapshot_server import SnapshotServer


def test_packed_links_round_trip_and_are_small():
    links = [
        LinkPlace(100 + 3 * i, 3, 2, 5_000_000 + 700 * i, 61 * (i % 4), 600, 1_700_000_000_000 + i)
        for i in range(50)
    ]
    links.append(LinkPlace(400, 1, 5, 12, 0, 80, 1_699_999_999_000))  # deltas go back
    packed = pack_links(links)
    assert unpack_links(packed) == links
    assert len(packed) / len(links) < 14  # ~40 bytes each unpacked
    assert unpack_links(b"") == []
    with pytest.raises(ValueError):
        unpack_links(packed[:-1])  # truncated
    with pytest.raises(ValueError):
        unpack_links(packed, max_links=3)
    # version 4: the first base offset from the answer's high watermark, no timestamps
    compact = pack_links(links[:1], start_offset=103, timestamps=False)
    assert unpack_links(compact, start_offset=103, timestamps=False) == [
        LinkPlace(100, 3, 2, 5_000_000, 0, 600, 0)
    ]
    assert len(compact) <= len(pack_links(links[:1])) - 7  # ~6 bytes of timestamp, ~1 offset


def test_sessions_apply_full_and_incremental_lists_and_refuse_gaps():
    sessions = SnapshotSessions(max_sessions=2, max_partitions=3)
    a, b, c, d = ("t", 0), ("t", 1), ("t", 2), ("t", 3)
    assert sessions.update(1, 9, 0, True, [], []) == SnapshotSessions.NOT_FOUND
    state = sessions.update(1, 9, 0, False, [(a, 10, -1, -1), (b, 20, 5, 30)], [])
    assert state == {a: (10, -1, -1), b: (20, 5, -1)}
    sessions.advance(1, 9, 0, {a: (15, 7, 12)})
    assert sessions.update(1, 9, 2, True, [], []) == SnapshotSessions.BAD_EPOCH
    # incremental: one added, one forgotten, the rest as the main advanced it
    state = sessions.update(1, 9, 1, True, [(c, 0, -1, -1)], [b])
    assert state == {a: (15, 7, 12), c: (0, -1, -1)}
    # an answer of an older poll changes nothing (a newer poll came meanwhile)
    sessions.advance(1, 9, 0, {a: (99, 99, 99)})
    assert sessions.update(1, 9, 2, True, [], [])[a] == (15, 7, 12)
    # bounded partitions per session: the one past the bound is left out
    state = sessions.update(1, 9, 3, True, [(b, 0, -1, -1), (d, 0, -1, -1)], [])
    assert len(state) == 3 and d not in state
    # version 5: the last stable offset the proxy tells moves the main's view of it on
    # (never back), once answered (a partition never answered is answered at once)
    assert sessions.update(1, 9, 4, True, [(a, 40, 7, 38), (b, 0, -1, 5)], [])[a] == (40, 7, 38)
    assert sessions.update(1, 9, 5, True, [(a, 41, 7, 20)], [])[a] == (41, 7, 38)
    assert sessions.update(1, 9, 6, True, [], [])[b] == (0, -1, -1)
    # bounded sessions: the least recently used goes, its next incremental poll is refused
    sessions.update(2, 1, 0, False, [], [])
    sessions.update(3, 1, 0, False, [], [])
    assert sessions.update(1, 9, 7, True, [], []) == SnapshotSessions.NOT_FOUND
    with pytest.raises(ValueError):
        SnapshotSessions(max_sessions=0)


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


def _roundtrip(server: SnapshotServer, req, session=None, version: int = SNAPSHOT_VERSION):
    """`req` encoded, decoded and answered at `version`; the answer encoded and decoded
    too (what crosses the wire, version 4 with `session`'s topic table, version 6 its
    channel table too) and its size."""
    frame = encode_request(req, 1, client_id=CLIENT_ID, version=version)
    decoded = decode_request(frame[4:])
    ctx = SimpleNamespace(api_version=version)
    resp = asyncio.run(server.get_partition_snapshot(decoded.body, ctx))
    out = encode_response(decoded, resp)
    out = out if isinstance(out, bytes) else b"".join(bytes(x) for x in out)
    _, back = decode_response(out[4:], SNAPSHOT_KEY, version)
    view = answer_view(
        back, session.topics if session else None, session.links if session else None
    )
    return view, len(frame) + len(out)


def _poll(req):
    """A poll's fields (version 4: unpacked)."""
    version = getattr(req, "version", 0)
    if version >= 6:
        return unpack_poll_v6(bytes(req.packed))
    return unpack_poll(bytes(req.packed), version) if version >= 4 else req


@pytest.mark.parametrize("version", [5, 6])
def test_a_session_poll_answers_only_news_and_idles_cheaply(version):
    topics = [uuid.uuid4() for _ in range(20)]
    logs = {str(t): _Log(i, hw=0) for i, t in enumerate(topics)}
    logs[str(topics[0])].high_watermark = logs[str(topics[0])].last_stable_offset = 10
    index = LinkIndex()
    for base in (0, 5):
        index.record(0, LinkLocation(base, 5, 3, LinkRecord(2, 1000 + base, 0, 300, 1_000)))
    partitions = SimpleNamespace(get=lambda t, p: logs.get(t) if p == 0 else None)
    server = SnapshotServer(partitions, index)  # type: ignore[arg-type]
    session = _PollSession()
    asked = [((str(t), 0), 0, -1) for t in topics]
    # the full list: every partition answered once, at once (its last stable offset: a
    # read_committed fetch at the proxy waits for it), the links packed
    started = time.monotonic()
    resp, _ = _roundtrip(server, session.request(2, 5_000, asked, version), session, version)
    assert time.monotonic() - started < 1.0
    assert resp.error_code == 0
    assert len(resp.partitions) == len(topics)
    assert all(s.last_stable_offset == s.high_watermark for s in resp.partitions)
    snap = resp.partitions[0]
    assert all(not _links(version, s) for s in resp.partitions[1:])
    assert (snap.high_watermark, snap.leader_epoch) == (10, 3)
    assert [(p.base_offset, p.record_count, p.channel_offset) for p in _links(version, snap)] == [
        (0, 5, 1000),
        (5, 5, 1005),
    ]
    session.sent(asked)
    for s in resp.partitions:
        session.answered((str(s.topic_id), 0), s.high_watermark, [])
    # nothing new: the proxy's next poll lists nothing, the main waits and answers nothing;
    # the round trip is a few dozen bytes however many partitions the session follows
    asked[0] = ((str(topics[0]), 0), 10, -1)
    req = session.request(2, 50, asked, version)
    poll = _poll(req)
    assert poll.incremental and not poll.partitions and not poll.forgotten
    started = time.monotonic()
    resp, size = _roundtrip(server, req, session, version)
    assert time.monotonic() - started >= 0.04
    assert resp.error_code == 0 and not resp.partitions
    # version 4: the poll packed (version 3: < 100); version 6: its flags leave out what
    # a steady poll does not change, the answer's error code packed
    assert size < (70 if version < 6 else 50), size
    session.sent(asked)
    # new data on another partition: answered at once, from the session's offset
    logs[str(topics[5])].high_watermark = logs[str(topics[5])].last_stable_offset = 4
    resp, _ = _roundtrip(server, session.request(2, 5_000, asked, version), session, version)
    assert [(str(s.topic_id), s.high_watermark) for s in resp.partitions] == [(str(topics[5]), 4)]
    session.sent(asked)
    session.answered((str(topics[5]), 0), 4, [])
    asked[5] = ((str(topics[5]), 0), 4, -1)
    # a partition forgotten, one led elsewhere now: answered once with an error, then dropped
    del logs[str(topics[7])]
    req = session.request(2, 50, asked[:-1], version)
    forgotten = _poll(req).forgotten
    assert [(str(f.topic_id), f.partition) for f in forgotten] == [(str(topics[-1]), 0)]
    resp, _ = _roundtrip(server, req, session, version)
    assert [(str(s.topic_id), s.error_code) for s in resp.partitions] == [
        (str(topics[7]), KafkaError.NOT_LEADER_OR_FOLLOWER)
    ]
    session.sent(asked[:-1])
    session.forget((str(topics[7]), 0))
    # the main lost the session (restart): refused, then the full list again
    server.sessions = SnapshotSessions()
    resp, _ = _roundtrip(server, session.request(2, 50, asked, version), session, version)
    assert resp.error_code == KafkaError.FETCH_SESSION_ID_NOT_FOUND
    session.failed()
    req = session.request(2, 50, asked, version)
    assert not _poll(req).incremental and len(_poll(req).partitions) == len(asked)
    resp, _ = _roundtrip(server, req, session, version)
    assert resp.error_code == 0


def test_version_1_polls_are_still_answered_per_partition():
    topic = uuid.uuid4()
    log = _Log(0, hw=5)
    index = LinkIndex()
    index.record(0, LinkLocation(0, 5, 3, LinkRecord(2, 7, 0, 300, 1_000)))
    server = SnapshotServer(SimpleNamespace(get=lambda t, p: log), index)  # type: ignore[arg-type]
    Q = GetPartitionSnapshotRequest[1]
    req = Q(
        node_id=2,
        max_wait_ms=0,
        partitions=[Q.PartitionRequest(topic_id=topic, partition=0, fetch_offset=5)],
    )
    resp = asyncio.run(server.get_partition_snapshot(req, SimpleNamespace(api_version=1)))
    assert resp.version == 1
    (snap,) = resp.partitions  # nothing new, answered all the same (version 1)
    assert (snap.high_watermark, list(snap.links)) == (5, [])


def test_a_packed_answer_round_trips_and_bad_packing_is_refused():
    from dataplane.zonerouter.snapshot_codec import (
        AbortedTxn,
        ControlBatch,
        PartitionSnapshot,
        pack_snapshots,
        unpack_snapshots,
    )

    t1, t2 = uuid.uuid4(), uuid.uuid4()
    snaps = [
        PartitionSnapshot(
            t1,
            0,
            0,
            3,
            1_000_000,
            999_990,
            [AbortedTxn(7, 5, 9)],
            [ControlBatch(9, b"m")],
            b"\x01\x02",
        ),
        PartitionSnapshot(t2, 4, KafkaError.NOT_LEADER_OR_FOLLOWER),
        PartitionSnapshot(t1, 1, 0, 0, 0, 0),
    ]
    packed = pack_snapshots(snaps)
    assert unpack_snapshots(packed) == snaps
    # each topic id once; a partition with nothing but its offsets takes a few bytes
    assert len(pack_snapshots(snaps[2:])) <= 1 + 16 + 12
    for bad in (packed[:-1], b"\x04" + bytes(16), b"\x00\x02"):
        with pytest.raises(ValueError):
            unpack_snapshots(bad)


def test_version_4_names_each_topic_once_per_session_and_version_3_still_works():
    """Issue #32: a v4 answer sends a topic id only the first time the session names it
    (the proxy mirrors the main's table; a table out of step is refused and the session
    starts over); a proxy not upgraded yet (version 3) is answered as before."""
    topic = uuid.uuid4()
    log = _Log(0, hw=3)
    server = SnapshotServer(SimpleNamespace(get=lambda t, p: log), LinkIndex())  # type: ignore[arg-type]
    session = _PollSession()
    asked = [((str(topic), 0), 0, -1)]
    resp, first_size = _roundtrip(server, session.request(2, 0, asked), session)
    assert [s.high_watermark for s in resp.partitions] == [3] and session.topics == [topic]
    session.sent(asked)
    session.answered((str(topic), 0), 3, [])
    log.high_watermark = log.last_stable_offset = 7
    resp, size = _roundtrip(server, session.request(2, 0, asked), session)
    assert [s.high_watermark for s in resp.partitions] == [7] and session.topics == [topic]
    assert size <= first_size - 16, (size, first_size)  # no topic id the second time
    session.sent(asked)
    session.answered((str(topic), 0), 7, [])
    # a proxy whose table lost step refuses the answer (the poller starts over)
    log.high_watermark = log.last_stable_offset = 9
    session.topics.append(uuid.uuid4())
    with pytest.raises(ValueError, match="topics"):
        _roundtrip(server, session.request(2, 0, asked), session)
    # version 3 (a proxy not upgraded): the same session flow, answered as before
    old = _PollSession()
    resp, _ = _roundtrip(server, old.request(2, 0, asked, 3), version=3)
    assert resp.version == 3 and [s.high_watermark for s in resp.partitions] == [9]


def test_a_caller_falls_back_to_the_older_version_for_a_peer_not_upgraded():
    from dataplane.zonerouter.protocol import VersionProbe

    now = [0.0]
    probe = VersionProbe(4, 3, retry_s=60, clock=lambda: now[0])
    assert probe.version() == 4
    probe.failed(4)  # an old peer closes the connection on version 4
    assert probe.version() == 3
    now[0] = 61.0
    assert probe.version() == 4  # tried again later (the peer may be upgraded by now)
    probe.answered(4)
    probe.failed(4)  # once the peer answered version 4, a failure is just a failure
    assert probe.version() == 4


def test_polls_of_a_pair_naming_few_record_bytes_are_paced():
    """A busy pair polls every MIN_POLL_INTERVAL_S; while its answers name few record bytes
    per second (small records) the interval grows so that a round trip costs at most
    POLL_BYTES_SHARE of them, up to MAX_POLL_INTERVAL_S."""
    from dataplane.zonerouter.snapshot_read import (
        MAX_POLL_INTERVAL_S,
        MIN_POLL_INTERVAL_S,
        POLL_BYTES_SHARE,
        PollPacer,
    )

    def steady(bytes_per_s: float, trip_bytes: int = 65, every_s: float = 0.02) -> float:
        pacer, now, interval = PollPacer(), 0.0, 0.0
        assert pacer.interval_s(0, trip_bytes, now) == MIN_POLL_INTERVAL_S  # nothing known
        for _ in range(500):
            now += every_s
            interval = pacer.interval_s(round(bytes_per_s * every_s), trip_bytes, now)
        assert abs(pacer.named_bytes_per_s - bytes_per_s) <= 0.02 * bytes_per_s + 1
        return interval

    # 1,000 records/s of 1 KiB over 3 mains: as often as before
    assert steady(340_000) == MIN_POLL_INTERVAL_S
    # of 100 B: ~33 KB/s a pair, paced to the longest interval
    assert steady(33_000) == MAX_POLL_INTERVAL_S
    # in between: a round trip costs POLL_BYTES_SHARE of what the answers name
    interval = steady(80_000)
    assert MIN_POLL_INTERVAL_S < interval < MAX_POLL_INTERVAL_S
    assert abs(65 / interval - POLL_BYTES_SHARE * 80_000) < 0.05 * POLL_BYTES_SHARE * 80_000
    # an answer without a size (a failed count) or a pair with nothing named: unpaced
    assert steady(0) == MIN_POLL_INTERVAL_S
    assert PollPacer().interval_s(10_000, 0, 1.0) == MIN_POLL_INTERVAL_S
