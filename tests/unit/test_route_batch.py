"""Zone routes batched per main (dataplane/zonerouter/route_batch.py, issue #32): routes of
several partitions and produce requests to one main go in one ZoneRouteRequest v2 (packed,
route_codec.py); a route whose channel append is done is waited for (bounded); routes that
come every few ms are held for the next produce request's (adaptive linger, bounded), sparse
ones are not; one route epoch per request; a request refused as a whole fails each of its
routes; closing fails what is queued."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import decode_request, encode_request
from dataplane.zonerouter.protocol import ZONE_ROUTE_VERSION, ZoneRouteResponse
from dataplane.zonerouter.route_batch import RouteBatcher
from dataplane.zonerouter.route_codec import (
    RouteSessions,
    pack_answers,
    pack_answers_v5,
    pack_entries,
    pack_refusal_v5,
    unpack_answers,
    unpack_entries,
    unpack_request,
)


class _Main:
    """A fake connection to a main: answers each entry with its channel offset as base
    offset, after `delay_s`; records every request."""

    def __init__(self, delay_s: float = 0.0, refuse: int = 0):
        self.delay_s = delay_s
        self.refuse = refuse
        self.requests: list = []
        self.closed = False
        self.sessions = RouteSessions()  # a v4 main's route sessions
        self.packed: list[bytes] = []  # each request's packed entries

    def call(self, req, timeout_s, api_key, version):
        assert version == ZONE_ROUTE_VERSION == 5
        self.packed.append(bytes(req.packed_entries))
        session, source, entries = self.sessions.unpack_session(self.packed[-1])
        req.route_epoch, req.source_node_id = session.epoch, source
        req.timeout_ms, req.entries = session.timeout_ms, entries
        self.requests.append(req)
        time.sleep(self.delay_s)
        R = ZoneRouteResponse[5]
        if self.refuse:
            return R(packed_answers=pack_refusal_v5(self.refuse, "fenced"))
        answers = [(0, None, offset, partition, offset + 1) for _, partition, offset in req.entries]
        return R(packed_answers=pack_answers_v5(answers, entries, session))

    def close(self) -> None:
        self.closed = True


def _batcher(main: _Main, linger_s: float = 0.002) -> RouteBatcher:
    return RouteBatcher(main, 7, "router-channel/node-7", 1, linger_s=linger_s)  # type: ignore[arg-type]


def test_routes_queued_while_one_is_in_flight_go_in_one_request():
    main = _Main(delay_s=0.2)
    batcher = _batcher(main)
    topic = str(uuid.uuid4())
    try:
        first = batcher.route(batcher.ticket(), 5, topic, 0, 100, 1000)
        time.sleep(0.05)  # the first request is in flight
        rest = [batcher.route(batcher.ticket(), 5, topic, p, 200 + p, 1000) for p in range(20)]
        assert first.result(5) == (0, None, 100, 0, 101)
        assert [f.result(5) for f in rest] == [(0, None, 200 + p, p, 201 + p) for p in range(20)]
        assert len(main.requests) == 2
        (sent,) = main.requests[1:]
        assert sent.route_epoch == 5 and sent.source_node_id == 7
        assert [(str(t), p) for t, p, _ in sent.entries] == [(topic, p) for p in range(20)]
        # the batched request encodes as one frame with every route in it, compactly
        frame = encode_request(sent, 1, client_id="~b", version=5)
        body = decode_request(frame[4:]).body
        assert bytes(body.packed_entries) == main.packed[1]
        # v1: ~80 bytes + 28 a route; v2: the epoch, source and timeout fixed-width (16)
        assert len(frame) < 30 + 16 + 20 * 4
    finally:
        batcher.close()
    assert main.closed


def test_a_route_whose_channel_append_is_done_is_waited_for_within_the_linger():
    main = _Main()
    batcher = _batcher(main, linger_s=1.0)
    topic = str(uuid.uuid4())
    try:
        late = batcher.ticket()
        batcher.channel_done(late)  # its worker has not handed the route over yet
        first = batcher.route(batcher.ticket(), 5, topic, 0, 1, 1000)
        time.sleep(0.1)
        assert not main.requests  # waiting for the expected one
        second = batcher.route(late, 5, topic, 1, 2, 1000)
        assert first.result(5)[2] == 1 and second.result(5)[2] == 2
        assert len(main.requests) == 1 and len(main.requests[0].entries) == 2
        # an abandoned ticket (its channel append failed) is not waited for
        gone = batcher.ticket()
        batcher.channel_done(gone)
        batcher.abandon(gone)
        started = time.monotonic()
        assert batcher.route(batcher.ticket(), 5, topic, 0, 3, 1000).result(5)[2] == 3
        assert time.monotonic() - started < 0.9
    finally:
        batcher.close()


def test_one_route_epoch_per_request_and_a_refused_request_fails_each_route():
    main = _Main(delay_s=0.2)
    batcher = _batcher(main)
    topic = str(uuid.uuid4())
    try:
        batcher.route(batcher.ticket(), 5, topic, 0, 1, 1000)
        time.sleep(0.05)
        old = batcher.route(batcher.ticket(), 5, topic, 1, 2, 1000)
        new = batcher.route(batcher.ticket(), 6, topic, 2, 3, 1000)
        assert old.result(5)[2] == 2 and new.result(5)[2] == 3
        assert [r.route_epoch for r in main.requests] == [5, 5, 6]
    finally:
        batcher.close()
    refused = _batcher(_Main(refuse=KafkaError.STALE_BROKER_EPOCH))
    try:
        futures = [refused.route(refused.ticket(), 5, topic, p, p, 1000) for p in range(3)]
        assert {f.result(5)[0] for f in futures} == {KafkaError.STALE_BROKER_EPOCH}
    finally:
        refused.close()


def test_a_closed_batcher_refuses_and_fails_what_is_queued():
    block = threading.Event()

    class _Stuck(_Main):
        def call(self, req, timeout_s, api_key, version):
            block.wait(5)
            raise ConnectionError("connection closed by the broker")

    batcher = _batcher(_Stuck())
    topic = str(uuid.uuid4())
    in_flight = batcher.route(batcher.ticket(), 5, topic, 0, 1, 1000)
    time.sleep(0.05)
    queued = batcher.route(batcher.ticket(), 5, topic, 1, 2, 1000)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    block.set()
    closer.join(5)
    with pytest.raises(ConnectionError):
        in_flight.result(5)
    with pytest.raises(ConnectionError):
        queued.result(5)
    with pytest.raises(ConnectionError):
        batcher.route(batcher.ticket(), 5, topic, 2, 3, 1000).result(5)


def test_routes_of_produce_requests_every_few_ms_share_a_request_and_sparse_ones_do_not():
    now = [100.0]  # the batcher's clock, moved by the test only
    main = _Main()
    batcher = RouteBatcher(main, 7, "router-channel/node-7", 1, clock=lambda: now[0])  # type: ignore[arg-type]
    topic = str(uuid.uuid4())
    try:
        # sparse (a produce request every 50 ms): each route goes at once, nothing learnt
        for n in range(5):
            now[0] += 0.05
            assert batcher.route(batcher.ticket(), 5, topic, 0, n, 1000).result(5)[2] == n
        assert len(main.requests) == 5 and batcher.adaptive_linger_s() == 0.0
        # a produce request every 2 ms: the mean gap is learnt (bounded by 5 ms); the
        # batches held meanwhile go once the clock has passed their linger
        learning = []
        for n in range(40):
            now[0] += 0.002
            learning.append(batcher.route(batcher.ticket(), 5, topic, 1, 10 + n, 1000))
        now[0] += 0.01
        assert [f.result(5)[2] for f in learning] == [10 + n for n in range(40)]
        assert 0.002 <= batcher.adaptive_linger_s() <= 0.0025
        sent = len(main.requests)
        # now a batch waits for the next produce request's routes: while the clock stands
        # still nothing is sent; the next request's route joins the same request
        now[0] += 0.002
        first = batcher.route(batcher.ticket(), 5, topic, 2, 100, 1000)
        time.sleep(0.1)
        assert len(main.requests) == sent and not first.done()
        second = batcher.route(batcher.ticket(), 5, topic, 3, 101, 1000)
        now[0] += 0.01  # the linger has passed
        assert first.result(5)[2] == 100 and second.result(5)[2] == 101
        assert len(main.requests) == sent + 1
        assert [e[1] for e in main.requests[-1].entries] == [2, 3]
    finally:
        batcher.close()


def test_packed_routes_and_answers_round_trip_and_bad_input_is_refused():
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    entries = [(t1, 0, 5), (t2, 3, 2**40), (t1, 1, 7), (t1, 2, 0)]
    packed = pack_entries(entries)
    assert unpack_entries(packed) == entries
    assert len(packed) < 1 + 32 + 4 * 8
    answers = [
        (0, None, 10, 1, 11),
        (6, "not the partition's main", -1, -1, -1),
        (87, None, 0, 0, 0),
    ]
    assert unpack_answers(pack_answers(answers)) == answers
    for bad in (
        packed[:-1] + b"\x80",
        b"\x05" + bytes(16),
        packed[:1] + packed[1:17] + b"\x09\x00\x00",
    ):
        with pytest.raises(ValueError):
            unpack_entries(bad)
    with pytest.raises(ValueError):
        unpack_answers(b"\x02\x7f")  # an error whose message runs past the end


def test_version_3_packs_the_requests_own_fields_and_falls_back_for_an_old_main():
    """ZoneRouteRequest v3 (issue #32): route epoch, source node and timeout as varints at
    the head of the packed entries; bad input is refused; a main not upgraded yet (it
    closes the connection on v3) is sent v2 by the batcher."""
    from dataplane.zonerouter.route_codec import pack_request

    t1 = uuid.uuid4()
    entries = [(t1, 0, 5), (t1, 1, 9)]
    packed = pack_request(12, 7, 30_000, entries)
    assert unpack_request(packed) == (12, 7, 30_000, entries)
    assert len(packed) <= len(pack_entries(entries)) + 6  # v2: 16 bytes of fixed fields
    with pytest.raises(ValueError):
        unpack_request(pack_request(12, 7, -1, entries))  # a negative timeout
    with pytest.raises(ValueError):
        unpack_request(packed[:2])  # truncated

    class _OldMain(_Main):
        def call(self, req, timeout_s, api_key, version):
            if version >= 3:
                raise ConnectionError("connection closed by the broker")
            self.requests.append((version, req))
            R = ZoneRouteResponse[version]
            answers = [(0, None, o, p, o + 1) for _, p, o in unpack_entries(req.packed_entries)]
            return R(error_code=0, error_message=None, packed_answers=pack_answers(answers))

    old = _OldMain()
    batcher = _batcher(old)
    try:
        with pytest.raises(ConnectionError):  # the client retries this one
            batcher.route(batcher.ticket(), 5, str(t1), 0, 1, 1000).result(5)
        assert batcher.route(batcher.ticket(), 5, str(t1), 0, 2, 1000).result(5)[2] == 2
        ((version, req),) = old.requests
        assert version == 2 and (req.route_epoch, req.source_node_id) == (5, 7)
    finally:
        batcher.close()
