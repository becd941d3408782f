"""An acked-write ledger: idempotent producers record every acknowledged (partition, offset,
value) with its send and ack times; afterwards a consumer reads everything back and the
ledger says what is missing or duplicated, and how long each partition was unavailable.

Used by the e2e tests (tests/e2e) and the benchmarks; the cluster helpers it re-exports
live in tests/support/cluster.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from tests.support.cluster import (  # noqa: F401  (re-exported: the ledger's users need them)
    automqctl,
    cluster_status,
    create_topic,
    leaders,
    running_cluster,
)

MAX_LEDGER_MESSAGES = 2_000_000
# librdkafka's idempotence events ("eos" debug: epoch bumps, drains, sequence errors) kept
# to explain a duplicate: a client-side epoch bump resends possibly-persisted messages with
# new sequence numbers, which no broker can deduplicate
MAX_EOS_EVENTS = 200
# what librdkafka logs to `AckLedger(log_path=...)`
LOG_PATH_DEBUG = "eos,msg,topic,broker"
EOS_EVENT_WORDS = ("bump", "drain", "ERRSEQ", "UNKPID", "ERRPID", "DUPSEQ", "fatal", "desync")


class _EventLog(logging.Handler):
    """The producer's log lines worth keeping (bounded); librdkafka's own loglines
    arrive here through poll()."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: deque[str] = deque(maxlen=MAX_EOS_EVENTS)  # the newest kept

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        if any(w in line for w in EOS_EVENT_WORDS):
            self.events.append(f"{time.strftime('%H:%M:%S')} {line}")


@dataclass
class Ack:
    partition: int
    # None: librdkafka reported the message persisted without an offset. An idempotent
    # producer that lost a response (broker paused or killed) infers the batch was written
    # when a later batch of the partition succeeds, and cannot know where it landed.
    offset: int | None
    value: bytes
    sent_s: float
    acked_s: float


@dataclass
class LedgerReport:
    acked: int
    consumed: int
    missing: list[tuple[int, bytes]] = field(default_factory=list)
    duplicated: list[bytes] = field(default_factory=list)
    out_of_order_partitions: list[int] = field(default_factory=list)
    failed_sends: int = 0
    # the producer's idempotence events (see EOS_EVENT_WORDS), to explain a duplicate
    eos_events: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.duplicated and not self.out_of_order_partitions


