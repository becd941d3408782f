"""FileWAL: group commit, recovery, torn tails, header slots, ring reuse, fencing, metrics."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from dataplane.config import FileWALConfig
from dataplane.s3stream.wal import (
    FileWAL,
    WALClosedError,
    WALCorruptError,
    WALError,
    WALFencedError,
    WALFullError,
    WALQueueFullError,
    WALQueueTimeoutError,
    WALTakeoverRefusedError,
    WriteAheadLog,
    take_over,
)
from dataplane.s3stream.wal import file_wal as file_wal_module
from dataplane.s3stream.wal import ring as ring_module
from dataplane.s3stream.wal.format import (
    DATA_START_BYTES,
    RECORD_HEADER_SIZE_BYTES,
    RESERVATION_SLOT_POSITIONS,
    STATE_SLOT_POSITIONS,
    Reservation,
    WALState,
    decode_record_header,
    encode_record_header,
    padding_bytes,
)

CAPACITY = 256 * 1024
CONFIG = FileWALConfig(
    max_record_bytes=16 * 1024,
    max_batch_bytes=64 * 1024,
    max_queue_bytes=256 * 1024,
    close_timeout_s=10.0,
)


@pytest.fixture()
def wal_path(tmp_path: Path) -> Path:
    return tmp_path / "node1.wal"


def open_wal(
    path: Path, node_id: int = 1, epoch: int = 1, capacity: int = CAPACITY, **overrides
) -> FileWAL:
    config = FileWALConfig(**{**CONFIG.model_dump(), **overrides})
    return FileWAL.open(path, node_id, epoch, capacity_bytes=capacity, config=config)


def append_sync(wal: FileWAL, data: bytes):
    return wal.append(data).result(timeout=10)


def file_pos(offset: int, capacity: int = CAPACITY) -> int:
    return DATA_START_BYTES + offset % capacity


def patch_file(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def recovered(wal) -> list[tuple[int, bytes]]:
    return [(r.offset, r.data) for r in wal.recover()]


# ---------------------------------------------------------------------------- basics
def test_is_a_write_ahead_log_and_file_layout(wal_path: Path) -> None:
    with open_wal(wal_path) as wal:
        assert isinstance(wal, WriteAheadLog)
        assert wal.capacity_bytes == CAPACITY
        assert wal.used_bytes == 0 and wal.free_bytes == CAPACITY
        assert wal.start_offset == wal.end_offset == 0
    assert wal_path.stat().st_size == DATA_START_BYTES + CAPACITY
    assert not [p for p in wal_path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("align", [0, 4096])
def test_append_then_recover_after_close(wal_path: Path, align: int) -> None:
    rng = random.Random(1)
    payloads = [rng.randbytes(rng.randint(0, 3000)) for _ in range(60)]
    with open_wal(wal_path, align_bytes=align) as wal:
        results = [wal.append(p) for p in payloads]
        results = [f.result(timeout=10) for f in results]
        end = wal.end_offset
    previous_end = 0
    for payload, result in zip(payloads, results):
        assert result.size_bytes == RECORD_HEADER_SIZE_BYTES + len(payload)
        if align == 0:
            assert result.offset == previous_end  # contiguous
        else:  # contiguous within a batch, a padding record between batches
            assert previous_end <= result.offset < previous_end + align + RECORD_HEADER_SIZE_BYTES
        previous_end = result.next_offset
    assert end == previous_end if align == 0 else end % align == 0
    with open_wal(wal_path, align_bytes=align) as wal:
        assert wal.end_offset == end
        assert recovered(wal) == [(r.offset, p) for r, p in zip(results, payloads)]
        # appends continue after the recovered records
        assert append_sync(wal, b"next").offset == end


@pytest.mark.parametrize("iov_max", [1024, 3])
def test_a_record_given_as_pieces_is_stored_and_recovered_as_one(
    wal_path: Path, iov_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # iov_max 3: a batch of more parts than one pwritev takes is written in several
    monkeypatch.setattr(ring_module, "_IOV_MAX", iov_max)
    rng = random.Random(2)
    mutable = bytearray(rng.randbytes(500))
    records = [
        (b"head", rng.randbytes(3000)),
        (memoryview(rng.randbytes(900))[100:700], b"", b"tail"),
        (bytes(mutable),),
        # copied, so changing the buffer later changes nothing: a writable piece, and a
        # read-only view of a writable buffer
        (mutable, b"!", memoryview(mutable).toreadonly()),
        (memoryview(rng.randbytes(400)).cast("I"),),  # 100 items of 4 bytes: 400 bytes
    ]
    joined = [b"".join(bytes(p) for p in r) for r in records]
    with open_wal(wal_path) as wal:
        results = [wal.append(r) for r in records]
        mutable[:] = bytes(len(mutable))
        results = [f.result(timeout=10) for f in results]
        assert [r.size_bytes for r in results] == [
            RECORD_HEADER_SIZE_BYTES + len(j) for j in joined
        ]
        with pytest.raises(ValueError):  # the limit counts every piece
            wal.append((bytes(wal._config.max_record_bytes), b"x"))
    with open_wal(wal_path) as wal:
        assert recovered(wal) == [(r.offset, j) for r, j in zip(results, joined)]


def test_every_batch_ends_on_the_alignment_boundary(wal_path: Path) -> None:
    with open_wal(wal_path, align_bytes=4096) as wal:
        for size in (0, 1, 4072, 4073, 5000, 8192):
            result = append_sync(wal, bytes(size))
            assert wal.end_offset % 4096 == 0
            assert wal.end_offset - result.next_offset in (0, *range(24, 4096 + 24))
        recovered_sizes = [len(d) for _, d in recovered(wal)]
    assert recovered_sizes == [0, 1, 4072, 4073, 5000, 8192]
    with open(wal_path, "rb") as f:  # the padding after the first record is a padding record
        f.seek(file_pos(24))
        header = decode_record_header(f.read(24))
    assert header is not None and header.is_padding and header.record_offset == 24


def test_record_limits_and_closed(wal_path: Path) -> None:
    wal = open_wal(wal_path)
    with pytest.raises(ValueError, match="max_record_bytes"):
        wal.append(b"x" * (CONFIG.max_record_bytes + 1))
    futures = [wal.append(b"%d" % i) for i in range(100)]
    wal.close()
    assert all(f.done() and f.exception() is None for f in futures)  # close drains the queue
    wal.close()  # idempotent
    with pytest.raises(WALClosedError):
        wal.append(b"late")
    with pytest.raises(WALClosedError):
        wal.trim(0)


def test_config_validation(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        FileWAL.open(tmp_path / "a", 1, 1, capacity_bytes=1024, config=CONFIG)
    with pytest.raises(ValueError):
        FileWAL.open(
            tmp_path / "b",
            1,
            1,
            capacity_bytes=CAPACITY,
            config=FileWALConfig(max_record_bytes=64 * 1024, max_batch_bytes=64 * 1024),
        )
    with pytest.raises(FileNotFoundError):
        FileWAL.open(tmp_path / "c", 1, 1)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------- group commit
def test_group_commit_uses_far_fewer_fsyncs_than_appends(wal_path: Path) -> None:
    threads_n, per_thread, window = 8, 150, 16
    before_fsync_metric = REGISTRY.get_sample_value("automq_wal_fsyncs_total") or 0.0
    before_bytes_metric = REGISTRY.get_sample_value("automq_wal_append_bytes_total") or 0.0
    with open_wal(wal_path, capacity=4 * 1024 * 1024) as wal:
        fsyncs_at_start = wal.fsync_count
        errors: list[BaseException] = []

        def appender(tid: int) -> None:
            try:
                pending = []
                for i in range(per_thread):
                    pending.append(wal.append(b"t%d-%d" % (tid, i) + bytes(100)))
                    if len(pending) >= window:
                        pending.pop(0).result(timeout=10)
                for f in pending:
                    f.result(timeout=10)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        workers = [threading.Thread(target=appender, args=(t,)) for t in range(threads_n)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=30)
        assert not errors
        appends = threads_n * per_thread
        fsyncs = wal.fsync_count - fsyncs_at_start
        assert wal.acked_records == appends
        assert fsyncs == wal.batch_count
        assert fsyncs * 4 <= appends, f"{fsyncs} fsyncs for {appends} appends"
        end = wal.end_offset
    assert (
        REGISTRY.get_sample_value("automq_wal_fsyncs_total") or 0
    ) - before_fsync_metric >= fsyncs
    assert (
        REGISTRY.get_sample_value("automq_wal_append_bytes_total") or 0
    ) - before_bytes_metric >= end
    assert (REGISTRY.get_sample_value("automq_wal_append_latency_seconds_count") or 0) >= appends


def test_single_synchronous_appender_fsyncs_every_append(wal_path: Path) -> None:
    with open_wal(wal_path) as wal:
        start = wal.fsync_count
        for i in range(20):
            append_sync(wal, b"%d" % i)
        assert wal.fsync_count - start == 20


def test_batches_respect_max_batch_bytes(wal_path: Path) -> None:
    with open_wal(wal_path, capacity=1024 * 1024, max_batch_bytes=32 * 1024, linger_s=0.05) as wal:
        futures = [wal.append(bytes(1000)) for _ in range(200)]
        for f in futures:
            f.result(timeout=10)
        # 200 * 1024 B in batches of <= 32 KiB: at least 7 batches
        assert wal.batch_count >= 200 * 1024 // (32 * 1024)


def test_ack_waits_for_fsync(wal_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wal = open_wal(wal_path)
    gate = threading.Event()
    real_fsync = file_wal_module.fsync_data

    def slow_fsync(fd: int) -> None:
        assert gate.wait(10)
        real_fsync(fd)

    monkeypatch.setattr(file_wal_module, "fsync_data", slow_fsync)
    try:
        future = wal.append(b"payload")
        time.sleep(0.2)
        assert not future.done(), "acknowledged before fsync returned"
        gate.set()
        assert future.result(timeout=10).offset == 0
    finally:
        gate.set()
        wal.close()


def test_fsync_failure_fails_batch_and_stops_wal(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = open_wal(wal_path)
    try:
        append_sync(wal, b"ok")

        def broken_fsync(fd: int) -> None:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(file_wal_module, "fsync_data", broken_fsync)
        with pytest.raises(WALError, match="Input/output"):
            wal.append(b"lost").result(timeout=10)
        with pytest.raises(WALError, match="failed"):
            wal.append(b"after")
    finally:
        wal.close()


def test_queue_backpressure_times_out(wal_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    fsync_entered = threading.Event()
    real_fsync = file_wal_module.fsync_data

    def blocked_fsync(fd: int) -> None:
        fsync_entered.set()
        assert gate.wait(10)
        real_fsync(fd)

    def wait_until(predicate) -> None:  # bounded: the writer thread answers in ms
        deadline = time.monotonic() + 10
        while not predicate():
            assert time.monotonic() < deadline, "writer thread did not get there"
            time.sleep(0.005)

    # while the committer's fsync is stuck, appends wait in the queue
    wal = open_wal(
        wal_path,
        max_record_bytes=12 * 1024,
        max_batch_bytes=16 * 1024,
        max_queue_bytes=64 * 1024,
    )
    monkeypatch.setattr(file_wal_module, "fsync_data", blocked_fsync)
    try:
        # Each step waits for the committer thread's state instead of sleeping: a committer
        # slower than a fixed sleep merged batches, so the queue was not at its bound when
        # the last append came (it passed, or an earlier one timed out).
        first = wal.append(bytes(10_000))  # batch 1: written, its fsync is stuck
        assert fsync_entered.wait(10)
        wait_until(lambda: not wal._queue)
        second = [wal.append(bytes(10_000))]  # queued behind the stuck fsync
        queued = []
        record_bytes = RECORD_HEADER_SIZE_BYTES + 10_000
        while wal._queued_bytes + record_bytes <= 64 * 1024:  # fill the queue to its bound
            queued.append(wal.append(bytes(10_000)))
        assert queued
        assert not any(f.done() for f in [first, *second, *queued])
        # append never blocks (its caller may be the event loop): a full queue says so at
        # once, with the signal that tells when it drained
        started = time.monotonic()
        with pytest.raises(WALQueueFullError) as full:
            wal.append(bytes(10_000))
        assert time.monotonic() - started < 0.1
        assert not wal.has_room(record_bytes)
        assert not full.value.room.wait(full.value.generation, 0.05)  # still stuck
        # a worker thread may wait for room instead, bounded
        started = time.monotonic()
        with pytest.raises(WALQueueTimeoutError):
            wal.append_waiting(bytes(10_000), 0.3)
        assert time.monotonic() - started >= 0.25
        gate.set()
        for f in [first, *second, *queued]:
            f.result(timeout=10)
        # the drained queue woke the waiters: room again
        assert full.value.room.wait(full.value.generation, 10)
        assert wal.has_room(record_bytes)
        wal.append_waiting(bytes(10_000), 5).result(timeout=10)
    finally:
        gate.set()
        wal.close()


def test_appends_during_a_slow_fsync_share_the_next_one(
    wal_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends that arrive while an fdatasync is slow are all made durable by the next
    fdatasync (not one more per append), and none is acknowledged early."""
    gate = threading.Event()
    real_fsync = file_wal_module.fsync_data

    def slow_fsync(fd: int) -> None:
        assert gate.wait(10)
        real_fsync(fd)

    wal = open_wal(wal_path)
    monkeypatch.setattr(file_wal_module, "fsync_data", slow_fsync)
    try:
        start = wal.fsync_count
        first = wal.append(b"first")
        time.sleep(0.05)
        later = []
        for i in range(5):  # each queued while the first fsync waits
            later.append(wal.append(b"later-%d" % i))
            time.sleep(0.05)
        assert not any(f.done() for f in [first, *later])
        gate.set()
        for f in [first, *later]:
            f.result(timeout=10)
        assert wal.fsync_count - start == 2
        assert wal.batch_count == 2
        assert [r.data for r in wal.recover()][-6:] == [
            b"first",
            *(b"later-%d" % i for i in range(5)),
        ]
    finally:
        gate.set()
        wal.close()


