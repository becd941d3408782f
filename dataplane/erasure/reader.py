"""Reading an erasure-coded stream behind the clock, with hole filling.

The visible end is now - read_delay. Before deciding offsets below it, the reader fills every
empty hole below the visible end with junk on each store it reaches (one durable fill mark per
store, see store.py). It needs more than m stores filled: then at most k - 1 stores still
accept shards below the mark, so no write can win an offset there any more, and whatever the
reader decides is final. Offsets are then decided from the filled stores' holes (holes.decide);
an offset whose open (unreachable) holes could still complete a write stops the read there: the
reader never skips what it cannot prove void.

Thread-safe: no state is shared between read() calls but the stores and the pool.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass

from dataplane.erasure.codec import CodecError, ErasureCodec
from dataplane.erasure.holes import (
    JUNK,
    UNKNOWN,
    Decision,
    DecisionKind,
    Hole,
    classify,
    decide,
)
from dataplane.erasure.shard_format import JUNK_MARKER, payload_checksum
from dataplane.erasure.store import RangeAnswer
from dataplane.erasure.writer import ShardStore

DEFAULT_READ_DELAY_MS = 500
# a tailing reader fills (one durable record per store) at most this often; in between it
# reads up to its last fill mark
DEFAULT_MIN_FILL_INTERVAL_MS = 50
DEFAULT_MAX_RECORDS = 1_000
MAX_READ_BYTES = 32 * 1024 * 1024


class ReadUnavailableError(RuntimeError):
    """Too few stores answered to decide anything."""


class SealedRangeError(RuntimeError):
    """The read starts below a store's drop mark: those offsets were sealed into object
    storage and the stores forgot them (an empty hole there means nothing)."""

    def __init__(self, stream_id: int, start: int, sealed_below: int):
        super().__init__(
            f"stream {stream_id}: offsets below {sealed_below} are sealed into object "
            f"storage (read from {start})"
        )
        self.sealed_below = sealed_below


class CorruptWriteError(RuntimeError):
    """k shards with valid checksums decoded to a payload with the wrong checksum (a writer bug)."""


@dataclass(frozen=True)
class ReadResult:
    records: list[tuple[int, bytes]]  # (offset, payload), ascending
    next_offset: int  # where the next read starts
    blocked_at: int | None  # an undecided offset the read stopped at (stores unreachable)
    first_void: int | None = None  # the first void offset the read passed (holes, no record)


class ErasureReader:
    """Reads the decided offsets of one stream from its k + m shard stores."""

    def __init__(
        self,
        stores: Sequence[ShardStore],
        stream_id: int,
        codec: ErasureCodec | None = None,
        read_delay_ms: int = DEFAULT_READ_DELAY_MS,
        clock_ns: Callable[[], int] = time.time_ns,
        min_fill_interval_ms: int = DEFAULT_MIN_FILL_INTERVAL_MS,
    ):
        self.codec = codec or ErasureCodec()
        if len(stores) != self.codec.total_shards:
            raise ValueError(f"need {self.codec.total_shards} shard stores, got {len(stores)}")
        if read_delay_ms < 0 or min_fill_interval_ms < 0:
            raise ValueError("read_delay_ms and min_fill_interval_ms must not be negative")
        self.min_fill_interval_ms = min_fill_interval_ms
        self._last_fill: tuple[int, int] | None = None  # (clock ns, end filled to)
        self._fill_lock = threading.Lock()
        self.stores = list(stores)
        self.stream_id = stream_id
        self.read_delay_ms = read_delay_ms
        self.clock_ns = clock_ns
        self._pool = ThreadPoolExecutor(
            max_workers=len(stores), thread_name_prefix="erasure-reader"
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ErasureReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def visible_end(self) -> int:
        """Offsets below it are decided by readers; above it writers are still at work."""
        return self.clock_ns() - self.read_delay_ms * 1_000_000

    def _each(self, call: Callable[[ShardStore], object]) -> list[object | None]:
        """call(store) on every store in parallel; None where a store failed."""

        def guarded(store: ShardStore) -> object | None:
            try:
                return call(store)
            except Exception:
                return None

        return list(self._pool.map(guarded, self.stores))

    def find_written(self, payload_crc: int) -> list[int] | None:
        """Offsets where a write of a payload with this CRC may be (the stores' recent
        shards), from the first m + 1 stores that answer: a won write has shards on k of the
        k + m stores, so any m + 1 of them hold one of its shards. None when fewer answer.
        A store that does not answer (paused) is not waited for once m + 1 have."""
        m = self.codec.parity_shards

        def find(store: ShardStore) -> list[int]:
            return list(store.find(self.stream_id, payload_crc))

        pending = {self._pool.submit(find, s) for s in self.stores}
        found: set[int] = set()
        answered = 0
        while pending and answered <= m:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                if future.exception() is None:
                    answered += 1
                    found.update(future.result())
        return sorted(found) if answered > m else None

    def decide_offset(self, offset: int) -> Decision:
        """Fill the empty holes of one offset with junk (write-once), then decide it."""
        if offset >= self.visible_end():
            raise ValueError(f"offset {offset} is not below the visible end yet")
        answers = self._each(lambda s: s.write(self.stream_id, offset, JUNK_MARKER).content)
        holes = [
            UNKNOWN if a is None else classify(a, self.stream_id, offset, i)  # type: ignore[arg-type]
            for i, a in enumerate(answers)
        ]
        return decide(holes, self.codec.data_shards)

    def read(
        self, start: int, max_records: int = DEFAULT_MAX_RECORDS, max_bytes: int = MAX_READ_BYTES
    ) -> ReadResult:
        """Decided offsets from `start` up to the visible end (fills holes first)."""
        k, m = self.codec.data_shards, self.codec.parity_shards
        now = self.clock_ns()
        with self._fill_lock:
            last = self._last_fill
        if last is not None and now - last[0] < self.min_fill_interval_ms * 1_000_000:
            # filled a moment ago: read below that mark (the stores only confirm it, no
            # new durable record)
            end = last[1]
        else:
            end = now - self.read_delay_ms * 1_000_000
        if start >= end:
            return ReadResult([], start, None)
        filled = self._each(lambda s: s.fill_below(self.stream_id, end))
        if sum(1 for f in filled if f is not None) <= m:
            raise ReadUnavailableError(
                f"stream {self.stream_id}: only {sum(f is not None for f in filled)} of {k + m} shard stores "
                f"answered; reading needs more than {m}"
            )
        with self._fill_lock:
            if self._last_fill is None or end > self._last_fill[1]:
                self._last_fill = (now, end)
        per_store_max = max(1, max_records) * 2
        ranges: list[RangeAnswer | None] = [None] * len(self.stores)
        answers = self._each(
            lambda s: s.read_range(self.stream_id, start, end, per_store_max, max_bytes)
        )
        for i, answer in enumerate(answers):
            if filled[i] is not None and isinstance(answer, RangeAnswer):
                ranges[i] = answer
        known = [r for r in ranges if r is not None]
        sealed_below = max((r.dropped_below for r in known), default=start)
        if sealed_below > start:
            raise SealedRangeError(self.stream_id, start, sealed_below)
        if len(known) <= m:
            raise ReadUnavailableError(
                f"stream {self.stream_id}: only {len(known)} shard stores listed their holes"
            )
        # below every store's cut the listing is complete
        complete_below = min([end] + [r.complete_below for r in known])
        by_offset: dict[int, dict[int, bytes]] = {}
        for i, r in enumerate(ranges):
            if r is None:
                continue
            for offset, data in r.holes:
                if offset < complete_below:
                    by_offset.setdefault(offset, {})[i] = data
        records: list[tuple[int, bytes]] = []
        first_void: int | None = None
        for offset in sorted(by_offset):
            if len(records) >= max_records:
                return ReadResult(records, offset, None, first_void)
            holes: list[Hole] = []
            for i, r in enumerate(ranges):
                data = by_offset[offset].get(i)
                if r is None:
                    holes.append(UNKNOWN)
                elif data is None:
                    holes.append(JUNK)  # empty below the store's fill mark
                else:
                    holes.append(classify(data, self.stream_id, offset, i))
            decision = decide(holes, k)
            if decision.kind is DecisionKind.UNDECIDED:
                return ReadResult(records, offset, offset, first_void)
            if decision.kind is DecisionKind.DECIDED:
                records.append((offset, self._decode(offset, decision)))
            elif first_void is None:
                first_void = offset
        return ReadResult(records, complete_below, None, first_void)

    def _decode(self, offset: int, decision: Decision) -> bytes:
        first = decision.shards[0]
        try:
            payload = self.codec.decode(
                [(s.shard_index, s.block) for s in decision.shards], first.payload_length
            )
        except CodecError as e:
            raise CorruptWriteError(f"stream {self.stream_id} offset {offset}: {e}") from None
        if payload_checksum(payload) != first.payload_crc:
            raise CorruptWriteError(
                f"stream {self.stream_id} offset {offset}: decoded payload fails its checksum"
            )
        return payload
