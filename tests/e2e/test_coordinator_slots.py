"""Group coordinators stay put when an unrelated broker dies (issue #10, "Nothing wedges").

On a 3-broker cluster two consumer groups of three confluent-kafka members each consume
one topic while an idempotent producer writes to it: group A is coordinated by broker A,
group B by broker B (chosen with FindCoordinator and checked against the slot map in
`automqctl cluster status --format json`). kill -9 of the third broker must not make
either group rebalance (no assign/revoke/lost callback, the same member ids) nor deliver
anything twice; kill -9 of broker A must make only group A rebalance. FindCoordinator
probes of 300 other groups check the same rule for every group: only the dead broker's
groups move.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import socket
import struct
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, KafkaError, KafkaException  # noqa: E402
from kafka.protocol.admin import DescribeGroupsRequest  # noqa: E402
from kafka.protocol.metadata import FindCoordinatorRequest  # noqa: E402

from controlplane.coordinators import group_slot  # noqa: E402
from dataplane.kafka.codec import decode_response, encode_request  # noqa: E402
from tests.support.ledger import AckLedger, automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SESSION_TIMEOUT_MS = 6000
PARTITIONS = 6
MEMBERS = 3
PROBES = 300
MAX_CANDIDATES = 2000
QUIET_S = 8.0  # how long the groups keep consuming after a kill before they are judged
# what each member's librdkafka logs to its file beside the cluster's logs (kept with them
# after a failure): the group state machine, assignments and connections
CLIENT_DEBUG = "cgrp,consumer,broker"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("coord") / "cluster"
    # a killed broker must stay down (failover, `broker start`): no supervisor
    with running_cluster(
        d, "--no-supervise", "--session-timeout-ms", str(SESSION_TIMEOUT_MS)
    ) as status:
        yield {
            "dir": d,
            "bootstrap": status["bootstrap_servers"],
            "addresses": {b["node_id"]: b["address"] for b in status["brokers"]},
        }


def cluster_status(cluster) -> dict:
    out = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster["dir"])
    return json.loads(out.stdout)  # exit code 1 just means unhealthy (a broker is down)


# ---------------------------------------------------------------- raw protocol


def _call(address: str, request, api_key: int, version: int, timeout_s: float = 10):
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(encode_request(request, correlation_id=1, version=version))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    return decode_response(frame, api_key, version)[1]


def find_coordinators(address: str, groups: list[str]) -> dict[str, int | None]:
    """FindCoordinator v4 (batched) for GROUP keys: group -> node (None on an error)."""
    found: dict[str, int | None] = {}
    for i in range(0, len(groups), 100):
        resp = _call(
            address,
            FindCoordinatorRequest[4](key_type=0, coordinator_keys=groups[i : i + 100]),
            10,
            4,
        )
        found.update({c.key: c.node_id if c.error_code == 0 else None for c in resp.coordinators})
    return found


def describe_members(address: str, group: str) -> tuple[int, str, set[str]]:
    """DescribeGroups v5 at `address`: (error code, state, member ids)."""
    resp = _call(
        address,
        DescribeGroupsRequest[5](groups=[group], include_authorized_operations=False),
        15,
        5,
    )
    g = resp.groups[0]
    return g.error_code, g.group_state, {m.member_id for m in g.members}


# ---------------------------------------------------------------- a consumer group


class GroupRun:
    """`MEMBERS` confluent-kafka consumers of one group, one thread each, committing after
    every batch; records every delivery and every assign/revoke/lost callback. Member `i`
    has client id `<group>-m<i>` (its member id starts with it) and writes its librdkafka
    debug log to `<log_dir>/<group>-m<i>.log`."""

    def __init__(self, bootstrap: str, group: str, topic: str, log_dir: Path):
        self.group = group
        self.log_dir = log_dir
        self.delivered: Counter[tuple[int, int]] = Counter()
        self.events: list[tuple[float, int, str, tuple[int, ...]]] = []
        self.assigned: dict[int, set[int]] = {i: set() for i in range(MEMBERS)}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        conf = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 10_000,
            "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
            "fetch.wait.max.ms": 100,
        }
        self._threads = [
            threading.Thread(
                target=self._run, args=(i, topic, conf), name=f"{group}-{i}", daemon=True
            )
            for i in range(MEMBERS)
        ]

    def start(self) -> GroupRun:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        hung = [t for t in self._threads if t.is_alive()]
        if hung:
            stacks = self.log_dir / f"{self.group}-stacks.txt"
            with stacks.open("w") as out:
                faulthandler.dump_traceback(out, all_threads=True)
            threads = {t.name: hex(t.ident or 0) for t in hung}
            raise AssertionError(
                f"{self.group}: a member hangs: {threads}, Python stacks in {stacks}; "
                f"{self.state()}"
            )

    def _event(self, member: int, kind: str, partitions) -> None:
        parts = tuple(sorted(p.partition for p in partitions))
        with self._lock:
            self.events.append((time.monotonic(), member, kind, parts))
            if kind == "assign":
                self.assigned[member] = set(parts)
            else:
                self.assigned[member] -= set(parts)

    def _run(self, member: int, topic: str, conf: dict) -> None:
        name = f"{self.group}-m{member}"
        logger = logging.getLogger(f"{__name__}.{name}")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        handler = logging.FileHandler(self.log_dir / f"{name}.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        logger.addHandler(handler)
        # librdkafka hands its log lines to the consumer's queue: written (and timed) when
        # the member polls, commits or closes, so a member stuck in a call logs nothing more
        consumer = Consumer({**conf, "client.id": name, "debug": CLIENT_DEBUG}, logger=logger)
        try:
            consumer.subscribe(
                [topic],
                on_assign=lambda c, ps: self._event(member, "assign", ps),
                on_revoke=lambda c, ps: self._event(member, "revoke", ps),
                on_lost=lambda c, ps: self._event(member, "lost", ps),
            )
            while not self._stop.is_set():
                msgs = consumer.consume(200, timeout=0.2)
                got = [(m.partition(), m.offset()) for m in msgs if not m.error()]
                with self._lock:
                    self.delivered.update(got)
                if got:
                    try:
                        consumer.commit(asynchronous=False)
                    except KafkaException as exc:
                        if exc.args[0].code() != KafkaError._NO_OFFSET:
                            with self._lock:
                                self.errors.append(str(exc))
        finally:
            try:
                consumer.close()
            finally:
                logger.removeHandler(handler)
                handler.close()

    # ------------------------------------------------------------ views

    def state(self) -> str:
        """Each member's partitions and the last callbacks, for a failure's message."""
        with self._lock:
            return (
                f"{self.group}: assigned {self.assigned}, last events {self.events[-9:]}, "
                f"client logs in {self.log_dir}"
            )

    def events_since(self, t: float) -> list[tuple[float, int, str, tuple[int, ...]]]:
        with self._lock:
            return [e for e in self.events if e[0] >= t]

    def last_event_s(self) -> float:
        with self._lock:
            return self.events[-1][0] if self.events else 0.0

    def duplicates(self) -> list[tuple[int, int]]:
        with self._lock:
            return sorted(k for k, n in self.delivered.items() if n > 1)

    def has_all(self, acked: set[tuple[int, int]]) -> bool:
        with self._lock:
            return acked <= set(self.delivered)

    def balanced(self) -> bool:
        with self._lock:
            owned = [p for ps in self.assigned.values() for p in ps]
            return sorted(owned) == list(range(PARTITIONS)) and all(self.assigned.values())


def wait_for(condition, timeout_s: float, what: str, details=None) -> None:
    """Poll `condition` until it holds or `timeout_s` passed (AssertionError naming `what`
    and, if given, `details()`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.3)
    more = f"; {details()}" if details is not None else ""
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}{more}")


