"""The file WAL's scan rule: a torn tail is harmless, corruption in the middle is a named loss.

Real WAL files written by FileWAL, then bytes overwritten, then reopened (restart) or taken
over (failover): the ERROR line, the metric and the report for `cluster status`.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from dataplane.config import FileWALConfig
from dataplane.formats.stream_records import StreamRecordBatch
from dataplane.s3stream.wal import FileWAL, take_over
from dataplane.s3stream.wal import metrics as wal_metrics
from dataplane.s3stream.wal.format import DATA_START_BYTES, RECORD_HEADER_SIZE_BYTES
from dataplane.s3stream.wal.loss import find_loss, in_flight_window_bytes, recent_losses
from dataplane.s3stream.wal.ring import RecordScanner, Ring, read_state

CONFIG = FileWALConfig(
    max_record_bytes=4096, max_batch_bytes=16 * 1024, max_queue_bytes=64 * 1024, linger_s=0
)
STREAM_ID = 7


def _corrupt_records() -> float:
    return wal_metrics.CORRUPT_RECORDS._value.get()


def _write(path: Path, count: int, capacity: int = 4 * 1024 * 1024, start: int = 0) -> list[int]:
    """Append `count` one-offset batches of stream 7 (one by one, each acknowledged);
    return their WAL offsets."""
    wal = FileWAL.open(path, 1, 1, capacity_bytes=capacity, config=CONFIG)
    try:
        offsets = []
        for i in range(start, start + count):
            body = StreamRecordBatch(STREAM_ID, 0, i, 1, bytes(900)).encode()
            offsets.append(wal.append(body).result(timeout=10).offset)
        return offsets
    finally:
        wal.close()


def _overwrite(path: Path, wal_offset: int, capacity: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, data, DATA_START_BYTES + wal_offset % capacity)
        os.fsync(fd)
    finally:
        os.close(fd)


def _recovered(wal) -> list[int]:
    return [StreamRecordBatch.decode(r.data)[0].base_offset for r in wal.recover()]


def test_mid_log_corruption_is_an_error_with_range_count_and_streams(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "wal"
    offsets = _write(path, 200)
    # a few bytes inside record 50's body: the 149 records after it are intact
    _overwrite(path, offsets[50] + RECORD_HEADER_SIZE_BYTES + 40, 4 * 1024 * 1024, b"\xff" * 8)
    before = _corrupt_records()
    with caplog.at_level(logging.INFO):
        wal = FileWAL.open(path, 1, 1, config=CONFIG)
    try:
        assert _recovered(wal) == list(range(50))
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1, errors
        assert f"149 records in bytes [{offsets[50]}, " in errors[0]
        assert "stream 7 offsets [51, 200)" in errors[0]
        assert "restart of node 1" in errors[0]
        assert _corrupt_records() - before == 149
        assert any("stream 7 offsets [51, 200)" in r for r in recent_losses())
        # the WAL continues after the last valid record
        body = StreamRecordBatch(STREAM_ID, 0, 50, 1, b"x").encode()
        assert wal.append(body).result(timeout=10).offset == offsets[50]
    finally:
        wal.close()


def test_torn_tail_is_not_a_loss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "wal"
    offsets = _write(path, 100)
    # the last record torn, garbage after it: what a crash mid-write leaves
    _overwrite(path, offsets[99] + RECORD_HEADER_SIZE_BYTES + 10, 4 * 1024 * 1024, b"\xff" * 8)
    _overwrite(path, offsets[99] + 2000, 4 * 1024 * 1024, os.urandom(3000))
    before = _corrupt_records()
    with caplog.at_level(logging.INFO):
        wal = FileWAL.open(path, 1, 1, config=CONFIG)
    try:
        assert _recovered(wal) == list(range(99))
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert _corrupt_records() == before
    finally:
        wal.close()


def test_a_loss_within_the_in_flight_window_is_named_with_its_caveat(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Damage whose valid successors all lie within the in-flight window: after a kill -9
    they were acknowledged (no write is torn by a process crash), after a power loss they
    may not have been; the loss is named and says so."""
    path = tmp_path / "wal"
    offsets = _write(path, 100)
    window = in_flight_window_bytes(CONFIG.max_batch_bytes)
    end = offsets[-1] + RECORD_HEADER_SIZE_BYTES + 1000
    inside = next(i for i, off in enumerate(offsets) if end - off < window)
    _overwrite(path, offsets[inside] + RECORD_HEADER_SIZE_BYTES + 40, 4 * 1024 * 1024, b"\xff" * 8)
    before = _corrupt_records()
    with caplog.at_level(logging.INFO):
        wal = FileWAL.open(path, 1, 1, config=CONFIG)
    try:
        assert len(_recovered(wal)) == inside
        assert wal.scan_loss is not None and wal.scan_loss.within_in_flight_window
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "may not have been acknowledged" in errors[0], errors
        assert _corrupt_records() - before == 99 - inside
    finally:
        wal.close()