class AckLedger:
    """Produce to every partition of `topic` at `rate_per_partition` msgs/s from a thread
    until `stop()`; every acknowledged message is recorded."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate_per_partition: float = 50.0,
        log_path: Path | None = None,
        **producer_config,
    ):
        """`log_path`: librdkafka's log of the producer (`LOG_PATH_DEBUG`: idempotence, each
        batch sent and answered, leaders, connections) goes to this file, kept beside a
        cluster's logs to explain a sequence error."""
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.interval_s = 1.0 / rate_per_partition
        self.acks: list[Ack] = []
        self.failed = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._events = _EventLog()
        events_logger = logging.getLogger(f"ledger.producer.{id(self)}")
        events_logger.propagate = False
        events_logger.setLevel(logging.DEBUG)
        events_logger.addHandler(self._events)
        self._log_file: logging.FileHandler | None = None
        if log_path is not None:
            self._log_file = logging.FileHandler(log_path)
            self._log_file.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            events_logger.addHandler(self._log_file)
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "debug": "eos" if log_path is None else LOG_PATH_DEBUG,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 120_000,
                "retry.backoff.ms": 50,
                "retry.backoff.max.ms": 200,
                "topic.metadata.refresh.interval.ms": 1000,
                **producer_config,
            },
            logger=events_logger,
        )
        self._thread = threading.Thread(target=self._run, name="ledger-producer", daemon=True)

    def start(self) -> AckLedger:
        self._thread.start()
        return self

    def _on_delivery(self, sent_s: float, value: bytes):
        def callback(err, msg) -> None:
            if err is not None:
                with self._lock:
                    self.failed += 1
                    if len(self.errors) < 20:
                        self.errors.append(str(err))
                return
            with self._lock:
                self.acks.append(
                    Ack(msg.partition(), msg.offset(), value, sent_s, time.monotonic())
                )

        return callback

    def _run(self) -> None:
        seq = 0
        next_send = time.monotonic()
        while not self._stop.is_set() and seq < MAX_LEDGER_MESSAGES:
            for p in range(self.partitions):
                value = f"{p}:{seq}".encode()
                for _ in range(100):  # local queue full: serve callbacks and try again
                    try:
                        self._producer.produce(
                            self.topic,
                            value=value,
                            partition=p,
                            on_delivery=self._on_delivery(time.monotonic(), value),
                        )
                        break
                    except BufferError:
                        self._producer.poll(0.05)
            seq += 1
            next_send += self.interval_s
            self._producer.poll(max(0.0, next_send - time.monotonic()))

    def stop(self, flush_timeout_s: float = 120) -> None:
        self._stop.set()
        self._thread.join(30)
        remaining = self._producer.flush(flush_timeout_s)
        if self._log_file is not None:
            self._log_file.close()
        assert remaining == 0, f"{remaining} messages neither acked nor failed"

    def snapshot(self) -> list[Ack]:
        with self._lock:
            return list(self.acks)

    # ------------------------------------------------------------ analysis

    def unavailability_s(self, partitions: set[int], after_s: float) -> dict[int, float]:
        """Per partition: the longest gap between consecutive acks after `after_s`, minus the
        send interval (what a steady producer experienced as the partition being down)."""
        by_partition: dict[int, list[float]] = defaultdict(list)
        for a in self.snapshot():
            if a.partition in partitions:
                by_partition[a.partition].append(a.acked_s)
        gaps: dict[int, float] = {}
        for p in partitions:
            times = sorted(t for t in by_partition.get(p, []))
            before = [t for t in times if t <= after_s]
            after = [t for t in times if t > after_s]
            seq = ([before[-1]] if before else []) + after
            gap = max((b - a for a, b in zip(seq, seq[1:])), default=float("inf"))
            gaps[p] = max(gap - self.interval_s, 0.0)
        return gaps

    def writable_again_s(self, partitions: set[int], event_s: float) -> dict[int, float]:
        """Per partition: seconds from `event_s` until the first ack of a message sent after
        the event (when the partition took writes again)."""
        firsts: dict[int, float] = {}
        for a in self.snapshot():
            if a.partition in partitions and a.sent_s >= event_s:
                firsts[a.partition] = min(firsts.get(a.partition, float("inf")), a.acked_s)
        return {p: firsts.get(p, float("inf")) - event_s for p in partitions}

    def wait_writable(
        self,
        partitions: set[int],
        after_s: float,
        timeout_s: float = 40,
        raise_on_timeout: bool = True,
    ) -> dict[int, float]:
        """Wait until every partition acknowledged a message sent after `after_s`; returns
        `writable_again_s`. On timeout: AssertionError, or the partial answer."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            again = self.writable_again_s(partitions, after_s)
            if all(v != float("inf") for v in again.values()):
                return again
            time.sleep(0.05)
        again = self.writable_again_s(partitions, after_s)
        if raise_on_timeout:
            # the producer's side of it: a fatal idempotence error stops every partition
            raise AssertionError(
                f"partitions not writable again: {again}; producer errors: {self.errors[-5:]};"
                f" its last idempotence events: {list(self._events.events)[-20:]}"
                + (f"; its log: {self._log_file.baseFilename}" if self._log_file else "")
            )
        return again

    def verify(self, timeout_s: float = 120) -> LedgerReport:
        """Read the whole topic back; every acked value exactly once, at its acked offset
        (in its partition where the client could not tell the offset)."""
        acked = self.snapshot()
        ends: dict[int, int] = defaultdict(int)
        for a in acked:
            if a.offset is not None:  # an ack without offset precedes a later one that has it
                ends[a.partition] = max(ends[a.partition], a.offset + 1)
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"verify-{time.time()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
            }
        )
        seen: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
        positions: dict[int, int] = {}
        last_offset: dict[int, int] = {}
        out_of_order: set[int] = set()
        try:
            consumer.assign([TopicPartition(self.topic, p, 0) for p in range(self.partitions)])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and any(
                positions.get(p, 0) < end for p, end in ends.items()
            ):
                msg = consumer.poll(0.2)
                if msg is None or msg.error():
                    continue
                p, off = msg.partition(), msg.offset()
                if off <= last_offset.get(p, -1):
                    out_of_order.add(p)
                last_offset[p] = off
                positions[p] = off + 1
                seen[msg.value()].append((p, off))
        finally:
            consumer.close()
        report = LedgerReport(
            acked=len(acked),
            consumed=sum(len(v) for v in seen.values()),
            failed_sends=self.failed,
            out_of_order_partitions=sorted(out_of_order),
            eos_events=list(self._events.events),
        )
        for a in acked:
            where = seen.get(a.value, [])
            if a.offset is None:
                found = any(p == a.partition for p, _ in where)  # its offset is unknown
            else:
                found = (a.partition, a.offset) in where
            if not found:
                report.missing.append((a.partition, a.value))
        report.duplicated = [v for v, where in seen.items() if len(where) > 1]
        return report
