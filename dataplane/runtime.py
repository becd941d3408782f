"""The broker process's Python runtime: garbage-collector pauses and event-loop lag, measured
and kept short; large buffers reused rather than handed back to the kernel.

CPython's cyclic collector stops every thread while it runs; a full (generation 2) collection
walks every tracked object, so with a large heap a pause reaches tens of milliseconds and shows
up as a slow second of produce latency. `install_gc_pause_metric` measures each pause as
`automq_gc_pause_seconds{generation}`; `freeze_startup_heap` moves what start-up
allocated (modules, metadata image, configuration) out of the collector's reach.

Every Kafka request is served on one event loop: while a callback runs long (or the loop waits
for the GIL held by another thread), every produce waiting on it waits too.
`EventLoopLagProbe` schedules a callback every `LOOP_LAG_PROBE_INTERVAL_S` and measures how
late it ran as `automq_event_loop_lag_seconds` (`automqctl perf` reports both p99s).

Other threads hand results to the loop through `LoopHandoff`: one wakeup of the loop for
every callback queued before it runs them, and within `loop_wakeups_held` (the file WAL's
committer resolving a group commit) one wakeup when the block ends, instead of one
`call_soon_threadsafe` per future (`asyncio.wrap_future`).
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import CancelledError as FutureCancelledError
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import Histogram

# buckets of the pause and lag histograms: fine enough for a millisecond tail
PAUSE_BUCKETS_S = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
    0.2, 0.5, 1.0,
)  # fmt: skip
GC_PAUSE_SECONDS = Histogram(
    "automq_gc_pause_seconds",
    "Duration of CPython garbage-collector runs (all threads stop meanwhile)",
    ["generation"],
    buckets=PAUSE_BUCKETS_S,
)
EVENT_LOOP_LAG_SECONDS = Histogram(
    "automq_event_loop_lag_seconds",
    "How late a callback scheduled on the Kafka event loop ran (the loop was running other "
    "callbacks or waiting for the GIL); sampled every LOOP_LAG_PROBE_INTERVAL_S",
    buckets=PAUSE_BUCKETS_S,
)
# how often the loop-lag probe runs: 50 samples a second, ~0.05% of a core
LOOP_LAG_PROBE_INTERVAL_S = 0.02

log = logging.getLogger(__name__)

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# the largest a glibc heap serves (HEAP_MAX_SIZE / 2 on 64-bit); GET bodies are <= 8 MiB
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024

_installed = threading.Lock()
_state = {"installed": False, "started_s": 0.0}


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _state["started_s"] = time.perf_counter()
    elif _state["started_s"]:
        GC_PAUSE_SECONDS.labels(str(info.get("generation", "?"))).observe(
            time.perf_counter() - _state["started_s"]
        )
        _state["started_s"] = 0.0


def install_gc_pause_metric() -> None:
    """Observe every collection's duration (idempotent). Collections run under the GIL, one
    at a time, so the start/stop pair needs no lock."""
    with _installed:
        if not _state["installed"]:
            gc.callbacks.append(_on_gc)
            _state["installed"] = True


def set_gil_switch_interval(interval_ms: float) -> None:
    """How long a thread may run Python before one waiting for the GIL gets it (for the
    whole process: `sys.setswitchinterval`)."""
    sys.setswitchinterval(interval_ms / 1000)


def freeze_startup_heap() -> None:
    """Collect once, then move every surviving object to the permanent generation: full
    collections no longer walk the start-up heap (modules, image, config)."""
    gc.collect()
    gc.freeze()


class EventLoopLagProbe:
    """A callback scheduled on `loop` every `interval_s`; how late each one ran (measured
    with `time.perf_counter`, so the loop's own millisecond clock does not round it) goes to
    `histogram`. A stall of D seconds is seen with probability ~D / interval_s, as a lag up
    to D. A broker `Component`: `start` and `stop` may be called from any thread; the probe
    itself runs only on the loop."""

    name = "event-loop-lag"

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        interval_s: float = LOOP_LAG_PROBE_INTERVAL_S,
        histogram: Histogram = EVENT_LOOP_LAG_SECONDS,
    ):
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self._loop = loop
        self._interval_s = interval_s
        self._histogram = histogram
        self._stopped = threading.Event()
        self._due_s = 0.0  # the loop's alone
        self._timer: asyncio.TimerHandle | None = None  # the loop's alone

    def start(self) -> None:
        """Schedule the first sample."""
        self._loop.call_soon_threadsafe(self._arm)

    def stop(self) -> None:
        """No more samples (a loop already closed has none anyway)."""
        self._stopped.set()
        try:
            self._loop.call_soon_threadsafe(self._cancel)
        except RuntimeError:  # the loop is closed
            pass

    def on_metadata(self, delta: object, image: object) -> None:
        """Metadata does not concern the probe."""

    def _arm(self) -> None:
        if self._stopped.is_set():
            return
        self._due_s = time.perf_counter() + self._interval_s
        self._timer = self._loop.call_later(self._interval_s, self._tick)

    def _tick(self) -> None:
        self._histogram.observe(max(0.0, time.perf_counter() - self._due_s))
        self._arm()

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def until_done(future: asyncio.Future, timeout_s: float | None = None) -> bool:
    """On the loop: until `future` is done (True) or `timeout_s` passed (False), never
    cancelling it when the awaiting task is cancelled or the time is up (as
    `asyncio.wait({future}, timeout=...)`, without its set and task: a response slot, a
    request's turn and a produce's durability are awaited once per request)."""
    if future.done():
        return True
    loop = future.get_loop()
    waiter = loop.create_future()

    def wake(_done: asyncio.Future | None = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    timer = None if timeout_s is None else loop.call_later(timeout_s, wake)
    try:
        await waiter
    finally:
        if timer is not None:
            timer.cancel()
        if not future.done():
            future.remove_done_callback(wake)
    return future.done()


async def outcome_within(future: Future | asyncio.Future, timeout_s: float) -> Any:
    """On the loop: `future`'s result (its exception raised), waiting at most `timeout_s`
    (then TimeoutError), never cancelling it, also when the awaiting task is cancelled. An
    append's durability future has other waiters (an idempotent retry of the batch, the
    partition's tracking of undurable batches): `asyncio.wait_for(asyncio.wrap_future(f))`
    cancelled it on a timeout, and a retry could then be acknowledged before the batch was
    durable. A concurrent future reaches the loop through its `LoopHandoff`; an outcome
    that comes after the timeout is marked retrieved (no "never retrieved" log line)."""
    if future.done():
        return future.result()
    waiter = LoopHandoff.of(asyncio.get_running_loop()).wrap_future(future)
    waiter.add_done_callback(_retrieve_outcome)
    if not await until_done(waiter, timeout_s):
        raise TimeoutError(f"not done within {timeout_s:.3f} s")
    return waiter.result()


def _retrieve_outcome(done: asyncio.Future) -> None:
    if not done.cancelled():
        done.exception()


class HeldWakeups:
    """Wakeups a thread defers to the end of a block: within `held()`, `deferred(key,
    wake)` keeps `wake` (one per key: a later one for the same key replaces it) and the
    outermost block calls each once when it ends, each in its own try (one failing must not
    leave the others asleep). Per thread: other threads' calls are not held. Two kinds:
    `loop_wakeups_held` and `writer_wakeups_held`."""

    def __init__(self, what: str) -> None:
        """`what` names the woken thing in the log line of a failing wakeup."""
        self._what = what
        self._local = threading.local()  # .owed: {key: wake} of this thread's open block

    @contextmanager
    def held(self) -> Iterator[None]:
        """The block (nested blocks: the outermost one wakes)."""
        if getattr(self._local, "owed", None) is not None:
            yield
            return
        owed: dict[object, Callable[[], None]] = {}
        self._local.owed = owed
        try:
            yield
        finally:
            self._local.owed = None
            for wake in owed.values():
                try:
                    wake()
                except Exception:  # noqa: BLE001 - the others must still be woken
                    log.exception("waking %s failed", self._what)

    def deferred(self, key: object, wake: Callable[[], None]) -> bool:
        """Whether `wake` is owed to an open block of this thread, to be called once when it
        ends; False: no block is open, call it now."""
        owed = getattr(self._local, "owed", None)
        if owed is None:
            return False
        owed[key] = wake
        return True


# A WAL thread resolving a group commit's futures holds `LoopHandoff.call_soon`'s wakeups:
# one wakeup of each event loop per group commit instead of one per awaited future.
_LOOP_WAKEUPS = HeldWakeups("an event loop")
loop_wakeups_held = _LOOP_WAKEUPS.held

# A produce request's partitions are appended with the WAL writers' wakeups held: the
# committer takes them in one group commit (one fdatasync), instead of waking for the first
# partition and taking the GIL while the loop appends the rest. The block must not span an
# await: other requests' appends on the loop would wait for its end.
_WRITER_WAKEUPS = HeldWakeups("a writer thread")
writer_wakeups_held = _WRITER_WAKEUPS.held
writer_wakeup_deferred = _WRITER_WAKEUPS.deferred


class LoopHandoff:
    """Callbacks handed to one event loop from any thread, as few wakeups as possible:
    the first callback queued since the loop last ran them schedules one run of all of
    them (`call_soon_threadsafe`: a write to the loop's self-pipe); later ones only join
    the queue. Thread-safe; the callbacks run on the loop, in the order queued."""

    _lock = threading.Lock()
    _of_loop: dict[asyncio.AbstractEventLoop, LoopHandoff] = {}  # noqa: RUF012

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue_lock = threading.Lock()
        self._queued: list[tuple[Callable[..., object], tuple]] = []
        self._wakeup_due = False

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> LoopHandoff:
        """The loop's handoff (one per loop, so callbacks from every caller share wakeups;
        closed loops are forgotten)."""
        with cls._lock:
            handoff = cls._of_loop.get(loop)
            if handoff is None:
                for known in [known for known in cls._of_loop if known.is_closed()]:
                    del cls._of_loop[known]
                handoff = cls._of_loop[loop] = cls(loop)
            return handoff

    def call_soon(self, callback: Callable[..., object], *args: object) -> None:
        """Run `callback(*args)` on the loop soon (any thread; never blocks). Inside
        `loop_wakeups_held` the wakeup waits for the block's end. A closed loop drops it."""
        with self._queue_lock:
            self._queued.append((callback, args))
            if self._wakeup_due:
                return  # a run is scheduled (or owed) and will take this one too
            self._wakeup_due = True
        if not _LOOP_WAKEUPS.deferred(self, self.wake):
            self.wake()

    def wake(self) -> None:
        """Schedule a run of the queued callbacks on the loop (any thread)."""
        try:
            self._loop.call_soon_threadsafe(self._run_queued)
        except RuntimeError:  # the loop is closed: nobody is left to call back
            with self._queue_lock:
                self._queued.clear()
                self._wakeup_due = False

    def wrap_future(self, future: Future | asyncio.Future) -> asyncio.Future:
        """An asyncio future of the loop with `future`'s outcome, handed over through this
        handoff (`asyncio.wrap_future` wakes the loop once per future). Cancelling the
        returned future does not cancel `future`. An asyncio future is returned as it is."""
        if isinstance(future, asyncio.Future):
            return future
        waiter = self._loop.create_future()

        def copy_outcome(done: Future) -> None:
            if waiter.done():  # cancelled meanwhile
                return
            try:  # one look at `done` (each of its accessors takes its lock)
                result = done.result(timeout=0)
            except FutureCancelledError:
                waiter.cancel()
            except BaseException as error:  # noqa: BLE001 - handed over, not handled
                waiter.set_exception(error)
            else:
                waiter.set_result(result)

        future.add_done_callback(lambda done: self.call_soon(copy_outcome, done))
        return waiter

    def _run_queued(self) -> None:
        """On the loop: run every callback queued so far."""
        with self._queue_lock:
            queued, self._queued = self._queued, []
            self._wakeup_due = False
        for callback, args in queued:
            try:
                callback(*args)
            except Exception as exc:  # one failing callback must not drop the others
                self._loop.call_exception_handler(
                    {"message": f"LoopHandoff callback {callback!r} failed", "exception": exc}
                )


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed large buffers for reuse (True if it was set).

    A catch-up read allocates a buffer for every GET body (up to 8 MiB) and frees it once the
    Fetch answer is sent. By default glibc maps buffers of that size fresh or trims them back
    to the kernel on free, so every byte read from the object store page-faults twice (a
    zeroed page per 4 KiB): a quarter of the broker's CPU during a catch-up. With a fixed
    mmap threshold above the GET size and a trim threshold of `TRIM_THRESHOLD_BYTES` per
    arena, freed buffers are reused instead; the process keeps that much freed memory at
    most per malloc arena. Linux/glibc only; a no-op elsewhere.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1 and ok
    if not ok:
        log.warning("mallopt refused the malloc thresholds; freed buffers go back to the kernel")
    return ok


# --------------------------------------------------------------------- what runs where


@dataclass(frozen=True)
class ExecutionContext:
    """One thread or pool of the broker process: its name (the thread name or name
    prefix it runs under), how many threads it has at most, and what may run on it."""

    name: str
    bound: str
    runs: str
    may_block: bool


# Every thread and pool a broker process starts, by name (a test checks that each
# `threading.Thread` / `ThreadPoolExecutor` in dataplane/ is named here, and
# docs/architecture.md shows this table). The event loop never blocks: a slow disk, object
# store or peer broker is awaited there (a future, a wait with a bound), never waited for.
RUNTIME: tuple[ExecutionContext, ...] = (
    ExecutionContext(
        "kafka-server",
        "1 per listener set",
        "the asyncio event loop: sockets, request decoding, every Kafka API handler; waits "
        "only by awaiting (WAL room, durability, fetch long-polls, I/O-pool results)",
        False,
    ),
    ExecutionContext(
        "kafka-io",
        "16 (IO_THREADS, broker/assembly.py)",
        "the Kafka APIs' I/O pool: reads below the `LogCache` (they may reach the object "
        "store), controller calls, partition deletes; every blocking call a handler makes",
        True,
    ),
    ExecutionContext("kafka-security", "2", "SCRAM user and ACL admin calls", True),
    ExecutionContext("heartbeat", "1", "broker heartbeats to the controller", True),
    ExecutionContext("metadata-follower", "1", "long-polls the metadata log", True),
    ExecutionContext("partitions", "1", "applies metadata deltas: opens/closes partitions", True),
    ExecutionContext("partition-move", "8", "opens partitions in parallel (tail reads)", True),
    ExecutionContext("retention", "1", "retention.ms / retention.bytes passes", True),
    ExecutionContext("stall-watch", "1", "notices a process stopped past its session", True),
    ExecutionContext(
        "controller-lease",
        "1",
        "self-fences a broker no controller answered for a session (broker/lease.py)",
        True,
    ),
    ExecutionContext("uploader", "1", "WAL -> stream-set objects -> commit -> WAL trim", True),
    ExecutionContext(
        "file-wal-committer",
        "1 per WAL",
        "group commits: pwritev, fdatasync, reservation check, appends' futures resolved",
        True,
    ),
    ExecutionContext("file-wal-prefill", "1 per new WAL file", "preallocates the file", True),
    ExecutionContext("object-wal-writer", "1 per object WAL", "PUTs WAL objects", True),
    ExecutionContext("object-wal-acks", "1 per object WAL", "acks appends in order", True),
    ExecutionContext(
        "wal-bucket-switch",
        "1 per bucket-following object WAL (RouterChannel, s3:// WAL)",
        "starts a WAL segment in the active bucket, or replaces a failed one",
        True,
    ),
    ExecutionContext("object-wal-read", "16", "parallel GETs while recovering a WAL", True),
    ExecutionContext(
        "resolve-links",
        "4 per WAL recovery (LINK_RESOLVE_WORKERS)",
        "reads the RouterChannel data of a recovered WAL's Link Records (restart, failover)",
        True,
    ),
    ExecutionContext(
        "objectstore",
        "object_store max_concurrency",
        "S3 requests (boto3, or the lean GET/PUT clients of `objectstore/s3_http.py`), run "
        "by priority (`objectstore/priority_pool.py`): PRODUCE "
        "(uploads, WAL PUTs, WAL recovery reads) before CATCH_UP before COMPACTION; a quarter "
        "of the threads run only PRODUCE work",
        True,
    ),
    ExecutionContext("objectstore-merger", "1", "merges adjacent range reads", True),
    ExecutionContext("probe", "1 per bucket", "bucket health probes (tiny PUTs)", True),
    ExecutionContext("failover", "1 per failed node", "WAL failover of a fenced node", True),
    ExecutionContext(
        "failover-close",
        "8 per WAL failover (CLOSE_WORKERS)",
        "closes the failed node's streams on the controller at once",
        True,
    ),
    ExecutionContext("shard-store", "1", "starts the erasure shard store", True),
    ExecutionContext("shard-store-http", "1", "the shard store's HTTP server", True),
    ExecutionContext("hole-store-room", "1 per shard store", "extends the hole file", True),
    ExecutionContext("erasure-produce", "32", "erasure-coded writes of produced batches", True),
    ExecutionContext("erasure-ticker", "1", "advances erasure partitions' visible ends", True),
    ExecutionContext("erasure-writer", "stores x 4", "shard writes to the stores", True),
    ExecutionContext("erasure-reader", "1 per store", "shard reads from the stores", True),
    ExecutionContext("erasure-sealer", "1", "seals decided records into objects", True),
    ExecutionContext("erasure-repair", "REPAIR_THREADS", "re-encodes missing shards", True),
    ExecutionContext("channel-trim", "1", "trims the zone router's RouterChannel", True),
    ExecutionContext(
        "proxy", "1 per proxied partition (<= 1024)", "a proxy's produce forwarding, in order", True
    ),
    ExecutionContext(
        "own", "1 per own-channel partition", "a main's own-channel produces, in order", True
    ),
    ExecutionContext("snapshot-read", "1 per main", "a proxy's snapshot long-polls", True),
    ExecutionContext(
        "zone-route", "1 per main", "a proxy's zone routes to one main, batched", True
    ),
    ExecutionContext(
        "coordinator-proxy", "64", "group/transaction requests forwarded to coordinators", True
    ),
)


def runtime_table() -> str:
    """RUNTIME as the markdown table docs/architecture.md shows."""
    rows = ["| thread / pool | threads | runs | may block |", "|---|---|---|---|"]
    for ctx in RUNTIME:
        rows.append(
            f"| `{ctx.name}` | {ctx.bound} | {ctx.runs} | {'yes' if ctx.may_block else 'no'} |"
        )
    return "\n".join(rows)
