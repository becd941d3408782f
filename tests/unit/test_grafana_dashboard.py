"""The Grafana dashboard (docs/grafana/automq-dashboard.json) and `automqctl cluster top`
query only metrics the broker exports: every `automq_*` name in their queries is a sample
name of a collector the broker's code registers (collected in-process by importing every
dataplane module; tests/e2e/test_cluster_top.py checks a real broker's /metrics too)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import dataplane
from cli import top_metrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "automq-dashboard.json"
METRIC_NAME = re.compile(r"\bautomq_[a-z0-9_]+\b")

# the sample names prometheus_client exports for a metric family of each type
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def exported_sample_names() -> set[str]:
    """Every sample name the broker's collectors export (labelled ones included before
    their first sample)."""
    for module in pkgutil.walk_packages(dataplane.__path__, "dataplane."):
        importlib.import_module(module.name)
    from prometheus_client import REGISTRY

    from dataplane.objectstore.metrics import default_metrics

    default_metrics()  # the object-store collectors register on first use
    names = set()
    for family in REGISTRY.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names.add(family.name + suffix)
    return names


def dashboard_queries(dashboard: dict) -> list[str]:
    """Every PromQL text of the dashboard: panel targets and templating queries."""
    queries = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels.extend(panel.get("panels", []))
        queries += [t["expr"] for t in panel.get("targets", [])]
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def queried_names(queries: list[str]) -> set[str]:
    return {name for query in queries for name in METRIC_NAME.findall(query)}


def test_every_metric_the_dashboard_queries_is_exported():
    dashboard = json.loads(DASHBOARD.read_text())
    names = queried_names(dashboard_queries(dashboard))
    # the figures of `cluster top` are all on it
    assert {
        "automq_topic_bytes_in_total",
        "automq_topic_bytes_out_total",
        "automq_request_latency_seconds_bucket",
        "automq_wal_used_bytes",
        "automq_stream_upload_lag_seconds",
        "automq_stream_upload_errors_total",
        "automq_partitions_led",
        "automq_kafka_connections",
    } <= names
    assert names - exported_sample_names() == set()


def test_every_metric_cluster_top_reads_is_exported():
    read = {
        value
        for key, value in vars(top_metrics).items()
        if key.isupper() and isinstance(value, str) and value.startswith("automq_")
    }
    histograms = {top_metrics.REQUEST_LATENCY + "_bucket"}
    read = (read - {top_metrics.REQUEST_LATENCY}) | histograms
    assert len(read) >= 10
    assert read - exported_sample_names() == set()


def test_a_query_naming_a_missing_metric_is_caught():
    queries = ['sum(rate(automq_topic_bytes_in_total[1m])) / automq_no_such_metric_total{a="b"}']
    assert queried_names(queries) - exported_sample_names() == {"automq_no_such_metric_total"}
