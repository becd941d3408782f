"""GetPartitionSnapshot version 6 (issue #32): a byte of flags leaves out a poll's,
partition's and link's usual values; a link's channel offset is a delta from the last one
the session named for its source node (a table both sides keep, like the topic table);
the answer's error code is packed. Round trips, sizes, bad input refused, and pollers of
older versions still answered."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace
from types import SimpleNamespace

import pytest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.formats.link_record import LinkRecord
from dataplane.kafka.codec import decode_request, decode_response, encode_request, encode_response
from dataplane.kafka.interbroker import CLIENT_ID
from dataplane.zonerouter.protocol import SNAPSHOT_KEY, SNAPSHOT_VERSION
from dataplane.zonerouter.snapshot import (
    LinkIndex,
    LinkLocation,
    LinkPlace,
    LinkTable,
    SnapshotSessions,
    pack_links,
)
from dataplane.zonerouter.snapshot_codec import (
    AbortedTxn,
    ControlBatch,
    PartitionSnapshot,
    PollForgotten,
    PollPartition,
    PollRequest,
    SessionTables,
    answer_view,
    pack_error_v6,
    pack_links_v6,
    pack_poll,
    pack_poll_v6,
    pack_snapshots,
    pack_snapshots_v6,
    unpack_links_v6,
    unpack_poll_v6,
    unpack_snapshots_v6,
)
from dataplane.zonerouter.snapshot_read import _links, _PollSession
from dataplane.zonerouter.snapshot_server import SnapshotServer


def _steady(first: int, n: int, source: int = 2) -> list[LinkPlace]:
    """`n` one-record batches of 170 bytes back to back from offset `first`, each in the
    next channel record of `source` (~1 KB apart), at varying positions."""
    return [
        LinkPlace(first + i, 1, source, 5_000_000 + 1_100 * (first + i), 40 * (i % 3), 170, 0)
        for i in range(n)
    ]


def test_links_round_trip_against_the_session_link_table():
    links = _steady(1000, 8)
    links += [
        LinkPlace(1010, 3, 5, 12, 0, 80, 0),  # a gap below it, another source, count, length
        LinkPlace(1013, 3, 2, 4_000_000, 700, 80, 0),  # channel offset going back
    ]
    main = LinkTable()
    packed = pack_links_v6(links, 1020, main)  # a marker (no link) at the end
    proxy = LinkTable()
    assert unpack_links_v6(packed, 1020, proxy) == links
    assert proxy == main  # the newest link of each source, the last packed (the oldest)
    assert main.channels == {2: 4_000_000, 5: 12}
    assert (main.count, main.source, main.length) == (1, 2, 170)
    # the next answer's links are deltas from the table: the first costs what later ones do
    steady = _steady(1020, 4)
    assert unpack_links_v6(pack_links_v6(steady, 1024, main), 1024, proxy) == steady
    more = _steady(1024, 4)
    packed_more = pack_links_v6(more, 1028, main)
    assert unpack_links_v6(packed_more, 1028, proxy) == more
    assert len(packed_more) <= 4 * 4, len(packed_more)  # ~9 bytes a link in version 5
    assert unpack_links_v6(b"", 7, LinkTable()) == []


@pytest.mark.parametrize(
    "bad",
    [
        b"\x0f",  # truncated after the flags
        b"\x10\x00\x00",  # unknown flags
        b"\x06\x01\x02\x00",  # truncated: no position
        b"\x0e\x00\x02\x00\x00\x05",  # a count of 0
        b"\x0e\x01\x02\x01\x00\x00",  # a length of 0
        b"\x0e\x01\x02\x01\x00\x05",  # below offset 0 (the high watermark is 0)
        b"\x0e\x01\x02\x03\x00\x05",  # a negative channel offset
    ],
)
def test_bad_links_are_refused(bad):
    with pytest.raises(ValueError):
        unpack_links_v6(bad, 0 if bad == b"\x0e\x01\x02\x01\x00\x05" else 10, LinkTable())


def test_answers_round_trip_and_a_steady_partition_is_small():
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
            links=_steady(999_998, 2),
        ),
        PartitionSnapshot(t2, 4, KafkaError.NOT_LEADER_OR_FOLLOWER, links=[]),
        PartitionSnapshot(t1, 1, 0, 0, 0, 0, links=[]),
    ]
    main = SessionTables()
    packed = pack_snapshots_v6(snaps, main)
    topics: list[uuid.UUID] = []
    links = LinkTable()
    assert unpack_snapshots_v6(packed, topics, links) == (0, snaps)
    assert topics == [t1, t2] and links == main.links
    # the same partitions again: no topic ids; a partition with two new links is ~14 bytes
    # (version 5: ~11 before its links, ~9 a link)
    steady = [PartitionSnapshot(t1, 0, 0, 3, 1_000_002, 1_000_002, links=_steady(1_000_000, 2))]
    again = pack_snapshots_v6(steady, main)
    assert unpack_snapshots_v6(again, topics, links) == (0, steady)
    assert len(again) <= 2 + 8 + 2 * 4, len(again)
    v5_links = pack_links(steady[0].links, start_offset=1_000_002, timestamps=False)
    v5 = pack_snapshots([replace(steady[0], packed_links=v5_links)], {t1: 0, t2: 1})
    assert len(again) <= len(v5) - 8, (len(again), len(v5))


def test_bad_answers_are_refused():
    topic = uuid.uuid4()
    main = SessionTables()
    snaps = [PartitionSnapshot(topic, 0, 0, 3, 10, 10, links=_steady(8, 2))]
    packed = pack_snapshots_v6(snaps, main)
    for bad in (
        packed[:-1],  # truncated
        packed[:2] + b"\x02" + bytes(16),  # a topic count past the end
        b"\x00\x02",  # the main's table has 1 topic, this proxy none
        b"\x00\x00\x05\x00\x00",  # a topic index past the table
        packed[:19] + b"\x00\x00\x40",  # unknown partition flags
        packed[:19] + b"\x00\x00\x03",  # an error with other flags
    ):
        with pytest.raises(ValueError):
            unpack_snapshots_v6(bad, [], LinkTable())
    # a refused answer: its error code alone
    refused = unpack_snapshots_v6(pack_error_v6(70), [], LinkTable())
    assert refused == (KafkaError.FETCH_SESSION_ID_NOT_FOUND, [])


def test_polls_round_trip_a_steady_one_in_five_bytes_and_bad_ones_are_refused():
    topic = uuid.uuid4()
    steady = PollRequest(2, 500, 61, 300, True)
    packed = pack_poll_v6(steady)
    assert len(packed) == 5 and len(pack_poll(steady, 5)) >= 10
    back = unpack_poll_v6(packed)
    assert back.session_epoch == 300 & 0x7F  # the main's session knows the rest
    assert (back.node_id, back.max_wait_ms, back.session_id, back.incremental) == (
        2,
        500,
        61,
        True,
    )
    full = PollRequest(
        3,
        7,  # rounded up to 10 ms units
        1,
        0,
        False,
        [PollPartition(topic, 4, 1_000, -1, 990), PollPartition(topic, 5, 0, 12, 0)],
        [PollForgotten(topic, 9)],
    )
    back = unpack_poll_v6(pack_poll_v6(full))
    assert back.max_wait_ms == 10 and back.partitions == full.partitions
    assert back.forgotten == full.forgotten and not back.incremental
    good = pack_poll_v6(full)
    for bad in (good[:-1], good + b"\x00", b"\x02\x01\x30\x00\x00", b"\x02\x01\x01\x00\x80\x01"):
        with pytest.raises(ValueError):
            unpack_poll_v6(bad)


def test_the_main_completes_the_session_epoch_from_its_low_bits():
    sessions = SnapshotSessions()
    part = [(("t", 0), 5, -1, -1)]
    assert isinstance(sessions.update(2, 9, 0, False, part, []), dict)
    for epoch in range(1, 300):  # past the 7 bits: the session knows the high ones
        full = sessions.full_epoch(2, 9, epoch & 0x7F, 7)
        assert full == epoch
        assert isinstance(sessions.update(2, 9, full, True, [], []), dict)
    # out of step (a poll lost in between): refused, the proxy sends its full list
    wrong = sessions.full_epoch(2, 9, 301 & 0x7F, 7)
    assert sessions.update(2, 9, wrong, True, [], []) == SnapshotSessions.BAD_EPOCH
    assert sessions.full_epoch(2, 10, 1, 7) == 1  # no such session: refused by `update`


class _Log:
    def __init__(self, stream_id: int, hw: int):
        self.stream_id = stream_id
        self.high_watermark = self.last_stable_offset = hw
        self.leader_epoch, self.log_start_offset = 3, 0

    def aborted_since(self, marker_offset: int) -> list:
        return []

    def add_listener(self, cb) -> None:
        pass

    def remove_listener(self, cb) -> None:
        pass


def _roundtrip(server, session: _PollSession, asked, version: int = SNAPSHOT_VERSION):
    """A poll of `session` at `version` over the wire and its answer as the proxy applies
    it (with the session's tables), and the bytes both ways."""
    frame = encode_request(session.request(2, 0, asked, version), 1, CLIENT_ID, version)
    decoded = decode_request(frame[4:])
    ctx = SimpleNamespace(api_version=version)
    resp = asyncio.run(server.get_partition_snapshot(decoded.body, ctx))
    out = encode_response(decoded, resp)
    out = out if isinstance(out, bytes) else b"".join(bytes(x) for x in out)
    _, back = decode_response(out[4:], SNAPSHOT_KEY, version)
    view = answer_view(back, session.topics, session.links)
    if view.error_code:
        session.failed()
    else:
        session.sent(asked)
        for snap in view.partitions:
            if not snap.error_code:
                session.answered((str(snap.topic_id), snap.partition), snap.high_watermark, [])
    return view, len(frame) + len(out)


def _link(index: LinkIndex, base: int, channel: int) -> None:
    index.record(0, LinkLocation(base, 1, 3, LinkRecord(7, channel, 0, 170, 1_000)))


def _trips(version: int, answers: int) -> tuple[float, _PollSession, SnapshotServer, list]:
    """`answers` polls of a new session at `version`, each answered with two new
    one-record batches ~1 KB apart in the channel: the mean bytes of a round trip (and
    the session, the main and the last list asked)."""
    topic = uuid.uuid4()
    log, index = _Log(0, hw=0), LinkIndex()
    server = SnapshotServer(SimpleNamespace(get=lambda t, p: log), index)  # type: ignore[arg-type]
    session = _PollSession()
    asked = [((str(topic), 0), 0, -1)]
    _roundtrip(server, session, asked, version)
    offset, channel, sizes = 0, 1_000_000, []
    for _ in range(answers):
        for _ in range(2):
            _link(index, offset, channel)
            offset, channel = offset + 1, channel + 1_100
        log.high_watermark = log.last_stable_offset = offset
        asked = [((str(topic), 0), offset - 2, -1)]
        view, size = _roundtrip(server, session, asked, version)
        links = _links(version, view.partitions[0])
        assert [(x.base_offset, x.channel_offset) for x in links] == [
            (offset - 2, channel - 2_200),
            (offset - 1, channel - 1_100),
        ]
        sizes.append(size)
    return sum(sizes) / len(sizes), session, server, asked


def test_a_session_keeps_both_tables_in_step_and_starts_over_together():
    v5, _, _, _ = _trips(5, 20)
    v6, session, server, asked = _trips(6, 20)
    # version 6 saves ~20 bytes of a ~75-byte round trip with two links
    assert v6 <= v5 - 15, (v5, v6)
    assert session.links.channels  # the table the main packed against, mirrored
    # the main lost the session: refused, and both sides start their tables over
    server.sessions = SnapshotSessions()
    view, _ = _roundtrip(server, session, asked)
    assert view.error_code == KafkaError.FETCH_SESSION_ID_NOT_FOUND
    assert session.full
    session.request(2, 0, asked)
    assert session.topics == [] and session.links == LinkTable()


def test_a_version_6_main_still_answers_older_pollers():
    """Proxies not upgraded yet poll at version 5 (or fall back to 3, as a new proxy does
    for a main not upgraded): answered in their format."""
    topic = uuid.uuid4()
    log, index = _Log(0, hw=2), LinkIndex()
    _link(index, 0, 100)
    _link(index, 1, 1_200)
    server = SnapshotServer(SimpleNamespace(get=lambda t, p: log), index)  # type: ignore[arg-type]
    for version in (3, 4, 5, 6):
        session = _PollSession()
        view, _ = _roundtrip(server, session, [((str(topic), 0), 0, -1)], version)
        assert view.version == version and view.error_code == 0
        (snap,) = view.partitions
        assert [(x.base_offset, x.channel_offset) for x in _links(version, snap)] == [
            (0, 100),
            (1, 1_200),
        ]
