"""`automqctl perf`: a load generator in the style of automq-perf-test.

Producers send fixed-size records at a target rate (each value starts with its send time);
consumer groups read them. Every interval it prints produce throughput and latency
(send -> ack) and end-to-end latency (send -> consumed) percentiles. With
`--backlog-seconds N`, consumers start only after N seconds of producing, so the run also
measures catch-up reads of that backlog while producing goes on, and how produce latency
changes during catch-up. A JSON summary ends the run.

The clients run in child processes (cli/perf_workers.py): producers in
`--producer-processes`, each consumer group in a process of its own, so producing and
consuming never share a GIL and fewer of the load generator's own stalls land in the
latencies it reports. This process only starts
them, merges their histograms per interval and prints.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import queue as queue_module
import signal
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import typer
from rich.table import Table

from cli.cluster_config import DEFAULT_CLUSTER_DIR, ClusterError
from cli.kafka_util import (
    QUIET_RDKAFKA,
    check_reachable,
    client_error_text,
    librdkafka_security,
)
from cli.local_cluster import LocalCluster
from cli.options import FormatOption
from cli.output import OutputFormat, console, err_console, fail, print_data, waiting, warn
from cli.perf_broker_metrics import BrokerPauses, MachineLag
from cli.perf_histogram import LatencyHistogram, WindowSummary, quantile_at_most
from cli.perf_workers import FLUSH_TIMEOUT_S, WorkerSpec, producer_plan, run_worker

WARMUP_TIMEOUT_S = 30.0  # clients connecting and consumers joining before the clock starts
CREATE_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 10.0  # consumers reading what was produced last, after producers stop
STOP_TIMEOUT_S = FLUSH_TIMEOUT_S + 15  # a child's flush and last report; then terminated
INTERRUPTED_STOP_TIMEOUT_S = 5.0
QUEUE_MESSAGES = 10_000  # children block (then give up) when the parent stops reading
MAX_RTT_SAMPLES = 100_000  # librdkafka round-trip windows kept for the summary


class _Window:
    """Samples of one interval (or the whole run), merged from the children; bounded."""

    def __init__(self) -> None:
        self.produce = LatencyHistogram()
        self.e2e = LatencyHistogram()
        self.produced_bytes = 0
        self.consumed_bytes = 0
        self.errors = 0
        self.rtt_p99_ms: list[float] = []  # one per producer and stats window (~1 s)
        self.queue_p99_ms: list[float] = []  # librdkafka's own queue, likewise
        self.rtt_windows: list[WindowSummary] = []  # per broker too (perf_workers.rtt_window)

    def add(self, sample: dict) -> None:
        if len(self.rtt_p99_ms) < MAX_RTT_SAMPLES:
            self.rtt_p99_ms.extend(sample.get("rtt_p99_ms", ()))
            self.queue_p99_ms.extend(sample.get("queue_p99_ms", ()))
            self.rtt_windows.extend(sample.get("rtt_windows", ()))
        self.produce.merge(sample["produce"])
        self.e2e.merge(sample["e2e"])
        self.produced_bytes += sample["produced_bytes"]
        self.consumed_bytes += sample["consumed_bytes"]
        self.errors += sample["errors"]


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


class PerfRun:
    """The parent of a perf run: starts the producer processes and one process per consumer
    group (cli/perf_workers.py), merges their samples and stops them on every path (`close`).
    Used from one thread."""

    def __init__(
        self,
        bootstrap: str,
        topics: list[str],
        partitions: int,
        record_size: int,
        rate: float,
        producers: int,
        producer_processes: int,
        groups: list[str],
        consumers_per_group: int,
        acks: str,
        client_settings: dict | None = None,
        interval_s: float = 1.0,
    ):
        self.ctx = multiprocessing.get_context("spawn")  # no fork of librdkafka's threads
        self.queue = self.ctx.Queue(QUEUE_MESSAGES)
        self.events = {
            name: self.ctx.Event()
            for name in ("go", "consuming", "stop_producing", "stop_consuming")
        }
        flush_s = min(0.1, interval_s / 4)
        settings = {
            k: v for k, v in (client_settings or {}).items() if isinstance(v, (str, int, float))
        }
        common = {
            "bootstrap": bootstrap,
            "client_settings": settings,
            "topics": topics,
            "record_size": max(record_size, 16),
            "acks": acks,
            "flush_s": flush_s,
        }
        plan = producer_plan(topics, partitions, rate, producers, producer_processes)
        self.specs = [
            WorkerSpec(worker_id=i, role="producer", producers=tuple(p), **common)
            for i, p in enumerate(plan)
        ]
        self.specs += [
            WorkerSpec(
                worker_id=len(plan) + g,
                role="consumer",
                group=group,
                consumers=consumers_per_group,
                **common,
            )
            for g, group in enumerate(groups)
        ]
        self.producer_clients = producers
        self.processes: list = []
        self.window = _Window()
        self.total = _Window()
        self.phase_produce = {p: LatencyHistogram() for p in ("before_catchup", "catchup", "after")}
        self.phase = "before_catchup"
        self.ready = 0
        self.records = {spec.worker_id: 0 for spec in self.specs}  # acked or consumed
        self.done: dict[int, int] = {}  # worker id -> pid, once it reported its last samples
        self.failures: list[str] = []

    @property
    def producer_ids(self) -> list[int]:
        return [s.worker_id for s in self.specs if s.role == "producer"]

    @property
    def consumer_ids(self) -> list[int]:
        return [s.worker_id for s in self.specs if s.role == "consumer"]

    def start(self) -> None:
        # a child inherits an ignored SIGINT through exec: a Ctrl-C while it is still
        # importing must not kill it with a traceback; the parent stops it
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
        try:
            for spec in self.specs:
                proc = self.ctx.Process(
                    target=run_worker,
                    args=(spec, self.queue, self.events),
                    name=f"perf-{spec.role}-{spec.worker_id}",
                    daemon=True,  # multiprocessing terminates it if the parent exits
                )
                proc.start()
                self.processes.append(proc)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)

    def pump(self, until: float) -> None:
        """Merge the children's messages until the monotonic time `until`."""
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return
            try:
                message = self.queue.get(timeout=min(left, 0.5))
            except queue_module.Empty:
                self._check_alive()
                continue
            self._handle(message)

    def _handle(self, message: tuple) -> None:
        kind, worker_id = message[0], message[1]
        if kind == "window":
            sample = message[2]
            for w in (self.window, self.total):
                w.add(sample)
            self.phase_produce[self.phase].merge(sample["produce"])
            self.records[worker_id] += sample["records"]
        elif kind == "ready":
            self.ready += 1
        elif kind == "done":
            self.done[worker_id] = message[2]
        elif kind == "failed":
            self.failures.append(message[2].splitlines()[-1])
            self.done.setdefault(worker_id, 0)
            warn(f"a perf {self.specs[worker_id].role} process failed: {self.failures[-1]}")

    def _check_alive(self) -> None:
        for spec, proc in zip(self.specs, self.processes, strict=True):
            if spec.worker_id not in self.done and not proc.is_alive():
                self.done[spec.worker_id] = 0
                self.failures.append(f"exit code {proc.exitcode}")
                warn(f"a perf {spec.role} process ended with exit code {proc.exitcode}")

    def wait_ready(self, wanted: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.ready < wanted and time.monotonic() < deadline:
            self.pump(min(deadline, time.monotonic() + 0.05))
            if self.failures:
                return False
        return self.ready >= wanted

    def wait_done(self, ids: list[int], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(i not in self.done for i in ids) and time.monotonic() < deadline:
            self.pump(min(deadline, time.monotonic() + 0.05))

    def drain_consumers(self, timeout_s: float) -> None:
        """Let every group read what the producers had acknowledged (bounded)."""
        produced = sum(self.records[i] for i in self.producer_ids)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
            self.records[i] < produced and i not in self.done for i in self.consumer_ids
        ):
            self.pump(min(deadline, time.monotonic() + 0.05))

    def close(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop every child: ask, wait (reading their last samples), terminate, kill."""
        self.events["stop_producing"].set()
        self.events["stop_consuming"].set()
        deadline = time.monotonic() + timeout_s
        while any(p.is_alive() for p in self.processes) and time.monotonic() < deadline:
            try:
                self._handle(self.queue.get(timeout=0.05))
            except queue_module.Empty:
                pass
        for proc in self.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in self.processes:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join(2)
        with contextlib.suppress(Exception):
            while True:  # samples sent right before exiting
                self._handle(self.queue.get_nowait())
        self.queue.close()
        self.queue.cancel_join_thread()

    def take_window(self) -> _Window:
        w, self.window = self.window, _Window()
        return w


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _summary_value(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def summary_table(summary: dict) -> Table:
    """The run's summary as a two-column table (the same fields as `--format json`)."""
    table = Table(title="summary", show_header=True)
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, _summary_value(value))
    return table


def perf(
    bootstrap_server: str | None = typer.Option(None, "--bootstrap-server", "-b"),
    dir: Path = typer.Option(DEFAULT_CLUSTER_DIR, "--dir", envvar="AUTOMQ_CLUSTER_DIR"),
    topics: int = typer.Option(1, min=1, max=1000, help="number of topics"),
    partitions: int = typer.Option(4, min=1, max=10_000, help="partitions per topic"),
    producers: int | None = typer.Option(
        None, min=1, max=64, help="producer clients (default: one per producer process)"
    ),
    producer_processes: int = typer.Option(
        # 1: on 2 cores a second producer client cost 1.4x the load generator's CPU and
        # raised the broker's own latency (docs/benchmarks.md); more spread the producers
        1,
        min=1,
        max=64,
        help="processes the producers are spread over (each consumer group has its own)",
    ),
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
    summary_intervals: bool = typer.Option(
        False,
        "--summary-intervals",
        help="the --summary-file also holds every interval's row, its end as Unix time and its "
        "produce latency histogram (bucket counts, cli/perf_histogram.py), so a script can "
        "take the percentiles of any window of the run",
    ),
    cleanup: bool = typer.Option(
        True,
        "--cleanup/--no-cleanup",
        help="delete the run's topics (and data) and consumer groups at the end",
    ),
    format: OutputFormat = FormatOption,
) -> None:
    """Generate load and report throughput and latency percentiles (with --format json or
    yaml, stdout holds only the summary; progress goes to stderr)."""
    progress = console if format == OutputFormat.table else err_console
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        fail("automqctl perf needs confluent-kafka: pip install confluent-kafka")
    if acks not in ("0", "1", "all"):
        fail("--acks must be 0, 1 or all")
    if producers is None:
        producers = producer_processes
    metrics_urls = _broker_metrics_urls(dir, bootstrap_server)
    bootstrap_server = _reachable_bootstrap(bootstrap_server, dir)
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
    _create_topics(admin, names, partitions, cleanup, progress)
    try:
        _run(
            bootstrap_server,
            names,
            run_id,
            topics,
            partitions,
            producers,
            producer_processes,
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
            summary_intervals,
            BrokerPauses(metrics_urls),
        )
    finally:
        if cleanup:
            _delete_topics(admin, names, progress)
            _delete_groups(admin, group_names_of(run_id, groups), progress)


def group_names_of(run_id: str, groups: int) -> list[str]:
    """The consumer groups of a run (one per --groups). Pure."""
    return [f"perf-{run_id}-g{g}" for g in range(groups)]


def _reachable_bootstrap(bootstrap_server: str | None, dir: Path) -> str:
    """--bootstrap-server, else the local cluster's; a clear error when it does not answer."""
    if bootstrap_server is None:
        try:
            bootstrap_server = LocalCluster(dir).load().bootstrap_servers()
        except ClusterError as exc:
            fail(f"{exc}; or pass --bootstrap-server")
    try:
        check_reachable(bootstrap_server, timeout_s=5.0)  # a dead address fails at once
    except (ConnectionError, ValueError) as exc:
        fail(str(exc))
    return bootstrap_server


def _broker_metrics_urls(dir: Path, bootstrap_server: str | None) -> list[str]:
    """The /metrics of the local cluster's brokers, when perf runs against that cluster
    (no --bootstrap-server, or the cluster's own); empty otherwise."""
    cluster = LocalCluster(dir)
    try:
        if not cluster.exists():
            return []
        config = cluster.load()
        if bootstrap_server is not None and bootstrap_server != config.bootstrap_servers():
            return []
    except ClusterError:
        return []
    return [
        f"http://{config.host}:{b.metrics_port}/metrics" for b in config.brokers if b.metrics_port
    ]


def _create_topics(admin, names: list[str], partitions: int, cleanup: bool, progress) -> None:
    """Create the run's topics; on failure delete what was created (unless --no-cleanup)
    and fail."""
    from confluent_kafka.admin import NewTopic

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


def _delete_groups(admin, names: list[str], progress=console) -> None:
    """Delete the run's consumer groups (their committed offsets); a group that never
    committed is not there, which is fine; any other failure is a note, not an error."""
    if not names:
        return
    try:
        futures = admin.delete_consumer_groups(names, request_timeout=30)
        for fut in futures.values():
            try:
                fut.result(30)
            except Exception as exc:
                if "GROUP_ID_NOT_FOUND" not in client_error_text(exc):
                    raise
        progress.print(f"deleted consumer groups {', '.join(names)} (--no-cleanup keeps them)")
    except Exception as exc:
        warn(f"could not delete the perf groups {', '.join(names)}: {client_error_text(exc)}")


def _run(
    bootstrap_server: str,
    names: list[str],
    run_id: str,
    topics: int,
    partitions: int,
    producers: int,
    producer_processes: int,
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
    summary_intervals: bool = False,
    broker_pauses: BrokerPauses | None = None,
) -> None:
    """Run the load on the created topics `names`, print every interval, then the summary
    (exit code 1 when there were errors). `broker_pauses` scrapes the brokers' loop lag and
    GC pauses at the start and the end of the measured phase."""
    broker_pauses = broker_pauses or BrokerPauses([])
    progress = console if format == OutputFormat.table else err_console
    processes = min(producer_processes, producers)
    group_names = group_names_of(run_id, groups)
    run = PerfRun(
        bootstrap_server,
        names,
        partitions,
        record_size,
        send_rate,
        producers,
        processes,
        group_names,
        consumers_per_group,
        acks,
        client_config,
        interval_s,
    )
    if backlog_seconds <= 0:
        run.phase = "after"
        run.events["consuming"].set()
    measured = _Measured(keep_histograms=summary_intervals)
    machine_lag = MachineLag(run.ctx)
    finished = False
    try:
        machine_lag.start()  # from the clients' warm-up on: it is ready before they are
        run.start()
        waiting_for = producers + (groups * consumers_per_group if backlog_seconds <= 0 else 0)
        if not run.wait_ready(waiting_for, WARMUP_TIMEOUT_S) and not run.failures:
            progress.print(f"[yellow]clients not ready after {WARMUP_TIMEOUT_S:.0f} s: starting[/]")
        run.events["go"].set()
        broker_pauses.start()
        start = time.monotonic()
        progress.print(
            f"topics {names} x {partitions} partitions, {producers} producers in "
            f"{processes} processes, {groups} groups (a process each), "
            f"{record_size} B records at {send_rate:.0f}/s"
        )
        progress.print("   time  prod MB/s  prod p50/p99/p999 ms   cons MB/s   e2e p50/p99/p999 ms")
        _measure(run, measured, start, duration_s, backlog_seconds, interval_s, groups, progress)
        pauses = {**broker_pauses.summary(), "machine_lag_p99_ms": machine_lag.p99_ms()}
        # producers flush what they have in flight; then the groups read up to it
        run.events["stop_producing"].set()
        run.wait_done(run.producer_ids, STOP_TIMEOUT_S)
        wall = time.monotonic() - start
        if run.events["consuming"].is_set():
            run.drain_consumers(DRAIN_TIMEOUT_S)
        finished = True
    finally:
        machine_lag.stop()
        # after Ctrl-C or an error the children get a few seconds, not a producer's flush
        run.close(STOP_TIMEOUT_S if finished else INTERRUPTED_STOP_TIMEOUT_S)
    summary = {
        "topics": topics,
        "partitions_per_topic": partitions,
        "producers": producers,
        "producer_processes": processes,
        "consumer_processes": groups,
        "groups": groups,
        "record_size": record_size,
        "send_rate": send_rate,
        "acks": acks,
        **_measured_summary(run, measured, wall, pauses),
    }
    if backlog_seconds > 0:
        summary.update(_catchup_summary(run, measured))
    _report(summary, measured, format, summary_file, summary_intervals)


@dataclass
class _Measured:
    """What the interval loop of a run saw: its rows and their histograms, and the backlog
    and its catch-up (`--backlog-seconds`)."""

    keep_histograms: bool  # --summary-intervals
    intervals: list[dict] = field(default_factory=list)
    # each interval's produce latencies (--summary-intervals)
    histograms: list[dict[int, int]] = field(default_factory=list)
    catchup_started: float | None = None
    catchup_done: float | None = None
    backlog_end_bytes: int = 0


def _measure(
    run: PerfRun,
    measured: _Measured,
    start: float,
    duration_s: float,
    backlog_seconds: float,
    interval_s: float,
    groups: int,
    progress,
) -> None:
    """Every `interval_s` until the run's time is up: merge the children's samples, start
    the consumers after the backlog, note when they caught up, print the interval's row."""
    next_at = start
    while time.monotonic() - start < duration_s + backlog_seconds:
        next_at += interval_s
        run.pump(next_at)
        elapsed = time.monotonic() - start
        if not run.events["consuming"].is_set() and elapsed >= backlog_seconds:
            measured.backlog_end_bytes = run.total.produced_bytes
            run.phase = "catchup" if backlog_seconds > 0 else "after"
            measured.catchup_started = time.monotonic()
            run.events["consuming"].set()
        if measured.catchup_started and measured.catchup_done is None and backlog_seconds > 0:
            if run.total.consumed_bytes >= measured.backlog_end_bytes * groups:
                measured.catchup_done = time.monotonic()
                run.phase = "after"
        w = run.take_window()
        row = _interval_row(w, elapsed, interval_s)
        measured.intervals.append(row)
        if measured.keep_histograms:
            measured.histograms.append(dict(w.produce.counts))
        progress.print(
            f"{row['t_s']:7.1f}  {row['produce_mb_s']:9.2f}  "
            f"{_fmt(row['produce_p50_ms'])}/{_fmt(row['produce_p99_ms'])}/"
            f"{_fmt(row['produce_p999_ms'])}   {row['consume_mb_s']:9.2f}   "
            f"{_fmt(row['e2e_p50_ms'])}/{_fmt(row['e2e_p99_ms'])}/"
            f"{_fmt(row['e2e_p999_ms'])}" + (f"  errors {w.errors}" if w.errors else "")
        )


def _interval_row(w: _Window, elapsed: float, interval_s: float) -> dict:
    """One interval's row: throughput, latency percentiles, errors, its end."""
    return {
        "t_s": round(elapsed, 1),
        "produce_mb_s": w.produced_bytes / interval_s / 1e6,
        "produce_p50_ms": w.produce.percentile(50),
        "produce_p99_ms": w.produce.percentile(99),
        "produce_p999_ms": w.produce.percentile(99.9),
        "consume_mb_s": w.consumed_bytes / interval_s / 1e6,
        "e2e_p50_ms": w.e2e.percentile(50),
        "e2e_p99_ms": w.e2e.percentile(99),
        "e2e_p999_ms": w.e2e.percentile(99.9),
        "errors": w.errors,
        "broker_rtt_p99_ms": _median(w.rtt_p99_ms),
        "end_unix_s": round(time.time(), 3),
    }


def _measured_summary(run: PerfRun, measured: _Measured, wall: float, pauses: dict) -> dict:
    """The summary's measurements over the whole run (`wall` seconds of producing);
    `pauses`: the brokers' loop-lag and GC-pause p99s (BrokerPauses.summary)."""
    total = run.total
    produced_records = sum(run.records[i] for i in run.producer_ids)
    return {
        "duration_s": round(wall, 1),
        "produced_mb": total.produced_bytes / 1e6,
        "produce_mb_s": total.produced_bytes / wall / 1e6,
        "produce_p50_ms": total.produce.percentile(50),
        "produce_p99_ms": total.produce.percentile(99),
        "produce_p999_ms": total.produce.percentile(99.9),
        "e2e_p50_ms": total.e2e.percentile(50),
        "e2e_p99_ms": total.e2e.percentile(99),
        "e2e_p999_ms": total.e2e.percentile(99.9),
        # the worst interval after the first (connections and metadata warm up in it): a p99
        # that looks fine over the run can hide slow seconds
        "max_interval_produce_p99_ms": max(
            (
                i["produce_p99_ms"]
                for i in measured.intervals[1:]
                if i["produce_p99_ms"] is not None
            ),
            default=None,
        ),
        # librdkafka's request round-trip p99 to the brokers per ~1 s window, measured in C
        # (no Python stall of the load generator in it): the median and worst window
        "broker_rtt_p99_ms": _median(total.rtt_p99_ms),
        "max_interval_broker_rtt_p99_ms": max(total.rtt_p99_ms, default=None),
        # every round trip of the run together, bounded from the windows' percentiles
        # (librdkafka gives no run-wide histogram): the run's p99 and p999 are at most these
        "broker_rtt_p99_at_most_ms": quantile_at_most(total.rtt_windows, 0.99),
        "broker_rtt_p999_at_most_ms": quantile_at_most(total.rtt_windows, 0.999),
        # the client's own share: librdkafka's queue from produce() until the message is in
        # a request (linger.ms and batching included), p99 per window, the median
        "client_queue_p99_ms": _median(total.queue_p99_ms),
        # the broker's own share of that round trip: how late its event loop ran what was
        # due, and its garbage-collector pauses (the worst broker's p99 over the run, from
        # /metrics; None when perf cannot reach the brokers' /metrics); and the machine's:
        # how late a process that only sleeps woke (the CPU scheduler's lateness, in the
        # broker's loop lag too)
        **pauses,
        # a child that failed or ended early is an error too: its samples are missing
        "errors": total.errors + len(run.failures),
        "produced_records": produced_records,
        # per group: every acknowledged record read once, unless the drain timed out
        "consumed_records": [run.records[i] for i in run.consumer_ids],
        # the parent only merges; each child has its own clients (and its own GIL)
        "pid": os.getpid(),
        "processes": [
            {"role": spec.role, "pid": run.done.get(spec.worker_id) or proc.pid}
            for spec, proc in zip(run.specs, run.processes, strict=True)
        ],
    }


def _catchup_summary(run: PerfRun, measured: _Measured) -> dict:
    """With `--backlog-seconds`: the backlog, how fast it was read, and produce latency
    before and during the catch-up."""
    catchup_s = (
        round(measured.catchup_done - measured.catchup_started, 2)
        if measured.catchup_done and measured.catchup_started
        else None
    )
    return {
        "backlog_mb": measured.backlog_end_bytes / 1e6,
        "catchup_s": catchup_s,
        "catchup_mb_s": measured.backlog_end_bytes / 1e6 / catchup_s if catchup_s else None,
        "produce_p99_before_catchup_ms": run.phase_produce["before_catchup"].percentile(99),
        "produce_p99_during_catchup_ms": run.phase_produce["catchup"].percentile(99),
    }


def _report(
    summary: dict,
    measured: _Measured,
    format: OutputFormat,
    summary_file: Path | None,
    summary_intervals: bool,
) -> None:
    """Print the summary, write it to `summary_file` (with every interval when
    `summary_intervals`), exit 1 when there were errors."""
    text = json.dumps(summary, indent=2)
    if not print_data(summary, format):
        console.print(summary_table(summary))
    if summary_file is not None:
        if summary_intervals:
            detail = [
                {**row, "produce_counts": counts}
                for row, counts in zip(measured.intervals, measured.histograms, strict=True)
            ]
            text = json.dumps({**summary, "intervals": detail})
        summary_file.write_text(text)
    if summary["errors"]:
        raise typer.Exit(1)
