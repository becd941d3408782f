"""Repairing decided writes that lack shards (issue #14): re-encode and fill their empty holes.

A write wins with k of k + m holes and does not wait for the rest; with m stores down or slow
then, it has no margin left until it is sealed into object storage. The repairer lists a
range of a stream's holes on every store, shard headers only (`list_heads`: 48 bytes a
hole; no fill: listing changes nothing); for each offset whose headers name one write k
times while a store that answered holds nothing there, it reads those k shards whole,
checks them, decodes the payload (checked against its CRC), re-encodes it and writes the
very frames the writer would have written (`HoleStore.repair`) into the empty holes.

Rules (why a repair can never change what a reader decided):
- only an offset holding k consistent valid shards of one write is repaired: that write has
  won the offset for good (k durable write-once holes), no reader can have found it void
  (a reader counts unreachable holes as open, so k accepted shards always keep a write
  possible), and adding shards of that same write changes no decision;
- a hole that holds bytes (a shard of any write, explicit junk, rotten bytes) is never
  changed, nor one below the store's drop mark (sealed);
- an offset without k consistent shards (undecided, void, split) is left alone;
- the re-encoded frames of the shards present must equal the stored ones byte for byte,
  else nothing is written (a guard against a codec that is not deterministic).

Bounded: a pass lists at most `max_holes` holes / `max_bytes` per store, writes at most
the rate limit's bytes (a token bucket, `max_bytes_per_s`) and stops at the caller's
deadline (the rate limit does not bind on small shards); the caller resumes at
`RepairPass.next_offset`. Holes missing on stores that did not answer are reported
(`RepairPass.waiting_from`) so the caller can look again once those stores answer.

Thread-safety: one thread runs passes of a repairer (the broker's sealer thread); the stats
are read by others (ints, updated under a lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from dataplane.config import ERASURE_REPAIR_BYTES_PER_S
from dataplane.erasure.codec import CodecError, ErasureCodec
from dataplane.erasure.holes import AcceptResult, HoleKind, classify
from dataplane.erasure.shard_format import Shard, encode_shard, payload_checksum, peek_head
from dataplane.erasure.store import RangeAnswer
from dataplane.erasure.writer import ShardStore

DEFAULT_MAX_HOLES = 5_000  # headers listed per store and pass


@dataclass
class RepairStats:
    """Totals of a repairer (or of all a broker runs). Updated under `lock`."""

    scanned_offsets: int = 0
    repaired_offsets: int = 0
    repaired_shards: int = 0
    repaired_bytes: int = 0
    # shards a repair could not place: the hole held other bytes (or was sealed)
    refused_shards: int = 0
    # decided offsets with a hole missing on a store that did not answer (looked at again)
    waiting_offsets: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


@dataclass(frozen=True)
class RepairPass:
    """What one pass over [start, end) did."""

    next_offset: int  # everything below it was looked at (resume here)
    repaired_shards: int
    listed: frozenset[int]  # indexes of the stores that answered the listing
    # the lowest offset of a decided write with a hole missing on a store that did not
    # answer, and those stores (None: none)
    waiting_from: int | None = None
    waiting_on: frozenset[int] = frozenset()


class ErasureRepairer:
    """Repairs the decided writes of one stream on its k + m stores (stores[i]: hole i)."""

    def __init__(
        self,
        stores: Sequence[ShardStore],
        stream_id: int,
        codec: ErasureCodec,
        pool: ThreadPoolExecutor,
        max_bytes_per_s: int = ERASURE_REPAIR_BYTES_PER_S,
        stats: RepairStats | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ):
        if len(stores) != codec.total_shards:
            raise ValueError(f"need {codec.total_shards} shard stores, got {len(stores)}")
        if max_bytes_per_s < 1:
            raise ValueError("max_bytes_per_s must be positive")
        self.stores = list(stores)
        self.stream_id = stream_id
        self.codec = codec
        self.pool = pool
        self.max_bytes_per_s = max_bytes_per_s
        self.stats = stats if stats is not None else RepairStats()
        self.clock_s = clock_s
        self._tokens = float(max_bytes_per_s)
        self._tokens_at = clock_s()

    def _take(self, size: int) -> bool:
        """Spend `size` bytes of the rate limit (at most one second's worth is saved up;
        a repair larger than that passes when the bucket is full)."""
        now = self.clock_s()
        self._tokens = min(
            float(self.max_bytes_per_s),
            self._tokens + (now - self._tokens_at) * self.max_bytes_per_s,
        )
        self._tokens_at = now
        if self._tokens >= min(size, self.max_bytes_per_s):
            self._tokens -= size
            return True
        return False

    def _list(self, start: int, end: int, max_holes: int) -> list[RangeAnswer | None]:
        def guarded(store: ShardStore) -> RangeAnswer | None:
            try:
                return store.list_heads(self.stream_id, start, end, max_holes)
            except Exception:  # down, slow, refusing: its holes are unknown this pass
                return None

        return list(self.pool.map(guarded, self.stores))

    def repair_range(
        self,
        start: int,
        end: int,
        max_holes: int = DEFAULT_MAX_HOLES,
        deadline_s: float | None = None,
    ) -> RepairPass:
        """One bounded pass over offsets [start, end). With `deadline_s` (on `clock_s`) the
        pass looks at one offset at least and starts none after the deadline: a store back
        from an outage can lack shards of hundreds of writes, each repair fsync'd, and the
        caller's thread has other work between passes (sealing, the drops of stores that
        missed theirs)."""
        if end <= start:
            return RepairPass(start, 0, frozenset())
        answers = self._list(start, end, max_holes)
        listed = frozenset(i for i, a in enumerate(answers) if a is not None)
        sealed_below = max((a.dropped_below for a in answers if a is not None), default=start)
        if sealed_below > start:  # sealed and dropped: nothing to repair below it
            return RepairPass(min(sealed_below, end), 0, listed)
        if len(listed) < self.codec.data_shards:  # k shards cannot be seen: nothing decidable
            return RepairPass(start, 0, listed)
        complete_below = min([end] + [a.complete_below for a in answers if a is not None])
        by_offset: dict[int, dict[int, bytes]] = {}
        for i, a in enumerate(answers):
            for offset, data in a.holes if a is not None else ():
                if offset < complete_below:
                    by_offset.setdefault(offset, {})[i] = data
        repaired = 0
        waiting_from: int | None = None
        waiting_on: set[int] = set()
        for index, offset in enumerate(sorted(by_offset)):
            if index and deadline_s is not None and self.clock_s() >= deadline_s:
                return RepairPass(offset, repaired, listed, waiting_from, frozenset(waiting_on))
            done = self._repair_offset(offset, by_offset[offset], listed)
            if done is None:  # out of rate budget: resume here next pass
                return RepairPass(offset, repaired, listed, waiting_from, frozenset(waiting_on))
            shards, waiting = done
            repaired += shards
            if waiting:
                waiting_from = offset if waiting_from is None else waiting_from
                waiting_on |= waiting
        return RepairPass(complete_below, repaired, listed, waiting_from, frozenset(waiting_on))

    def _repair_offset(
        self, offset: int, held: dict[int, bytes], listed: frozenset[int]
    ) -> tuple[int, set[int]] | None:
        """Repair one offset; returns (shards written, stores waited for), None when the
        rate limit stops the pass."""
        n = self.codec.total_shards
        self.stats.add(scanned_offsets=1)
        # candidates from the headers (unchecked): holes i naming this stream, offset, hole
        # and the stream's code
        groups: dict[tuple[int, int, int, int, int], list[int]] = {}
        for i, head_bytes in held.items():
            head = peek_head(head_bytes)
            if head is not None and (
                head.stream_id,
                head.offset,
                head.shard_index,
                head.data_shards,
                head.parity_shards,
            ) == (self.stream_id, offset, i, self.codec.data_shards, self.codec.parity_shards):
                groups.setdefault(head.write_key, []).append(i)
        holders = next((g for g in groups.values() if len(g) >= self.codec.data_shards), None)
        if holders is None:
            return 0, set()  # undecided or void here: never repaired
        # holes listed as holding nothing (empty, or junk only by the fill mark)
        missing = [i for i in listed if i not in held]
        waiting = {i for i in range(n) if i not in listed}
        if not missing:
            if waiting:
                self.stats.add(waiting_offsets=1)
            return 0, waiting
        winner = self._read_winner(offset, holders)
        if winner is None:
            return 0, set()  # fewer than k of them are valid, consistent shards
        frame_bytes = len(encode_shard(winner[0]))
        if not self._take(frame_bytes * len(missing)):
            return None
        frames = self._frames(offset, winner)
        if frames is None:
            return 0, set()
        # only the holes of a store that answered and held nothing; never over bytes
        results = list(
            self.pool.map(
                lambda i: self._put(i, offset, frames[i]),
                missing,
            )
        )
        written = sum(1 for r in results if r is True)
        refused = sum(1 for r in results if r is False)
        waiting |= {i for i, r in zip(missing, results) if r is None}
        self.stats.add(
            repaired_offsets=1 if written else 0,
            repaired_shards=written,
            repaired_bytes=written * frame_bytes,
            refused_shards=refused,
            waiting_offsets=1 if waiting else 0,
        )
        return written, waiting

    def _read_winner(self, offset: int, holders: list[int]) -> list[Shard] | None:
        """The whole shards in the holes `holders`, checked (frame CRC, the right stream,
        offset and hole); a group of one write if it has k, else None."""

        def read(i: int) -> bytes | None:
            try:
                return self.stores[i].read(self.stream_id, offset)
            except Exception:
                return None

        frames = list(self.pool.map(read, holders))
        groups: dict[tuple[int, int, int, int, int], list[Shard]] = {}
        for i, frame in zip(holders, frames):
            hole = classify(frame, self.stream_id, offset, i)
            if hole.kind is HoleKind.SHARD and hole.shard is not None:
                groups.setdefault(hole.shard.write_key, []).append(hole.shard)
        return next((g for g in groups.values() if len(g) >= g[0].data_shards), None)

    def _frames(self, offset: int, winner: list[Shard]) -> list[bytes] | None:
        """The write's k + m frames re-encoded from k of its shards; None when the decoded
        payload fails its CRC or the re-encoded frames differ from the shards present."""
        first = winner[0]
        try:
            payload = self.codec.decode(
                [(s.shard_index, s.block) for s in winner], first.payload_length
            )
        except CodecError:
            return None
        if payload_checksum(payload) != first.payload_crc:
            return None
        frames = [
            encode_shard(
                Shard(
                    first.writer_id,
                    self.stream_id,
                    offset,
                    i,
                    first.data_shards,
                    first.parity_shards,
                    first.payload_length,
                    first.payload_crc,
                    block,
                )
            )
            for i, block in enumerate(self.codec.encode(payload))
        ]
        if any(frames[s.shard_index] != encode_shard(s) for s in winner):
            return None
        return frames

    def _put(self, index: int, offset: int, frame: bytes) -> bool | None:
        """True: the hole holds the frame now; False: it held other bytes; None: no answer."""
        try:
            answer = self.stores[index].repair(self.stream_id, offset, frame)
        except Exception:
            return None
        return answer.result is AcceptResult.ACCEPTED


__all__ = ["ErasureRepairer", "RepairPass", "RepairStats"]
