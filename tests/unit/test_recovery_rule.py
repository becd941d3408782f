"""`recovery.UncommittedBatches`: which recovered WAL batches must be re-uploaded, and which
cannot be recovered and why (the one rule of the engine's restart and of WAL failover)."""

from __future__ import annotations

import pytest

from controlplane.errors import ControllerError, ErrorCode
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream.recovery import StreamTarget, UncommittedBatches, stream_target

WRITER = 1


def batch(stream_id: int, base: int, count: int = 10, epoch: int = 3) -> StreamRecordBatch:
    return StreamRecordBatch(stream_id, epoch, base, count, b"x")


def metadata(streams: dict[int, dict]):
    def lookup(stream_id: int) -> dict:
        if stream_id not in streams:
            raise ControllerError(ErrorCode.UNKNOWN_STREAM, f"stream {stream_id}")
        return streams[stream_id]

    return lookup


def opened(end: int, node_id: int = WRITER, epoch: int = 3) -> dict:
    return {"state": "opened", "node_id": node_id, "epoch": epoch, "end_offset": end}


def test_keeps_batches_past_the_committed_end_in_order() -> None:
    rule = UncommittedBatches(WRITER, metadata({7: opened(20)}))
    kept = [
        b.base_offset
        for b in (batch(7, 0), batch(7, 10), batch(7, 20), batch(7, 30))
        if rule.accept(b)
    ]
    assert kept == [20, 30]
    assert rule.skipped == {}


def test_skips_streams_not_the_writers() -> None:
    streams = {
        1: {"state": "closed", "node_id": WRITER, "epoch": 3, "end_offset": 0},
        2: opened(0, node_id=9),
        3: opened(0, epoch=4),
    }
    rule = UncommittedBatches(WRITER, metadata(streams))
    assert not any(rule.accept(batch(sid, 0)) for sid in (1, 2, 3))
    assert not rule.accept(batch(4, 0))  # deleted
    assert rule.skipped == {4: "deleted"}


def test_a_gap_makes_the_stream_unrecoverable() -> None:
    rule = UncommittedBatches(WRITER, metadata({7: opened(20)}))
    assert not rule.accept(batch(7, 25))
    assert not rule.accept(batch(7, 35))  # later batches of the stream are not kept either
    assert rule.skipped == {7: "WAL resumes at 25, committed end is 20"}


def test_reread_and_skip() -> None:
    streams = {7: opened(0)}
    rule = UncommittedBatches(WRITER, metadata(streams))
    assert rule.accept(batch(7, 0))
    streams[7] = opened(30)  # the stream moved past what was sent
    rule.reread(7)
    assert not rule.accept(batch(7, 10))
    assert rule.accept(batch(7, 30))
    rule.skip(7, "refused")
    assert not rule.accept(batch(7, 40))
    assert rule.skipped == {7: "refused"}


def test_other_controller_errors_propagate() -> None:
    def failing(stream_id: int) -> dict:
        raise ControllerError(ErrorCode.NOT_CONTROLLER, "no leader")

    with pytest.raises(ControllerError):
        UncommittedBatches(WRITER, failing).accept(batch(7, 0))


def test_stream_target() -> None:
    assert stream_target(opened(5), WRITER) == StreamTarget(3, 5)
    assert stream_target(opened(5, node_id=2), WRITER) is None


def test_a_wal_loss_names_the_acknowledged_offsets_nothing_committed_covers(caplog) -> None:
    """Stream 7 recovered up to 40 (committed 20 + two batches), the loss held 30..90: 40..90
    are gone. Stream 8's lost records were all committed: nothing gone. Stream 9 is closed."""
    from dataplane.s3stream.wal.base import WALLoss
    from dataplane.s3stream.wal.loss import recent_losses

    rule = UncommittedBatches(
        WRITER, metadata({7: opened(20), 8: opened(500), 9: {"state": "closed"}})
    )
    assert rule.accept(batch(7, 20)) and rule.accept(batch(7, 30))
    loss = WALLoss("w", 0, 100, 9, "crc", {7: (30, 90), 8: (100, 200), 9: (0, 5)})
    with caplog.at_level("ERROR"):
        gone = rule.name_lost(loss, "restart of node 1")
    assert gone == {7: (40, 90)}
    assert "restart of node 1: acknowledged offsets gone: stream 7 [40, 90)" in caplog.text
    assert "restart of node 1: acknowledged offsets gone: stream 7 [40, 90)" in recent_losses()
    assert rule.name_lost(None, "x") == {}
