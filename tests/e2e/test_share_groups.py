"""KIP-932 share groups with confluent-kafka's `ShareConsumer` against `automqctl cluster up`
(3 brokers). Group configs (`share.auto.offset.reset`, `share.record.lock.duration.ms`) are
set per group with IncrementalAlterConfigs, as `kafka-configs --entity-type groups` does.

* 3 consumers of one partition each get records, never one another's while they hold them;
* explicit acknowledgement: RELEASE delivers again (delivery count 2), REJECT never;
* the delivery count limit (5) archives a record released 5 times;
* a consumer kill -9'd while holding records: they go to another consumer once the lock
  (2 s here) expires;
* the partition leader is kill -9'd, then the partition is reassigned: no acknowledged record
  is delivered again, none is lost;
* DescribeShareGroupOffsets / AlterShareGroupOffsets / DeleteShareGroupOffsets over the wire
  (no confluent-kafka call).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import AcknowledgeType, Producer, ShareConsumer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from dataplane.formats.kafka_errors import KafkaError  # noqa: E402
from dataplane.kafka.codec import decode_response, encode_request  # noqa: E402
from dataplane.kafka.share.protocol import (  # noqa: E402
    AlterShareGroupOffsetsRequest,
    DeleteShareGroupOffsetsRequest,
    DescribeShareGroupOffsetsRequest,
)
from tests.support.cluster import automqctl, create_topic, leaders, running_cluster  # noqa: E402
from tests.support.share import share_consumer  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MEMBER = Path(__file__).with_name("share_member.py")
MAX_POLL_RECORDS = 10


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("share") / "cluster"
    # a killed broker must stay down (failover, `broker start`): no supervisor
    with running_cluster(d, "--brokers", "3", "--no-supervise") as status:
        # only the test moves partitions (a move makes acquired records available again:
        # their holders' acknowledgements fail, as in Kafka)
        off = automqctl("balancer", "disable", cluster_dir=d)
        assert off.returncode == 0, off.stderr + off.stdout
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


# ---------------------------------------------------------------- helpers


def group_configs(bootstrap: str, group: str, **configs: str) -> None:
    """Set share group configs (dots as underscores in the keyword names)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entries = [
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in configs.items()
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, count: int) -> list[int]:
    """`count` records, each acknowledged; their offsets."""
    offsets: list[int] = []
    errors: list = []

    def ack(err, msg):
        (errors.append(err) if err else offsets.append(msg.offset()))

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        p.produce(topic, value=f"r{i}".encode(), on_delivery=ack)
    assert p.flush(60) == 0 and not errors, errors
    return sorted(offsets)


@contextmanager
def subscribed(bootstrap: str, group: str, topic: str) -> Iterator[ShareConsumer]:
    """A share consumer, closed on leaving, also when the test fails."""
    c = share_consumer(bootstrap, group, topic, MAX_POLL_RECORDS)
    try:
        yield c
    finally:
        c.close()


