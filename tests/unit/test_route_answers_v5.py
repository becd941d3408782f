"""ZoneRouteRequest v5 (issue #32, dataplane/zonerouter/route_codec.py): the answers are
packed against the route session too — a partition's base offset as a delta from the end
of its last answer, its stream only when it changed, a small end offset in the flags
byte — and the request's error code and message go into the packed bytes. Round trips,
bytes on the wire against v4, bad input refused, a refused or lost answer starting the
session over on both sides, and mains not upgraded yet."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.kafka.codec import decode_request, encode_request, encode_response
from dataplane.kafka.interbroker import CLIENT_ID
from dataplane.zonerouter.protocol import ZoneRouteRequest, ZoneRouteResponse
from dataplane.zonerouter.route_batch import RouteBatcher
from dataplane.zonerouter.route_codec import (
    ProxyRouteSession,
    RouteSessions,
    RouteSessionState,
    pack_answers,
    pack_answers_v5,
    pack_refusal_v5,
    unpack_answers_v5,
)
from dataplane.zonerouter.route_handler import ZoneRouteHandler
from dataplane.zonerouter.traffic import ZoneTraffic

T1, T2 = uuid.uuid4(), uuid.uuid4()


def test_answers_round_trip_and_a_steady_partition_costs_one_byte():
    main, proxy = RouteSessionState(), RouteSessionState()
    entries = [(T1, 0, 10), (T1, 1, 20), (T2, 0, 30)]
    first = [(0, None, 500_000, 7, 500_003), (0, None, 9_000, 8, 9_001), (0, None, 0, 9, 40)]
    packed = pack_answers_v5(first, entries, main)
    assert unpack_answers_v5(packed, entries, proxy) == (0, None, first)
    assert (
        main.partitions
        == proxy.partitions
        == {
            (T1, 0): (500_003, 7),
            (T1, 1): (9_001, 8),
            (T2, 0): (40, 9),
        }
    )
    # the same partitions again, back to back: one byte each (v4: ~5), after the error code
    entries = [(T1, 0, 50), (T1, 0, 60), (T1, 1, 70)]
    steady = [
        (0, None, 500_003, 7, 500_005),
        (0, None, 500_005, 7, 500_006),  # one partition twice in one request
        (0, None, 9_001, 8, 9_002),
    ]
    packed = pack_answers_v5(steady, entries, main)
    assert unpack_answers_v5(packed, entries, proxy) == (0, None, steady)
    assert len(packed) == 1 + 3
    assert len(pack_answers(steady, True)) >= 3 * 5
    # another producer appended in between, a new stream (a new main), a large batch, a
    # deduplicated retry (no links written: end -1), an error: what differs is sent
    entries = [(T1, 0, 80), (T1, 1, 90), (T2, 0, 100), (T1, 0, 110), (T2, 0, 120)]
    odd = [
        (0, None, 500_010, 7, 500_011),
        (0, None, 9_002, 12, 9_100),
        (0, None, 30, 9, -1),
        (KafkaError.NOT_LEADER_OR_FOLLOWER, "not the partition's main", -1, 7, 500_011),
        (0, None, 40, 9, 41),  # still expected from the last end written (40)
    ]
    packed = pack_answers_v5(odd, entries, main)
    assert unpack_answers_v5(packed, entries, proxy) == (0, None, odd)
    assert main.partitions == proxy.partitions


def test_a_refusal_packs_the_requests_error_and_message():
    for message in ("route epoch 3 is fenced", None, "x" * 5000):
        code, got, answers = unpack_answers_v5(
            pack_refusal_v5(KafkaError.STALE_BROKER_EPOCH, message),
            [(T1, 0, 1)],
            RouteSessionState(),
        )
        assert (code, answers) == (KafkaError.STALE_BROKER_EPOCH, [])
        assert got == (None if message is None else message[:4096])


@pytest.mark.parametrize(
    "bad",
    [
        b"",  # no error code
        b"\x00",  # no answer for the entry
        b"\x00\x02",  # a base offset delta missing
        b"\x00\x03\x00",  # an error flag with others missing
        b"\x00\x19",  # an end in the flags byte and a sent one
        b"\x00\x10\x00",  # trailing bytes
        b"\x00\x0f\x0c\x7f",  # an error whose message runs past the end
        b"\x0c\x7f",  # a refusal whose message runs past the end
    ],
)
def test_bad_answers_are_refused(bad):
    with pytest.raises(ValueError):
        unpack_answers_v5(bad, [(T1, 0, 1)], RouteSessionState())


class _Main:
    """A fake main serving up to `newest`: appends each route it takes, answers with the
    count of appends so far as base offset; `lose_next` drops the connection after
    taking a request."""

    def __init__(self, newest: int = 5):
        self.newest = newest
        self.sessions = RouteSessions()
        self.appended: list[int] = []
        self.versions: list[int] = []
        self.lose_next = False
        self.sizes: list[int] = []

    def call(self, req, timeout_s, api_key, version):
        if version > self.newest:  # not upgraded yet: it closes the connection
            raise ConnectionError("connection closed by the broker")
        self.versions.append(version)
        frame = encode_request(req, 1, client_id=CLIENT_ID, version=version)
        decoded = decode_request(frame[4:])
        session, _, entries = self.sessions.unpack_session(bytes(decoded.body.packed_entries))
        answers = []
        for _, partition, offset in entries:
            self.appended.append(offset)
            n = len(self.appended)
            answers.append((0, None, n - 1, partition, n))
        if self.lose_next:
            self.lose_next = False
            raise ConnectionError("connection reset after the main took the request")
        R = ZoneRouteResponse[version]
        if version >= 5:
            resp = R(packed_answers=pack_answers_v5(answers, entries, session))
        else:
            resp = R(error_code=0, error_message=None, packed_answers=pack_answers(answers, True))
        out = encode_response(decoded, resp)
        self.sizes.append(len(frame) + len(out))
        return resp

    def close(self) -> None:
        pass


def _route(batcher: RouteBatcher, topic: str, offset: int):
    return batcher.route(batcher.ticket(), 5, topic, 0, offset, 1000).result(5)


def _session_trips(newest: int) -> int:
    """Routes to a main of `newest` through a proxy of the same release, one answer lost on
    the way; every answer right; the median bytes of a steady round trip."""
    main = _Main(newest)
    batcher = RouteBatcher(main, 7, "router-channel/node-7", 1, linger_s=0.0)  # type: ignore[arg-type]
    batcher.versions.newest = newest
    topic = str(uuid.uuid4())
    try:
        for n in range(10):
            assert _route(batcher, topic, 1000 * n) == (0, None, n, 0, n + 1)
        main.lose_next = True
        with pytest.raises(ConnectionError):
            _route(batcher, topic, 10_000)
        # a new session: the base offset is sent again, and is right
        assert _route(batcher, topic, 11_000) == (0, None, 11, 0, 12)
        assert _route(batcher, topic, 12_000) == (0, None, 12, 0, 13)
        assert set(main.versions) == {newest}
    finally:
        batcher.close()
    return sorted(main.sizes[2:9])[3]


def test_a_route_round_trip_is_smaller_and_a_lost_answer_starts_over():
    # the request's error fields (3 bytes) and ~3 bytes of answer fewer than version 4
    v4, v5 = _session_trips(4), _session_trips(5)
    assert v5 <= v4 - 5, (v4, v5)


def test_a_proxy_falls_back_to_version_2_for_a_main_not_upgraded():
    main = _Main(newest=4)
    main.sessions = None  # v2 needs no session

    def call(req, timeout_s, api_key, version):
        if version > 4:
            raise ConnectionError("connection closed by the broker")
        main.versions.append(version)
        from dataplane.zonerouter.route_codec import unpack_entries

        entries = unpack_entries(bytes(req.packed_entries))
        answers = [(0, None, offset, partition, offset + 1) for _, partition, offset in entries]
        R = ZoneRouteResponse[version]
        return R(error_code=0, error_message=None, packed_answers=pack_answers(answers))

    main.call = call  # type: ignore[method-assign]
    batcher = RouteBatcher(main, 7, "router-channel/node-7", 1, linger_s=0.0)  # type: ignore[arg-type]
    topic = str(uuid.uuid4())
    try:
        with pytest.raises(ConnectionError):  # the client retries this one
            _route(batcher, topic, 1)
        assert _route(batcher, topic, 2) == (0, None, 2, 0, 3)
        assert main.versions == [2]
    finally:
        batcher.close()


def test_the_handler_refuses_at_version_5_in_the_packed_bytes():
    image = SimpleNamespace(route_epoch=SimpleNamespace(current_epoch=6, fenced_epoch=5))
    # no partitions, channels or io: a refused request must not reach them
    handler = ZoneRouteHandler(lambda: image, None, None, ZoneTraffic("az1"), None)  # type: ignore[arg-type]
    proxy = ProxyRouteSession()
    proxy.pack(6, 7, 1000, [(T1, 0, 5)])
    proxy.confirm()  # as if an earlier main had taken it
    entries = [(T1, 0, 9)]
    packed = proxy.pack(6, 7, 1000, entries)
    ctx = SimpleNamespace(api_version=5)
    resp = asyncio.run(handler.zone_route(ZoneRouteRequest[5](packed_entries=packed), ctx))
    code, message, answers = unpack_answers_v5(
        bytes(resp.packed_answers), entries, RouteSessionState()
    )
    assert code == KafkaError.FETCH_SESSION_ID_NOT_FOUND and answers == []
    assert "this main none" in (message or "") and handler._pending == {}
    # a fenced route epoch (a fresh session: taken, then refused as a whole)
    fresh = ProxyRouteSession().pack(5, 7, 1000, entries)
    resp = asyncio.run(handler.zone_route(ZoneRouteRequest[5](packed_entries=fresh), ctx))
    code, message, _ = unpack_answers_v5(bytes(resp.packed_answers), entries, RouteSessionState())
    assert code == KafkaError.STALE_BROKER_EPOCH and "fenced" in (message or "")
    bad = asyncio.run(handler.zone_route(ZoneRouteRequest[5](packed_entries=b"\x0e"), ctx))
    assert unpack_answers_v5(bytes(bad.packed_answers), entries, RouteSessionState())[0] == (
        KafkaError.INVALID_REQUEST
    )
