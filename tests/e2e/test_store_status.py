"""`cluster status` reports a hung object store (issue 33 item 6): with every embedded
store paused (SIGSTOP: each request hangs) the status turns degraded within a bounded wait,
naming the store and what waits on it (pending uploads, WAL fill, failover mode); once the
stores resume it is healthy again by itself."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402

from tests.support.cluster import cluster_status, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

# a probe every 2 s with a 2 s timeout, a heartbeat a second, the leader's view: well within
DEGRADED_WITHIN_S = 20.0
HEALTHY_AGAIN_WITHIN_S = 30.0


def _wait_status(cluster_dir, predicate, timeout_s: float) -> tuple[dict, float]:
    """The first status `predicate` accepts and the seconds it took (AssertionError after
    `timeout_s` with the last status)."""
    started = time.monotonic()
    status: dict = {}
    while time.monotonic() - started < timeout_s:
        status = cluster_status(cluster_dir)
        if predicate(status):
            return status, time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"not within {timeout_s} s: {status.get('problems')}")


def _produce(bootstrap: str, count: int) -> None:
    """`count` records, all acknowledged (the producer goes when this returns)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(count):
        producer.produce("held", f"m{i}".encode())
    assert producer.flush(30) == 0


def _store_problems(status: dict) -> list[str]:
    return [p for p in status.get("problems", []) if p.startswith("object store of bucket")]


def test_a_paused_object_store_makes_status_degraded_naming_it_until_it_resumes(tmp_path, faults):
    d = tmp_path / "cluster"
    with running_cluster(d, "--brokers", "1", "--upload-interval-s", "2") as up:
        bootstrap = up["bootstrap_servers"]
        create_topic(bootstrap, "held", 1)
        _wait_status(d, lambda s: s["healthy"], HEALTHY_AGAIN_WITHIN_S)
        pids = faults.pause_object_stores(up)
        paused_at = time.monotonic()
        _produce(bootstrap, 200)  # acked into the WAL: these uploads wait on the store
        status, took_s = _wait_status(
            d,
            # both stores are paused: both buckets named (their probes fail in any order)
            lambda s: s["state"] == "degraded" and len(_store_problems(s)) == 2,
            DEGRADED_WITHIN_S - (time.monotonic() - paused_at),
        )
        text = " ".join(_store_problems(status))
        print(f"degraded {time.monotonic() - paused_at:.1f} s after the pause: {text}")
        assert "bucket 0 failing: the embedded main store (s3, pid" in text, text
        assert "bucket 1 failing: the embedded failover store (s3-failover, pid" in text, text
        assert "waiting: broker 1: uploads pending for" in text, text
        assert "failover mode normal" in text, text
        faults.resume(*pids)
        resumed_at = time.monotonic()
        status, took_s = _wait_status(d, lambda s: s["healthy"], HEALTHY_AGAIN_WITHIN_S)
        print(f"healthy {took_s:.1f} s after the stores resumed")
        assert status["state"] == "healthy" and not _store_problems(status)
        assert time.monotonic() - resumed_at < HEALTHY_AGAIN_WITHIN_S