# ---------------------------------------------------------------------------- torn tails
def _write_records(path: Path, n: int, size: int = 200, **overrides) -> list:
    with open_wal(path, **overrides) as wal:
        return [f.result(timeout=10) for f in [wal.append(bytes([i]) * size) for i in range(n)]]


@pytest.mark.parametrize("damage", ["body_byte", "header_byte", "truncated_zeros"])
def test_torn_tail_is_dropped_and_overwritten(wal_path: Path, damage: str) -> None:
    results = _write_records(wal_path, 10)
    last = results[-1]
    if damage == "body_byte":
        patch_file(wal_path, file_pos(last.offset) + RECORD_HEADER_SIZE_BYTES + 50, b"\xff")
    elif damage == "header_byte":
        patch_file(wal_path, file_pos(last.offset) + 9, b"\x7f")
    else:  # the tail of the record never reached the disk
        patch_file(wal_path, file_pos(last.offset) + 100, bytes(last.size_bytes - 100))
    with open_wal(wal_path) as wal:
        got = recovered(wal)
        assert got == [(r.offset, bytes([i]) * 200) for i, r in enumerate(results[:-1])]
        assert wal.end_offset == last.offset
        new = append_sync(wal, b"replacement")
        assert new.offset == last.offset
    with open_wal(wal_path) as wal:
        got = recovered(wal)
        assert got[-1] == (last.offset, b"replacement")
        assert len(got) == 10


