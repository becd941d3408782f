"""`automqctl perf`'s view of the brokers' own pauses: the loop-lag and GC-pause histograms
scraped from /metrics at the start and the end of a run, and the p99 of their difference;
and its consumer, which hands records over as soon as there are some."""

from __future__ import annotations

import http.server
import math
import multiprocessing
import threading
import time

import pytest

from cli.perf_broker_metrics import (
    GC_PAUSE_METRIC,
    LOOP_LAG_METRIC,
    BrokerPauses,
    MachineLag,
)
from cli.perf_workers import read_available
from cli.top_metrics import bucket_delta as histogram_delta
from cli.top_metrics import histogram_buckets, parse_prometheus_text
from cli.top_metrics import histogram_quantile as _quantile

BOUNDS = (0.001, 0.002, 0.005, 0.01, math.inf)


def _page(lag_counts: tuple[int, ...], gc_counts: dict[str, tuple[int, ...]]) -> str:
    """A /metrics page as prometheus_client renders it (cumulative counts per bound)."""
    lines = [f"# TYPE {LOOP_LAG_METRIC} histogram"]
    for bound, count in zip(BOUNDS, lag_counts, strict=True):
        le = "+Inf" if math.isinf(bound) else repr(bound)
        lines.append(f'{LOOP_LAG_METRIC}_bucket{{le="{le}"}} {float(count)}')
    lines += [f"{LOOP_LAG_METRIC}_count {float(lag_counts[-1])}", f"{LOOP_LAG_METRIC}_sum 0.5"]
    lines.append(f"{LOOP_LAG_METRIC}_created 1.7e9")
    for generation, counts in gc_counts.items():
        for bound, count in zip(BOUNDS, counts, strict=True):
            le = "+Inf" if math.isinf(bound) else repr(bound)
            lines.append(
                f'{GC_PAUSE_METRIC}_bucket{{generation="{generation}",le="{le}"}} {float(count)}'
            )
    lines.append('other_bucket{le="0.001"} 99.0')
    return "\n".join(lines) + "\n"


def _quantile_q(q, buckets):
    return _quantile(buckets, q)


def test_a_histogram_is_read_from_the_page_with_its_label_sets_summed():
    text = _page((1, 2, 3, 4, 5), {"0": (10, 10, 10, 10, 10), "2": (0, 1, 1, 2, 2)})
    assert histogram_buckets(parse_prometheus_text(text), LOOP_LAG_METRIC) == dict(
        zip(BOUNDS, (1, 2, 3, 4, 5))
    )
    assert histogram_buckets(parse_prometheus_text(text), GC_PAUSE_METRIC) == dict(
        zip(BOUNDS, (10, 11, 11, 12, 12))
    )
    assert histogram_buckets(parse_prometheus_text(text), "missing") == {}


def test_the_p99_of_a_run_is_that_of_what_was_observed_between_the_scrapes():
    # before the run: 1,000 samples, many of them slow (start-up)
    before = dict(zip(BOUNDS, (500, 600, 800, 1000, 1000)))
    # during it: 1,000 more, 980 of them <= 1 ms, 10 in (1, 2] ms, 10 in (5, 10] ms
    after = dict(zip(BOUNDS, (1480, 1590, 1790, 2000, 2000)))
    delta = histogram_delta(before, after)
    assert delta == dict(zip(BOUNDS, (980, 990, 990, 1000, 1000)))
    # rank 990 of 1,000: the top of the (1, 2] ms bucket, linearly interpolated
    assert _quantile_q(0.99, delta) == pytest.approx(0.002)
    assert _quantile_q(0.995, delta) == pytest.approx(0.0075)
    assert _quantile_q(0.5, delta) == pytest.approx(0.001 * 500 / 980)
    # the whole history would have put the p99 at 9.9 ms
    assert _quantile_q(0.99, after) > 0.009


