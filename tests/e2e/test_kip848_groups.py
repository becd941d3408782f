"""KIP-848 consumer groups (`group.protocol=consumer`) with confluent-kafka against
`automqctl cluster up` (3 brokers; the broker's consumer session timeout lowered to 8 s with
`--override group.consumer.session.timeout.ms`, Kafka's key).

* a group of 3 members (subprocesses, `kip848_member.py`) reads a 6-partition topic while a
  producer writes to it; a 4th member joins, then one of the first three is kill -9'd: every
  acknowledged record is consumed, and a record is delivered again only if no member had
  committed past it before (so duplicates come only after the killed member's last commit);
* the group's coordinator broker is kill -9'd: the next coordinator recovers the group's state
  (same members, no new epoch from scratch) and the members read on;
* ApiVersions lists ConsumerGroupHeartbeat and ConsumerGroupDescribe; bad heartbeats get
  Kafka's error codes.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer, TopicPartition  # noqa: E402
from kafka.protocol.admin import ListGroupsRequest  # noqa: E402
from kafka.protocol.metadata import ApiVersionsRequest, FindCoordinatorRequest  # noqa: E402

from dataplane.kafka.codec import decode_response, encode_request  # noqa: E402
from dataplane.kafka.groups.consumer_handlers import (  # noqa: E402
    ConsumerGroupDescribeRequest,
    ConsumerGroupHeartbeatRequest,
)
from tests.support.cluster import automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARTITIONS = 6
SESSION_TIMEOUT_MS = 8000
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("kip848") / "cluster"
    with running_cluster(
        d,
        # a killed broker must stay down (failover, `broker start`): no supervisor
        "--no-supervise",
        "--brokers",
        "3",
        "--override",
        f"group.consumer.session.timeout.ms={SESSION_TIMEOUT_MS}",
        "--override",
        "group.consumer.heartbeat.interval.ms=500",
    ) as status:
        yield {
            "dir": d,
            "bootstrap": status["bootstrap_servers"],
            "addresses": {b["node_id"]: b["address"] for b in status["brokers"]},
            "azs": {b["node_id"]: b["az"] for b in status["brokers"]},
        }


# ---------------------------------------------------------------- helpers


def call(address: str, request, api_key: int, version: int, timeout_s: float = 10):
    """One request on a fresh connection; the decoded response."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(encode_request(request, correlation_id=1, version=version))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    return decode_response(frame, api_key, version)[1]


def coordinator_of(cluster, group: str) -> int | None:
    for address in cluster["addresses"].values():
        try:
            resp = call(
                address, FindCoordinatorRequest[4](key_type=0, coordinator_keys=[group]), 10, 4
            )
        except OSError:
            continue
        c = resp.coordinators[0]
        if c.error_code == 0:
            return c.node_id
    return None


def describe(cluster, group: str):
    """ConsumerGroupDescribe at the group's coordinator (None while there is none)."""
    node = coordinator_of(cluster, group)
    if node is None:
        return None
    try:
        resp = call(
            cluster["addresses"][node],
            ConsumerGroupDescribeRequest[0](group_ids=[group], include_authorized_operations=False),
            69,
            0,
        )
    except OSError:
        return None
    g = resp.groups[0]
    return g if g.error_code == 0 else None


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


class Member:
    """A `kip848_member.py` subprocess and its output file."""

    def __init__(self, cluster, group: str, topic: str, out: Path):
        self.out = out
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.e2e.kip848_member",
                cluster["bootstrap"],
                group,
                topic,
                str(out),
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def lines(self) -> list[list[str]]:
        if not self.out.exists():
            return []
        return [line.split() for line in self.out.read_text().splitlines() if line.strip()]

    def records(self) -> list[tuple[int, int, float]]:
        return [
            (int(p), int(o), float(t))
            for k, p, o, t in (x for x in self.lines() if x[0] == "R" and len(x) == 4)
        ]

    def commits(self) -> list[tuple[int, int, float]]:
        return [
            (int(p), int(o), float(t))
            for k, p, o, t in (x for x in self.lines() if x[0] == "C" and len(x) == 4)
        ]

    def started_s(self) -> float | None:
        first = next((x for x in self.lines() if x[0] == "A"), None)
        return None if first is None else int(first[1]) / 1000

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


