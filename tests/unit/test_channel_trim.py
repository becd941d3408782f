"""When a proxy may trim its RouterChannel (dataplane/zonerouter/zone_router.py `trim_point`): a
record stays while its main may still need it to resolve a Link Record of uncommitted
data."""

from __future__ import annotations

from types import SimpleNamespace

from dataplane.zonerouter.traffic import ZoneTraffic
from dataplane.zonerouter.zone_router import UNKNOWN_END, ZoneRouter, _ChannelRecord


def _router(streams: dict) -> ZoneRouter:
    image = SimpleNamespace(streams=streams)
    return ZoneRouter(1, 0, None, lambda: image, lambda *a: [], ZoneTraffic("az1"))  # type: ignore[arg-type]


def _record(router: ZoneRouter, offset: int, size: int, **fields) -> _ChannelRecord:
    entry = _ChannelRecord(offset + size)
    for key, value in fields.items():
        setattr(entry, key, value)
    router._records[offset] = entry
    return entry


def test_records_are_trimmed_once_their_links_are_committed_in_channel_order():
    stream = SimpleNamespace(epoch=3, end_offset=5)
    router = _router({7: stream})
    linked = dict(answered=True, stream_id=7, stream_epoch=3)
    _record(router, 0, 100, end_offset=5, **linked)  # committed already
    _record(router, 100, 50, end_offset=9, **linked)  # not yet
    _record(router, 150, 50, end_offset=-1, answered=True)  # refused: no link
    assert router.trim_point() == 100
    stream.end_offset = 9
    assert router.trim_point() == 200 and not router._records
    # nothing left: the trim point stays at the end of what was released
    assert router.trim_point() == 200


def test_an_unanswered_record_or_an_unknown_append_blocks_the_trim():
    stream = SimpleNamespace(epoch=3, end_offset=100)
    router = _router({7: stream})
    _record(router, 0, 10, answered=False)
    assert router.trim_point() == 0
    router._records[0].answered = True  # answered with an error: nothing linked
    router._records[0].end_offset = -1
    # a lost answer: the main may have linked it; only a new stream epoch (the main's WAL
    # recovered and committed by a failover) or a later answer releases it
    _record(router, 10, 10, answered=True, stream_id=7, stream_epoch=3, end_offset=UNKNOWN_END)
    assert router.trim_point() == 10
    stream.end_offset = 10**9
    assert router.trim_point() == 10
    stream.epoch = 4
    assert router.trim_point() == 20


def test_no_trim_past_where_an_append_without_an_offset_yet_may_land():
    stream = SimpleNamespace(epoch=3, end_offset=100)
    router = _router({7: stream})
    linked = dict(answered=True, stream_id=7, stream_epoch=3, end_offset=5)
    _record(router, 0, 10, **linked)
    # an append started when the channel's durable end was 10: its record lands at or past
    # 10; the record at 10 (acknowledged, not registered yet, say) must stay
    router._appending = {0: 10}
    _record(router, 10, 10, **linked)
    _record(router, 20, 10, **linked)
    assert router.trim_point() == 10 and sorted(router._records) == [10, 20]
    router._appending = {0: 10, 1: 30}
    assert router.trim_point() == 10
    router._appending = {1: 30}  # registered: under load the trims go on behind the appends
    assert router.trim_point() == 30 and not router._records


def test_a_previous_incarnations_records_are_kept_until_the_committed_route_epoch():
    image = SimpleNamespace(
        streams={}, route_epoch=SimpleNamespace(current_epoch=7, committed_epoch=5)
    )
    ready = [False]
    router = ZoneRouter(
        1, 0, None, lambda: image, lambda *a: [], ZoneTraffic("az1"), ready_fn=lambda: ready[0]
    )  # type: ignore[arg-type]
    router._acked_end = 500  # the channel's end when this incarnation opened it
    router._keep_before = 120
    assert router.trim_point() == 120  # the image is not caught up: the epoch is unknown
    ready[0] = True
    assert router.trim_point() == 120 and router._keep_until_epoch == 7
    image.route_epoch.current_epoch = 9
    image.route_epoch.committed_epoch = 6
    assert router.trim_point() == 120
    image.route_epoch.committed_epoch = 7  # every main committed what it got in epoch <= 7
    assert router.trim_point() == 500


def test_a_mains_persisted_epoch_waits_for_its_links_to_be_committed():
    from dataplane.zonerouter.route_handler import ZoneRouteHandler

    stream = SimpleNamespace(epoch=2, end_offset=10)
    image = SimpleNamespace(
        streams={4: stream}, route_epoch=SimpleNamespace(current_epoch=6, fenced_epoch=5)
    )
    handler = ZoneRouteHandler(lambda: image, None, None, ZoneTraffic("az1"), None)  # type: ignore[arg-type]
    assert handler.persisted_epoch() == 5  # nothing accepted: everything up to the fenced
    entry = {"epoch": 3, "done": True, "stream_id": 4, "end": 20, "stream_epoch": 2}
    handler._pending[0] = entry
    handler._pending[1] = {"epoch": 6, "done": False, "stream_id": -1, "end": -1}
    assert handler.persisted_epoch() == 2  # epoch 3's links are not uploaded yet
    stream.end_offset = 20
    assert handler.persisted_epoch() == 5 and 0 not in handler._pending
    # a request in flight in an epoch at or below the fenced one holds it back
    handler._pending[2] = {"epoch": 4, "done": False, "stream_id": -1, "end": -1}
    assert handler.persisted_epoch() == 3


def test_a_main_behind_the_fenced_epoch_forces_an_upload():
    """The forced ConfirmWAL commit: links accepted in a now fenced epoch make the main
    upload at its next heartbeat, whatever its upload interval."""
    from dataplane.zonerouter.route_handler import ZoneRouteHandler

    stream = SimpleNamespace(epoch=2, end_offset=10)
    image = SimpleNamespace(
        streams={4: stream}, route_epoch=SimpleNamespace(current_epoch=4, fenced_epoch=3)
    )
    handler = ZoneRouteHandler(lambda: image, None, None, ZoneTraffic("az1"), None)  # type: ignore[arg-type]
    uploads: list[int] = []

    def request_upload() -> None:
        uploads.append(1)

    # a link of the current epoch, not uploaded: not due yet
    handler._pending[0] = {"epoch": 4, "done": True, "stream_id": 4, "end": 20, "stream_epoch": 2}
    assert handler.persisted_epoch_forcing_commit(request_upload) == 3 and uploads == []
    # the controller bumps the route epoch: that link's epoch is fenced now
    image.route_epoch.current_epoch, image.route_epoch.fenced_epoch = 5, 4
    assert handler.persisted_epoch_forcing_commit(request_upload) == 3 and uploads == [1]
    # the upload committed it: caught up, nothing forced
    stream.end_offset = 20
    assert handler.persisted_epoch_forcing_commit(request_upload) == 4 and uploads == [1]