@pytest.mark.parametrize(("align", "size"), [(0, 200), (4096, 4096 - RECORD_HEADER_SIZE_BYTES)])
def test_intact_records_after_a_torn_one_never_reappear(
    wal_path: Path, align: int, size: int
) -> None:
    """Records after a corrupt one (same torn batch) must not come back behind new records."""
    results = _write_records(wal_path, 10, size, align_bytes=align)
    torn = results[5]
    patch_file(wal_path, file_pos(torn.offset) + RECORD_HEADER_SIZE_BYTES + 1, b"\xee")
    with open_wal(wal_path, align_bytes=align) as wal:
        assert len(recovered(wal)) == 5
        # same size as the torn record (and aligned: no padding), so the chain now reaches
        # exactly the offset of the intact, never-acknowledged record 6
        assert append_sync(wal, b"n" * size).next_offset == results[6].offset
        assert wal.end_offset == results[6].offset
    with open_wal(wal_path, align_bytes=align) as wal:
        got = recovered(wal)
        assert [d for _, d in got] == [bytes([i]) * size for i in range(5)] + [b"n" * size]


def test_stale_record_from_a_previous_lap_is_not_recovered(wal_path: Path) -> None:
    # a valid record header whose logical offset is one lap behind must end the chain
    with open_wal(wal_path) as wal:
        append_sync(wal, b"a" * 100)
        end = wal.end_offset
    body = b"z" * 50
    import crc32c

    stale = (
        encode_record_header(
            len(body), end - CAPACITY + RECORD_HEADER_SIZE_BYTES, crc32c.crc32c(body)
        )
        + body
    )
    patch_file(wal_path, file_pos(end), stale)
    with open_wal(wal_path) as wal:
        assert recovered(wal) == [(0, b"a" * 100)]