class Writer:
    """A producer thread writing round-robin to every partition; `acked` holds what the
    broker acknowledged."""

    def __init__(
        self, bootstrap: str, topic: str, rate_per_s: int = 300, partitions: int = PARTITIONS
    ):
        self.acked: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        self._topic, self._rate, self._partitions = topic, rate_per_s, partitions
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _ack(self, err, msg) -> None:
        if err is None:
            with self._lock:
                self.acked.add((msg.partition(), msg.offset()))

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            self._producer.produce(
                self._topic, value=b"%d" % i, partition=i % self._partitions, on_delivery=self._ack
            )
            i += 1
            self._producer.poll(0)
            time.sleep(1 / self._rate)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def stop(self) -> set[tuple[int, int]]:
        self._stop.set()
        self._thread.join(10)
        assert self._producer.flush(60) == 0
        with self._lock:
            return set(self.acked)


def consumed(members: list[Member]) -> set[tuple[int, int]]:
    return {(p, o) for m in members for p, o, _ in m.records()}


def check_duplicates(members: list[Member]) -> int:
    """A record delivered twice must not have been committed past (by the member that read it
    first) before its second delivery. Returns the number of duplicates."""
    reads: dict[tuple[int, int], list[tuple[float, int]]] = {}
    for index, m in enumerate(members):
        for p, o, t in m.records():
            reads.setdefault((p, o), []).append((t, index))
    commits = [m.commits() for m in members]
    duplicates = 0
    for (p, o), deliveries in reads.items():
        if len(deliveries) < 2:
            continue
        duplicates += len(deliveries) - 1
        deliveries.sort()
        first_t, first = deliveries[0]
        for t, _ in deliveries[1:]:
            committed = [c for c in commits[first] if c[0] == p and c[1] > o and c[2] < t - 0.5]
            assert not committed, (
                f"record {p}/{o} delivered again at {t} after member {first} committed past it: {committed[:1]}"
            )
    return duplicates


# ---------------------------------------------------------------- tests


def test_api_versions_and_heartbeat_errors(cluster):
    address = next(iter(cluster["addresses"].values()))
    keys = {
        k.api_key: k
        for k in call(
            address,
            ApiVersionsRequest[3](client_software_name="test", client_software_version="1"),
            18,
            3,
        ).api_keys
    }
    assert (keys[68].min_version, keys[68].max_version) == (0, 1)
    assert (keys[69].min_version, keys[69].max_version) == (0, 0)
    group = f"hb-{uuid.uuid4().hex[:8]}"
    wait_for(lambda: coordinator_of(cluster, group) is not None, 30, "a coordinator")
    coord = cluster["addresses"][coordinator_of(cluster, group)]

    def hb(**kw):
        fields = dict(
            group_id=group,
            member_id="m-1",
            member_epoch=0,
            rebalance_timeout_ms=30000,
            subscribed_topic_names=["nope"],
            topic_partitions=[],
        )
        fields.update(kw)
        return call(coord, ConsumerGroupHeartbeatRequest[1](**fields), 68, 1)

    assert hb(member_epoch=5).error_code == 69  # GROUP_ID_NOT_FOUND: no such group yet
    assert hb(member_epoch=-7).error_code == 42  # INVALID_REQUEST
    assert hb(rebalance_timeout_ms=-1).error_code == 42
    assert hb(server_assignor="sticky").error_code == 112  # UNSUPPORTED_ASSIGNOR
    assert hb(subscribed_topic_names=None, subscribed_topic_regex="(a)\\1").error_code == 128
    joined = hb()
    assert (
        joined.error_code == 0 and joined.member_epoch >= 1 and joined.heartbeat_interval_ms == 500
    )
    assert hb(member_id="other", member_epoch=1).error_code == 25  # UNKNOWN_MEMBER_ID
    assert hb(member_epoch=joined.member_epoch + 3, topic_partitions=None).error_code == 110
    assert hb(member_epoch=-1).error_code == 0  # leave
    listed = call(coord, ListGroupsRequest[5](states_filter=[], types_filter=["consumer"]), 16, 5)
    assert [(g.group_id, g.group_type) for g in listed.groups if g.group_id == group] == [
        (group, "consumer")
    ]


