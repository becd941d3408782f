"""Which compacted partitions the log cleaner cleans: min.cleanable.dirty.ratio from the
cleaner checkpoint's clean/dirty split, max.compaction.lag.ms for partitions below it."""

from __future__ import annotations

import pytest

from spark_jobs.cleaner_policy import NEVER_MS, decide, dirty_ratio

NOW_MS = 1_000_000


def never_called() -> int:
    raise AssertionError("the first dirty timestamp is read only when it can decide")


def test_dirty_ratio_is_the_dirty_share():
    assert dirty_ratio(0, 0) == 0.0
    assert dirty_ratio(300, 100) == 0.25
    assert dirty_ratio(0, 10) == 1.0


def test_a_partition_above_the_ratio_is_cleaned_without_reading_timestamps():
    d = decide(100, 101, 0.5, 1, NOW_MS, never_called)
    assert d.clean and "min.cleanable.dirty.ratio" in d.reason


def test_the_ratio_compares_strictly_as_kafka():
    assert not decide(100, 100, 0.5, NEVER_MS, NOW_MS, never_called).clean


def test_below_the_ratio_is_skipped_when_max_lag_is_never():
    d = decide(900, 100, 0.5, NEVER_MS, NOW_MS, never_called)
    assert not d.clean and d.dirty_ratio == pytest.approx(0.1)


def test_below_the_ratio_is_cleaned_when_dirty_data_is_older_than_max_lag():
    assert decide(900, 100, 0.5, 10_000, NOW_MS, lambda: NOW_MS - 10_001).clean
    assert not decide(900, 100, 0.5, 10_000, NOW_MS, lambda: NOW_MS - 9_999).clean
    # an unknown timestamp (not a Kafka batch, -1) never makes a partition due
    assert not decide(900, 100, 0.5, 10_000, NOW_MS, lambda: None).clean
    assert not decide(900, 100, 0.5, 10_000, NOW_MS, lambda: -1).clean


def test_no_dirty_data_is_never_cleaned():
    assert not decide(1000, 0, 0.0, 1, NOW_MS, never_called).clean
    assert not decide(0, 0, 0.0, 1, NOW_MS, never_called).clean


def test_ratio_zero_cleans_any_dirty_data():
    assert decide(10**9, 1, 0.0, NEVER_MS, NOW_MS, never_called).clean