def poll_some(c: ShareConsumer, timeout_s: float = 60) -> list:
    """The next non-empty batch of records (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = [m for m in c.poll(1.0) if m.error() is None]
        if got:
            return got
    raise AssertionError(f"no records within {timeout_s}s")


def poll_at_least(c: ShareConsumer, count: int) -> list:
    """Batches of records until there are at least `count` (each batch a bounded wait)."""
    got: list = []
    while len(got) < count:
        got += poll_some(c)
    return got


def poll_for(c: ShareConsumer, seconds: float) -> list:
    """Every record a consumer gets in `seconds` (each accepted at once)."""
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for m in c.poll(0.5):
            if m.error() is None:
                out.append(m)
                c.acknowledge(m, AcknowledgeType.ACCEPT)
        if out:
            commit(c)
    return out


def commit(c: ShareConsumer) -> None:
    results = c.commit_sync(30)
    failed = {tp: err for tp, err in (results or {}).items() if err is not None}
    assert not failed, failed


def accept_all(c: ShareConsumer, msgs: list) -> None:
    for m in msgs:
        c.acknowledge(m, AcknowledgeType.ACCEPT)
    commit(c)


def setup(cluster, name: str, records: int, **configs: str) -> tuple[str, str]:
    """A topic of one partition holding `records` records, and a share group reading it from
    the earliest offset (with share group `configs`)."""
    topic, group = f"{name}-t", f"{name}-g"
    create_topic(cluster["bootstrap"], topic, 1)
    group_configs(cluster["bootstrap"], group, share_auto_offset_reset="earliest", **configs)
    produce(cluster["bootstrap"], topic, records)
    return topic, group


def coordinator_call(bootstrap: str, group: str, request, api_key: int):
    """`request` (version 0) at the group's coordinator, over the wire as a client sends it;
    the decoded response (confluent-kafka 2.16's AdminClient has no share-group offsets
    calls)."""
    from kafka.protocol.metadata import FindCoordinatorRequest

    def call(address: tuple[str, int], req, key: int, version: int):
        with socket.create_connection(address, timeout=10) as sock:
            sock.sendall(encode_request(req, correlation_id=1, version=version))
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            frame = sock.recv(size, socket.MSG_WAITALL)
        return decode_response(frame, key, version)[1]

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    found = call(
        (host, int(port)), FindCoordinatorRequest[4](key_type=0, coordinator_keys=[group]), 10, 4
    ).coordinators[0]
    assert found.error_code == 0, found
    return call((found.host, found.port), request, api_key, 0)


def start_offset(bootstrap: str, group: str, topic: str) -> int:
    """The group's start offset on partition 0 of `topic` (DescribeShareGroupOffsets)."""
    D = DescribeShareGroupOffsetsRequest
    G = D.DescribeShareGroupOffsetsRequestGroup
    describe = D(
        version=0,
        groups=[
            G(
                group_id=group,
                topics=[G.DescribeShareGroupOffsetsRequestTopic(topic_name=topic, partitions=[0])],
            )
        ],
    )
    g = coordinator_call(bootstrap, group, describe, 90).groups[0]
    assert g.error_code == 0, g
    return g.topics[0].partitions[0].start_offset


