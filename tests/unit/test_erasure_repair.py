"""Repairing decided writes that lack shards (issue #14), on in-process HoleStores: a write
won with exactly 4 of 6 shards gets its 2 missing shards back (also into holes a reader's
fill mark had made junk), so it survives 2 *other* stores being lost; offsets that are not
decided (void, 3 shards) are never repaired; bytes in a hole are never replaced; the pass
is rate-limited and resumes where it stopped."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dataplane.erasure.codec import ErasureCodec
from dataplane.erasure.holes import AcceptResult
from dataplane.erasure.reader import ErasureReader
from dataplane.erasure.repair import ErasureRepairer
from dataplane.erasure.shard_format import HEADER_BYTES, JUNK_MARKER
from dataplane.erasure.store import HoleStore
from dataplane.erasure.writer import ErasureWriter

STREAM = 7


class _Down:
    """A store that is unreachable."""

    def __getattr__(self, name: str):
        def fail(*_: object) -> None:
            raise ConnectionRefusedError("down")

        return fail


class _Clock:
    def __init__(self) -> None:
        self.now = 10**18

    def __call__(self) -> int:
        self.now += 1_000
        return self.now


@pytest.fixture
def stores(tmp_path: Path):
    opened = [HoleStore(tmp_path / f"store-{i}") for i in range(6)]
    yield opened
    for store in opened:
        store.close()


@pytest.fixture
def pool():
    with ThreadPoolExecutor(6) as executor:
        yield executor


def _repairer(view, pool, **kwargs) -> ErasureRepairer:
    return ErasureRepairer(view, STREAM, ErasureCodec(), pool, **kwargs)


def test_a_write_won_with_four_shards_is_repaired_and_survives_two_other_stores_lost(
    stores: list[HoleStore], pool: ThreadPoolExecutor
) -> None:
    clock = _Clock()
    # stores 4 and 5 are down while the writes are made: each wins with exactly 4 shards
    with ErasureWriter([*stores[:4], _Down(), _Down()], STREAM, clock_ns=clock) as writer:
        offsets = [writer.append(b"payload-%d" % i) for i in range(5)]
    assert all(stores[4].read(STREAM, o) is None for o in offsets)
    clock.now += 10**9
    # a reader passes them once all six answer again: stores 4 and 5 are filled (junk below
    # the mark), the writes are read from their 4 shards
    with ErasureReader(stores, STREAM, clock_ns=clock) as reader:
        assert reader.read(0).records == [(o, b"payload-%d" % i) for i, o in enumerate(offsets)]
    assert stores[4].read(STREAM, offsets[0]) == JUNK_MARKER  # junk by the fill mark
    lose_two = [_Down(), _Down(), *stores[2:]]
    # without repair, losing stores 0 and 1 leaves 2 shards visible: the reader must stop
    with ErasureReader(lose_two, STREAM, clock_ns=clock) as reader:
        assert reader.read(0).blocked_at == offsets[0]
    end = clock.now
    result = _repairer(stores, pool).repair_range(0, end)
    assert result.repaired_shards == 2 * len(offsets)
    assert result.next_offset == end and result.waiting_from is None
    # the repaired holes hold the very frames the writer would have written
    for i in (4, 5):
        assert stores[i].read(STREAM, offsets[0]) == writer.shards(offsets[0], b"payload-0")[i]
    # a second pass finds nothing to do
    assert _repairer(stores, pool).repair_range(0, clock.now).repaired_shards == 0
    # now two other stores may be lost: every write is still read, from stores 2..5
    with ErasureReader(lose_two, STREAM, clock_ns=clock) as reader:
        result_read = reader.read(0)
    assert result_read.blocked_at is None
    assert result_read.records == [(o, b"payload-%d" % i) for i, o in enumerate(offsets)]
    # the repaired holes survive a restart of their store
    stores[5].close()
    stores[5] = HoleStore(stores[5].directory)
    assert stores[5].read(STREAM, offsets[4]) == writer.shards(offsets[4], b"payload-4")[5]


def test_holes_on_unreachable_stores_are_reported_and_repaired_when_they_answer(
    stores: list[HoleStore], pool: ThreadPoolExecutor
) -> None:
    clock = _Clock()
    with ErasureWriter([*stores[:4], _Down(), _Down()], STREAM, clock_ns=clock) as writer:
        offset = writer.append(b"x" * 1000)
    # store 5 is still down for the repairer: store 4 is repaired, 5 is waited for
    end = clock.now + 10**9
    result = _repairer([*stores[:5], _Down()], pool).repair_range(0, end)
    assert result.repaired_shards == 1
    assert (result.waiting_from, result.waiting_on) == (offset, frozenset({5}))
    assert 5 not in result.listed
    result = _repairer(stores, pool).repair_range(0, end)
    assert result.repaired_shards == 1 and result.waiting_from is None
    assert stores[5].read(STREAM, offset) == writer.shards(offset, b"x" * 1000)[5]


def test_undecided_and_void_offsets_are_never_repaired_and_held_bytes_never_replaced(
    stores: list[HoleStore], pool: ThreadPoolExecutor
) -> None:
    clock = _Clock()
    a = ErasureWriter(stores, STREAM, writer_id=1, clock_ns=clock)
    b = ErasureWriter(stores, STREAM, writer_id=2, clock_ns=clock)
    split, three, junked = clock.now, clock.now + 10, clock.now + 20
    # a 3/3 split between two writers: void
    for i, frame in enumerate(a.shards(split, b"from-a")):
        if i < 3:
            stores[i].write(STREAM, split, frame)
    for i, frame in enumerate(b.shards(split, b"from-b")):
        if i >= 3:
            stores[i].write(STREAM, split, frame)
    # 3 shards of one write, 3 empty holes: not decided (a 4th could still land)
    for i, frame in enumerate(a.shards(three, b"three")[:3]):
        stores[i].write(STREAM, three, frame)
    # a won write whose other holes a reader filled with explicit junk, one by one
    frames = a.shards(junked, b"junked")
    for i in range(4):
        stores[i].write(STREAM, junked, frames[i])
    for i in (4, 5):
        stores[i].write(STREAM, junked, JUNK_MARKER)
    before = [store.read_range(STREAM, 0, 2**62, 100, 1 << 20).holes for store in stores]
    repairer = _repairer(stores, pool)
    result = repairer.repair_range(0, clock.now + 100)
    assert result.repaired_shards == 0
    assert repairer.stats.refused_shards == 0  # junk bytes are held: never even sent
    assert [store.read_range(STREAM, 0, 2**62, 100, 1 << 20).holes for store in stores] == before
    clock.now += 10**9
    with ErasureReader(stores, STREAM, clock_ns=clock) as reader:
        assert reader.read(0).records == [(junked, b"junked")]
    # after the fill the 3-shard write is void: the repairer still leaves it alone
    assert repairer.repair_range(0, clock.now).repaired_shards == 0
    with ErasureReader(stores, STREAM, clock_ns=clock) as reader:
        assert reader.read(0).records == [(junked, b"junked")]
    a.close()
    b.close()


class _Rotten:
    """A store whose whole-hole reads answer rotten bytes (its listing looks fine)."""

    def __init__(self, store: HoleStore):
        self.store = store

    def read(self, stream_id: int, offset: int) -> bytes | None:
        data = self.store.read(stream_id, offset)
        return None if data is None else data[:-1] + bytes([data[-1] ^ 0xFF])

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def test_a_rotten_shard_is_never_used_for_a_repair(
    stores: list[HoleStore], pool: ThreadPoolExecutor
) -> None:
    clock = _Clock()
    with ErasureWriter([*stores[:4], _Down(), _Down()], STREAM, clock_ns=clock) as writer:
        offset = writer.append(b"z" * 500)
    # one of the 4 holders answers a shard failing its checksum: only 3 good ones are left
    view = [*stores[:3], _Rotten(stores[3]), *stores[4:]]
    result = _repairer(view, pool).repair_range(0, clock.now + 10**9)
    assert result.repaired_shards == 0
    assert stores[4].read(STREAM, offset) is None and stores[5].read(STREAM, offset) is None
    # with the good shard, the repair goes ahead
    assert _repairer(stores, pool).repair_range(0, clock.now + 10**9).repaired_shards == 2


def test_the_store_takes_a_repair_only_into_a_hole_without_bytes(tmp_path: Path) -> None:
    store = HoleStore(tmp_path / "s")
    writer = ErasureWriter([store] * 6, STREAM, writer_id=3)
    frames = writer.shards(100, b"payload")
    other = writer.shards(100, b"another payload")
    # below the fill mark, never written: a repair is taken, a plain write is not
    store.fill_below(STREAM, 1_000)
    assert store.write(STREAM, 100, frames[0]).result is AcceptResult.TAKEN
    assert store.repair(STREAM, 100, frames[0]).result is AcceptResult.ACCEPTED
    assert store.repair(STREAM, 100, frames[0]).result is AcceptResult.ACCEPTED  # identical
    answer = store.repair(STREAM, 100, other[0])
    assert answer.result is AcceptResult.TAKEN and answer.content == frames[0]
    store.write(STREAM, 2_000, JUNK_MARKER)  # junk written into a hole stays junk
    assert store.repair(STREAM, 2_000, writer.shards(2_000, b"p")[0]).result is AcceptResult.TAKEN
    store.drop_below(STREAM, 300)  # sealed: refused
    answer = store.repair(STREAM, 250, writer.shards(250, b"p")[0])
    assert answer.result is AcceptResult.TAKEN and answer.content == JUNK_MARKER
    # only a valid shard frame of this stream and offset
    with pytest.raises(ValueError, match="valid shard frame"):
        store.repair(STREAM, 4_000, JUNK_MARKER)
    with pytest.raises(ValueError, match="names stream"):
        store.repair(STREAM, 4_000, writer.shards(4_001, b"p")[0])
    assert store.read(STREAM, 4_000) is None
    writer.close()
    store.close()


def test_a_pass_is_rate_limited_and_the_next_resumes_where_it_stopped(
    stores: list[HoleStore], pool: ThreadPoolExecutor
) -> None:
    clock = _Clock()
    with ErasureWriter([*stores[:4], _Down(), _Down()], STREAM, clock_ns=clock) as writer:
        offsets = [writer.append(b"y" * 4000) for _ in range(6)]
    end = clock.now + 10**9
    frame_bytes = len(stores[0].read(STREAM, offsets[0]))
    seconds = [0.0]
    # two offsets' worth of missing shards (2 each) per second
    repairer = _repairer(stores, pool, max_bytes_per_s=4 * frame_bytes, clock_s=lambda: seconds[0])
    first = repairer.repair_range(0, end)
    assert first.repaired_shards == 4 and first.next_offset == offsets[2]
    assert repairer.repair_range(first.next_offset, clock.now).repaired_shards == 0  # no budget
    seconds[0] += 1.0
    second = repairer.repair_range(first.next_offset, end)
    assert second.repaired_shards == 4 and second.next_offset == offsets[4]
    seconds[0] += 10.0  # saved up at most one second's worth
    third = repairer.repair_range(second.next_offset, end)
    assert third.repaired_shards == 4 and third.next_offset == end
    assert repairer.stats.repaired_shards == 12
    assert all(stores[5].read(STREAM, o) is not None for o in offsets)


def test_a_pass_stops_at_its_deadline_after_one_offset_and_the_next_resumes(
    stores: list[HoleStore], pool: ThreadPoolExecutor
) -> None:
    clock = _Clock()
    with ErasureWriter([*stores[:4], _Down(), _Down()], STREAM, clock_ns=clock) as writer:
        offsets = [writer.append(b"z" * 100) for _ in range(4)]
    end = clock.now + 10**9
    seconds = [0.0]

    def ticking() -> float:  # each look at the clock is a second later
        seconds[0] += 1.0
        return seconds[0]

    repairer = _repairer(stores, pool, clock_s=ticking)
    # the deadline has passed before the first offset: that one is still repaired
    first = repairer.repair_range(0, end, deadline_s=0.0)
    assert first.repaired_shards == 2 and first.next_offset == offsets[1]
    assert stores[4].read(STREAM, offsets[0]) is not None
    assert stores[4].read(STREAM, offsets[1]) is None
    # the deadline 2.5 s of looks away (a look for the deadline, one for the rate budget
    # per offset): offsets 1 and 2 are repaired, offset 3 waits for the next pass
    second = repairer.repair_range(first.next_offset, end, deadline_s=seconds[0] + 2.5)
    assert second.repaired_shards == 4 and second.next_offset == offsets[3]
    last = repairer.repair_range(second.next_offset, end)  # no deadline: to the end
    assert last.repaired_shards == 2 and last.next_offset == end
    assert all(stores[5].read(STREAM, o) is not None for o in offsets)


def test_repairs_over_the_stores_http_service(tmp_path: Path) -> None:
    import threading

    from dataplane.erasure.store_client import ShardStoreClient
    from dataplane.erasure.store_server import ShardStoreHTTPServer

    store = HoleStore(tmp_path / "s")
    server = ShardStoreHTTPServer(("127.0.0.1", 0), store, secret="s3cret")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    writer = ErasureWriter([store] * 6, STREAM, writer_id=4)
    try:
        client = ShardStoreClient(f"127.0.0.1:{server.server_address[1]}", secret="s3cret")
        frame = writer.shards(100, b"payload")[0]
        client.fill_below(STREAM, 1_000)
        assert client.write(STREAM, 100, frame).result is AcceptResult.TAKEN
        answer = client.repair(STREAM, 100, frame)
        assert answer.result is AcceptResult.ACCEPTED and answer.filled_below == 1_000
        other = client.repair(STREAM, 100, writer.shards(100, b"other")[0])
        assert other.result is AcceptResult.TAKEN and other.content == frame
        with pytest.raises(ValueError, match="valid shard frame"):
            client.repair(STREAM, 4_000, b"not a shard")
        # the repairer lists shard headers only
        heads = client.list_heads(STREAM, 0, 2_000, 10)
        assert heads.holes == [(100, frame[:HEADER_BYTES])] and heads.filled_below == 1_000
        assert store.read(STREAM, 100) == frame and store.read(STREAM, 4_000) is None
    finally:
        writer.close()
        server.shutdown()
        server.server_close()
        store.close()