# ---------------------------------------------------------------------------- header slots
def _read_slot(path: Path, position: int, cls):
    with open(path, "rb") as f:
        f.seek(position)
        return cls.decode(f.read(64))


def test_corrupt_reservation_slot_falls_back_to_the_other(wal_path: Path) -> None:
    _write_records(wal_path, 3)
    with open_wal(wal_path, epoch=2):  # writes reservation seq 2 into slot 0
        pass
    slots = [_read_slot(wal_path, p, Reservation) for p in RESERVATION_SLOT_POSITIONS]
    newest = max(slots, key=lambda s: s.seq)
    assert newest.node_epoch == 2
    patch_file(wal_path, newest.slot_position + 20, b"\x00\x01\x02")
    # the older slot (epoch 1) is used: epoch 1 may open again, records intact
    with open_wal(wal_path, epoch=1) as wal:
        assert len(recovered(wal)) == 3
    # both slots broken -> unreadable
    for p in RESERVATION_SLOT_POSITIONS:
        patch_file(wal_path, p + 20, b"\x00\x01\x02")
    with pytest.raises(WALCorruptError, match="reservation"):
        open_wal(wal_path, epoch=5)


def test_corrupt_state_slot_falls_back_to_older_trim(wal_path: Path) -> None:
    with open_wal(wal_path) as wal:
        results = [append_sync(wal, b"r%d" % i) for i in range(10)]
        wal.trim(results[3].offset)
        wal.trim(results[6].offset)
    slots = [_read_slot(wal_path, p, WALState) for p in STATE_SLOT_POSITIONS]
    newest = max(slots, key=lambda s: s.seq)
    assert newest.trim_offset == results[6].offset
    patch_file(wal_path, newest.slot_position + 30, b"\xff\xff")
    with open_wal(wal_path) as wal:
        # the older trim point is used: more records than after the last trim, none lost
        assert wal.start_offset == results[3].offset
        assert [d for _, d in recovered(wal)] == [b"r%d" % i for i in range(3, 10)]


