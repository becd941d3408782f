"""FileWAL with O_DIRECT group commits (wal/direct_write.py): the same records, recovered
the same way, and buffered writes wherever O_DIRECT is unavailable or refused."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from dataplane.config import FileWALConfig
from dataplane.s3stream.wal import FileWAL
from dataplane.s3stream.wal import direct_write as direct_write_module

CAPACITY = 256 * 1024
CONFIG = dict(max_record_bytes=16 * 1024, max_batch_bytes=64 * 1024, max_queue_bytes=256 * 1024)


def _open(path: Path, **overrides) -> FileWAL:
    config = FileWALConfig(**{**CONFIG, **overrides})
    return FileWAL.open(path, 1, 1, capacity_bytes=CAPACITY, config=config)


def _direct_io_possible(directory: Path) -> bool:
    probe = directory / "probe"
    probe.write_bytes(b"")
    try:
        os.close(os.open(probe, os.O_WRONLY | getattr(os, "O_DIRECT", 0)))
        return hasattr(os, "O_DIRECT")
    except OSError:
        return False
    finally:
        probe.unlink()


def _laps(wal: FileWAL, count: int) -> list[tuple[int, bytes]]:
    """Append `count` records of varied sizes, trimming so the ring wraps; returns what
    the WAL must still hold (offset, data)."""
    kept: list[tuple[int, bytes]] = []
    for i in range(count):
        data = bytes([i % 251]) * (500 + (i * 977) % 9000)
        futures = [wal.append(data[: len(data) // 2]), wal.append((data[len(data) // 2 :],))]
        for future, piece in zip(
            futures, (data[: len(data) // 2], data[len(data) // 2 :]), strict=True
        ):
            kept.append((future.result(timeout=10).offset, piece))
        if wal.used_bytes > CAPACITY // 2:
            wal.trim(kept[-4][0])
            kept = kept[-4:]
    return kept


def test_direct_group_commits_recover_like_buffered_ones(tmp_path: Path) -> None:
    if not _direct_io_possible(tmp_path):
        pytest.skip("this filesystem has no O_DIRECT")
    for direct in (True, False):
        path = tmp_path / f"{direct}.wal"
        with _open(path, direct_io=direct) as wal:
            assert wal.direct_io is direct
            kept = _laps(wal, 300)
            assert wal.end_offset > 3 * CAPACITY  # wrapped the ring several times
            assert [(r.offset, r.data) for r in wal.recover()] == kept
        with _open(path, direct_io=direct) as wal:
            assert [(r.offset, r.data) for r in wal.recover()] == kept


def test_no_direct_writes_without_aligned_batches(tmp_path: Path) -> None:
    with _open(tmp_path / "a.wal", align_bytes=0) as wal:
        assert not wal.direct_io  # batches not padded to 4 KiB: all buffered
        assert wal.append(b"x" * 100).result(timeout=10).offset == 0


def test_a_filesystem_without_o_direct_gets_buffered_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refusing_open(path, flags, *args):
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct_write_module.os, "open", refusing_open)
    path = tmp_path / "b.wal"
    with _open(path) as wal:
        assert not wal.direct_io
        kept = _laps(wal, 40)
    monkeypatch.undo()
    with _open(path) as wal:
        assert [(r.offset, r.data) for r in wal.recover()] == kept


def test_a_refused_direct_write_is_written_buffered_and_direct_io_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _direct_io_possible(tmp_path):
        pytest.skip("this filesystem has no O_DIRECT")
    path = tmp_path / "c.wal"
    with _open(path) as wal:
        assert wal.direct_io
        first = wal.append(b"a" * 3000).result(timeout=10)

        def refusing_pwrite(fd, data, position):
            raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(direct_write_module.os, "pwrite", refusing_pwrite)
        second = wal.append(b"b" * 3000).result(timeout=10)  # written buffered instead
        assert not wal.direct_io
        third = wal.append(b"c" * 3000).result(timeout=10)
    monkeypatch.undo()
    with _open(path) as wal:
        assert [(r.offset, r.data) for r in wal.recover()] == [
            (first.offset, b"a" * 3000),
            (second.offset, b"b" * 3000),
            (third.offset, b"c" * 3000),
        ]


def test_another_write_error_fails_the_wal_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not _direct_io_possible(tmp_path):
        pytest.skip("this filesystem has no O_DIRECT")
    with _open(tmp_path / "d.wal") as wal:

        def failing_pwrite(fd, data, position):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(direct_write_module.os, "pwrite", failing_pwrite)
        with pytest.raises(Exception, match="Input/output"):
            wal.append(b"lost").result(timeout=10)
        assert wal.failed
