"""ZoneRouteRequest v4 (issue #32, dataplane/zonerouter/route_codec.py): a route session
per proxy and main names each topic id once, then by index, and sends the route epoch,
timeout and first channel offset as deltas; bad input is refused and leaves the session
as it was; a session out of step (the main restarted, an answer lost) is refused before
any append and the proxy's batcher starts a new one without losing or repeating a route;
a main not upgraded yet gets an older version."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from dataplane.formats.kafka_errors import KafkaError
from dataplane.zonerouter.protocol import ZoneRouteRequest, ZoneRouteResponse
from dataplane.zonerouter.route_batch import RouteBatcher
from dataplane.zonerouter.route_codec import (
    ProxyRouteSession,
    RouteSessionMismatch,
    RouteSessions,
    pack_answers,
    pack_answers_v5,
    pack_refusal_v5,
    pack_request,
    unpack_answers,
    unpack_entries,
    unpack_request,
)
from dataplane.zonerouter.route_handler import ZoneRouteHandler
from dataplane.zonerouter.traffic import ZoneTraffic

CHANNEL_OFFSET = 3 * 2**22 + 12_345  # an offset well into the channel (several varint bytes)


def test_a_session_sends_each_topic_once_and_deltas_and_round_trips():
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    proxy, main = ProxyRouteSession(), RouteSessions()
    first = [(t1, 0, CHANNEL_OFFSET), (t1, 2, CHANNEL_OFFSET + 90)]
    packed = proxy.pack(17, 7, 30_000, first)
    assert main.unpack(packed) == (17, 7, 30_000, first)
    proxy.confirm()
    # the same topic again: no topic id, the epoch and timeout unchanged, a small offset delta
    second = [(t1, 1, CHANNEL_OFFSET + 400)]
    packed_again = proxy.pack(17, 7, 30_000, second)
    assert main.unpack(packed_again) == (17, 7, 30_000, second)
    proxy.confirm()
    v3 = pack_request(17, 7, 30_000, second)
    assert len(packed_again) <= 9 and len(v3) - len(packed_again) >= 19  # 28 -> 9
    # a new topic is sent once, then named by its index; a new epoch and timeout
    third = [(t2, 0, CHANNEL_OFFSET + 500), (t1, 0, CHANNEL_OFFSET + 10)]
    assert main.unpack(proxy.pack(18, 7, 5_000, third)) == (18, 7, 5_000, third)
    proxy.confirm()
    fourth = [(t2, 3, CHANNEL_OFFSET + 900)]
    packed_fourth = proxy.pack(18, 7, 5_000, fourth)
    assert main.unpack(packed_fourth) == (18, 7, 5_000, fourth)
    assert t2.bytes not in packed_fourth
    # version 4 answers: the end offset from the answer's own base offset
    answers = [(0, None, 2**30, 4, 2**30 + 3), (6, "not the partition's main", -1, -1, -1)]
    assert unpack_answers(pack_answers(answers, True), True) == answers
    assert len(pack_answers(answers[:1], True)) < len(pack_answers(answers[:1]))


def test_bad_input_is_refused_clearly_and_leaves_the_session_as_it_was():
    topic = uuid.uuid4()
    proxy, main = ProxyRouteSession(), RouteSessions()
    main.unpack(proxy.pack(3, 7, 1000, [(topic, 0, 10)]))
    proxy.confirm()
    good = proxy.pack(3, 7, 1000, [(topic, 1, 20)])
    header = good[:-4]  # source, session, topics (then flags and a 3-byte entry)
    for bad, words in (
        (good[:2], "truncated|flags"),
        (header + b"\x00" + b"\x04\x00\x00", "topic index"),  # index 2 of 1
        (header + b"\x04\x02" + bytes(8), "new topic count"),  # a new topic cut short
        (header + b"\x09", "flags"),
        (b"\x0e\x00\x02", "session"),  # session id 0
        (b"\x0e\xfe\xff\x03\x00", "session"),  # too large a session id
    ):
        with pytest.raises(ValueError, match=words):
            main.unpack(bad)
    with pytest.raises(ValueError, match="timeout"):
        main.unpack(ProxyRouteSession().pack(3, 7, -1, [(topic, 0, 1)]))
    # the session is unchanged: the good request still decodes against it
    assert main.unpack(good) == (3, 7, 1000, [(topic, 1, 20)])
    # another proxy's session, or one this main never saw, is out of step
    with pytest.raises(RouteSessionMismatch, match="this main none"):
        RouteSessions().unpack(good)
    with pytest.raises(ValueError):
        RouteSessions(max_sessions=0)


def test_the_main_drops_the_least_recently_used_session():
    topic = uuid.uuid4()
    main = RouteSessions(max_sessions=2)
    proxies = [ProxyRouteSession() for _ in range(3)]
    for proxy in proxies:
        main.unpack(proxy.pack(1, 7, 1000, [(topic, 0, 5)]))
        proxy.confirm()
    with pytest.raises(RouteSessionMismatch):  # the first was dropped: it starts over
        main.unpack(proxies[0].pack(1, 7, 1000, [(topic, 0, 6)]))
    assert main.unpack(proxies[2].pack(1, 7, 1000, [(topic, 0, 6)]))[3] == [(topic, 0, 6)]


class _Main:
    """A fake v4 main: appends each route it takes (by its channel offset) and answers
    with the count of appends so far as base offset; `restart()` forgets its sessions;
    `lose_next` takes the next request and then drops the connection."""

    def __init__(self, newest: int = 5):
        self.newest = newest
        self.sessions = RouteSessions()
        self.appended: list[int] = []
        self.versions: list[int] = []
        self.refused = 0
        self.lose_next = False

    def restart(self) -> None:
        self.sessions = RouteSessions()

    def call(self, req, timeout_s, api_key, version):
        if version > self.newest:  # not upgraded yet: it closes the connection
            raise ConnectionError("connection closed by the broker")
        self.versions.append(version)
        R = ZoneRouteResponse[version]
        session = None
        if version >= 4:
            try:
                session, _, entries = self.sessions.unpack_session(bytes(req.packed_entries))
            except RouteSessionMismatch as exc:
                self.refused += 1
                error = KafkaError.FETCH_SESSION_ID_NOT_FOUND
                if version >= 5:
                    return R(packed_answers=pack_refusal_v5(error, str(exc)))
                return R(error_code=error, error_message=str(exc), packed_answers=b"")
        elif version == 3:
            _, _, _, entries = unpack_request(bytes(req.packed_entries))
        else:
            entries = unpack_entries(bytes(req.packed_entries))
        answers = []
        for _, partition, offset in entries:
            self.appended.append(offset)
            answers.append((0, None, len(self.appended) - 1, partition, len(self.appended)))
        if self.lose_next:
            self.lose_next = False
            raise ConnectionError("connection reset after the main took the request")
        if version >= 5:
            return R(packed_answers=pack_answers_v5(answers, entries, session))
        return R(
            error_code=0, error_message=None, packed_answers=pack_answers(answers, version >= 4)
        )

    def close(self) -> None:
        pass


def _route(batcher: RouteBatcher, topic: str, offset: int):
    return batcher.route(batcher.ticket(), 5, topic, 0, offset, 1000).result(5)


def test_a_main_restart_or_a_lost_answer_starts_a_new_session_without_losing_a_route():
    main = _Main()
    batcher = RouteBatcher(main, 7, "router-channel/node-7", 1, linger_s=0.0)  # type: ignore[arg-type]
    topic = str(uuid.uuid4())
    try:
        assert _route(batcher, topic, 100)[0] == 0
        assert _route(batcher, topic, 200)[0] == 0
        main.restart()  # its sessions are gone: the proxy's table is unknown to it
        assert _route(batcher, topic, 300) == (0, None, 2, 0, 3)
        assert main.refused == 1
        # the main took a request but its answer was lost: the route fails (the proxy
        # keeps its channel record), the next request starts a new session
        main.lose_next = True
        with pytest.raises(ConnectionError):
            _route(batcher, topic, 400)
        assert _route(batcher, topic, 500)[0] == 0
        assert main.appended == [100, 200, 300, 400, 500]  # each once, none lost
        assert main.refused == 1 and set(main.versions) == {5}
    finally:
        batcher.close()


def test_a_main_not_upgraded_to_version_4_gets_an_older_version():
    main = _Main(newest=3)
    batcher = RouteBatcher(main, 7, "router-channel/node-7", 1, linger_s=0.0)  # type: ignore[arg-type]
    topic = str(uuid.uuid4())
    try:
        with pytest.raises(ConnectionError):  # the client retries this one
            _route(batcher, topic, 1)
        assert _route(batcher, topic, 2) == (0, None, 0, 0, 1)
        assert main.versions == [2] and main.appended == [2]
    finally:
        batcher.close()


def test_the_handler_refuses_a_session_out_of_step_before_any_append():
    image = SimpleNamespace(route_epoch=SimpleNamespace(current_epoch=6, fenced_epoch=5))
    # no partitions, channels or io: a refused request must not reach them
    handler = ZoneRouteHandler(lambda: image, None, None, ZoneTraffic("az1"), None)  # type: ignore[arg-type]
    proxy = ProxyRouteSession()
    proxy.pack(6, 7, 1000, [(uuid.uuid4(), 0, 5)])
    proxy.confirm()  # as if an earlier main had taken it
    packed = proxy.pack(6, 7, 1000, [(uuid.uuid4(), 0, 9)])
    ctx = SimpleNamespace(api_version=4)
    resp = asyncio.run(handler.zone_route(ZoneRouteRequest[4](packed_entries=packed), ctx))
    assert resp.error_code == KafkaError.FETCH_SESSION_ID_NOT_FOUND
    assert "this main none" in resp.error_message and handler._pending == {}
    bad = asyncio.run(handler.zone_route(ZoneRouteRequest[4](packed_entries=b"\x0e"), ctx))
    assert bad.error_code == KafkaError.INVALID_REQUEST