# ---------------------------------------------------------------------------- ring reuse
def test_ring_wraps_after_trim(wal_path: Path) -> None:
    capacity = 64 * 1024
    kw = dict(
        capacity=capacity, max_batch_bytes=16 * 1024, max_record_bytes=8 * 1024, align_bytes=0
    )
    with open_wal(wal_path, **kw) as wal:
        first = [append_sync(wal, bytes([i]) * 1100) for i in range(50)]  # ~56 KB
        wal.trim(first[40].offset)
        second = [append_sync(wal, bytes([100 + i]) * 1100) for i in range(30)]
        assert second[-1].next_offset > capacity
        assert any(r.offset % capacity + r.size_bytes > capacity for r in second), (
            "no record straddles"
        )
        expected = [(r.offset, bytes([40 + i]) * 1100) for i, r in enumerate(first[40:])]
        expected += [(r.offset, bytes([100 + i]) * 1100) for i, r in enumerate(second)]
        assert recovered(wal) == expected
    with open_wal(wal_path, **kw) as wal:
        assert recovered(wal) == expected
        assert wal.start_offset == first[40].offset


def test_ring_wraps_with_padding(wal_path: Path) -> None:
    capacity = 64 * 1024
    kw = dict(
        capacity=capacity, max_batch_bytes=16 * 1024, max_record_bytes=8 * 1024, align_bytes=4096
    )
    with open_wal(wal_path, **kw) as wal:
        first = [append_sync(wal, bytes([i]) * 3000) for i in range(16)]  # one 4 KiB slot each
        with pytest.raises(WALFullError):
            wal.append(b"x")
        wal.trim(first[10].offset)
        second = [append_sync(wal, bytes([100 + i]) * 3000) for i in range(10)]
        assert second[-1].offset > capacity
        expected = [(r.offset, bytes([10 + i]) * 3000) for i, r in enumerate(first[10:])]
        expected += [(r.offset, bytes([100 + i]) * 3000) for i, r in enumerate(second)]
        assert recovered(wal) == expected
    with open_wal(wal_path, **kw) as wal:
        assert recovered(wal) == expected


