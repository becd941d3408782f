"""RingPrefiller: a new WAL's first lap is zero-filled ahead of the writer, never over it."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from dataplane.config import FileWALConfig
from dataplane.s3stream.wal import FileWAL
from dataplane.s3stream.wal.format import DATA_START_BYTES
from dataplane.s3stream.wal.prefill import RingPrefiller

MIB = 1024 * 1024
CONFIG = FileWALConfig(
    max_record_bytes=64 * 1024,
    max_batch_bytes=256 * 1024,
    max_queue_bytes=1024 * 1024,
    close_timeout_s=10.0,
)


def _fallocated(path: Path, size: int) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.posix_fallocate(fd, 0, size)
    return fd


def _unwritten_reads_as_hole(tmp_path: Path) -> bool:
    """Whether this filesystem reports fallocated, never-written space as a hole
    (ext4 and XFS do), which is how the tests below see where zeros were written."""
    probe = tmp_path / "probe"
    fd = _fallocated(probe, MIB)
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) == 0
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def _first_hole(path: Path, start: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, start, os.SEEK_HOLE)
    finally:
        os.close(fd)


def test_a_new_wal_gets_written_extents_ahead_of_its_appends(tmp_path: Path) -> None:
    if not _unwritten_reads_as_hole(tmp_path):
        pytest.skip("this filesystem does not report unwritten extents as holes")
    capacity = 32 * MIB
    config = CONFIG.model_copy(update={"prefill_ahead_bytes": 4 * MIB})
    wal = FileWAL.open(tmp_path / "w.wal", 1, 1, capacity_bytes=capacity, config=config)
    try:
        for _ in range(8):
            wal.append(b"x" * 60_000).result(timeout=10)
        assert wal._prefiller is not None
        end = wal.end_offset
        want = DATA_START_BYTES + end + 4 * MIB - 4096
        hole = _first_hole(wal.path, DATA_START_BYTES)
        for _ in range(200):  # bounded: the prefiller writes 4 MiB in well under 10 s
            if hole >= want:
                break
            threading.Event().wait(0.05)
            hole = _first_hole(wal.path, DATA_START_BYTES)
        # zeros reach 4 MiB beyond what was appended, and stop near there
        assert want <= hole <= DATA_START_BYTES + end + 4 * MIB + 2 * MIB
    finally:
        wal.close()


def test_reopening_an_existing_wal_does_not_prefill(tmp_path: Path) -> None:
    path = tmp_path / "w.wal"
    FileWAL.open(path, 1, 1, capacity_bytes=16 * MIB, config=CONFIG).close()
    wal = FileWAL.open(path, 1, 2, config=CONFIG)
    try:
        assert wal._prefiller is None
    finally:
        wal.close()
    off = FileWAL.open(
        tmp_path / "off.wal",
        1,
        1,
        capacity_bytes=16 * MIB,
        config=CONFIG.model_copy(update={"prefill_ahead_bytes": 0}),
    )
    try:
        assert off._prefiller is None
    finally:
        off.close()


def test_zeros_never_land_on_bytes_the_writer_claimed(tmp_path: Path) -> None:
    """A writer racing a prefiller with a tiny lead: every byte written after a claim
    survives, and the writer never waits longer than a chunk write."""
    path = tmp_path / "race.wal"
    capacity = 4 * MIB
    fd = _fallocated(path, DATA_START_BYTES + capacity)
    rng = random.Random(7)
    prefiller = RingPrefiller(
        path, capacity, ahead_bytes=8192, chunk_bytes=4096, max_bytes_per_s=1 << 40
    )
    prefiller.start()
    segments: list[tuple[int, int, int]] = []
    pos = 0
    try:
        for _ in range(500):  # bounded: let it take a lead first, so the two really race
            if prefiller.filled_bytes > 0:
                break
            threading.Event().wait(0.01)
        while pos < capacity:
            size = min(rng.randint(1, 20_000), capacity - pos)
            value = rng.randint(1, 255)
            prefiller.claim(pos + size)
            os.pwrite(fd, bytes([value]) * size, DATA_START_BYTES + pos)
            segments.append((pos, size, value))
            pos += size
    finally:
        prefiller.stop()
    assert not prefiller.active
    data = os.pread(fd, capacity, DATA_START_BYTES)
    os.close(fd)
    for start, size, value in segments:
        assert data[start : start + size] == bytes([value]) * size, (start, size)
    assert prefiller.filled_bytes > 0


def test_a_lightly_used_wal_zero_fills_only_its_lead(tmp_path: Path) -> None:
    path = tmp_path / "light.wal"
    capacity = 64 * MIB
    fd = _fallocated(path, DATA_START_BYTES + capacity)
    os.close(fd)
    prefiller = RingPrefiller(path, capacity, ahead_bytes=2 * MIB, chunk_bytes=MIB)
    prefiller.start()
    try:
        prefiller.claim(100)
        for _ in range(200):  # bounded wait for the lead to be written
            if prefiller.filled_bytes >= 2 * MIB:
                break
            threading.Event().wait(0.02)
        threading.Event().wait(0.2)  # it must now be idle, not filling the rest
        assert 2 * MIB <= prefiller.filled_bytes <= 3 * MIB
        assert prefiller.active
    finally:
        prefiller.stop()
    assert not prefiller.active


def test_prefiller_limits_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        RingPrefiller(tmp_path / "x", MIB, ahead_bytes=64 * MIB, chunk_bytes=1000)
    with pytest.raises(ValueError):
        RingPrefiller(tmp_path / "x", MIB, ahead_bytes=4096, chunk_bytes=8192)
    with pytest.raises(ValueError):
        FileWALConfig(prefill_ahead_bytes=-1)


def test_zeros_in_flight_at_close_never_land_on_what_close_writes(tmp_path, monkeypatch):
    """close() stops the prefiller while a zero chunk is being written and then writes
    what is queued: the writer must still wait for that chunk (found by review: it skipped
    the claim once the prefiller was stopped, and the late zeros erased acked records)."""
    from dataplane.s3stream.wal import prefill as prefill_mod
    from dataplane.s3stream.wal.ring import Ring

    real_zero = prefill_mod.pwrite_all

    def slow_zero(fd, buf, offset):
        if offset >= DATA_START_BYTES + MIB:  # the second chunk is slow (a busy disk)
            threading.Event().wait(1.0)
        return real_zero(fd, buf, offset)

    real_batch = Ring.write_batch

    def slow_batch(self, logical, parts, total):  # a writer a little slower than close()
        threading.Event().wait(0.01)
        return real_batch(self, logical, parts, total)

    monkeypatch.setattr(prefill_mod, "pwrite_all", slow_zero)
    monkeypatch.setattr(Ring, "write_batch", slow_batch)
    config = CONFIG.model_copy(
        update={
            "max_batch_bytes": 128 * 1024,
            "max_queue_bytes": 8 * MIB,
            "prefill_ahead_bytes": MIB,
        }
    )
    path = tmp_path / "w.wal"
    wal = FileWAL.open(path, 1, 1, capacity_bytes=16 * MIB, config=config)
    first = wal.append(b"a" * 4000).result(5)  # the prefiller now writes [1, 2) MiB
    threading.Event().wait(0.1)
    futures = [wal.append(b"x" * 60_000) for _ in range(40)]  # ~2.4 MiB: across 1 MiB
    wal.close()  # writes what is queued
    acked = [f.result(0) for f in futures if f.exception(0) is None]
    assert acked
    reopened = FileWAL.open(path, 1, 2, config=config.model_copy(update={"prefill_ahead_bytes": 0}))
    try:
        recovered = {r.offset for r in reopened.recover()}
    finally:
        reopened.close()
    lost = [a.offset for a in [first, *acked] if a.offset not in recovered]
    assert not lost, f"{len(lost)} of {len(acked) + 1} acknowledged records lost"


def test_a_taken_over_wal_writes_no_more_zeros(tmp_path: Path) -> None:
    """The prefiller re-reads the reservation before every chunk: once another node took
    the WAL over, the old owner writes nothing, not even zeros."""
    from dataplane.s3stream.wal import take_over

    path = tmp_path / "w.wal"
    config = CONFIG.model_copy(update={"prefill_ahead_bytes": 2 * MIB})
    wal = FileWAL.open(path, 1, 1, capacity_bytes=64 * MIB, config=config)
    try:
        prefiller = wal._prefiller
        assert prefiller is not None
        for _ in range(500):  # bounded: its 2 MiB lead is written, then it is idle
            if prefiller.filled_bytes >= 2 * MIB:
                break
            threading.Event().wait(0.01)
        with take_over(path, 2, 2):
            wal.append(b"claim")  # wakes it: it must not write the next chunk
            for _ in range(500):  # bounded: it ends at once, or within a second when idle
                if not prefiller.active:
                    break
                threading.Event().wait(0.01)
            assert not prefiller.active
            assert prefiller.filled_bytes <= 3 * MIB
    finally:
        wal.close()