def test_quantile_edges_and_a_restarted_broker():
    assert _quantile_q(0.99, {}) is None
    assert _quantile_q(0.99, dict(zip(BOUNDS, (0, 0, 0, 0, 0)))) is None
    # beyond the last finite bound: that bound (as Prometheus' histogram_quantile)
    assert _quantile_q(0.99, dict(zip(BOUNDS, (0, 0, 0, 0, 3)))) == 0.01
    # counters that went backwards (the broker restarted): the later scrape alone
    restarted = dict(zip(BOUNDS, (5, 5, 5, 5, 5)))
    assert histogram_delta(dict(zip(BOUNDS, (9, 9, 9, 9, 9))), restarted) == restarted


class _Pages(http.server.BaseHTTPRequestHandler):
    pages: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        body = self.pages.pop(0).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_perf_reports_the_worst_brokers_p99_from_two_scrapes():
    _Pages.pages = [
        _page((0, 0, 0, 0, 0), {"0": (0, 0, 0, 0, 0)}),
        _page((100, 100, 100, 100, 100), {"0": (50, 100, 100, 100, 100)}),
    ]
    server = http.server.HTTPServer(("127.0.0.1", 0), _Pages)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        pauses = BrokerPauses([url, "http://127.0.0.1:1/metrics"])  # the second never answers
        pauses.start()
        summary = pauses.summary()
    finally:
        server.shutdown()
        server.server_close()
    assert summary["broker_loop_lag_p99_ms"] == pytest.approx(0.99)
    assert summary["broker_gc_pause_p99_ms"] == pytest.approx(1.98)
    assert summary["broker_wal_append_p99_ms"] is None  # not on these pages
    assert BrokerPauses([]).summary() == {
        "broker_loop_lag_p99_ms": None,
        "broker_gc_pause_p99_ms": None,
        "broker_wal_append_p99_ms": None,
    }


class _Message:
    def __init__(self, value: bytes, error: object = None):
        self._value, self._error = value, error

    def value(self) -> bytes:
        return self._value

    def error(self) -> object:
        return self._error


class _FetchedConsumer:
    """A consumer whose librdkafka queue holds `fetched` records; `consume` with a timeout
    waits it out unless `n` records are there (as librdkafka's does)."""

    def __init__(self, fetched: list[_Message]):
        self.fetched = fetched
        self.calls: list[tuple] = []

    def poll(self, timeout: float) -> _Message | None:
        self.calls.append(("poll", timeout))
        if not self.fetched:
            time.sleep(timeout)
            return None
        return self.fetched.pop(0)

    def consume(self, n: int, timeout: float) -> list[_Message]:
        self.calls.append(("consume", n, timeout))
        out, self.fetched = self.fetched[:n], self.fetched[n:]
        if len(out) < n:
            time.sleep(timeout)
        return out


def test_the_consumer_hands_over_fetched_records_without_waiting_for_more():
    consumer = _FetchedConsumer([_Message(b"a"), _Message(b"", error="EOF"), _Message(b"b")])
    started = time.monotonic()
    assert read_available(consumer, 1000, 0.5) == [b"a", b"b"]
    assert time.monotonic() - started < 0.4  # not the 0.5 s wait for 1,000 records
    assert consumer.calls == [("poll", 0.5), ("consume", 999, 0)]
    # nothing fetched: one bounded wait, then nothing
    assert read_available(consumer, 1000, 0.01) == []
    assert consumer.calls[-1] == ("poll", 0.01)
    # at most max_records at once
    consumer = _FetchedConsumer([_Message(bytes([i])) for i in range(5)])
    assert len(read_available(consumer, 3, 0.1)) == 3 and len(consumer.fetched) == 2


def test_the_machines_own_lateness_is_measured_by_a_process_that_only_sleeps():
    lag = MachineLag(multiprocessing.get_context("spawn"))
    lag.start()
    assert lag.ready(60)
    time.sleep(0.5)  # 50 samples a second
    p99_ms = lag.p99_ms()
    assert p99_ms is not None and 0 <= p99_ms < 1000
