"""The child processes of `automqctl perf`: producer processes and one process per consumer
group, each with its own confluent-kafka clients and its own GIL.

Measured in one process, a load generator's stalls (a sleeping thread woke 166-342 ms late at
50,000 records/s, docs/benchmarks.md) ended up in the latencies it reported as the broker's.
Here producing and consuming never share a process, and producing can be spread over
processes (`--producer-processes`; one by default: on 2 cores a second producer client cost
more CPU than the broker could spare).
Each child counts its latencies into histograms (cli/perf_histogram.py) and sends them with
its byte and record counts to the parent over a multiprocessing queue every `flush_s`; the
parent merges and prints them. Control goes the other way through events: `go` (the clock
starts), `consuming` (consumers may join), `stop_producing` and `stop_consuming`.

A child ignores SIGINT (the parent stops it, so its last samples arrive), asks the kernel to
kill it when the parent dies (PR_SET_PDEATHSIG) and also watches the parent itself, so no
child outlives its `perf`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import os
import queue as queue_module
import signal
import threading
import time
import traceback
from dataclasses import dataclass

from cli.kafka_util import QUIET_RDKAFKA
from cli.perf_histogram import LatencyHistogram, WindowSummary

WARMUP_TIMEOUT_S = 30.0  # clients connecting before the clock starts
STICKY_S = 0.010  # a producer fills one partition this long, as librdkafka's sticky default
FLUSH_TIMEOUT_S = 30.0  # a producer's outstanding records at the end
PUT_TIMEOUT_S = 10.0  # a parent that does not read for this long is gone
STATS_INTERVAL_MS = 1000  # librdkafka statistics (request round-trip times) per producer
IDLE_POLL_S = 0.001  # a producer with nothing due waits this long for delivery reports
CONSUME_WAIT_S = 0.1  # a consumer waits this long for its first record
CONSUME_BATCH = 1000  # records a consumer takes from librdkafka's queue at once
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class WorkerSpec:
    """What one child process does (picklable: sent to the child at spawn)."""

    worker_id: int
    role: str  # "producer" or "consumer"
    bootstrap: str
    client_settings: dict  # plain librdkafka settings (security); quiet logging is added here
    topics: list[str]
    record_size: int = 1024
    acks: str = "all"
    # producer: (global producer index, records/s, [(topic, partition)]) per client
    producers: tuple = ()
    group: str = ""
    consumers: int = 1
    flush_s: float = 0.1


class _Counters:
    """One interval's samples of a child. Thread-safe: every method takes the lock (delivery
    callbacks and consumer threads add; the reporter thread takes)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._reset()
        self.total_records = 0

    def _reset(self) -> None:
        self.produce = LatencyHistogram()
        self.e2e = LatencyHistogram()
        self.produced_bytes = 0
        self.consumed_bytes = 0
        self.records = 0
        self.errors = 0
        self.rtt_p99_ms: list[float] = []  # librdkafka's request round-trip p99 per stats window
        # each broker's round trips per stats window, summarised (`rtt_window`): the run's
        # upper bounds of the p99 and p999 come from these
        self.rtt_windows: list[WindowSummary] = []
        # librdkafka's time from produce() until the request is built (its queue, linger
        # included), p99 per stats window: the client's own share of a produce's latency
        self.queue_p99_ms: list[float] = []

    def delivered(self, latencies_s: list[float], size: int) -> None:
        """Records of `size` bytes acknowledged after these latencies (seconds)."""
        with self.lock:
            self.produce.add_many(latencies_s, 1000.0)
            self.produced_bytes += size * len(latencies_s)
            self.records += len(latencies_s)
            self.total_records += len(latencies_s)

    def consumed(self, latencies_ms: list[float], size_bytes: int) -> None:
        """Records of `size_bytes` in all read these end-to-end latencies (ms) after they
        were sent."""
        with self.lock:
            self.e2e.add_many(latencies_ms)
            self.consumed_bytes += size_bytes
            self.records += len(latencies_ms)
            self.total_records += len(latencies_ms)

    def error(self) -> None:
        with self.lock:
            self.errors += 1

    def rtt(
        self,
        p99_ms: float,
        queue_p99_ms: float | None = None,
        windows: list[WindowSummary] | None = None,
    ) -> None:
        with self.lock:
            self.rtt_p99_ms.append(p99_ms)
            self.rtt_windows.extend(windows or ())
            if queue_p99_ms is not None:
                self.queue_p99_ms.append(queue_p99_ms)

    def take(self) -> dict:
        with self.lock:
            out = {
                "produce": self.produce.counts,
                "e2e": self.e2e.counts,
                "produced_bytes": self.produced_bytes,
                "consumed_bytes": self.consumed_bytes,
                "records": self.records,
                "errors": self.errors,
                "rtt_p99_ms": self.rtt_p99_ms,
                "rtt_windows": self.rtt_windows,
                "queue_p99_ms": self.queue_p99_ms,
            }
            self._reset()
        return out


