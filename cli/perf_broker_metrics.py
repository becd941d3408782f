"""The brokers' own pauses during an `automqctl perf` run, from their Prometheus /metrics.

A broker serves every Kafka request on one event loop; how late that loop runs what is due
(`automq_event_loop_lag_seconds`) and how long the garbage collector stops every thread
(`automq_gc_pause_seconds`) are the broker's own share of a produce's round trip. perf
scrapes each broker's /metrics when the measured phase starts and when it ends and reports
the p99 of what was observed in between (the bucket counts' difference), beside librdkafka's
`broker_rtt_p99_ms`. Not every interval: rendering /metrics takes the broker ~15 ms of
Python under the GIL, which would land in the very lag it measures.

Beside it, the machine's own share (`MachineLag`): a child process that does nothing but
sleep `PROBE_INTERVAL_S` and measure how late it woke. On a machine shared with other work
that lateness (the CPU scheduler's) is in every loop-lag sample of the broker too; the
broker's own share is the difference.

The arithmetic is `cli/top_metrics.py`'s (the Prometheus text, bucket differences and
quantiles `cluster top` uses too).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import time
import urllib.request
from dataclasses import dataclass, field

from cli.perf_histogram import LatencyHistogram
from cli.top_metrics import (
    Buckets,
    bucket_delta,
    histogram_buckets,
    histogram_quantile,
    parse_prometheus_text,
)

LOOP_LAG_METRIC = "automq_event_loop_lag_seconds"
GC_PAUSE_METRIC = "automq_gc_pause_seconds"
WAL_APPEND_METRIC = "automq_wal_append_latency_seconds"
# the summary's field -> the broker's histogram it is the p99 of
SUMMARY_METRICS = {
    "broker_loop_lag_p99_ms": LOOP_LAG_METRIC,
    "broker_gc_pause_p99_ms": GC_PAUSE_METRIC,
    # from a WAL append to its acknowledgement (written and fdatasync'ed, the WAL's
    # threads handing over): the part of the round trip spent off the event loop
    "broker_wal_append_p99_ms": WAL_APPEND_METRIC,
}
SCRAPE_TIMEOUT_S = 2.0
MAX_METRICS_BYTES = 16 * 1024 * 1024  # a /metrics page larger than this is cut off
PROBE_INTERVAL_S = 0.02  # as the broker's probe (dataplane/runtime.py)
MACHINE_LAG_TIMEOUT_S = 5.0  # the reference process's answer at the end


@dataclass
class BrokerPauses:
    """Scrapes the brokers' /metrics (`urls`) at the start and at the end of the measured
    phase. Used from one thread (perf's parent process)."""

    urls: list[str]
    started: list[dict[str, Buckets] | None] = field(default_factory=list)

    def start(self) -> None:
        """The first scrape (the measured phase starts)."""
        self.started = [_scrape(url) for url in self.urls]

    def summary(self) -> dict:
        """The second scrape: the worst broker's p99 of each metric over the phase (ms, by
        its `SUMMARY_METRICS` field), or None where no broker could be scraped or observed
        anything."""
        p99s: dict[str, list[float]] = {name: [] for name in SUMMARY_METRICS.values()}
        for url, before in zip(self.urls, self.started, strict=True):
            after = _scrape(url)
            if before is None or after is None:
                continue
            for name in p99s:
                p99 = histogram_quantile(bucket_delta(before[name], after[name]), 0.99)
                if p99 is not None:
                    p99s[name].append(p99 * 1000)
        return {field: max(p99s[name], default=None) for field, name in SUMMARY_METRICS.items()}


def _scrape(url: str) -> dict[str, Buckets] | None:
    """One broker's histograms, or None when its /metrics does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as resp:
            text = resp.read(MAX_METRICS_BYTES).decode(errors="replace")
    except (OSError, ValueError):
        return None
    scrape = parse_prometheus_text(text)
    return {name: histogram_buckets(scrape, name) for name in SUMMARY_METRICS.values()}


class MachineLag:
    """The machine's wake-up lateness over the measured phase: a child process sleeps
    `PROBE_INTERVAL_S` at a time and counts how late it woke (perf_histogram buckets).
    `start` and `p99_ms` are called from one thread."""

    def __init__(self, ctx) -> None:
        self._stop = ctx.Event()
        self._ready = ctx.Event()
        self._receive, send = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=_sleep_and_measure,
            args=(self._ready, self._stop, send, PROBE_INTERVAL_S),
            name="perf-machine-lag",
            daemon=True,
        )

    def start(self) -> None:
        """Start the reference process (spawning takes a few hundred ms: `ready`)."""
        self._process.start()

    def ready(self, timeout_s: float) -> bool:
        """Whether the process measures, after waiting up to `timeout_s` for it."""
        return self._ready.wait(timeout_s)

    def stop(self) -> None:
        """Ask the process to end (it also ends with its parent)."""
        self._stop.set()

    def p99_ms(self) -> float | None:
        """Stop the process; the p99 of its lateness (ms), None if it did not answer."""
        self.stop()
        counts = None
        with contextlib.suppress(EOFError, OSError):
            if self._receive.poll(MACHINE_LAG_TIMEOUT_S):
                counts = self._receive.recv()
        self._process.join(MACHINE_LAG_TIMEOUT_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(MACHINE_LAG_TIMEOUT_S)
        if counts is None:
            return None
        histogram = LatencyHistogram()
        histogram.merge(counts)
        return histogram.percentile(99)


def _sleep_and_measure(ready, stop, send, interval_s: float) -> None:
    """The reference process: sleep, note how late it woke, until `stop`; send the counts."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops it
    parent = multiprocessing.parent_process()
    histogram = LatencyHistogram()
    ready.set()
    while not stop.is_set() and (parent is None or parent.is_alive()):
        due = time.perf_counter() + interval_s
        time.sleep(interval_s)
        histogram.add(max(0.0, time.perf_counter() - due) * 1000)
    with contextlib.suppress(OSError):
        send.send(histogram.counts)
