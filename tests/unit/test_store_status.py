"""`cluster status` names a failing object store and what waits on it (issue 33 item 6)."""

from __future__ import annotations

from pathlib import Path

from cli.local_cluster import LocalCluster
from cli.store_status import store_problems


def _config(tmp_path: Path):
    return LocalCluster(tmp_path / "c").create(
        brokers=2,
        controllers=1,
        azs=["az1"],
        base_port=None,
        bucket_uris=None,
        session_timeout_ms=6000,
    )


def _broker(node_id: int, lag_s: float | None, used: int | None) -> dict:
    return {
        "node_id": node_id,
        "upload_lag_s": lag_s,
        "wal_used_bytes": used,
        "wal_capacity_bytes": 1000 if used is not None else None,
    }


def _leader(buckets: list[dict]) -> dict:
    return {"bucket_failover": {"mode": "normal", "active_bucket_id": 0, "buckets": buckets}}


def _bucket(bucket_id: int, healthy: bool | None, failing: int = 0) -> dict:
    return {
        "bucket_id": bucket_id,
        "healthy": healthy,
        "reports": 2 if healthy is not None else 0,
        "failing_reports": failing,
        "last_error": "Read timeout on endpoint URL" if failing else None,
        "failing_for_ms": 12_400 if failing else 0,
    }


def test_a_failing_bucket_is_named_with_its_store_and_what_waits(tmp_path: Path) -> None:
    config = _config(tmp_path)
    brokers = [_broker(1, 14.2, 350), _broker(2, 0.0, 0), _broker(3, None, None)]
    leader = _leader([_bucket(0, False, failing=2), _bucket(1, True)])
    problems = store_problems(config, brokers, leader, {"s3": 4242})
    assert len(problems) == 1, problems
    text = problems[0]
    assert text.startswith(
        "object store of bucket 0 failing: the embedded main store (s3, pid 4242"
    )
    assert "writes fail on 2 of 2 brokers for 12 s (Read timeout on endpoint URL)" in text
    assert "broker 1: uploads pending for 14 s, WAL 35% full" in text
    assert "broker 2: no upload pending, WAL 0% full" in text
    assert "broker 3" not in text  # it has not reported yet
    assert "failover mode normal (new objects go to bucket 0)" in text


def test_healthy_or_unreported_buckets_and_no_leader_are_no_problem(tmp_path: Path) -> None:
    config = _config(tmp_path)
    brokers = [_broker(1, 0.0, 0)]
    assert store_problems(config, brokers, _leader([_bucket(0, True), _bucket(1, None)]), {}) == []
    assert store_problems(config, brokers, None, {}) == []


def test_writes_that_failed_before_the_store_restarted_are_no_problem(tmp_path: Path) -> None:
    """Found in a full run: `cluster up` restarted a killed store and returned healthy, then
    a probe failure from the store's downtime reached the controller and status called the
    running store failing for a probe interval. A failure older than the store's process
    was its previous process's; a failure after it started is a problem."""
    config = _config(tmp_path)
    brokers = [_broker(1, 0.0, 0)]
    failing = {**_bucket(1, False, failing=2), "last_failure_age_ms": 1_500}
    pids = {"s3": 4242, "s3-failover": 4343}
    # the failover store has run 1.0 s: its last failures (1.5 s ago) were before it
    assert store_problems(config, brokers, _leader([failing]), pids, {"s3-failover": 1.0}) == []
    # it has run 2.0 s: a write failed on this process
    assert len(store_problems(config, brokers, _leader([failing]), pids, {"s3-failover": 2.0})) == 1
    # unknown age, or brokers that do not say when they last failed: a problem, as before
    assert len(store_problems(config, brokers, _leader([failing]), pids)) == 1
    unknown = {**failing, "last_failure_age_ms": None}
    assert len(store_problems(config, brokers, _leader([unknown]), pids, {"s3-failover": 1.0})) == 1


def test_a_store_has_answered_since_the_start_that_waited_for_it(tmp_path: Path) -> None:
    import os
    import time

    cluster = LocalCluster(tmp_path / "c")
    _config(tmp_path)
    me = os.getpid()  # stands in for a store process
    since_start = cluster.store_answering_s("s3-failover", me)
    assert since_start is not None and since_start > 0
    ready = cluster.dir / "pids" / "s3-failover.ready"
    ready.parent.mkdir(parents=True, exist_ok=True)
    ready.write_text(f"{me} {time.time() - 0.5}")
    assert 0.4 < cluster.store_answering_s("s3-failover", me) < min(since_start, 5.0)
    ready.write_text(f"{me + 1} {time.time()}")  # another process's start: not this one's
    assert cluster.store_answering_s("s3-failover", me) >= since_start
