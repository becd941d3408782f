"""The embedded writer (the seed's "write agent as an SDK"): encodes a payload (e.g. a Kafka
record batch) into k + m shards and writes shard i to shard store i, all in parallel.

A write wins its offset with k accepted holes; the writer answers then and lets the remaining
shards finish in the background. A lost write (void offset, taken by another writer, or
refused below a reader's fill mark) is retried at max(offset + random, now, the highest fill
mark a store reported + 1), a bounded number of times: a writer whose clock lags the
readers' by more than the read delay thus still makes progress. Offsets are the writer's clock in ns (sparse), kept strictly increasing per writer.

A store that fails is skipped for a short back-off, and at most a few requests are in flight
per store, so a paused store costs neither latency nor threads once noticed.

Thread-safe: append() may be called from several threads (each call picks its own offset).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from dataplane.erasure.codec import ErasureCodec
from dataplane.erasure.holes import AcceptResult, Ack, WriteOutcome, may_have_won, write_outcome
from dataplane.erasure.shard_format import Shard, encode_shard, payload_checksum
from dataplane.erasure.store import RangeAnswer, WriteAnswer

DEFAULT_MAX_ATTEMPTS = 8
DEFAULT_RETRY_SPREAD_NS = 1_000_000
DEFAULT_WRITE_TIMEOUT_MS = 5_000
DEFAULT_STORE_BACKOFF_MS = 1_000
MAX_IN_FLIGHT_PER_STORE = 8
CAPACITY_POLL_S = 0.001  # how often an append waiting for free in-flight slots looks again


class ShardStore(Protocol):
    """What writers and readers need of a shard store (HoleStore in process, or
    ShardStoreClient over the network)."""

    def write(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer: ...

    def repair(self, stream_id: int, offset: int, data: bytes) -> WriteAnswer: ...

    def read(self, stream_id: int, offset: int) -> bytes | None: ...

    def read_range(
        self, stream_id: int, start: int, end: int, max_holes: int, max_bytes: int
    ) -> RangeAnswer: ...

    def list_heads(self, stream_id: int, start: int, end: int, max_holes: int) -> RangeAnswer: ...

    def fill_below(self, stream_id: int, mark: int) -> int: ...

    def drop_below(self, stream_id: int, mark: int) -> int: ...

    def find(self, stream_id: int, payload_crc: int) -> list[int]: ...


class WriteFailedError(RuntimeError):
    """No offset could be won within the attempts (too few stores reachable, or contention)."""


@dataclass(frozen=True)
class WriteResult:
    offset: int
    outcome: WriteOutcome
    acks: tuple[Ack, ...]


class _StoreHealth:
    """In-flight count and back-off of one store. Thread-safe."""

    def __init__(self, backoff_ms: int):
        self._lock = threading.Lock()
        self._in_flight = 0
        self._skip_until = 0.0
        self._backoff_s = backoff_ms / 1000

    def try_begin(self, ignore_backoff: bool = False) -> bool:
        with self._lock:
            backing_off = not ignore_backoff and time.monotonic() < self._skip_until
            if self._in_flight >= MAX_IN_FLIGHT_PER_STORE or backing_off:
                return False
            self._in_flight += 1
            return True

    def idle(self) -> bool:
        """Nothing in flight and not backing off."""
        with self._lock:
            return self._in_flight == 0 and time.monotonic() >= self._skip_until

    def state(self) -> str:
        """ "free" (a shard may be sent now), "busy" (its in-flight bound is reached: a slot
        frees as an answer comes) or "backoff" (it failed a moment ago)."""
        with self._lock:
            if time.monotonic() < self._skip_until:
                return "backoff"
            return "busy" if self._in_flight >= MAX_IN_FLIGHT_PER_STORE else "free"

    def end(self, ok: bool) -> None:
        with self._lock:
            self._in_flight -= 1
            if not ok:
                self._skip_until = time.monotonic() + self._backoff_s


class ErasureWriter:
    """Writes payloads to k + m shard stores; stores[i] keeps hole i of every offset."""

    def __init__(
        self,
        stores: Sequence[ShardStore],
        stream_id: int,
        codec: ErasureCodec | None = None,
        writer_id: int | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_spread_ns: int = DEFAULT_RETRY_SPREAD_NS,
        write_timeout_ms: int = DEFAULT_WRITE_TIMEOUT_MS,
        store_backoff_ms: int = DEFAULT_STORE_BACKOFF_MS,
        clock_ns: Callable[[], int] = time.time_ns,
        offset_alignment: int = 1,
    ):
        self.codec = codec or ErasureCodec()
        if offset_alignment < 1:
            raise ValueError("offset_alignment must be at least 1")
        # offsets are multiples of it: a Kafka batch of n records at offset o takes o..o+n-1,
        # so with n <= alignment two batches' offsets never overlap
        self.offset_alignment = offset_alignment
        if len(stores) != self.codec.total_shards:
            raise ValueError(
                f"an RS({self.codec.data_shards},{self.codec.parity_shards}) stream needs "
                f"{self.codec.total_shards} shard stores, got {len(stores)}"
            )
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.stores = list(stores)
        self.stream_id = stream_id
        self.writer_id = writer_id if writer_id is not None else random.getrandbits(63)
        self.max_attempts = max_attempts
        self.retry_spread_ns = retry_spread_ns
        self.write_timeout_ms = write_timeout_ms
        self.clock_ns = clock_ns
        self._health = [_StoreHealth(store_backoff_ms) for _ in stores]
        self._pool = ThreadPoolExecutor(
            max_workers=len(stores) * MAX_IN_FLIGHT_PER_STORE, thread_name_prefix="erasure-writer"
        )
        self._clock_lock = threading.Lock()
        self._last_offset = -1
        self._fill_mark = -(2**63)  # the highest fill mark any store reported

    def close(self) -> None:
        """Stop the background shard writes (waits for those in flight, bounded by timeouts)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> ErasureWriter:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def idle(self) -> bool:
        """No shard of an earlier append is still being written and no store is skipped for
        back-off: the next append starts as a first one would (benchmarks wait for it
        between phases)."""
        return all(h.idle() for h in self._health)

    def _next_offset(self, at_least: int = 0) -> int:
        with self._clock_lock:
            offset = max(self.clock_ns(), at_least, self._last_offset + 1, self._fill_mark + 1)
            offset = -(-offset // self.offset_alignment) * self.offset_alignment
            self._last_offset = offset
            return offset

    def append(self, payload: bytes) -> int:
        """Write the payload at a new offset; returns the offset it won."""
        offset = self._next_offset()
        k = self.codec.data_shards
        for attempt in range(self.max_attempts):
            self._await_capacity()
            result = self.write_at(offset, payload)
            if result.outcome is not WriteOutcome.WON and may_have_won(result.acks, k):
                # unanswered shards may have completed k holes: resend the very same shards
                # (an identical rewrite is accepted) before moving on, or the payload could be
                # decided at two offsets
                result = self.write_at(offset, payload, probe=True)
            if result.outcome is WriteOutcome.WON:
                return offset
            if attempt + 1 < self.max_attempts:
                offset = self._next_offset(offset + random.randint(1, self.retry_spread_ns))
        maybe = (
            " (the last attempt may still have been written)"
            if may_have_won(result.acks, k)
            else ""
        )
        raise WriteFailedError(
            f"stream {self.stream_id}: no offset won in {self.max_attempts} attempts{maybe} "
            f"(last acks: {[a.value for a in result.acks]})"
        )

    def _await_capacity(self) -> None:
        """Wait (at most the write timeout) while fewer than k stores could take a shard now
        only because this writer's in-flight bound is reached on them: many concurrent
        appends would otherwise find them all busy and burn their attempts at once. Stores
        in back-off are not waited for."""
        k = self.codec.data_shards
        deadline = time.monotonic() + self.write_timeout_ms / 1000
        while True:
            states = [h.state() for h in self._health]
            free, busy = states.count("free"), states.count("busy")
            if free >= k or free + busy < k or time.monotonic() >= deadline:
                return
            time.sleep(CAPACITY_POLL_S)

    def shards(self, offset: int, payload: bytes) -> list[bytes]:
        """The k + m shard frames of a payload at an offset (frame i for hole i)."""
        crc = payload_checksum(payload)
        k, m = self.codec.data_shards, self.codec.parity_shards
        return [
            encode_shard(
                Shard(self.writer_id, self.stream_id, offset, i, k, m, len(payload), crc, block)
            )
            for i, block in enumerate(self.codec.encode(payload))
        ]

    def write_at(self, offset: int, payload: bytes, probe: bool = False) -> WriteResult:
        """One attempt at one offset: won with k accepted holes, lost once k is out of reach.
        `probe` sends even to stores in back-off."""
        frames = self.shards(offset, payload)
        acks = [Ack.PENDING] * len(frames)
        futures: dict[Future, int] = {}
        for i, frame in enumerate(frames):
            if not self._health[i].try_begin(ignore_backoff=probe):
                acks[i] = Ack.SKIPPED
                continue
            futures[self._pool.submit(self._write_one, i, offset, frame)] = i
        deadline = time.monotonic() + self.write_timeout_ms / 1000
        pending = set(futures)
        k = self.codec.data_shards
        while write_outcome(acks, k) is WriteOutcome.PENDING and pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            done, pending = wait(pending, timeout=remaining, return_when=FIRST_COMPLETED)
            for future in done:
                acks[futures[future]] = future.result()
        outcome = write_outcome(acks, k)
        if outcome is WriteOutcome.PENDING:  # the deadline passed: unanswered shards failed
            acks = [Ack.FAILED if a is Ack.PENDING else a for a in acks]
            outcome = write_outcome(acks, k)
        return WriteResult(offset, outcome, tuple(acks))

    def _write_one(self, index: int, offset: int, frame: bytes) -> Ack:
        ok = False
        try:
            answer = self.stores[index].write(self.stream_id, offset, frame)
            ok = True
            if answer.filled_below is not None:
                with self._clock_lock:
                    self._fill_mark = max(self._fill_mark, answer.filled_below)
            return Ack.ACCEPTED if answer.result is AcceptResult.ACCEPTED else Ack.TAKEN
        except Exception:  # unreachable, timed out, full: this hole's state is unknown
            return Ack.FAILED
        finally:
            self._health[index].end(ok)