def _die_with_parent() -> None:
    """SIGINT is the parent's to handle; the kernel kills this process when the parent dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():
        os._exit(1)  # it died before the line above took effect


def _put(out, message: tuple) -> None:
    try:
        out.put(message, timeout=PUT_TIMEOUT_S)
    except queue_module.Full:  # the parent stopped reading: it is gone or stopping us
        os._exit(1)


def run_worker(spec: WorkerSpec, out, events: dict) -> None:
    """Entry point of a child process: run the clients, report samples until stopped."""
    _die_with_parent()
    counters = _Counters()
    try:
        if spec.role == "producer":
            stop = events["stop_producing"]
            threads = [
                threading.Thread(
                    target=_reporting_failure,
                    args=(spec, out, _produce_loop, p, counters, out, events),
                    daemon=True,
                )
                for p in spec.producers
            ]
        else:
            stop = events["stop_consuming"]
            threads = [
                threading.Thread(
                    target=_reporting_failure,
                    args=(spec, out, _consume_loop, counters, out, events),
                    daemon=True,
                )
                for _ in range(spec.consumers)
            ]
        for t in threads:
            t.start()
        parent = multiprocessing.parent_process()
        while not stop.wait(spec.flush_s):
            if parent is not None and not parent.is_alive():
                os._exit(1)
            _put(out, ("window", spec.worker_id, counters.take()))
        for t in threads:  # producers flush their outstanding records, consumers close
            t.join(FLUSH_TIMEOUT_S + 5)
        _put(out, ("window", spec.worker_id, counters.take()))
        _put(out, ("done", spec.worker_id, os.getpid(), counters.total_records))
    except BaseException:  # noqa: BLE001 - reported to the parent, which counts it
        _put(out, ("failed", spec.worker_id, traceback.format_exc(limit=3).strip()))
        raise SystemExit(1) from None


def _reporting_failure(spec: WorkerSpec, out, loop, *args) -> None:
    """Run a client's loop; an exception goes to the parent (it counts as an error there)."""
    try:
        loop(spec, *args)
    except Exception:  # noqa: BLE001 - reported, not swallowed
        _put(out, ("failed", spec.worker_id, traceback.format_exc(limit=3).strip()))


