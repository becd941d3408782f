"""`automqctl cluster top`'s arithmetic (cli/top_metrics.py) on pages prometheus_client
really writes, and its drawing (cli/top_view.py) of one document."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from rich.console import Console

from cli import top_metrics as tm
from cli.top_view import render

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 1.0)


class FakeBroker:
    """The broker's collectors of the figures, on a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.bytes_in = Counter("automq_topic_bytes_in", "", ["topic"], registry=r)
        self.bytes_out = Counter("automq_topic_bytes_out", "", ["topic"], registry=r)
        self.latency = Histogram(
            "automq_request_latency_seconds", "", ["api"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.wal_used = Gauge("automq_wal_used_bytes", "", registry=r)
        self.wal_capacity = Gauge("automq_wal_capacity_bytes", "", registry=r)
        self.upload_lag = Gauge("automq_stream_upload_lag_seconds", "", registry=r)
        self.upload_errors = Counter("automq_stream_upload_errors", "", registry=r)
        self.upload_failing = Gauge("automq_stream_upload_failing", "", registry=r)
        self.partitions = Gauge("automq_partitions_led", "", registry=r)
        self.connections = Gauge("automq_kafka_connections", "", registry=r)
        self.error = Info("automq_stream_last_upload_error", "", registry=r)

    def scrape(self, node_id: int, at_s: float) -> tm.BrokerScrape:
        text = generate_latest(self.registry).decode()
        return tm.BrokerScrape(node_id, at_s, tm.parse_prometheus_text(text))


def test_parse_reads_labels_with_quotes_commas_and_escapes():
    broker = FakeBroker()
    broker.bytes_in.labels('we"ird,topic\\x').inc(5)
    broker.error.info({"error": 'PUT failed: 503, "slow down"'})
    broker.wal_used.set(7)
    scrape = tm.parse_prometheus_text(generate_latest(broker.registry).decode())
    assert tm.by_label(scrape, "automq_topic_bytes_in_total", "topic") == {'we"ird,topic\\x': 5.0}
    [(labels, value)] = scrape["automq_stream_last_upload_error_info"]
    assert dict(labels) == {"error": 'PUT failed: 503, "slow down"'} and value == 1.0
    assert tm.series_sum(scrape, "automq_wal_used_bytes") == 7.0
    assert tm.series_sum(scrape, "automq_absent") is None
    # a bound of "+Inf" is a number; garbage lines are left out
    assert tm.parse_prometheus_text('x_bucket{le="+Inf"} 3\nbad{le="1" 2\nnovalue\n') == {
        "x_bucket": [((("le", "+Inf"),), 3.0)]
    }


def test_histogram_quantile_interpolates_inside_the_bucket():
    # 100 observations: 50 up to 10 ms, 40 more up to 50 ms, 10 more up to 100 ms
    buckets = {0.01: 50, 0.05: 90, 0.1: 100, math.inf: 100}
    assert tm.histogram_quantile(buckets, 0.5) == pytest.approx(0.01)
    assert tm.histogram_quantile(buckets, 0.7) == pytest.approx(0.03)
    assert tm.histogram_quantile(buckets, 0.99) == pytest.approx(0.095)
    assert tm.histogram_quantile(buckets, 0.25) == pytest.approx(0.005)  # first bucket from 0
    # in the +Inf bucket: the largest finite bound
    assert tm.histogram_quantile({0.1: 1, math.inf: 10}, 0.99) == 0.1
    assert tm.histogram_quantile({0.1: 0, math.inf: 0}, 0.99) is None
    assert tm.histogram_quantile({}, 0.99) is None


def test_deltas_of_counters_and_buckets_survive_a_restart():
    assert tm.counter_delta(10, 25) == 15
    assert tm.counter_delta(100, 4) == 4  # the broker restarted: counted 4 since
    assert tm.counter_delta(None, 4) == 4 and tm.counter_delta(3, None) == 0
    before = {0.01: 5, math.inf: 6}
    assert tm.bucket_delta(before, {0.01: 7, math.inf: 10}) == {0.01: 2, math.inf: 4}
    assert tm.bucket_delta(before, {0.01: 1, math.inf: 1}) == {0.01: 1, math.inf: 1}


def test_broker_figures_from_two_scrapes():
    broker = FakeBroker()
    broker.bytes_in.labels("orders").inc(1_000_000)
    broker.latency.labels("Fetch").observe(0.5)  # a long poll before: not in the window
    broker.wal_capacity.set(1000)
    before = broker.scrape(1, at_s=100.0)
    broker.bytes_in.labels("orders").inc(3_000_000)
    broker.bytes_in.labels("clicks").inc(1_000_000)
    broker.bytes_out.labels("orders").inc(2_000_000)
    for _ in range(99):
        broker.latency.labels("Produce").observe(0.003)
    broker.latency.labels("Produce").observe(0.08)
    for _ in range(50):
        broker.latency.labels("Fetch").observe(0.5)  # long polls: left out of the request p99
        broker.latency.labels("Metadata").observe(0.0005)
    broker.wal_used.set(250)
    broker.upload_lag.set(1.5)
    broker.upload_errors.inc(2)
    broker.upload_failing.set(1)
    broker.partitions.set(6)
    broker.connections.set(4)
    after = broker.scrape(1, at_s=102.0)

    figures = tm.broker_figures(before, after)
    assert figures["produce_mb_s"] == pytest.approx(2.0)  # 4 MB in 2 s, both topics
    assert figures["fetch_mb_s"] == pytest.approx(1.0)
    # 100 produces: 99 in (1 ms, 5 ms], the slowest in (50, 100] ms
    assert 1.0 < figures["produce_p99_ms"] <= 5.0
    assert figures["request_p99_ms"] <= 5.0  # Metadata and Produce only, not the Fetches
    assert figures["wal_fill"] == 0.25 and figures["wal_capacity_bytes"] == 1000
    assert figures["upload_lag_s"] == 1.5 and figures["upload_errors"] == 2
    assert figures["upload_failing"] is True
    assert (figures["partitions_led"], figures["connections"]) == (6, 4)
    assert figures["error"] is None

    rates = tm.topic_rates([(before, after)])
    assert rates["orders"] == {"in_mb_s": pytest.approx(1.5), "out_mb_s": pytest.approx(1.0)}
    assert rates["clicks"]["in_mb_s"] == pytest.approx(0.5)


def test_a_broker_without_a_scrape_has_no_figures_and_says_why():
    broker = FakeBroker()
    ok = broker.scrape(1, at_s=1.0)
    failed = tm.BrokerScrape(1, 3.0, None, "metrics 127.0.0.1:1: connection refused")
    figures = tm.broker_figures(ok, failed)
    assert figures["error"].endswith("connection refused")
    assert all(figures[k] is None for k in tm.BROKER_FIGURES)
    # the first sample of a broker: gauges known, rates not yet
    first = tm.broker_figures(tm.BrokerScrape(1, 1.0, None), ok)
    assert first["produce_mb_s"] is None and first["connections"] == 0


def test_group_lag_per_topic_and_group():
    committed = {
        "billing": {("orders", 0): 90, ("orders", 1): 50, ("gone", 0): 7},
        "audit": {("orders", 0): 100, ("orders", 1): -1001},  # -1001: nothing committed
    }
    ends = {("orders", 0): 100, ("orders", 1): 80}
    assert tm.group_lags(committed, ends) == {"orders": {"billing": 40, "audit": 0}}


STATUS = {
    "cluster_dir": "/tmp/c",
    "state": "healthy",
    "failover_mode": "failover",
    "problems": [],
    "buckets": [
        {"bucket_id": 0, "uri": "0@s3://main", "active": False},
        {"bucket_id": 1, "uri": "1@s3://failover", "active": True},
    ],
    "brokers": [
        {"node_id": 1, "az": "az1", "registered": True, "fenced": False, "pid": 10,
         "metrics_address": "127.0.0.1:9001", "partitions_led": 3},
        {"node_id": 2, "az": "az2", "registered": False, "fenced": True, "pid": None,
         "metrics_address": "127.0.0.1:9002", "partitions_led": 0},
    ],
}  # fmt: skip


def _document() -> dict:
    broker = FakeBroker()
    broker.bytes_in.labels("idle").inc(10)  # no traffic in the window, no group: not shown
    before = broker.scrape(1, at_s=0.0)
    broker.bytes_in.labels("orders").inc(4_000_000)
    broker.wal_capacity.set(100)
    broker.wal_used.set(90)
    after = broker.scrape(1, at_s=2.0)
    lags = {"orders": {"audit": 5, "billing": 40}, "quiet": {"billing": 7}}
    return tm.top_document(STATUS, {1: (before, after)}, lags, None, 2.0)


def test_document_has_the_failover_mode_active_bucket_brokers_and_topics():
    doc = _document()
    assert doc["failover_mode"] == "failover"
    assert doc["active_bucket"] == {"bucket_id": 1, "uri": "1@s3://failover"}
    assert doc["produce_mb_s"] == pytest.approx(2.0)
    one, two = doc["brokers"]
    assert one["state"] == "active" and one["produce_mb_s"] == pytest.approx(2.0)
    assert one["wal_fill"] == pytest.approx(0.9)
    assert two["state"] == "stopped" and two["error"] == "not scraped"
    assert two["produce_mb_s"] is None and two["partitions_led"] == 0
    assert [t["topic"] for t in doc["topics"]] == ["orders", "quiet"]
    assert list(doc["topics"][0]["group_lag"].items()) == [("billing", 40), ("audit", 5)]


def test_render_shows_the_figures():
    console = Console(record=True, width=200, color_system=None)
    console.print(render(_document(), "q quits"))
    text = console.export_text()
    assert "failover mode: failover" in text and "active bucket: 1 (1@s3://failover)" in text
    assert "90%" in text  # WAL fill
    assert "orders" in text and "billing 40, audit 5" in text and "2.00" in text
    assert "stopped" in text and "q quits" in text


def test_render_names_a_running_broker_whose_metrics_did_not_answer():
    doc = _document()
    doc["brokers"][0]["error"] = "metrics 127.0.0.1:9001: [Errno 111] Connection refused"
    console = Console(record=True, width=200, color_system=None)
    console.print(render(doc))
    text = console.export_text()
    assert "active (no /metrics)" in text
    assert "broker 1: metrics 127.0.0.1:9001: [Errno 111] Connection refused" in text
    assert "broker 2:" not in text  # stopped: its state says it