def test_platformatic_kafka_consumer_protocol_reads_a_topic(cluster):
    """@platformatic/kafka (tests/js, installed by tests/run.sh with npm) with
    `groupProtocol: 'consumer'` reads every record of a 6-partition topic."""
    js = REPO / "tests" / "js"
    if (
        shutil.which("node") is None
        or not (js / "node_modules" / "@platformatic" / "kafka").is_dir()
    ):
        pytest.skip("node or @platformatic/kafka not installed (tests/run.sh installs them)")
    topic = "kip848-js"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    writer = Writer(cluster["bootstrap"], topic).start()
    wait_for(lambda: writer.count() >= 120, 60, "120 records written")
    acked = writer.stop()
    out = subprocess.run(
        [
            "node",
            str(js / "kip848.mjs"),
            cluster["bootstrap"],
            topic,
            "kip848-js-group",
            str(len(acked)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=js,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"read": len(acked), "partitions": list(range(PARTITIONS))}
    listed = call(
        cluster["addresses"][coordinator_of(cluster, "kip848-js-group")],
        ListGroupsRequest[5](states_filter=[], types_filter=["consumer"]),
        16,
        5,
    )
    assert "kip848-js-group" in {g.group_id for g in listed.groups}


def test_group_of_three_join_and_kill(cluster, tmp_path):
    topic, group = "kip848-a", "kip848-g1"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    writer = Writer(cluster["bootstrap"], topic).start()
    members = [Member(cluster, group, topic, tmp_path / f"m{i}.txt") for i in range(3)]
    try:
        wait_for(lambda: all(m.started_s() for m in members), 90, "3 members reading")
        members.append(Member(cluster, group, topic, tmp_path / "m3.txt"))
        wait_for(lambda: members[3].started_s() is not None, 90, "the 4th member's first record")
        members[0].kill()
        after_kill = writer.count()
        wait_for(lambda: writer.count() > after_kill + 600, 60, "more records after the kill")
        acked = writer.stop()
        wait_for(lambda: acked <= consumed(members), 120, "every acknowledged record consumed")
        duplicates = check_duplicates(members)
        group_state = describe(cluster, group)
        assert group_state is not None and len(group_state.members) == 3, group_state
        print(f"{len(acked)} records, {duplicates} duplicates")
    finally:
        writer.stop() if not writer._stop.is_set() else None
        for m in members:
            m.stop()


def test_a_consumer_group_through_the_zone_router(cluster):
    """A member of an AZ (client.id automq_az=...) that knows only its AZ's broker: its
    group's coordinator is elsewhere, so ConsumerGroupHeartbeat and OffsetCommit go through
    the coordinator's proxy in its AZ; it reads every record and commits."""
    az_of = cluster["azs"]
    az = az_of[min(az_of)]
    local = [n for n, a in az_of.items() if a == az]
    if len(set(az_of.values())) < 2:
        pytest.skip("one AZ: no zone router")
    group = next(
        g
        for g in (f"kip848-zone-{uuid.uuid4().hex[:6]}" for _ in range(200))
        if coordinator_of(cluster, g) not in local
    )
    topic = "kip848-zone"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    writer = Writer(cluster["bootstrap"], topic).start()
    wait_for(lambda: writer.count() >= 300, 60, "300 records written")
    acked = writer.stop()
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": ",".join(cluster["addresses"][n] for n in local),
            "client.id": f"automq_az={az}",
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    seen: set[tuple[int, int]] = set()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not acked <= seen:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                seen.add((msg.partition(), msg.offset()))
        assert acked <= seen
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], 30)
        assert sum(tp.offset for tp in committed) == len(acked)
    finally:
        consumer.close()