def _produce_loop(spec: WorkerSpec, producer: tuple, counters: _Counters, out, events) -> None:
    from confluent_kafka import Producer

    _index, rate, partitions = producer
    client = Producer(
        {
            "bootstrap.servers": spec.bootstrap,
            "acks": spec.acks,
            "linger.ms": 2,
            "enable.idempotence": spec.acks == "all",
            "queue.buffering.max.kbytes": 262144,
            # librdkafka's own request round-trip times (measured in C, so no Python stall
            # of this process is in them): the broker's side of the produce latency
            "statistics.interval.ms": STATS_INTERVAL_MS,
            "stats_cb": lambda stats: _note_rtt(stats, counters),
            **QUIET_RDKAFKA,
            **spec.client_settings,
        }
    )
    pad = b"x" * (spec.record_size - 8)
    try:
        client.list_topics(spec.topics[0], timeout=WARMUP_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - the run reports the errors it then gets
        pass
    _put(out, ("ready", spec.worker_id))
    stop = events["stop_producing"]
    while not events["go"].wait(0.1):
        if stop.is_set():
            return
    sent = 0
    start = time.monotonic()

    size = len(pad) + 8
    # Delivery callbacks run in this thread (inside poll and flush): they only append, and
    # the loop hands each batch to the counters (the reporter thread takes those)
    latencies_s: list[float] = []
    note_latency = latencies_s.append

    def on_delivery(err, msg):
        # librdkafka's latency: from produce() to the moment this report is served here
        # (confluent-kafka takes it when it builds the message for the callback, not when
        # the ack arrived): the loop below serves reports as soon as they come, so little
        # of this process's own lateness is in it
        if err is not None:
            counters.error()
            return
        note_latency(msg.latency())

    def hand_over() -> None:
        if latencies_s:
            counters.delivered(latencies_s, size)  # counted under its lock, not kept
            latencies_s.clear()

    while not stop.is_set():
        hand_over()
        now = time.monotonic()
        due = int((now - start) * rate) - sent
        if due <= 0:
            # wait in poll, which serves a delivery report the moment it arrives (a sleep
            # would leave it waiting, counted as broker latency)
            client.poll(IDLE_POLL_S)
            continue
        topic, partition = partitions[int((now - start) / STICKY_S) % len(partitions)]
        for i in range(min(due, 1_000)):
            if i % 100 == 99:
                # serve delivery callbacks inside a burst too: a callback that waits
                # for the loop would be counted as broker latency
                client.poll(0)
            value = time.time_ns().to_bytes(8, "big") + pad
            try:
                client.produce(topic, value=value, partition=partition, on_delivery=on_delivery)
            except BufferError:
                client.poll(0.05)
                break
            sent += 1
        client.poll(0)
    client.flush(FLUSH_TIMEOUT_S)
    hand_over()


def _note_rtt(stats_json: str, counters: _Counters) -> None:
    """The worst broker's request round-trip p99 of one librdkafka stats window, and its
    worst internal queue p99 (`int_latency`: produce() until the message is in a request);
    µs in the stats; windows without requests are skipped."""
    try:
        brokers = [
            b
            for b in json.loads(stats_json).get("brokers", {}).values()
            if b.get("nodeid", -1) >= 0 and b.get("rtt", {}).get("cnt", 0) > 0
        ]
        p99s = [b["rtt"]["p99"] / 1000 for b in brokers]
        windows = [rtt_window(b["rtt"]) for b in brokers]
        queue_p99s = [
            b["int_latency"]["p99"] / 1000
            for b in brokers
            if b.get("int_latency", {}).get("cnt", 0) > 0
        ]
    except (ValueError, KeyError, TypeError, AttributeError):
        return  # a stats format this code does not know: no figure, not an error
    if p99s:
        counters.rtt(max(p99s), max(queue_p99s, default=None), windows)


# librdkafka's percentiles of a window and the fraction of its samples each leaves above
_RTT_POINTS = (
    ("p50", 0.5),
    ("p75", 0.25),
    ("p90", 0.1),
    ("p95", 0.05),
    ("p99", 0.01),
    ("p99_99", 0.0001),
)


def rtt_window(rtt: dict) -> WindowSummary:
    """One broker's round trips of one librdkafka stats window (µs there) as a window
    summary in ms: its percentiles and its maximum. Samples beyond librdkafka's histogram
    (`outofrange`) are in no percentile, so they count as above every one but the maximum."""
    count = int(rtt["cnt"])
    beyond = rtt.get("outofrange", 0) / count
    points = [
        (rtt[key] / 1000, min(1.0, fraction + beyond))
        for key, fraction in _RTT_POINTS
        if key in rtt
    ]
    if "max" in rtt:
        points.append((rtt["max"] / 1000, 0.0))
    return count, tuple(points)


def _consume_loop(spec: WorkerSpec, counters: _Counters, out, events) -> None:
    from confluent_kafka import Consumer

    stop = events["stop_consuming"]
    while not events["consuming"].wait(0.1):
        if stop.is_set():
            return
    consumer = Consumer(
        {
            "bootstrap.servers": spec.bootstrap,
            "group.id": spec.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "fetch.max.bytes": 64 * 1024 * 1024,
            **QUIET_RDKAFKA,
            **spec.client_settings,
        }
    )
    consumer.subscribe(spec.topics, on_assign=lambda c, parts: _put(out, ("ready", spec.worker_id)))
    try:
        while not stop.is_set():
            values = read_available(consumer, CONSUME_BATCH, CONSUME_WAIT_S)
            if values:
                now_ns = time.time_ns()
                counters.consumed(
                    [(now_ns - int.from_bytes(v[:8], "big")) / 1e6 for v in values],
                    sum(map(len, values)),
                )
    finally:
        consumer.close()


def read_available(consumer, max_records: int, wait_s: float) -> list[bytes]:
    """The values of the records `consumer` has, returned as soon as there is one: waits
    up to `wait_s` for the first, then takes what else is already fetched (at most
    `max_records` in all) without waiting. `consume(n, timeout)` would wait until n
    records or the timeout gathered: at 10,000 records/s, ~50 ms added to every record's
    end-to-end latency."""
    first = consumer.poll(wait_s)
    if first is None:
        return []
    messages = [first, *consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]
    return [m.value() for m in messages if not m.error()]


def producer_plan(
    topics: list[str], partitions: int, rate: float, producers: int, processes: int
) -> list[list[tuple]]:
    """Producers spread over processes (producer k in process k mod N), each with an equal
    share of the rate and its own partitions (every partition has one producer while there
    are at least as many partitions as producers). Pure."""
    pairs = [(t, p) for p in range(partitions) for t in topics]
    plan: list[list[tuple]] = [[] for _ in range(min(processes, producers))]
    for k in range(producers):
        own = pairs[k::producers] if len(pairs) >= producers else [pairs[k % len(pairs)]]
        plan[k % len(plan)].append((k, rate / producers, own))
    return plan
