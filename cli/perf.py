"""`automqctl perf`: a load generator in the style of automq-perf-test.

Producers send fixed-size records at a target rate (each value starts with its send time);
consumer groups read them. Every interval it prints produce throughput and latency
(send -> ack) and end-to-end latency (send -> consumed) percentiles. With
`--backlog-seconds N`, consumers start only after N seconds of producing, so the run also
measures catch-up reads of that backlog while producing goes on, and how produce latency
changes during catch-up. A JSON summary ends the run.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import typer

from cli.kafka_util import (
    QUIET_RDKAFKA,
    check_reachable,
    client_error_text,
    librdkafka_security,
)
from cli.options import FormatOption
from cli.output import OutputFormat, console, err_console, fail, print_data, waiting, warn
from cli.processes import DEFAULT_CLUSTER_DIR, ClusterError, LocalCluster

MAX_SAMPLES = 2_000_000
WARMUP_TIMEOUT_S = 30.0  # clients connecting and consumers joining before the clock starts
CREATE_TIMEOUT_S = 30.0


@dataclass
class _Window:
    """Samples of one interval (and the whole run), bounded."""

    produce_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    produced_bytes: int = 0
    consumed_bytes: int = 0
    errors: int = 0


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class PerfRun:
    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        record_size: int,
        rate: float,
        producers: int,
        acks: str,
        client_config: dict | None = None,
    ):
        self.bootstrap = bootstrap
        # librdkafka settings every client gets (quiet logging, the cluster's SASL login)
        self.client_config = client_config if client_config is not None else dict(QUIET_RDKAFKA)
        self.topics = topics
        self.record_size = max(record_size, 16)
        self.rate = rate
        self.producers = producers
        self.acks = acks
        self.lock = threading.Lock()
        self.window = _Window()
        self.total = _Window()
        self.phase_produce_ms: dict[str, list[float]] = {
            "before_catchup": [],
            "catchup": [],
            "after": [],
        }
        self.phase = "before_catchup"
        self.stop = threading.Event()
        self.consuming = threading.Event()
        # the clock starts when every producer is connected (metadata, producer id) and,
        # without a backlog phase, every consumer has its partitions, as OpenMessaging
        # Benchmark does: joins and connects are not broker latency
        self.go = threading.Event()
        self.ready = threading.Semaphore(0)

    def _record(self, attr: str, value) -> None:
        with self.lock:
            for w in (self.window, self.total):
                if isinstance(value, float):
                    lst = getattr(w, attr)
                    if len(lst) < MAX_SAMPLES:
                        lst.append(value)
                else:
                    setattr(w, attr, getattr(w, attr) + value)

    def produce_loop(self, index: int) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": self.acks,
                "linger.ms": 2,
                "enable.idempotence": self.acks == "all",
                "queue.buffering.max.kbytes": 262144,
                **self.client_config,
            }
        )
        pad = b"x" * (self.record_size - 8)
        per_producer = self.rate / self.producers
        try:
            producer.list_topics(self.topics[0], timeout=WARMUP_TIMEOUT_S)
        except Exception:  # noqa: BLE001 - the run reports the errors it then gets
            pass
        self.ready.release()
        self.go.wait()
        sent = 0
        start = time.monotonic()

        def on_delivery(err, msg, t0):
            if err is not None:
                self._record("errors", 1)
                return
            ms = (time.monotonic() - t0) * 1000
            self._record("produce_ms", ms)
            self._record("produced_bytes", len(msg.value()))
            with self.lock:
                if len(self.phase_produce_ms[self.phase]) < MAX_SAMPLES:
                    self.phase_produce_ms[self.phase].append(ms)

        while not self.stop.is_set():
            due = int((time.monotonic() - start) * per_producer) - sent
            if due <= 0:
                time.sleep(0.001)
                producer.poll(0)
                continue
            for i in range(min(due, 1_000)):
                if i % 100 == 99:
                    # serve delivery callbacks inside a burst too: a callback that waits
                    # for the loop would be counted as broker latency
                    producer.poll(0)
                t0 = time.monotonic()
                value = time.time_ns().to_bytes(8, "big") + pad
                topic = self.topics[(sent + index) % len(self.topics)]
                try:
                    producer.produce(
                        topic, value=value, on_delivery=lambda e, m, t0=t0: on_delivery(e, m, t0)
                    )
                except BufferError:
                    producer.poll(0.05)
                    break
                sent += 1
            producer.poll(0)
        producer.flush(30)

    def consume_loop(self, group: str) -> None:
        from confluent_kafka import Consumer

        self.consuming.wait()
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "fetch.max.bytes": 64 * 1024 * 1024,
                **self.client_config,
            }
        )
        consumer.subscribe(self.topics, on_assign=lambda c, parts: self.ready.release())
        try:
            while not self.stop.is_set():
                for msg in consumer.consume(1000, 0.2):
                    if msg.error():
                        continue
                    value = msg.value()
                    sent_ns = int.from_bytes(value[:8], "big")
                    self._record("e2e_ms", (time.time_ns() - sent_ns) / 1e6)
                    self._record("consumed_bytes", len(value))
        finally:
            consumer.close()

    def take_window(self) -> _Window:
        with self.lock:
            w, self.window = self.window, _Window()
        return w


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def perf(
    bootstrap_server: str | None = typer.Option(None, "--bootstrap-server", "-b"),
    dir: Path = typer.Option(DEFAULT_CLUSTER_DIR, "--dir", envvar="AUTOMQ_CLUSTER_DIR"),
    topics: int = typer.Option(1, min=1, max=1000, help="number of topics"),
    partitions: int = typer.Option(4, min=1, max=10_000, help="partitions per topic"),
    producers: int = typer.Option(1, min=1, max=64),
    groups: int = typer.Option(1, min=0, max=64, help="consumer groups"),
    consumers_per_group: int = typer.Option(1, min=1, max=64),
    record_size: int = typer.Option(1024, min=16, max=8 * 1024 * 1024, help="bytes"),
    send_rate: float = typer.Option(1000.0, min=1, help="records per second, all producers"),
    duration_s: float = typer.Option(30.0, "--duration", min=1, max=86_400),
    backlog_seconds: float = typer.Option(0.0, min=0, help="produce this long before consuming"),
    interval_s: float = typer.Option(1.0, "--interval", min=0.1, max=60),
    acks: str = typer.Option("all", help="0, 1 or all"),
    topic_prefix: str = typer.Option("perf", help="topics are PREFIX-<run>-<n>"),
    summary_file: Path | None = typer.Option(None, help="also write the JSON summary here"),
    cleanup: bool = typer.Option(
        True, "--cleanup/--no-cleanup", help="delete the run's topics (and data) at the end"
    ),
    format: OutputFormat = FormatOption,
) -> None:
    """Generate load and report throughput and latency percentiles (with --format json or
    yaml, stdout holds only the summary; progress goes to stderr)."""
    progress = console if format == OutputFormat.table else err_console
    try:
        from confluent_kafka.admin import AdminClient, NewTopic
    except ImportError:
        fail("automqctl perf needs confluent-kafka: pip install confluent-kafka")
    if acks not in ("0", "1", "all"):
        fail("--acks must be 0, 1 or all")
    if bootstrap_server is None:
        try:
            bootstrap_server = LocalCluster(dir).load().bootstrap_servers()
        except ClusterError as exc:
            fail(f"{exc}; or pass --bootstrap-server")
    try:
        check_reachable(bootstrap_server, timeout_s=5.0)  # a dead address fails at once
    except (ConnectionError, ValueError) as exc:
        fail(str(exc))
    run_id = uuid.uuid4().hex[:6]
    names = [f"{topic_prefix}-{run_id}-{i}" for i in range(topics)]
    try:
        client_config = {
            **QUIET_RDKAFKA,
            **librdkafka_security(LocalCluster(dir).client_security()),
        }
    except ClusterError as exc:
        fail(str(exc))
    admin = AdminClient({"bootstrap.servers": bootstrap_server, **client_config})
    try:
        with waiting(f"creating {len(names)} topics"):
            for _name, fut in admin.create_topics(
                [NewTopic(n, partitions, 1) for n in names],
                operation_timeout=CREATE_TIMEOUT_S,
                request_timeout=CREATE_TIMEOUT_S,
            ).items():
                fut.result(CREATE_TIMEOUT_S)
    except Exception as exc:
        if cleanup:
            _delete_topics(admin, names, progress)
        fail(f"creating topics failed: {client_error_text(exc)}")
    try:
        _run(
            bootstrap_server,
            names,
            run_id,
            topics,
            partitions,
            producers,
            groups,
            consumers_per_group,
            record_size,
            send_rate,
            duration_s,
            backlog_seconds,
            interval_s,
            acks,
            summary_file,
            client_config,
            format,
        )
    finally:
        if cleanup:
            _delete_topics(admin, names, progress)


def _delete_topics(admin, names: list[str], progress=console) -> None:
    """Delete the run's topics (and their data); a failure is a note, not an error."""
    try:
        futures = admin.delete_topics(names, operation_timeout=30, request_timeout=30)
        for fut in futures.values():
            try:
                fut.result(30)
            except Exception as exc:
                text = client_error_text(exc)
                if "UNKNOWN_TOPIC" not in text:  # never created: nothing to delete
                    raise
        progress.print(f"deleted topics {', '.join(names)} (--no-cleanup keeps them)")
    except Exception as exc:
        warn(f"could not delete the perf topics {', '.join(names)}: {client_error_text(exc)}")


