"""The durable shard store and the writer/reader on in-process stores: write-once across
restarts, the fill mark, torn tails, bounds; writes with 2 stores failing, a forced 3/3 split,
a late shard after a reader's fill."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from dataplane.erasure.holes import AcceptResult, Ack, WriteOutcome
from dataplane.erasure.reader import ErasureReader, ReadUnavailableError
from dataplane.erasure.shard_format import JUNK_MARKER
from dataplane.erasure.store import (
    LOG_FILE,
    PREALLOCATE_MIN_BYTES,
    HoleStore,
    StoreFullError,
    WriteAnswer,
    used_log_bytes,
)
from dataplane.erasure.writer import ErasureWriter, WriteFailedError

STREAM = 5


def test_holes_are_write_once_and_survive_a_restart(tmp_path: Path) -> None:
    store = HoleStore(tmp_path)
    assert store.write(STREAM, 10, b"first").result is AcceptResult.ACCEPTED
    assert store.write(STREAM, 10, b"first").result is AcceptResult.ACCEPTED  # idempotent
    taken = store.write(STREAM, 10, b"second")
    assert (taken.result, taken.content) == (AcceptResult.TAKEN, b"first")
    assert store.fill_below(STREAM, 100) == 100
    assert store.fill_below(STREAM, 50) == 100  # never lowered
    store.close()

    store = HoleStore(tmp_path)
    assert store.read(STREAM, 10) == b"first"
    assert store.write(STREAM, 10, b"second").result is AcceptResult.TAKEN
    # an empty hole below the fill mark holds junk: a late shard is refused
    assert store.write(STREAM, 20, b"late") == WriteAnswer(AcceptResult.TAKEN, JUNK_MARKER, 100)
    assert store.read(STREAM, 20) == JUNK_MARKER
    assert store.write(STREAM, 200, b"new").result is AcceptResult.ACCEPTED
    assert store.read(STREAM + 1, 20) is None  # streams are independent
    store.close()


def test_a_torn_tail_is_cut_and_the_store_stays_writable(tmp_path: Path) -> None:
    store = HoleStore(tmp_path)
    store.write(STREAM, 1, b"kept")
    store.write(STREAM, 2, b"torn")
    store.close()
    path = tmp_path / LOG_FILE
    os.truncate(path, used_log_bytes(tmp_path) - 2)  # the file ends inside the last record
    store = HoleStore(tmp_path)
    assert store.read(STREAM, 1) == b"kept"
    assert store.read(STREAM, 2) is None
    assert store.write(STREAM, 2, b"again").result is AcceptResult.ACCEPTED
    store.close()
    assert HoleStore(tmp_path).read(STREAM, 2) == b"again"


def test_the_log_grows_into_zeroed_room_and_replay_ends_at_the_zeros(tmp_path: Path) -> None:
    store = HoleStore(tmp_path)
    path = tmp_path / LOG_FILE
    # room is zeroed ahead of the appends at open: the file is longer than its records
    assert used_log_bytes(tmp_path) == 0 and path.stat().st_size == PREALLOCATE_MIN_BYTES
    shard = os.urandom(4096)
    for offset in range(200):  # ~0.8 MiB: past the first room, so it is extended
        store.write(STREAM, offset, shard)
    deadline = time.monotonic() + 10
    while path.stat().st_size - used_log_bytes(tmp_path) < PREALLOCATE_MIN_BYTES // 2:
        assert time.monotonic() < deadline, "the room was never extended"
        time.sleep(0.01)
    assert store.extensions >= 1
    used = used_log_bytes(tmp_path)
    assert path.read_bytes()[used:] == bytes(path.stat().st_size - used)  # zeros only
    store.close()
    store = HoleStore(tmp_path)  # replay stops at the zeros; appends continue after them
    assert store.hole_count == 200 and store.read(STREAM, 199) == shard
    assert store.write(STREAM, 200, b"after reopen").result is AcceptResult.ACCEPTED
    store.close()
    store = HoleStore(tmp_path)
    assert store.hole_count == 201 and store.read(STREAM, 200) == b"after reopen"
    store.close()


def test_a_torn_record_followed_by_zeros_ends_the_log(tmp_path: Path) -> None:
    store = HoleStore(tmp_path)
    store.write(STREAM, 1, b"kept")
    store.write(STREAM, 2, b"torn" * 10)
    store.close()
    end = used_log_bytes(tmp_path)
    with open(tmp_path / LOG_FILE, "r+b") as f:  # the last sector of the append never landed
        f.seek(end - 8)
        f.write(bytes(8))
    store = HoleStore(tmp_path)
    assert store.read(STREAM, 1) == b"kept" and store.read(STREAM, 2) is None
    assert store.write(STREAM, 2, b"again").result is AcceptResult.ACCEPTED
    store.close()
    store = HoleStore(tmp_path)
    assert store.read(STREAM, 2) == b"again" and store.hole_count == 2
    store.close()


def test_a_whole_record_after_a_torn_one_never_comes_back(tmp_path: Path) -> None:
    """A crash can land a later append whole and an earlier one torn (neither was
    answered). Open must erase the later one: otherwise, once an append of the torn one's
    length overwrites it, replay would read on into the stale record."""
    donor = HoleStore(tmp_path / "donor")  # the two appends' bytes, as the store writes them
    donor.write(STREAM, 2, b"A" * 100)
    donor.write(STREAM, 3, b"stale")
    donor.close()
    records = (tmp_path / "donor" / LOG_FILE).read_bytes()[: used_log_bytes(tmp_path / "donor")]
    store = HoleStore(tmp_path / "s")
    store.write(STREAM, 1, b"kept")
    store.close()
    end = used_log_bytes(tmp_path / "s")
    torn = bytearray(records)
    torn[50] ^= 0xFF  # the first append is torn, the second whole
    with open(tmp_path / "s" / LOG_FILE, "r+b") as f:
        f.seek(end)
        f.write(torn)
    store = HoleStore(tmp_path / "s")
    assert store.read(STREAM, 2) is None and store.read(STREAM, 3) is None
    # the same length as the torn record: it ends exactly where the stale one began
    assert store.write(STREAM, 4, b"B" * 100).result is AcceptResult.ACCEPTED
    store.close()
    store = HoleStore(tmp_path / "s")
    assert store.read(STREAM, 4) == b"B" * 100
    assert store.read(STREAM, 3) is None and store.hole_count == 2
    store.close()


def test_the_index_is_bounded(tmp_path: Path) -> None:
    store = HoleStore(tmp_path, max_holes=2)
    store.write(STREAM, 1, b"a")
    store.write(STREAM, 2, b"b")
    with pytest.raises(StoreFullError):
        store.write(STREAM, 3, b"c")
    assert store.write(STREAM, 1, b"x").result is AcceptResult.TAKEN  # answers still work
    with pytest.raises(ValueError):
        store.write(STREAM, 4, b"")
    store.close()


def test_range_reads_respect_their_limits(tmp_path: Path) -> None:
    store = HoleStore(tmp_path)
    for offset in (30, 10, 20, 40):
        store.write(STREAM, offset, bytes(10))
    answer = store.read_range(STREAM, 10, 40, max_holes=2, max_bytes=1000)
    assert [o for o, _ in answer.holes] == [10, 20] and answer.complete_below == 30
    answer = store.read_range(STREAM, 0, 100, max_holes=100, max_bytes=15)
    assert [o for o, _ in answer.holes] == [10, 20] and answer.complete_below == 30
    answer = store.read_range(STREAM, 15, 100, max_holes=100, max_bytes=1000)
    assert [o for o, _ in answer.holes] == [20, 30, 40] and answer.complete_below == 100
    store.close()


class _Down:
    """A store that is unreachable."""

    def __getattr__(self, name: str):
        def fail(*_: object) -> None:
            raise ConnectionRefusedError("down")

        return fail


@pytest.fixture
def stores(tmp_path: Path):
    opened = [HoleStore(tmp_path / f"store-{i}") for i in range(6)]
    yield opened
    for store in opened:
        store.close()


class _Clock:
    def __init__(self) -> None:
        self.now = 10**18

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


def test_writes_succeed_with_two_stores_down_and_read_back(stores: list[HoleStore]) -> None:
    clock = _Clock()
    live = [*stores[:4], _Down(), _Down()]
    with (
        ErasureWriter(live, STREAM, clock_ns=clock) as writer,
        ErasureReader(live, STREAM, clock_ns=clock) as reader,
    ):
        offsets = [writer.append(b"record-%d" % i) for i in range(20)]
        assert offsets == sorted(set(offsets))
        clock.now += 10**9  # past the read delay
        result = reader.read(0)
    assert result.blocked_at is None
    assert result.records == [(o, b"record-%d" % i) for i, o in enumerate(offsets)]


def test_three_stores_down_fail_the_write_and_the_read(stores: list[HoleStore]) -> None:
    live = [*stores[:3], _Down(), _Down(), _Down()]
    with ErasureWriter(live, STREAM, max_attempts=2) as writer:
        with pytest.raises(WriteFailedError, match="no offset won in 2 attempts"):
            writer.append(b"x")
    # the failed attempts left 3 shards each, and the down stores might hold a 4th: a reader
    # must stop at the first of them rather than skip it
    with ErasureReader(live, STREAM, read_delay_ms=0) as reader:
        result = reader.read(0)
        assert result.records == [] and result.blocked_at is not None
        assert result.next_offset == result.blocked_at
    # with 4 stores down nothing can be decided at all
    with ErasureReader([*stores[:2], *[_Down()] * 4], STREAM, read_delay_ms=0) as reader:
        with pytest.raises(ReadUnavailableError, match="only 2 of 6 shard stores answered"):
            reader.read(0)


def test_a_forced_three_three_split_fails_both_writers_and_stays_void(
    stores: list[HoleStore],
) -> None:
    clock = _Clock()
    a = ErasureWriter(stores, STREAM, writer_id=1, max_attempts=1, clock_ns=clock)
    b = ErasureWriter(stores, STREAM, writer_id=2, max_attempts=1, clock_ns=clock)
    offset = clock.now
    for i, frame in enumerate(a.shards(offset, b"from-a")[:3]):
        stores[i].write(STREAM, offset, frame)
    for i, frame in enumerate(b.shards(offset, b"from-b")[3:], start=3):
        stores[i].write(STREAM, offset, frame)
    result_a = a.write_at(offset, b"from-a")
    result_b = b.write_at(offset, b"from-b")
    assert result_a.outcome is WriteOutcome.LOST and result_b.outcome is WriteOutcome.LOST
    # the writer stops waiting once k holes are out of reach: its own holes may still be
    # unanswered (PENDING) then, but none is refused and the other writer's three are TAKEN
    assert result_a.acks[3:] == (Ack.TAKEN,) * 3
    assert set(result_a.acks[:3]) <= {Ack.ACCEPTED, Ack.PENDING}
    assert result_b.acks[:3] == (Ack.TAKEN,) * 3
    assert set(result_b.acks[3:]) <= {Ack.ACCEPTED, Ack.PENDING}
    clock.now += 10**9
    with ErasureReader(stores, STREAM, clock_ns=clock) as reader:
        assert reader.read(0).records == []
        assert reader.decide_offset(offset).kind.value == "void"
    # with retries, both writers get an offset of their own
    a.max_attempts = b.max_attempts = 8
    won = {a.append(b"from-a"), b.append(b"from-b")}
    assert len(won) == 2
    a.close()
    b.close()


def test_a_late_fourth_shard_after_a_fill_never_makes_the_offset_appear(
    stores: list[HoleStore],
) -> None:
    clock = _Clock()
    writer = ErasureWriter(stores, STREAM, writer_id=9, clock_ns=clock)
    offset = clock.now
    frames = writer.shards(offset, b"slow write")
    for i in range(3):
        stores[i].write(STREAM, offset, frames[i])
    clock.now += 10**9
    with ErasureReader(stores, STREAM, clock_ns=clock) as reader:
        first = reader.read(0)
        assert first.records == [] and first.blocked_at is None
        # the delayed shards arrive: the holes hold junk, the store refuses them
        for i in (3, 4):
            assert stores[i].write(STREAM, offset, frames[i]).result is AcceptResult.TAKEN
        assert writer.write_at(offset, b"slow write").outcome is WriteOutcome.LOST
        assert reader.read(0).records == []
    writer.close()


def test_a_writer_whose_clock_lags_the_readers_moves_past_the_fill_mark(
    stores: list[HoleStore],
) -> None:
    reader_clock = _Clock()
    writer_clock = _Clock()
    writer_clock.now = reader_clock.now - 60 * 10**9  # a minute behind
    with ErasureReader(stores, STREAM, clock_ns=reader_clock) as reader:
        assert reader.read(0).records == []  # fills below the reader's visible end
    mark = stores[0].fill_below(STREAM, 0)  # the fill mark, unchanged
    assert mark > writer_clock.now
    with ErasureWriter(stores, STREAM, clock_ns=writer_clock, max_attempts=2) as writer:
        offset = writer.append(b"from the past")
    assert offset > mark
    reader_clock.now = offset + 10**9
    with ErasureReader(stores, STREAM, clock_ns=reader_clock) as reader:
        assert reader.read(0).records == [(offset, b"from the past")]


class _LosesFirstAnswer:
    """A store that keeps the first shard it gets but whose answer is lost (a timeout)."""

    def __init__(self, store: HoleStore):
        self.store = store
        self.lost = False

    def write(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer:
        answer = self.store.write(stream_id, offset, data)
        if not self.lost:
            self.lost = True
            raise TimeoutError("answer lost")
        return answer

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def test_an_unanswered_shard_is_resent_at_the_same_offset_not_duplicated(
    stores: list[HoleStore],
) -> None:
    clock = _Clock()
    flaky = _LosesFirstAnswer(stores[3])
    live = [*stores[:3], flaky, _Down(), _Down()]
    with ErasureWriter(live, STREAM, clock_ns=clock) as writer:
        offset = writer.append(b"once")
        assert flaky.lost
    clock.now += 10**9
    with ErasureReader(stores, STREAM, clock_ns=clock) as reader:
        # stores 4 and 5 were down for the writer; the reader sees them empty and fills them
        assert reader.read(0).records == [(offset, b"once")]


def test_concurrent_writes_share_fsyncs_and_answers_wait_for_them(tmp_path: Path) -> None:
    release = threading.Event()
    calls: list[int] = []

    def slow_first_fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # the first group commit waits until every writer has appended
            assert release.wait(timeout=30)
        os.fsync(fd)

    store = HoleStore(tmp_path, fsync=slow_first_fsync)
    answers: dict[int, AcceptResult] = {}

    def write(n: int) -> None:
        # two threads per offset: exactly one is accepted
        answers[n] = store.write(STREAM, n // 2, b"writer-%d" % n).result

    threads = [threading.Thread(target=write, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while store.hole_count < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert answers == {}  # nobody answered before the fsync
    release.set()
    for t in threads:
        t.join(timeout=30)
    assert len(answers) == 16
    for offset in range(8):
        assert sorted(answers[n].value for n in (2 * offset, 2 * offset + 1)) == [
            "accepted",
            "taken",
        ]
    assert len(calls) <= 2  # one fsync for the first writer, one for everyone who waited
    store.close()
    reopened = HoleStore(tmp_path)
    for offset in range(8):
        winner = next(
            n for n in (2 * offset, 2 * offset + 1) if answers[n] is AcceptResult.ACCEPTED
        )
        assert reopened.read(STREAM, offset) == b"writer-%d" % winner
    reopened.close()


def test_a_failed_fsync_stops_all_answers(tmp_path: Path) -> None:
    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    store = HoleStore(tmp_path, fsync=failing)
    with pytest.raises(OSError, match="cannot be synced|Input/output"):
        store.write(STREAM, 1, b"a")
    with pytest.raises(OSError, match="cannot be synced"):
        store.read(STREAM, 1)
    store.close()


class _CountsFills:
    def __init__(self, store: HoleStore):
        self.store = store
        self.marks: list[int] = []

    def fill_below(self, stream_id: int, mark: int) -> int:
        self.marks.append(mark)
        return self.store.fill_below(stream_id, mark)

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def test_a_tailing_reader_fills_at_most_once_per_interval(stores: list[HoleStore]) -> None:
    clock = _Clock()
    counted = [_CountsFills(s) for s in stores]
    with ErasureWriter(stores, STREAM, clock_ns=clock) as writer:
        first = writer.append(b"first")
        clock.now += 10**9
        with ErasureReader(counted, STREAM, clock_ns=clock, min_fill_interval_ms=50) as reader:
            assert reader.read(0).records == [(first, b"first")]
            marks = set(counted[0].marks)
            second = writer.append(b"second")
            clock.now += 10 * 10**6  # 10 ms later: the last fill is reused
            again = reader.read(0)
            assert again.records == [(first, b"first")] and set(counted[0].marks) == marks
            assert again.next_offset <= second
            clock.now += 10**9  # later: a new fill, and the second record
            assert [p for _, p in reader.read(0).records] == [b"first", b"second"]
            assert len(set(counted[0].marks)) == 2