def test_new_partitions_get_a_new_target_assignment(cluster):
    """Partitions added to a subscribed topic reach the group's member without any member
    change (a new group epoch and target assignment at its next heartbeat)."""
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewPartitions

    topic = "kip848-grow"
    create_topic(cluster["bootstrap"], topic, 2)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster["bootstrap"],
            "group.id": "kip848-grow",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    try:
        consumer.subscribe([topic])
        wait_for(
            lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == 2,
            60,
            "2 partitions",
        )
        admin = AdminClient({"bootstrap.servers": cluster["bootstrap"]})
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
        wait_for(
            lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == 4,
            60,
            "4 partitions",
        )
        producer = Producer({"bootstrap.servers": cluster["bootstrap"]})
        producer.produce(topic, value=b"new", partition=3)
        assert producer.flush(30) == 0
        got = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not got:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.partition())
        assert got == [3]
    finally:
        consumer.close()


def test_automqctl_group_shows_both_kinds(cluster):
    """`automqctl group list|describe` shows a classic and a KIP-848 group side by side:
    type, state, members with their assignments, committed offsets and lag."""
    from confluent_kafka import Consumer

    topic = "kip848-cli"
    create_topic(cluster["bootstrap"], topic, 2)
    writer = Writer(cluster["bootstrap"], topic, partitions=2).start()
    wait_for(lambda: writer.count() >= 40, 60, "40 records written")
    acked = writer.stop()
    consumers = {}
    try:
        for group, protocol in (("kip848-cli-classic", "classic"), ("kip848-cli-new", "consumer")):
            c = Consumer(
                {
                    "bootstrap.servers": cluster["bootstrap"],
                    "group.id": group,
                    "group.protocol": protocol,
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                }
            )
            c.subscribe([topic])
            consumers[group] = c
            read = 0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and read < len(acked):
                msg = c.poll(0.5)
                if msg is not None and not msg.error():
                    read += 1
            assert read == len(acked), (group, read)
            c.commit(asynchronous=False)
        listed = automqctl("group", "list", "--format", "json", cluster_dir=cluster["dir"])
        assert listed.returncode == 0, listed.stderr
        kinds = {g["group"]: g["type"] for g in json.loads(listed.stdout)}
        assert kinds["kip848-cli-classic"] == "classic" and kinds["kip848-cli-new"] == "consumer"
        for group, kind in (("kip848-cli-classic", "classic"), ("kip848-cli-new", "consumer")):
            out = automqctl(
                "group", "describe", group, "--format", "json", cluster_dir=cluster["dir"]
            )
            assert out.returncode == 0, out.stderr
            described = json.loads(out.stdout)
            assert described["type"] == kind and len(described["members"]) == 1, described
            assert len(described["members"][0]["assignment"]) == 2, described
            assert sum(o["lag"] for o in described["offsets"]) == 0, described
            assert sum(o["committed"] for o in described["offsets"]) == len(acked)
            if kind == "consumer":  # ConsumerGroupDescribe's epochs
                assert described["group_epoch"] >= 1, described
                assert described["assignment_epoch"] == described["group_epoch"], described
                assert described["members"][0]["member_epoch"] == described["group_epoch"]
            else:
                assert described["group_epoch"] is None, described
        table = automqctl("group", "describe", "kip848-cli-new", cluster_dir=cluster["dir"])
        assert table.returncode == 0 and "type consumer" in table.stdout, (
            table.stdout + table.stderr
        )
        assert "group epoch" in table.stdout, table.stdout
    finally:
        for c in consumers.values():
            c.close()