def test_padding_never_takes_space_of_admitted_appends(wal_path: Path) -> None:
    kw = dict(
        capacity=64 * 1024, max_batch_bytes=16 * 1024, max_record_bytes=8 * 1024, align_bytes=4096
    )
    with open_wal(wal_path, **kw) as wal:
        futures = []
        with pytest.raises(WALFullError):
            for _ in range(200):  # bounded: 64 KiB / 1 KiB
                futures.append(wal.append(bytes(1000)))
        assert len(futures) >= 60
        for f in futures:  # every admitted append succeeds
            f.result(timeout=10)
        assert wal.used_bytes <= 64 * 1024


@pytest.mark.parametrize(("align", "fits"), [(0, range(60, 70)), (4096, [16])])
def test_wal_full_then_trim_frees_space(wal_path: Path, align: int, fits) -> None:
    capacity = 64 * 1024
    kw = dict(
        capacity=capacity, max_batch_bytes=16 * 1024, max_record_bytes=8 * 1024, align_bytes=align
    )
    with open_wal(wal_path, **kw) as wal:
        results = []
        with pytest.raises(WALFullError, match="trim"):
            for _i in range(1000):  # bounded: 64 KiB / 1 KiB records
                results.append(append_sync(wal, bytes(1000)))
        assert len(results) in fits
        assert wal.used_bytes <= capacity
        wal.trim(results[10].offset)
        append_sync(wal, bytes(1000))
        with pytest.raises(WALFullError):
            for _ in range(20):
                append_sync(wal, bytes(1000))


def test_capacity_reuse_many_laps(wal_path: Path) -> None:
    capacity = 64 * 1024
    kw = dict(capacity=capacity, max_batch_bytes=16 * 1024, max_record_bytes=8 * 1024)
    size_before = None
    with open_wal(wal_path, **kw) as wal:
        size_before = wal_path.stat().st_size
        total = 0
        for lap in range(12):
            futures = [wal.append(b"%d-%d" % (lap, i) + bytes(3000)) for i in range(10)]
            last = [f.result(timeout=10) for f in futures][-1]
            total += 10 * (3000 + RECORD_HEADER_SIZE_BYTES)
            assert [d[:6] for _, d in recovered(wal)][0].startswith(b"%d-0" % lap)
            wal.trim(last.next_offset)  # a padding record may follow the last record
            assert wal.used_bytes < 4096 + RECORD_HEADER_SIZE_BYTES
            wal.trim(wal.end_offset)
            assert wal.used_bytes == 0
        assert total > 4 * capacity
        assert wal.end_offset > 4 * capacity
    assert wal_path.stat().st_size == size_before


def test_trim_validation_and_persistence(wal_path: Path) -> None:
    with open_wal(wal_path) as wal:
        results = [append_sync(wal, b"x" * 100) for _ in range(5)]
        with pytest.raises(ValueError, match="durable end"):
            wal.trim(wal.end_offset + 1)
        with pytest.raises(ValueError, match="record boundary"):
            wal.trim(results[2].offset + 7)
        with pytest.raises(ValueError, match="record boundary"):  # inside a padding record
            wal.trim(results[2].next_offset + 100)
        wal.trim(results[2].offset)
        wal.trim(results[1].offset)  # going back is a no-op
        assert wal.start_offset == results[2].offset
        assert wal.used_bytes == wal.end_offset - results[2].offset
    with open_wal(wal_path) as wal:
        assert wal.start_offset == results[2].offset
        assert [o for o, _ in recovered(wal)] == [r.offset for r in results[2:]]
        wal.trim(results[-1].next_offset)  # the padding record's offset is a boundary too
        assert wal.used_bytes == padding_bytes(results[-1].next_offset, 4096)
    with open_wal(wal_path) as wal:
        assert wal.start_offset == results[-1].next_offset
        assert recovered(wal) == []
        wal.trim(wal.end_offset)
        assert wal.used_bytes == 0