def test_a_reported_loss_is_not_reported_again_by_the_next_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The lost range is zeroed once reported: the next restart (after new appends that end
    inside it) finds no loss and does not chain into the stale records."""
    path = tmp_path / "wal"
    offsets = _write(path, 200)
    _overwrite(path, offsets[50] + RECORD_HEADER_SIZE_BYTES + 40, 4 * 1024 * 1024, b"\xff" * 8)
    FileWAL.open(path, 1, 1, config=CONFIG).close()  # reports the loss of 51..199
    _write(path, 10, start=1000)  # new records over part of the lost range
    before = _corrupt_records()
    caplog.clear()
    with caplog.at_level(logging.INFO):
        wal = FileWAL.open(path, 1, 1, config=CONFIG)
    try:
        assert _recovered(wal) == list(range(50)) + list(range(1000, 1010))
        assert wal.scan_loss is None
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert _corrupt_records() == before
    finally:
        wal.close()


def test_wrapped_ring_stops_the_search_at_the_earlier_lap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """After the ring wrapped, the bytes after the write head are records of an earlier lap:
    not a loss; corruption in the current lap still is."""
    capacity = 512 * 1024
    path = tmp_path / "wal"
    wal = FileWAL.open(path, 1, 1, capacity_bytes=capacity, config=CONFIG)
    offsets = []
    try:
        for i in range(600):  # one 4 KiB page per record: 2.4 MB through a 512 KiB ring
            body = StreamRecordBatch(STREAM_ID, 0, i, 1, bytes(900)).encode()
            offsets.append(wal.append(body).result(timeout=10).offset)
            if i % 10 == 9 and i >= 60:
                wal.trim(offsets[i - 60])
    finally:
        wal.close()
    before = _corrupt_records()
    with caplog.at_level(logging.INFO):
        FileWAL.open(path, 1, 1, config=CONFIG).close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert _corrupt_records() == before
    # now corrupt the second retained record (539 is the first)
    _overwrite(path, offsets[540] + RECORD_HEADER_SIZE_BYTES + 5, capacity, b"\xee" * 4)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        FileWAL.open(path, 1, 1, config=CONFIG).close()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "59 records" in errors[0], errors
    assert "stream 7 offsets [541, 600)" in errors[0]
    assert _corrupt_records() - before == 59


def test_failover_names_the_loss_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "wal"
    offsets = _write(path, 120)
    _overwrite(path, offsets[20] + 3, 4 * 1024 * 1024, b"\x00\x01\x02")  # a header this time
    before = _corrupt_records()
    with caplog.at_level(logging.INFO):
        with take_over(path, 3, 5) as handle:
            assert len(list(handle.recover())) == 20
            assert len(list(handle.recover())) == 20  # read again: not counted again
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert "failover by node 3 epoch 5" in errors[0]
    assert "99 records" in errors[0] and "stream 7 offsets [21, 120)" in errors[0]
    assert _corrupt_records() - before == 99
    caplog.clear()
    with caplog.at_level(logging.INFO):
        wal = FileWAL.open(path, 1, 6, config=CONFIG)  # the owner back with a newer epoch
    try:
        assert len(_recovered(wal)) == 20 and wal.scan_loss is None
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        wal.close()


def test_a_loss_reaches_the_heartbeat_and_cluster_status() -> None:
    """The broker's heartbeat carries the loss line; `cluster status` names broker and range."""
    from types import SimpleNamespace

    from cli.status import _problems
    from controlplane.requests import BrokerUploadStats
    from dataplane.broker.heartbeat import HeartbeatStats
    from dataplane.s3stream.wal.loss import WALLoss, report_loss

    loss = WALLoss("/x/wal-9", 4096, 90112, 33, "body CRC mismatch", {3: (10, 43)})
    report_loss(loss, "restart of node 9")
    storage = SimpleNamespace(
        upload_stats=lambda: SimpleNamespace(
            wal_used_bytes=0, wal_capacity_bytes=1, upload_lag_s=0.0, last_upload_error=None
        )
    )
    sent = HeartbeatStats(storage, None, None, None, None).upload_stats()  # type: ignore[arg-type]
    assert BrokerUploadStats.model_validate(sent.model_dump()) == sent  # the controller accepts it
    lines = [line for line in sent.wal_losses if "wal-9" in line]
    assert lines == [
        "restart of node 9: WAL /x/wal-9: 33 records in bytes [4096, 90112) lost after "
        "corruption (body CRC mismatch); stream 3 offsets [10, 43)"
    ]
    broker = {
        "node_id": 9,
        "registered": True,
        "fenced": False,
        "fence_reason": None,
        "last_heartbeat_age_ms": 10,
        "pid": 123,
        "wal_losses": lines,
    }
    config = SimpleNamespace(settings=SimpleNamespace(broker_session_timeout_ms=6000))
    problems = _problems(config, [], [broker], {"node_id": 1})  # type: ignore[arg-type]
    assert problems == [f"broker 9 lost WAL records: {lines[0]}"]


