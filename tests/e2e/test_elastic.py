"""Elastic operations against `automqctl cluster up` with real Kafka clients: controlled
shutdown, crash failover with WAL takeover, a broker paused past its session timeout, and the
acked-write ledger under a seeded schedule of kills, pauses and restarts.

Every test keeps an idempotent producer running through the event and ends by reading the
whole topic back: no acknowledged record may be missing, none duplicated.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from contextlib import contextmanager

import pytest

pytest.importorskip("confluent_kafka")
from cli.local_cluster import LocalCluster  # noqa: E402
from tests.support.cluster import automqctl, cluster_fixture, create_topic, leaders  # noqa: E402
from tests.support.ledger import AckLedger  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BROKERS = (1, 2, 3)
SESSION_TIMEOUT_MS = 6000
# a fixed seed so a failure can be replayed; AUTOMQ_CHAOS_SEED explores other schedules
CHAOS_SEED = int(os.environ.get("AUTOMQ_CHAOS_SEED", "20261122"))
CHAOS_EVENTS = int(os.environ.get("AUTOMQ_CHAOS_EVENTS", "4"))


# free ports (the default): a fixed range can collide with ephemeral client ports; a paused
# broker is resumed by the `faults` fixture at the end of its test, whatever happened
# a killed broker must stay down (failover, `broker start`): no supervisor
cluster = cluster_fixture(
    "elastic", "--no-supervise", "--session-timeout-ms", str(SESSION_TIMEOUT_MS)
)


def brokers(cluster) -> dict[int, dict]:
    out = automqctl("broker", "list", "--format", "json", cluster_dir=cluster["dir"])
    assert out.returncode == 0, out.stderr
    return {b["node_id"]: b for b in json.loads(out.stdout)}


def wait_all_active(cluster, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        bs = brokers(cluster)
        if all(bs[n]["registered"] and not bs[n]["fenced"] and bs[n]["pid"] for n in BROKERS):
            return
        time.sleep(0.3)
    raise AssertionError(f"brokers not all active: {brokers(cluster)}")


def wait_failover_done(cluster, node: int, timeout_s: float = 30) -> None:
    """Wait until a broker's log says it finished recovering `node`'s WAL."""
    needle = f"WAL failover of node {node} done"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(needle in p.read_text() for p in (cluster["dir"] / "logs").glob("broker-*.log")):
            return
        time.sleep(0.3)
    raise AssertionError(f"no broker logged {needle!r} within {timeout_s}s")


def assert_ledger_exact(ledger: AckLedger) -> None:
    report = ledger.verify()
    assert report.acked > 0
    assert not report.missing, f"{len(report.missing)} acked records missing: {report.missing[:5]}"
    assert not report.duplicated, (
        f"{len(report.duplicated)} duplicated: {report.duplicated[:5]}; the producer's "
        f"idempotence events: {report.eos_events[-20:]}"
    )
    assert not report.out_of_order_partitions
    assert report.consumed == report.acked


@contextmanager
def producing(cluster, partitions: int = 6, rate: float = 40.0):
    topic = f"elastic-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, partitions)
    ledger = AckLedger(cluster["bootstrap"], topic, partitions, rate_per_partition=rate).start()
    try:
        yield topic, ledger
    finally:
        ledger.stop()


def pid_of(cluster, node: int) -> int:
    pid = LocalCluster(cluster["dir"]).running(f"broker-{node}")
    assert pid, f"broker-{node} is not running"
    return pid


def victim_with_partitions(cluster, topic: str) -> tuple[int, set[int]]:
    led = leaders(cluster["bootstrap"], topic)
    node = max(BROKERS, key=lambda n: (sum(1 for v in led.values() if v == n), -n))
    return node, {p for p, leader in led.items() if leader == node}


# ---------------------------------------------------------------- scenarios


def test_controlled_shutdown_moves_partitions_and_clients_continue(cluster):
    wait_all_active(cluster)
    with producing(cluster) as (topic, ledger):
        time.sleep(2)
        node, moved = victim_with_partitions(cluster, topic)
        assert moved
        stopped = automqctl("broker", "stop", str(node), cluster_dir=cluster["dir"])
        assert stopped.returncode == 0, stopped.stderr
        event = time.monotonic()
        # its partitions are led by the others now, and take writes while it is down
        after = leaders(cluster["bootstrap"], topic)
        assert all(after[p] != node for p in moved), after
        ledger.wait_writable(moved, event)
        gaps = ledger.unavailability_s(moved, event - 5)
        print(f"controlled shutdown of broker {node}: unavailability per partition {gaps}")
        started = automqctl("broker", "start", str(node), cluster_dir=cluster["dir"])
        assert started.returncode == 0, started.stderr
        time.sleep(1)
    assert_ledger_exact(ledger)


def test_kill_9_fails_over_the_wal_to_another_broker(cluster):
    wait_all_active(cluster)
    with producing(cluster) as (topic, ledger):
        time.sleep(2)
        node, moved = victim_with_partitions(cluster, topic)
        killed = automqctl("broker", "kill", str(node), cluster_dir=cluster["dir"])
        assert killed.returncode == 0, killed.stderr
        event = time.monotonic()
        # while it stays down, another broker recovers its WAL and leads its partitions
        again = ledger.wait_writable(moved, event)
        after = leaders(cluster["bootstrap"], topic)
        assert all(after[p] != node for p in moved), after
        wait_failover_done(cluster, node)
        print(f"kill -9 of broker {node}: writable again after {again}")
        assert automqctl("broker", "start", str(node), cluster_dir=cluster["dir"]).returncode == 0
    assert_ledger_exact(ledger)


def test_broker_paused_past_its_session_acks_nothing_after_the_takeover(cluster, faults):
    wait_all_active(cluster)
    with producing(cluster) as (topic, ledger):
        time.sleep(2)
        node, moved = victim_with_partitions(cluster, topic)
        pid = pid_of(cluster, node)
        epoch = brokers(cluster)[node]["node_epoch"]
        with faults.suspended(pid):
            event = time.monotonic()
            # fenced, WAL taken over, partitions moved: writes continue without it
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                after = leaders(cluster["bootstrap"], topic)
                if all(after[p] != node for p in moved):
                    break
                time.sleep(0.3)
            assert all(after[p] != node for p in moved), after
            wait_failover_done(cluster, node)
        # it wakes up fenced, restarts itself (same process) and registers with a new epoch
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            b = brokers(cluster)[node]
            if b["node_epoch"] > epoch and not b["fenced"] and b["pid"] == pid:
                break
            time.sleep(0.3)
        assert b["node_epoch"] > epoch and not b["fenced"], b
        ledger.wait_writable(set(range(6)), time.monotonic())
        assert time.monotonic() - event > SESSION_TIMEOUT_MS / 1000
    assert_ledger_exact(ledger)


def test_acked_write_ledger_under_seeded_kills_pauses_and_restarts(cluster, faults):
    """A schedule drawn from a fixed seed: kill -9 (then start), SIGSTOP past the session
    timeout (then SIGCONT), graceful restart; one broker at a time, producers running."""
    rng = random.Random(CHAOS_SEED)
    schedule = [
        (rng.choice(["kill", "pause", "restart"]), rng.choice(BROKERS), rng.uniform(0.5, 3.0))
        for _ in range(CHAOS_EVENTS)
    ]
    print(f"chaos schedule (seed {CHAOS_SEED}): {schedule}")
    wait_all_active(cluster)
    with producing(cluster, partitions=8, rate=30) as (topic, ledger):
        for action, node, delay_s in schedule:
            time.sleep(delay_s)
            if action == "kill":
                assert (
                    automqctl("broker", "kill", str(node), cluster_dir=cluster["dir"]).returncode
                    == 0
                )
                time.sleep(rng.uniform(0.0, SESSION_TIMEOUT_MS / 1000 + 3))
                assert (
                    automqctl("broker", "start", str(node), cluster_dir=cluster["dir"]).returncode
                    == 0
                )
            elif action == "pause":
                pid = pid_of(cluster, node)
                with faults.suspended(pid):
                    time.sleep(SESSION_TIMEOUT_MS / 1000 + rng.uniform(1.0, 4.0))
            else:
                assert (
                    automqctl("broker", "stop", str(node), cluster_dir=cluster["dir"]).returncode
                    == 0
                )
                assert (
                    automqctl("broker", "start", str(node), cluster_dir=cluster["dir"]).returncode
                    == 0
                )
            wait_all_active(cluster)
            ledger.wait_writable(set(range(8)), time.monotonic())
    assert_ledger_exact(ledger)
    assert ledger.failed == 0, ledger.errors