def test_random_operations_match_a_model(wal_path: Path) -> None:
    rng = random.Random(7)
    capacity = 64 * 1024
    kw = dict(capacity=capacity, max_batch_bytes=16 * 1024, max_record_bytes=4 * 1024)
    model: list[tuple[int, bytes]] = []
    wal = open_wal(wal_path, **kw)
    try:
        for _step in range(300):
            op = rng.random()
            if op < 0.7:
                data = rng.randbytes(rng.randint(0, 4000))
                try:
                    result = append_sync(wal, data)
                except WALFullError:
                    assert wal.used_bytes + RECORD_HEADER_SIZE_BYTES + len(data) > capacity
                    continue
                model.append((result.offset, data))
            elif op < 0.9 and model:
                keep = rng.randint(0, len(model))
                up_to = model[keep][0] if keep < len(model) else wal.end_offset
                wal.trim(up_to)
                model = model[keep:]
            else:
                wal.close()
                wal = open_wal(wal_path, **kw)
                assert recovered(wal) == model
        assert recovered(wal) == model
    finally:
        wal.close()


# ---------------------------------------------------------------------------- reservation
def test_take_over_fences_the_owner(wal_path: Path) -> None:
    owner = open_wal(wal_path, node_id=1, epoch=1)
    try:
        acked = [append_sync(owner, b"a%d" % i) for i in range(20)]
        with pytest.raises(WALTakeoverRefusedError):
            take_over(wal_path, 2, 1)
        with take_over(wal_path, 2, 2) as recovery:
            assert recovery.owner == (2, 2)
            with pytest.raises(WALFencedError):
                owner.append(b"after takeover").result(timeout=10)
            with pytest.raises(WALFencedError):
                owner.append(b"again")
            with pytest.raises(WALFencedError):
                owner.trim(acked[3].offset)
            assert owner.fenced
            got = recovered(recovery)
            assert got[: len(acked)] == [(r.offset, b"a%d" % i) for i, r in enumerate(acked)]
            # the fenced batch was written (never acknowledged): it may be recovered, nothing else
            assert [d for _, d in got[len(acked) :]] in ([], [b"after takeover"])
            last_end = got[-1][0] + RECORD_HEADER_SIZE_BYTES + len(got[-1][1])
            assert recovery.end_offset == last_end + padding_bytes(last_end, 4096)
            recovery.trim(acked[10].offset)
            with take_over(wal_path, 3, 3) as third:
                assert third.start_offset == acked[10].offset
                with pytest.raises(WALFencedError):
                    recovery.trim(acked[12].offset)
    finally:
        owner.close()


def test_a_recoverer_retrying_its_failover_takes_the_wal_again(wal_path: Path) -> None:
    """A failover that failed half way (an upload error after the takeover) is retried by
    the same node with the same failover epoch: it must get the WAL again, from where its
    last trim left it; any other node at that epoch is still refused."""
    with open_wal(wal_path, node_id=1, epoch=1) as owner:
        acked = [append_sync(owner, b"r%d" % i) for i in range(6)]
    with take_over(wal_path, 2, 2) as first:
        first.trim(acked[2].offset)  # uploaded part of it, then failed
    with pytest.raises(WALTakeoverRefusedError):
        take_over(wal_path, 3, 2)
    with take_over(wal_path, 2, 2) as retry:
        assert [r.data for r in retry.recover()] == [b"r%d" % i for i in range(2, 6)]
    with pytest.raises(WALTakeoverRefusedError):
        take_over(wal_path, 2, 1)