class _CountingRing(Ring):
    """A Ring that counts the bytes read through it."""

    def __init__(self, fd: int, capacity_bytes: int) -> None:
        super().__init__(fd, capacity_bytes)
        self.bytes_read = 0

    def read(self, logical: int, size: int) -> bytes:
        self.bytes_read += size
        return super().read(logical, size)


def test_the_search_past_the_end_skips_the_unwritten_ring(tmp_path: Path) -> None:
    """A restart or failover of a fresh WAL reads what was written, not the unwritten rest
    of its ring (512 MiB by default: seconds of a failover went to reading zeros); records
    past a corrupt one are still found."""
    capacity = 256 * 1024 * 1024  # fallocated: unwritten, nothing is stored
    path = tmp_path / "wal"
    config = CONFIG.model_copy(update={"prefill_ahead_bytes": 0})
    wal = FileWAL.open(path, 1, 1, capacity_bytes=capacity, config=config)
    try:
        offsets = [
            wal.append(StreamRecordBatch(STREAM_ID, 0, i, 1, bytes(900)).encode())
            .result(timeout=10)
            .offset
            for i in range(100)
        ]
    finally:
        wal.close()

    def search() -> tuple[object, int]:
        fd = os.open(path, os.O_RDONLY)
        try:
            state = read_state(fd)
            assert state is not None
            scanner = RecordScanner(Ring(fd, capacity), state.trim_offset)
            for _ in scanner:
                pass
            ring = _CountingRing(fd, capacity)
            limit = state.trim_offset + capacity
            return find_loss(ring, "wal", scanner.end_offset, limit, 0, scanner.stop_reason), (
                ring.bytes_read
            )
        finally:
            os.close(fd)

    # what it reads: ~2 MiB written, and what the page cache holds beyond it (pages read
    # ahead count as data), not the 256 MiB ring
    loss, read_bytes = search()
    assert loss is None  # the end of what was written: nothing after it
    assert read_bytes <= 32 * 1024 * 1024, read_bytes
    _overwrite(path, offsets[50] + RECORD_HEADER_SIZE_BYTES + 40, capacity, b"\xff" * 8)
    loss, read_bytes = search()
    assert loss is not None and loss.records == 49 and loss.start_offset == offsets[50]
    assert read_bytes <= 32 * 1024 * 1024, read_bytes


def test_data_extents_skip_holes_and_never_a_written_byte(tmp_path: Path) -> None:
    capacity = 16 * 1024 * 1024
    path = tmp_path / "sparse"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, DATA_START_BYTES + capacity)  # all hole
        ring = Ring(fd, capacity)
        ring.write(0, b"\x01" * 4096)
        ring.write(8 * 1024 * 1024 + 100, b"\x02" * 10)
        ring.write(capacity - 2, b"\x03" * 4)  # across the ring's end
        extents = ring.data_extents(0, capacity)
        assert extents[0][0] == 0 and len(extents) == 3, extents
        # whatever is left out reads as zeros
        gaps = [(a[1], b[0]) for a, b in zip(extents, extents[1:], strict=False)]
        gaps.append((extents[-1][1], capacity))
        assert all(not any(ring.read(a, b - a)) for a, b in gaps if b > a)
        assert sum(b - a for a, b in extents) < 64 * 1024  # the holes are not read
        # a later lap: the written bytes across the wrap are one range
        wrapped = ring.data_extents(capacity // 2, capacity // 2 + capacity)
        assert any(a < capacity < b for a, b in wrapped), wrapped
        assert ring.read(capacity - 2, 4) == b"\x03" * 4
    finally:
        os.close(fd)