def test_a_regex_subscription_reads_every_matching_topic(cluster):
    """librdkafka's `^`-prefixed subscription is a SubscribedTopicRegex under KIP-848: the
    broker resolves it and assigns the matching topics' partitions (a topic created after
    the subscription included)."""
    from confluent_kafka import Consumer

    create_topic(cluster["bootstrap"], "kip848-re-a", 2)
    create_topic(cluster["bootstrap"], "kip848-other", 1)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster["bootstrap"],
            "group.id": "kip848-regex",
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    try:
        consumer.subscribe(["^kip848-re-.*"])
        wait_for(
            lambda: consumer.poll(0.2) is None and len(consumer.assignment()) == 2,
            60,
            "kip848-re-a",
        )
        create_topic(cluster["bootstrap"], "kip848-re-b", 2)
        wait_for(
            lambda: (
                consumer.poll(0.2) is None
                and {(tp.topic, tp.partition) for tp in consumer.assignment()}
                == {("kip848-re-a", 0), ("kip848-re-a", 1), ("kip848-re-b", 0), ("kip848-re-b", 1)}
            ),
            90,
            "both matching topics assigned",
        )
        described = describe(cluster, "kip848-regex")
        assert [m.subscribed_topic_regex for m in described.members] == ["(^kip848-re-.*)"], (
            described
        )
    finally:
        consumer.close()


def test_a_static_member_restart_keeps_its_partitions(cluster):
    """A static member (`group.instance.id`) that closes (epoch -2) and comes back within the
    session timeout gets its partitions back; the other member keeps its own throughout."""
    from confluent_kafka import Consumer

    topic = "kip848-static"
    create_topic(cluster["bootstrap"], topic, 4)

    def member(instance: str) -> Consumer:
        c = Consumer(
            {
                "bootstrap.servers": cluster["bootstrap"],
                "group.id": "kip848-static",
                "group.protocol": "consumer",
                "group.instance.id": instance,
                "auto.offset.reset": "earliest",
            }
        )
        c.subscribe([topic])
        return c

    def owned(c: Consumer) -> set[int]:
        c.poll(0.2)
        return {tp.partition for tp in c.assignment()}

    def owned_by_both() -> tuple[set[int], set[int]]:
        # poll BOTH members at every check: librdkafka applies an assignment change (and
        # only then reports its revocation) inside poll(), so an unpolled member keeps all 4
        # partitions and the other waits for them forever (issue #31: the old check
        # `len(owned(a)) == 2 and len(owned(b)) == 2` never polled b when b joined first)
        return owned(a), owned(b)

    a, b = member("inst-a"), member("inst-b")
    try:
        wait_for(lambda: [len(p) for p in owned_by_both()] == [2, 2], 60, "2 + 2 partitions")
        mine, theirs = owned_by_both()
        epoch = describe(cluster, "kip848-static").group_epoch
        a.close()
        a = member("inst-a")
        wait_for(lambda: owned_by_both()[0] == mine, 60, "the restarted member's old partitions")
        assert owned(b) == theirs
        assert describe(cluster, "kip848-static").group_epoch == epoch  # no rebalance
    finally:
        a.close()
        b.close()


def test_group_survives_coordinator_kill(cluster, tmp_path):
    topic, group = "kip848-b", "kip848-g2"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    writer = Writer(cluster["bootstrap"], topic).start()
    members = [Member(cluster, group, topic, tmp_path / f"m{i}.txt") for i in range(3)]
    try:
        wait_for(lambda: all(m.started_s() for m in members), 90, "3 members reading")
        wait_for(
            lambda: (d := describe(cluster, group)) is not None and d.group_state == "Stable",
            60,
            "Stable",
        )
        before = describe(cluster, group)
        ids_before = {m.member_id for m in before.members}
        node = coordinator_of(cluster, group)
        assert automqctl("broker", "kill", str(node), cluster_dir=cluster["dir"]).returncode == 0
        del cluster["addresses"][node]
        after_kill = writer.count()
        wait_for(lambda: writer.count() > after_kill + 600, 120, "more records after the kill")
        acked = writer.stop()
        wait_for(lambda: acked <= consumed(members), 180, "every acknowledged record consumed")
        after = describe(cluster, group)
        assert after is not None and coordinator_of(cluster, group) != node
        # the state was recovered: the same members, the epoch carried on
        assert {m.member_id for m in after.members} == ids_before, (ids_before, after.members)
        assert after.group_epoch >= before.group_epoch
        check_duplicates(members)
    finally:
        writer.stop() if not writer._stop.is_set() else None
        for m in members:
            m.stop()
