"""The hole-filling argument, checked on random histories: shards of competing writers land
in any order on real HoleStores, readers with different visible ends and different stores
down read in between, and

- every two reads agree on every offset both claim to have decided (their complete prefix):
  no late shard makes an offset appear (or change) after a reader passed it;
- an offset won by a writer (4 of its shards accepted) is returned, with that payload, by
  every read that passed it;
- repairs (erasure/repair.py, with stores down too) in between change neither: they only
  add shards of decided writes, also into holes a fill made junk.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dataplane.erasure.codec import ErasureCodec
from dataplane.erasure.holes import AcceptResult
from dataplane.erasure.reader import ErasureReader, ReadUnavailableError
from dataplane.erasure.repair import ErasureRepairer
from dataplane.erasure.store import HoleStore
from dataplane.erasure.writer import ErasureWriter

STREAM = 1
OFFSETS = 2
WRITERS = 2

shard_op = st.tuples(
    st.just("shard"),
    st.integers(0, WRITERS - 1),
    st.integers(0, OFFSETS - 1),
    st.integers(0, 5),
)
read_op = st.tuples(
    st.just("read"),
    st.integers(1, OFFSETS),  # the visible end
    st.frozensets(st.integers(0, 5), max_size=3),  # stores down for this read
)
repair_op = st.tuples(st.just("repair"), st.frozensets(st.integers(0, 5), max_size=3))
histories = st.lists(st.one_of(shard_op, shard_op, read_op, repair_op), min_size=1, max_size=40)


class _Down:
    def __getattr__(self, name: str):
        def fail(*_: object) -> None:
            raise ConnectionRefusedError("down")

        return fail


def _no_fsync(fd: int) -> None:  # durability is not what this test is about
    return None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories)
# a late 4th shard after a reader passed the offset (the reader must have filled the hole)
@example(
    [
        ("shard", 0, 0, 0),
        ("shard", 0, 0, 1),
        ("shard", 0, 0, 2),
        ("read", 1, frozenset()),
        ("shard", 0, 0, 3),
    ]
)
# a won offset whose holders are partly down: the reader must stop, not skip it
@example(
    [
        *[("shard", 0, 0, i) for i in range(4)],
        ("read", 1, frozenset({2, 3})),
        ("read", 1, frozenset()),
    ]
)
# a write won with 4 shards, repaired after a fill, read with 2 of its first holders down
@example(
    [
        *[("shard", 0, 0, i) for i in range(4)],
        ("read", 1, frozenset()),
        ("repair", frozenset()),
        ("read", 1, frozenset({0, 1})),
    ]
)
def test_readers_never_contradict_each_other_or_a_winner(history: list[tuple]) -> None:
    with (
        tempfile.TemporaryDirectory(prefix="erasure-agree-") as tmp,
        ThreadPoolExecutor(6) as pool,
    ):
        stores = [HoleStore(Path(tmp) / str(i), fsync=_no_fsync) for i in range(6)]
        writers = [ErasureWriter(stores, STREAM, writer_id=w + 1) for w in range(WRITERS)]
        accepted: dict[tuple[int, int], set[int]] = {}  # (writer, offset) -> stores holding it
        reads: list[tuple[int, dict[int, bytes]]] = []  # (complete below, offset -> payload)
        try:
            for op in history:
                if op[0] == "shard":
                    _, w, offset, i = op
                    frame = writers[w].shards(offset, b"w%d@%d" % (w, offset))[i]
                    if stores[i].write(STREAM, offset, frame).result is AcceptResult.ACCEPTED:
                        accepted.setdefault((w, offset), set()).add(i)
                elif op[0] == "repair":
                    view = [_Down() if i in op[1] else s for i, s in enumerate(stores)]
                    ErasureRepairer(view, STREAM, ErasureCodec(), pool).repair_range(0, OFFSETS)
                else:
                    _, end, down = op
                    view = [_Down() if i in down else s for i, s in enumerate(stores)]
                    with ErasureReader(
                        view, STREAM, read_delay_ms=0, clock_ns=lambda end=end: end
                    ) as reader:
                        try:
                            result = reader.read(0)
                        except ReadUnavailableError:
                            continue
                    reads.append((result.next_offset, dict(result.records)))
            for i, (below_a, records_a) in enumerate(reads):
                for below_b, records_b in reads[i + 1 :]:
                    common = min(below_a, below_b)
                    assert {o: p for o, p in records_a.items() if o < common} == {
                        o: p for o, p in records_b.items() if o < common
                    }
            for (w, offset), holders in accepted.items():
                if len(holders) >= 4:
                    for below, records in reads:
                        if offset < below:
                            assert records.get(offset) == b"w%d@%d" % (w, offset)
        finally:
            for writer in writers:
                writer.close()
            for store in stores:
                store.close()