def wait_until(condition, timeout_s: float, what: str):
    """The first truthy value of `condition()` (bounded wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


# ---------------------------------------------------------------- tests


def test_three_consumers_share_one_partition(cluster):
    # the records are held while automqctl runs: a lock that cannot expire meanwhile
    topic, group = setup(cluster, "share3", 60, share_record_lock_duration_ms="600000")
    consumers = [
        share_consumer(cluster["bootstrap"], group, topic, MAX_POLL_RECORDS) for _ in range(3)
    ]
    try:
        # each holds what it got (no acknowledgement yet): the next gets other records
        held = [poll_some(c) for c in consumers]
        offsets = [{m.offset() for m in batch} for batch in held]
        assert all(offsets), offsets
        assert not (offsets[0] & offsets[1] or offsets[0] & offsets[2] or offsets[1] & offsets[2])
        # automqctl shows the group: its 3 members, the partition's held records
        out = automqctl("group", "describe", group, "--format", "json", cluster_dir=cluster["dir"])
        assert out.returncode == 0, out.stderr + out.stdout
        described = json.loads(out.stdout)
        assert described["type"] == "share" and len(described["members"]) == 3, described
        (part,) = described["partitions"]
        assert part["start_offset"] == 0
        assert part["in_flight"]["acquired"] >= sum(len(o) for o in offsets), described
        listed = automqctl("group", "list", "--format", "json", cluster_dir=cluster["dir"])
        assert {"group": group, "type": "share", "state": "Stable"} in json.loads(listed.stdout)
        for c, batch in zip(consumers, held):
            accept_all(c, batch)
        seen = [m.offset() for batch in held for m in batch]
        deadline = time.monotonic() + 120
        while len(set(seen)) < 60 and time.monotonic() < deadline:
            for c in consumers:
                batch = [m for m in c.poll(0.5) if m.error() is None]
                if batch:
                    seen += [m.offset() for m in batch]
                    accept_all(c, batch)
        assert sorted(seen) == list(range(60))  # every record once, none twice
    finally:
        for c in consumers:
            c.close()


def test_release_redelivers_and_reject_archives(cluster):
    topic, group = setup(cluster, "sharerr", 6)
    with subscribed(cluster["bootstrap"], group, topic) as c:
        got = poll_some(c)
        assert sorted(m.offset() for m in got) == list(range(6))
        kinds = {0: AcknowledgeType.ACCEPT, 1: AcknowledgeType.RELEASE, 2: AcknowledgeType.REJECT}
        for m in got:
            c.acknowledge(m, kinds[m.offset() % 3])
        commit(c)
        again = poll_some(c)
        assert sorted((m.offset(), m.delivery_count()) for m in again) == [(1, 2), (4, 2)]
        accept_all(c, again)
        # nothing else comes: the rejected ones are archived, the accepted ones done
        assert poll_for(c, 4) == []


def test_delivery_count_limit_archives_after_five(cluster):
    topic, group = setup(cluster, "sharedl", 1)
    with subscribed(cluster["bootstrap"], group, topic) as c:
        counts = []
        for _ in range(5):
            (m,) = poll_some(c)
            counts.append(m.delivery_count())
            c.acknowledge(m, AcknowledgeType.RELEASE)
            commit(c)
        assert counts == [1, 2, 3, 4, 5]
        assert poll_for(c, 4) == []  # archived after the fifth delivery


def test_share_group_offsets_describe_and_delete(cluster):
    """DescribeShareGroupOffsets reports the start offset past the acknowledged records;
    DeleteShareGroupOffsets is NON_EMPTY_GROUP while a consumer is in the group, then deletes
    the topic's state: -1 described, and a new consumer reads from the start again
    (`share.auto.offset.reset=earliest`)."""
    topic, group = setup(cluster, "shareoffsets", 5)
    bootstrap = cluster["bootstrap"]
    X = DeleteShareGroupOffsetsRequest
    delete = X(
        version=0, group_id=group, topics=[X.DeleteShareGroupOffsetsRequestTopic(topic_name=topic)]
    )
    with subscribed(bootstrap, group, topic) as c:
        accept_all(c, poll_at_least(c, 5))
        wait_until(
            lambda: start_offset(bootstrap, group, topic) == 5, 30, "start offset 5 described"
        )
        busy = coordinator_call(bootstrap, group, delete, 92)
        assert busy.error_code == KafkaError.NON_EMPTY_GROUP, busy
    deleted = wait_until(
        lambda: (r := coordinator_call(bootstrap, group, delete, 92)).error_code == 0 and r,
        30,
        "the delete of an empty group",
    )
    assert [(t.topic_name, t.error_code) for t in deleted.responses] == [(topic, 0)]
    wait_until(lambda: start_offset(bootstrap, group, topic) == -1, 30, "no stored state described")
    with subscribed(bootstrap, group, topic) as again:
        got = poll_some(again)
        assert min(m.offset() for m in got) == 0


def test_share_group_offsets_alter(cluster):
    """AlterShareGroupOffsets is NON_EMPTY_GROUP while a consumer is in the group; once it
    left, the start offset is set back to 4 (the leader still holds the share-partition
    loaded, idle, at start 10): described as 4, and a new consumer reads from exactly 4.
    An unknown partition gets UNKNOWN_TOPIC_OR_PARTITION."""
    topic, group = setup(cluster, "sharealter", 10)
    bootstrap = cluster["bootstrap"]
    A = AlterShareGroupOffsetsRequest
    T = A.AlterShareGroupOffsetsRequestTopic

    def alter_request(partition: int, start: int):
        p = T.AlterShareGroupOffsetsRequestPartition(partition_index=partition, start_offset=start)
        return A(version=0, group_id=group, topics=[T(topic_name=topic, partitions=[p])])

    with subscribed(bootstrap, group, topic) as c:
        accept_all(c, poll_at_least(c, 10))
        wait_until(
            lambda: start_offset(bootstrap, group, topic) == 10, 30, "start offset 10 described"
        )
        busy = coordinator_call(bootstrap, group, alter_request(0, 4), 91)
        assert busy.error_code == KafkaError.NON_EMPTY_GROUP, busy
    altered = wait_until(
        lambda: (
            (r := coordinator_call(bootstrap, group, alter_request(0, 4), 91)).error_code == 0 and r
        ),
        30,
        "the alter of an empty group",
    )
    [t] = altered.responses
    assert [(p.partition_index, p.error_code) for p in t.partitions] == [(0, 0)], altered
    unknown = coordinator_call(bootstrap, group, alter_request(7, 0), 91)
    assert unknown.responses[0].partitions[0].error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    wait_until(lambda: start_offset(bootstrap, group, topic) == 4, 30, "start offset 4 described")
    with subscribed(bootstrap, group, topic) as again:
        got = poll_at_least(again, 6)
        assert sorted(m.offset() for m in got) == list(range(4, 10))
        accept_all(again, got)
    wait_until(lambda: start_offset(bootstrap, group, topic) == 10, 30, "start offset 10 again")


def test_killed_consumer_records_come_back_after_the_lock(cluster, tmp_path):
    topic, group = setup(cluster, "sharekill", 5, share_record_lock_duration_ms="2000")
    out = tmp_path / "member.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with out.open("w") as f:
        member = subprocess.Popen(
            [sys.executable, str(MEMBER), cluster["bootstrap"], group, topic], stdout=f, env=env
        )
    try:
        deadline = time.monotonic() + 90
        while "holding" not in out.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        held = [tuple(map(int, line.split())) for line in out.read_text().split("\n")[:-2]]
        assert held and all(count == 1 for _, count in held), out.read_text()
        os.kill(member.pid, signal.SIGKILL)
        member.wait(10)
        with subscribed(cluster["bootstrap"], group, topic) as c:
            got = []
            deadline = time.monotonic() + 60
            while len(got) < 5 and time.monotonic() < deadline:
                batch = poll_some(c)
                got += batch
                accept_all(c, batch)
            redelivered = {m.offset(): m.delivery_count() for m in got}
            assert sorted(redelivered) == list(range(5))
            assert all(redelivered[o] == 2 for o, _ in held), (held, redelivered)
    finally:
        if member.poll() is None:
            member.kill()
            member.wait(10)


def test_broker_kill_and_reassignment_keep_every_acknowledgement(cluster, tmp_path):
    topic, group = setup(cluster, "sharemove", 90)
    bootstrap = cluster["bootstrap"]
    acked: set[int] = set()
    delivered: list[int] = []

    def consume_until(count: int, timeout_s: float = 120) -> None:
        with subscribed(bootstrap, group, topic) as c:
            deadline = time.monotonic() + timeout_s
            while len(acked) < count and time.monotonic() < deadline:
                batch = [m for m in c.poll(1.0) if m.error() is None]
                if not batch:
                    continue
                delivered.extend(m.offset() for m in batch)
                # a record acknowledged before must never come again
                assert not {m.offset() for m in batch} & acked, (batch, acked)
                accept_all(c, batch)
                acked.update(m.offset() for m in batch)
        assert len(acked) >= count, (count, sorted(acked))

    consume_until(30)
    leader = leaders(bootstrap, topic)[0]
    assert automqctl("broker", "kill", str(leader), cluster_dir=cluster["dir"]).returncode == 0
    consume_until(60, timeout_s=180)
    assert automqctl("broker", "start", str(leader), cluster_dir=cluster["dir"]).returncode == 0
    now = leaders(bootstrap, topic)[0]
    target = next(n for n in (1, 2, 3) if n != now)
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            {"version": 1, "partitions": [{"topic": topic, "partition": 0, "node_id": target}]}
        )
    )
    moved = automqctl("reassign", "execute", "--plan", str(plan), cluster_dir=cluster["dir"])
    assert moved.returncode == 0, moved.stderr + moved.stdout
    verified = automqctl(
        "reassign", "verify", "--plan", str(plan), "--timeout-s", "60", cluster_dir=cluster["dir"]
    )
    assert verified.returncode == 0, verified.stderr + verified.stdout
    consume_until(90, timeout_s=180)
    assert acked == set(range(90))  # none lost, none acknowledged twice (checked above)
