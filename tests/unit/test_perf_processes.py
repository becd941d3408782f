"""`automqctl perf`'s pure parts: the histogram its child processes send and the parent
merges, and how producers, rate and partitions are spread over processes."""

from __future__ import annotations

import math
import random

from cli.perf_histogram import LatencyHistogram, quantile_at_most
from cli.perf_workers import producer_plan


def _exact(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def test_merged_histograms_give_the_sample_percentiles_within_one_percent():
    rng = random.Random(7)
    values = [rng.lognormvariate(1.5, 1.2) for _ in range(20_000)] + [900.0] * 30
    parts = [LatencyHistogram() for _ in range(3)]
    for i, v in enumerate(values):
        parts[i % 3].add(v)
    merged = LatencyHistogram()
    for part in parts:
        merged.merge(part.counts)
    assert merged.count == len(values)
    for p in (50, 99, 99.9):
        assert abs(merged.percentile(p) / _exact(values, p) - 1) < 0.01
    assert len(merged.counts) < 2_000  # bounded whatever the count
    assert LatencyHistogram().percentile(99) is None
    tiny = LatencyHistogram()
    tiny.add(-0.5)  # a clock step backwards between processes is not an error
    assert tiny.percentile(50) < 0.01


def test_producers_are_spread_over_processes_with_their_own_partitions():
    plan = producer_plan(["a", "b"], 3, 1000.0, producers=4, processes=2)
    assert [[k for k, _, _ in proc] for proc in plan] == [[0, 2], [1, 3]]
    assert all(rate == 250.0 for proc in plan for _, rate, _ in proc)
    owned = [pair for proc in plan for _, _, pairs in proc for pair in pairs]
    assert sorted(owned) == sorted((t, p) for t in "ab" for p in range(3))  # each once
    # more producers than partitions: every producer still has one to write to
    plan = producer_plan(["a"], 1, 100.0, producers=2, processes=4)
    assert len(plan) == 2 and all(pairs == [("a", 0)] for proc in plan for _, _, pairs in proc)


def test_a_batch_lands_in_the_buckets_of_its_values_one_by_one():
    rng = random.Random(11)
    seconds = [rng.lognormvariate(-5, 1.5) for _ in range(5_000)] + [0.0, -1e-6, 1e-9]
    one_by_one, batched = LatencyHistogram(), LatencyHistogram()
    for s in seconds:
        one_by_one.add(s * 1000)
    batched.add_many(seconds, 1000.0)
    assert batched.counts == one_by_one.counts and batched.count == len(seconds)
    batched.add_many([])
    assert batched.count == len(seconds)


def test_the_summary_prints_as_a_table_not_a_json_document():
    """`perf`'s table output ends with a table of the summary's fields (issue #30: it ended
    with a raw JSON dump); --format json keeps the document."""
    import io

    from rich.console import Console

    from cli.perf import group_names_of, summary_table

    buffer = io.StringIO()
    Console(file=buffer, width=200).print(
        summary_table({"produced_records": 12345, "produce_p99_ms": 3.25, "e2e_p99_ms": None})
    )
    text = buffer.getvalue()
    assert "{" not in text and '"' not in text
    assert "produced_records" in text and "12,345" in text and "3.25" in text
    assert group_names_of("abc123", 2) == ["perf-abc123-g0", "perf-abc123-g1"]


def test_librdkafka_stats_give_the_round_trip_and_the_clients_own_queue():
    """perf splits a produce's latency: the broker round trip (`rtt`) and librdkafka's own
    queue before the request (`int_latency`), both measured in C, per stats window."""
    import json

    from cli.perf_workers import _Counters, _note_rtt

    counters = _Counters()
    stats = {
        "brokers": {
            "bootstrap": {"nodeid": -1, "rtt": {"cnt": 5, "p99": 90_000}},
            "b1": {
                "nodeid": 1,
                "rtt": {"cnt": 10, "p99": 2_500, "max": 3_000, "outofrange": 1},
                "int_latency": {"cnt": 10, "p99": 7_000},
            },
            "b2": {
                "nodeid": 2,
                "rtt": {"cnt": 10, "p50": 700, "p99": 1_500, "max": 1_600},
                "int_latency": {"cnt": 0, "p99": 0},
            },
        }
    }
    _note_rtt(json.dumps(stats), counters)
    _note_rtt("not json", counters)  # an unknown format: no figure, no error
    sample = counters.take()
    assert sample["rtt_p99_ms"] == [2.5] and sample["queue_p99_ms"] == [7.0]
    # each broker's window for the run-wide bounds; a sample beyond librdkafka's histogram
    # may lie above any of its percentiles, not above its maximum
    assert sample["rtt_windows"] == [
        (10, ((2.5, 0.11), (3.0, 0.0))),
        (10, ((0.7, 0.5), (1.5, 0.01), (1.6, 0.0))),
    ]


def _window_of(samples: list[float]) -> tuple[int, tuple[tuple[float, float], ...]]:
    """A window summary as librdkafka's percentiles give one: at each percentile p the
    smallest sample with at most (1 - p) of the samples above it, and the maximum."""
    ordered = sorted(samples)
    n = len(ordered)
    points = []
    for fraction in (0.5, 0.25, 0.1, 0.05, 0.01, 0.0001):
        points.append((ordered[min(n - 1, math.ceil(n * (1 - fraction)) - 1)], fraction))
    points.append((ordered[-1], 0.0))
    return n, tuple(points)


def test_the_run_wide_round_trip_quantile_is_bounded_from_the_windows_percentiles():
    # ten quiet windows: at most 0.01 % of each above 5 ms, so the run's p999 is at most 5
    quiet = [(1000, ((1.0, 0.5), (2.0, 0.01), (5.0, 0.0001), (6.0, 0.0)))] * 10
    assert quantile_at_most(quiet, 0.999) == 5.0
    assert quantile_at_most(quiet, 0.99) == 2.0
    # one slow window: up to 1 % of its samples above its p99 (10 of the run's 11,000
    # samples, within its 0.1 %), none above its maximum
    slow = (1000, ((1.0, 0.5), (30.0, 0.05), (50.0, 0.01), (80.0, 0.0)))
    assert quantile_at_most([*quiet, slow], 0.999) == 50.0
    assert quantile_at_most([*quiet, slow], 0.99) == 30.0  # 50 of its samples above 30
    assert quantile_at_most([], 0.999) is None


def test_the_bound_is_never_below_the_exact_quantile_of_the_samples():
    rng = random.Random(7)
    for _ in range(200):
        windows = [
            [rng.lognormvariate(0.5, rng.uniform(0.2, 1.5)) for _ in range(rng.randint(1, 400))]
            for _ in range(rng.randint(1, 30))
        ]
        everything = sorted(v for w in windows for v in w)
        for q in (0.99, 0.999):
            exact = everything[min(len(everything) - 1, math.ceil(len(everything) * q) - 1)]
            bound = quantile_at_most([_window_of(w) for w in windows], q)
            assert exact <= bound <= everything[-1], (q, exact, bound)