def _run(
    bootstrap_server: str,
    names: list[str],
    run_id: str,
    topics: int,
    partitions: int,
    producers: int,
    groups: int,
    consumers_per_group: int,
    record_size: int,
    send_rate: float,
    duration_s: float,
    backlog_seconds: float,
    interval_s: float,
    acks: str,
    summary_file: Path | None,
    client_config: dict | None = None,
    format: OutputFormat = OutputFormat.table,
) -> None:
    progress = console if format == OutputFormat.table else err_console
    run = PerfRun(bootstrap_server, names, record_size, send_rate, producers, acks, client_config)
    threads = [
        threading.Thread(target=run.produce_loop, args=(i,), daemon=True) for i in range(producers)
    ]
    threads += [
        threading.Thread(target=run.consume_loop, args=(f"perf-{run_id}-g{g}",), daemon=True)
        for g in range(groups)
        for _ in range(consumers_per_group)
    ]
    if backlog_seconds <= 0:
        run.phase = "after"
        run.consuming.set()
    for t in threads:
        t.start()
    waiting_for = producers + (groups * consumers_per_group if backlog_seconds <= 0 else 0)
    warmup_deadline = time.monotonic() + WARMUP_TIMEOUT_S
    for _ in range(waiting_for):
        if not run.ready.acquire(timeout=max(0.0, warmup_deadline - time.monotonic())):
            progress.print(f"[yellow]clients not ready after {WARMUP_TIMEOUT_S:.0f} s: starting[/]")
            break
    run.go.set()
    start = time.monotonic()
    catchup_started = None
    catchup_done = None
    backlog_end_bytes = 0
    intervals = []
    progress.print(
        f"topics {names} x {partitions} partitions, {producers} producers, "
        f"{groups} groups, {record_size} B records at {send_rate:.0f}/s"
    )
    progress.print("   time  prod MB/s  prod p50/p99/p999 ms   cons MB/s   e2e p50/p99/p999 ms")
    try:
        while time.monotonic() - start < duration_s + backlog_seconds:
            time.sleep(interval_s)
            elapsed = time.monotonic() - start
            if not run.consuming.is_set() and elapsed >= backlog_seconds:
                with run.lock:
                    backlog_end_bytes = run.total.produced_bytes
                    run.phase = "catchup" if backlog_seconds > 0 else "after"
                catchup_started = time.monotonic()
                run.consuming.set()
            if catchup_started and catchup_done is None and backlog_seconds > 0:
                with run.lock:
                    if run.total.consumed_bytes >= backlog_end_bytes * groups:
                        catchup_done = time.monotonic()
                        run.phase = "after"
            w = run.take_window()
            row = {
                "t_s": round(elapsed, 1),
                "produce_mb_s": w.produced_bytes / interval_s / 1e6,
                "produce_p50_ms": percentile(w.produce_ms, 50),
                "produce_p99_ms": percentile(w.produce_ms, 99),
                "produce_p999_ms": percentile(w.produce_ms, 99.9),
                "consume_mb_s": w.consumed_bytes / interval_s / 1e6,
                "e2e_p50_ms": percentile(w.e2e_ms, 50),
                "e2e_p99_ms": percentile(w.e2e_ms, 99),
                "e2e_p999_ms": percentile(w.e2e_ms, 99.9),
                "errors": w.errors,
            }
            intervals.append(row)
            progress.print(
                f"{row['t_s']:7.1f}  {row['produce_mb_s']:9.2f}  "
                f"{_fmt(row['produce_p50_ms'])}/{_fmt(row['produce_p99_ms'])}/"
                f"{_fmt(row['produce_p999_ms'])}   {row['consume_mb_s']:9.2f}   "
                f"{_fmt(row['e2e_p50_ms'])}/{_fmt(row['e2e_p99_ms'])}/"
                f"{_fmt(row['e2e_p999_ms'])}" + (f"  errors {w.errors}" if w.errors else "")
            )
    finally:
        run.stop.set()
        for t in threads:
            t.join(60)
    total = run.total
    wall = time.monotonic() - start
    summary = {
        "topics": topics,
        "partitions_per_topic": partitions,
        "producers": producers,
        "groups": groups,
        "record_size": record_size,
        "send_rate": send_rate,
        "acks": acks,
        "duration_s": round(wall, 1),
        "produced_mb": total.produced_bytes / 1e6,
        "produce_mb_s": total.produced_bytes / wall / 1e6,
        "produce_p50_ms": percentile(total.produce_ms, 50),
        "produce_p99_ms": percentile(total.produce_ms, 99),
        "produce_p999_ms": percentile(total.produce_ms, 99.9),
        "e2e_p50_ms": percentile(total.e2e_ms, 50),
        "e2e_p99_ms": percentile(total.e2e_ms, 99),
        "e2e_p999_ms": percentile(total.e2e_ms, 99.9),
        # the worst interval after the first (connections and metadata warm up in it): a p99
        # that looks fine over the run can hide slow seconds
        "max_interval_produce_p99_ms": max(
            (i["produce_p99_ms"] for i in intervals[1:] if i["produce_p99_ms"] is not None),
            default=None,
        ),
        "errors": total.errors,
    }
    if backlog_seconds > 0:
        summary["backlog_mb"] = backlog_end_bytes / 1e6
        summary["catchup_s"] = (
            round(catchup_done - catchup_started, 2) if catchup_done and catchup_started else None
        )
        summary["catchup_mb_s"] = (
            backlog_end_bytes / 1e6 / summary["catchup_s"] if summary["catchup_s"] else None
        )
        summary["produce_p99_before_catchup_ms"] = percentile(
            run.phase_produce_ms["before_catchup"], 99
        )
        summary["produce_p99_during_catchup_ms"] = percentile(run.phase_produce_ms["catchup"], 99)
    text = json.dumps(summary, indent=2)
    if not print_data(summary, format):
        console.print(text, markup=False, highlight=False)
    if summary_file is not None:
        summary_file.write_text(text)
    if total.errors:
        raise typer.Exit(1)