def wait_steady(runs: list[GroupRun], timeout_s: float = 90) -> None:
    """Every group has all partitions spread over its members and no callback for 3 s."""
    wait_for(
        lambda: all(r.balanced() and time.monotonic() - r.last_event_s() > 3 for r in runs),
        timeout_s,
        "both groups to settle",
    )


def wait_slots_moved_off(cluster, node: int, timeout_s: float = 40) -> dict:
    """The broker is fenced and owns no coordinator slot any more."""
    result: dict = {}

    def moved() -> bool:
        status = cluster_status(cluster)
        b = next(b for b in status["brokers"] if b["node_id"] == node)
        result.update(status)
        return b["fenced"] and b["coordinator_slots"] == 0

    wait_for(moved, timeout_s, f"broker {node} fenced without coordinator slots")
    return result


def wait_failover_done(cluster, node: int, timeout_s: float = 40) -> None:
    needle = f"WAL failover of node {node} done"
    logs = Path(cluster["dir"]) / "logs"
    wait_for(
        lambda: any(needle in p.read_text() for p in logs.glob("broker-*.log")), timeout_s, needle
    )


def choose_groups(cluster, address: str, owners: list, a: int, b: int) -> tuple[str, str]:
    """Group ids coordinated by `a` and by `b` (FindCoordinator, checked against the slots)."""
    prefix = uuid.uuid4().hex[:6]
    candidates = [f"coord-{prefix}-{i}" for i in range(MAX_CANDIDATES)]
    found = find_coordinators(address, candidates)
    for g in candidates:  # FindCoordinator answers from the slot map
        assert found[g] == owners[group_slot(g, len(owners))], g
    group_a = next(g for g in candidates if found[g] == a)
    group_b = next(g for g in candidates if found[g] == b)
    return group_a, group_b


