"""Placement and the self-balancer against `automqctl cluster up`, with idempotent producers
running through every move: a restarted broker gets its share of partitions back within a
minute (nobody runs `reassign`), a topic created right after the restart is spread, no
acknowledged record is lost or duplicated; `balancer disable` survives a controller failover
and nothing moves while it is off; `enable` moves again.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter

import pytest

pytest.importorskip("confluent_kafka")
from cli.local_cluster import LocalCluster  # noqa: E402
from tests.support.ledger import AckLedger, automqctl, create_topic, leaders, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BROKERS = (1, 2, 3)
SESSION_TIMEOUT_MS = 6000
SHARE_WITHIN_S = 60.0
QUIET_S = 15.0  # while disabled: settle time + several rounds, and nothing may move


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("balancer") / "cluster"
    with running_cluster(d, "--session-timeout-ms", str(SESSION_TIMEOUT_MS)) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


def ctl(cluster, *args: str):
    return automqctl(*args, cluster_dir=cluster["dir"])


def balancer_status(cluster) -> dict:
    out = ctl(cluster, "balancer", "status", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def brokers(cluster) -> dict[int, dict]:
    out = ctl(cluster, "broker", "list", "--format", "json")
    assert out.returncode == 0, out.stderr
    return {b["node_id"]: b for b in json.loads(out.stdout)}


def led(cluster, topics: list[str]) -> Counter:
    """Partitions of `topics` per broker, from a Metadata request."""
    c: Counter = Counter({n: 0 for n in BROKERS})
    for t in topics:
        c.update(leaders(cluster["bootstrap"], t).values())
    return c


def wait_all_active(cluster, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        bs = brokers(cluster)
        if all(bs[n]["registered"] and not bs[n]["fenced"] and bs[n]["pid"] for n in BROKERS):
            return
        time.sleep(0.3)
    raise AssertionError(f"brokers not all active: {brokers(cluster)}")


def wait_share(
    cluster, node: int, topics: list[str], since_s: float, timeout_s: float = SHARE_WITHIN_S
) -> tuple[float, Counter]:
    """Wait until `node` leads its share of `topics` (counts within 1 of each other) and
    the balancer has no move in progress; returns (seconds since `since_s`, counts)."""
    deadline = since_s + timeout_s
    counts: Counter = Counter()
    while time.monotonic() < deadline:
        counts = led(cluster, topics)
        total = sum(counts.values())
        if (
            counts[node] >= total // len(BROKERS)
            and max(counts.values()) - min(counts.values()) <= 1
            and balancer_status(cluster)["state"] == "idle"
        ):
            return time.monotonic() - since_s, counts
        time.sleep(0.5)
    raise AssertionError(
        f"broker {node} did not get its share within {timeout_s:.0f}s: {counts}; "
        f"balancer: {balancer_status(cluster)}"
    )


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


def test_restarted_broker_gets_its_share_back_and_new_topics_spread(cluster):
    wait_all_active(cluster)
    assert balancer_status(cluster)["state"] in ("idle", "in_progress")  # on by default
    suffix = uuid.uuid4().hex[:6]
    live, idle, new = f"bal-live-{suffix}", f"bal-idle-{suffix}", f"bal-new-{suffix}"
    create_topic(cluster["bootstrap"], idle, 6)
    create_topic(cluster["bootstrap"], live, 6)
    ledger = AckLedger(cluster["bootstrap"], live, 6, rate_per_partition=40).start()
    try:
        ledger.wait_writable(set(range(6)), time.monotonic())
        out = ctl(cluster, "broker", "stop", "1")
        assert out.returncode == 0, out.stderr
        assert led(cluster, [live, idle])[1] == 0  # its partitions moved away
        time.sleep(4)  # the balancer gives nothing to a stopped broker
        assert led(cluster, [live, idle])[1] == 0

        out = ctl(cluster, "broker", "start", "1")
        assert out.returncode == 0, out.stderr
        started = time.monotonic()
        # the reported pile-up: a topic created now went wholly to the empty broker
        create_topic(cluster["bootstrap"], new, 6)
        assert led(cluster, [new]) == {1: 2, 2: 2, 3: 2}

        took_s, counts = wait_share(cluster, 1, [live, idle, new], started)
        print(f"\nbroker 1 leads its share {dict(counts)} {took_s:.1f}s after its restart")
        # moved back, not only given new ones: the old topics are balanced too (4/4/4 +- 1)
        assert led(cluster, [live, idle])[1] >= 3
        ledger.wait_writable(set(range(6)), time.monotonic())
    finally:
        ledger.stop()
    assert_ledger_exact(ledger)
    assert ledger.failed == 0, ledger.errors
    status = balancer_status(cluster)
    moves = [m for m in status["recent_moves"] if m["topic"] in (live, idle, new)]
    assert moves and all(m["to"] == 1 and m["status"] == "done" for m in moves), moves
    assert all(m["reason"].startswith("count:") for m in moves)
    table = ctl(cluster, "balancer", "status")
    assert table.returncode == 0 and "balancer: idle" in " ".join(table.stdout.split()), (
        table.stdout
    )


def test_disabled_balancer_survives_failover_and_moves_nothing_until_enabled(cluster):
    wait_all_active(cluster)
    topics = [t for t in _all_topics(cluster)]
    live = f"bal-off-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], live, 6)
    topics.append(live)
    ledger = AckLedger(cluster["bootstrap"], live, 6, rate_per_partition=40).start()
    local = LocalCluster(cluster["dir"])
    config = local.load()
    try:
        out = ctl(cluster, "balancer", "disable")
        assert out.returncode == 0 and "disabled" in out.stdout, out.stderr
        assert balancer_status(cluster)["state"] == "off"
        # the switch is in the metadata: a new controller leader keeps it off
        leader = json.loads(ctl(cluster, "cluster", "status", "--format", "json").stdout)["leader"]
        assert leader is not None
        local.stop(f"controller-{leader}")
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                st = json.loads(ctl(cluster, "cluster", "status", "--format", "json").stdout)
                if st["leader"] not in (None, leader):
                    break
                time.sleep(0.3)
            assert balancer_status(cluster)["state"] == "off"
        finally:
            local.start_controller(config, leader)

        moves_before = len(balancer_status(cluster)["recent_moves"])
        out = ctl(cluster, "broker", "stop", "2")
        assert out.returncode == 0, out.stderr
        out = ctl(cluster, "broker", "start", "2")
        assert out.returncode == 0, out.stderr
        started = time.monotonic()
        while time.monotonic() - started < QUIET_S:
            assert led(cluster, topics)[2] == 0, "the balancer moved while disabled"
            time.sleep(1)
        status = balancer_status(cluster)
        assert status["state"] == "off" and len(status["recent_moves"]) == moves_before

        out = ctl(cluster, "balancer", "enable", "--format", "json")
        assert out.returncode == 0 and json.loads(out.stdout)["enabled"] is True, out.stderr
        enabled = time.monotonic()
        took_s, counts = wait_share(cluster, 2, topics, enabled)
        print(f"\nafter enable, broker 2 leads its share {dict(counts)} in {took_s:.1f}s")
        ledger.wait_writable(set(range(6)), time.monotonic())
    finally:
        ledger.stop()
        ctl(cluster, "balancer", "enable")
    assert_ledger_exact(ledger)
    assert ledger.failed == 0, ledger.errors


def _all_topics(cluster) -> list[str]:
    out = ctl(cluster, "topic", "list", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    return [t["name"] if isinstance(t, dict) else t for t in data]