def test_first_batch_after_a_trim_checks_ownership_before_writing(wal_path: Path) -> None:
    owner = open_wal(wal_path, node_id=1, epoch=1)
    try:
        acked = [append_sync(owner, b"a%d" % i) for i in range(10)]
        owner.trim(acked[4].offset)
        acked_end = owner.end_offset
        with take_over(wal_path, 2, 2) as recovery:
            with pytest.raises(WALFencedError):
                owner.append(b"must not be written").result(timeout=10)
            # nothing was written: the chain ends at the last acknowledged record
            assert [d for _, d in recovered(recovery)] == [b"a%d" % i for i in range(4, 10)]
            assert recovery.end_offset == acked_end
    finally:
        owner.close()


def test_open_respects_reservation_epochs(wal_path: Path) -> None:
    with open_wal(wal_path, node_id=1, epoch=1) as wal:
        append_sync(wal, b"one")
    with open_wal(wal_path, node_id=1, epoch=1) as wal:  # same owner again
        assert len(recovered(wal)) == 1
    with open_wal(wal_path, node_id=1, epoch=3) as wal:  # restart with a new epoch
        append_sync(wal, b"two")
    with pytest.raises(WALFencedError, match="epoch 3"):
        open_wal(wal_path, node_id=1, epoch=2)
    with pytest.raises(WALFencedError):
        open_wal(wal_path, node_id=2, epoch=3)  # same epoch, other node
    with take_over(wal_path, 7, 4) as recovery:
        assert [r.data for r in recovery.recover()] == [b"one", b"two"]
    with pytest.raises(WALFencedError):
        open_wal(wal_path, node_id=1, epoch=4)
    with open_wal(wal_path, node_id=1, epoch=5) as wal:
        assert [d for _, d in recovered(wal)] == [b"one", b"two"]


def test_many_wals_in_one_process_share_metrics(tmp_path: Path) -> None:
    wals = [
        open_wal(
            tmp_path / f"w{i}", capacity=64 * 1024, max_batch_bytes=16 * 1024, max_record_bytes=1024
        )
        for i in range(5)
    ]
    try:
        for w in wals:
            append_sync(w, b"x")
    finally:
        for w in wals:
            w.close()
    names = {m.name for m in REGISTRY.collect()}
    assert {
        "automq_wal_append_bytes",
        "automq_wal_fsyncs",
        "automq_wal_append_latency_seconds",
    } <= names


# ---------------------------------------------------------------------------- formats
def test_record_header_format() -> None:
    raw = encode_record_header(10, 1024, 0xDEADBEEF)
    assert len(raw) == 24 and raw[:4] == b"AWLR"
    header = decode_record_header(raw)
    assert header is not None and (header.body_length, header.body_offset, header.body_crc32c) == (
        10,
        1024,
        0xDEADBEEF,
    )
    assert header.record_offset == 1000
    for i in range(24):
        damaged = bytearray(raw)
        damaged[i] ^= 0x10
        assert decode_record_header(bytes(damaged)) is None


def test_appends_with_writer_wakeups_held_make_one_group_commit(wal_path: Path) -> None:
    """A produce request's partitions are appended with the committer's wakeup held: it
    is not woken by the first append (and does not commit it alone), and takes all of
    them in one group commit when the block ends."""
    from dataplane.runtime import writer_wakeups_held

    wal = open_wal(wal_path)
    try:
        wal.append(b"warm-up").result(timeout=10)
        deadline = time.monotonic() + 10  # the committer goes back to waiting in ms
        while not wal.writer_idle and time.monotonic() < deadline:
            time.sleep(0.001)
        assert wal.writer_idle
        before = wal.batch_count
        with writer_wakeups_held():
            futures = [wal.append(b"partition-0")]
            time.sleep(0.05)  # (a committer woken by the append would take it alone now)
            futures += [wal.append(b"partition-%d" % i) for i in range(1, 6)]
            with writer_wakeups_held():  # nested: the outermost block wakes it
                futures.append(wal.append(b"nested"))
            assert wal.writer_idle  # not woken: nothing was committed
            assert not any(f.done() for f in futures)
        for f in futures:
            f.result(timeout=10)
        assert wal.batch_count == before + 1
        assert [r.data for r in wal.recover()][-7:] == [
            *(b"partition-%d" % i for i in range(6)),
            b"nested",
        ]
    finally:
        wal.close()