# ---------------------------------------------------------------- the scenario


def test_groups_rebalance_only_when_their_own_coordinator_dies(cluster):
    status = cluster_status(cluster)
    owners = status["coordinator_slot_owners"]
    assert len(owners) == 50 and None not in owners, owners
    per_broker = {b["node_id"]: b["coordinator_slots"] for b in status["brokers"]}
    assert sorted(per_broker.values()) == [16, 17, 17], per_broker
    node_a, node_b, victim = 1, 2, 3
    address = {n: cluster["addresses"][n] for n in (1, 2, 3)}
    group_a, group_b = choose_groups(cluster, address[node_a], owners, node_a, node_b)
    probes = [f"probe-{uuid.uuid4().hex[:6]}-{i}" for i in range(PROBES)]
    probes_before = find_coordinators(address[node_a], probes)
    assert set(probes_before.values()) == {1, 2, 3}

    topic = f"coord-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    log_dir = Path(cluster["dir"]).parent / "client-logs"
    log_dir.mkdir(exist_ok=True)
    ledger = AckLedger(
        cluster["bootstrap"],
        topic,
        PARTITIONS,
        rate_per_partition=20,
        log_path=log_dir / "ledger-producer.log",
    ).start()
    runs = [GroupRun(cluster["bootstrap"], g, topic, log_dir).start() for g in (group_a, group_b)]
    run_a, run_b = runs
    try:
        wait_steady(runs)
        members = {
            r.group: describe_members(address[n], r.group)
            for r, n in ((run_a, node_a), (run_b, node_b))
        }
        assert all(
            m[0] == 0 and m[1] == "Stable" and len(m[2]) == MEMBERS for m in members.values()
        ), members

        # 1. kill -9 the broker that coordinates neither group
        t_kill = time.monotonic()
        assert automqctl("broker", "kill", str(victim), cluster_dir=cluster["dir"]).returncode == 0
        after = wait_slots_moved_off(cluster, victim)
        wait_failover_done(cluster, victim)
        ledger.wait_writable(set(range(PARTITIONS)), time.monotonic())
        time.sleep(QUIET_S)
        for run in runs:
            assert run.events_since(t_kill) == [], (run.group, run.events_since(t_kill))
            assert run.duplicates() == [], (run.group, run.duplicates()[:10])
        for run, node in ((run_a, node_a), (run_b, node_b)):
            assert describe_members(address[node], run.group) == members[run.group]
        # every other group kept its coordinator too, unless it was the dead broker's
        probes_after = find_coordinators(address[node_a], probes)
        for g, before in probes_before.items():
            if before == victim:
                assert probes_after[g] in (node_a, node_b), g
            else:
                assert probes_after[g] == before, (g, before, probes_after[g])
        assert sorted(b["coordinator_slots"] for b in after["brokers"]) == [0, 25, 25]

        # 2. kill -9 the coordinator of group A: only group A rebalances
        t_kill = time.monotonic()
        assert automqctl("broker", "kill", str(node_a), cluster_dir=cluster["dir"]).returncode == 0
        wait_slots_moved_off(cluster, node_a)
        wait_for(
            lambda: any(e[2] == "assign" for e in run_a.events_since(t_kill)) and run_a.balanced(),
            60,
            "group A to rebalance onto its new coordinator",
            details=run_a.state,
        )
        wait_failover_done(cluster, node_a)
        ledger.wait_writable(set(range(PARTITIONS)), time.monotonic())
        time.sleep(QUIET_S)
        assert run_b.events_since(t_kill) == [], run_b.events_since(t_kill)
        assert describe_members(address[node_b], group_b) == members[group_b]
        assert find_coordinators(address[node_b], [group_a, group_b]) == {
            group_a: node_b,
            group_b: node_b,
        }
        ledger.stop()
        # an ack without an offset (librdkafka inferred it persisted) precedes a later ack of
        # its partition: the known offsets cover it
        acked = {(a.partition, a.offset) for a in ledger.snapshot() if a.offset is not None}
        wait_for(
            lambda: all(r.has_all(acked) for r in runs),
            90,
            "both groups to consume every acked message",
        )
    finally:
        try:
            ledger.stop(flush_timeout_s=30)  # again after a failure: never leave it running
        except AssertionError:
            pass
        for run in runs:
            run.stop()
    assert run_b.duplicates() == [], run_b.duplicates()[:10]
    assert run_b.errors == [], run_b.errors[:5]
    print(
        f"group A ({group_a}) after its coordinator died: "
        f"{len(run_a.duplicates())} duplicate deliveries, events {run_a.events_since(t_kill)}"
    )
