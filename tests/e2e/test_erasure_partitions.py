"""Leaderless erasure-coded partitions (issue #14) on `automqctl cluster up --brokers 6` with
stock Kafka clients: a confluent-kafka producer (acks=all) writes to an
`automq.partition.mode=erasure` topic while 2 of the 6 brokers are killed with kill -9;
writes keep being acknowledged (4 of 6 shard stores suffice); after they restarted, 2
brokers are paused (SIGSTOP) and every partition keeps being acknowledged; then a
consumer reads every acked record at its acked (sparse) offset; none is lost, and the few
duplicates of client retries (the producer's idempotence is off: a retry on another broker
is not deduplicated) are counted and bounded. A kafka-python consumer group then reads the
whole topic, commits, and a new member resumes after the commit; a record written by the
embedded writer (no broker on the write path) is read by that group too, and one it wrote
with 2 stores out of its reach (acked by exactly 4) is repaired by the serving broker:
the 2 other stores get their shards before the write is sealed. Meanwhile the
decided records were sealed into object storage and the shard stores dropped them: after
all 6 brokers are killed and restarted, a new consumer from the beginning reads every acked
record at its acked offset; retention.ms then moves the log start past the sealed pieces.
"""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Producer  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402
from kafka import KafkaConsumer, TopicPartition  # noqa: E402

from cli.local_cluster import LocalCluster  # noqa: E402
from controlplane.client import ControllerClient  # noqa: E402
from dataplane.broker.metadata import MetadataFollower  # noqa: E402
from dataplane.erasure.embedded import BrokerShardStore, EmbeddedErasureProducer  # noqa: E402
from dataplane.erasure.holes import HoleKind, classify  # noqa: E402
from dataplane.erasure.store_client import ShardStoreClient  # noqa: E402
from dataplane.objectstore import ObjectStorage, object_key, parse_bucket_uris  # noqa: E402
from tests.support.cluster import automqctl, create_topic, leaders, running_cluster  # noqa: E402
from tests.support.ledger import AckLedger  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PARTITIONS = 3


def wait_all_unfenced(cluster_dir, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = automqctl("broker", "list", "--format", "json", cluster_dir=cluster_dir)
        brokers = json.loads(out.stdout) if out.returncode == 0 else []
        if len(brokers) == 6 and all(b["registered"] and not b["fenced"] for b in brokers):
            return
        time.sleep(0.3)
    raise AssertionError("brokers not all unfenced")


def group_read(
    bootstrap: str, group: str, expect: int, timeout_ms: int = 20_000, topic: str = "events"
) -> dict:
    """(partition, offset) -> value read by a kafka-python member of `group` from `topic`,
    which then commits; stops at `expect` records or after `timeout_ms` without one."""
    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=timeout_ms,
    )
    got: dict = {}
    try:
        for m in consumer:
            got[(m.partition, m.offset)] = m.value
            if expect and len(got) >= expect:
                break
        consumer.commit()
    finally:
        consumer.close()
    return got


KILLED = (5, 6)
REPAIRS = "repairs"  # the topic of the repair check
SESSION_TIMEOUT_MS = 3000


def test_erasure_topic_keeps_acking_with_2_of_6_brokers_killed_and_loses_no_ack(tmp_path, faults):
    cluster_dir = tmp_path / "cluster"
    with running_cluster(
        cluster_dir,
        # a killed broker must stay down (failover, `broker start`): no supervisor
        "--no-supervise",
        "--brokers",
        "6",
        "--session-timeout-ms",
        str(SESSION_TIMEOUT_MS),
        "--wal-capacity-mib",
        "64",
    ) as status:
        bootstrap = status["bootstrap_servers"]
        create_topic(bootstrap, "events", PARTITIONS, configs={"automq.partition.mode": "erasure"})
        topic = AdminClient({"bootstrap.servers": bootstrap}).list_topics("events", timeout=10)
        for p in topic.topics["events"].partitions.values():
            # no leader of its own: all 6 brokers keep a shard, any of them serves it
            assert sorted(p.replicas) == [1, 2, 3, 4, 5, 6], p.replicas
        # idempotence off: an erasure partition does not deduplicate producer retries
        ledger = AckLedger(
            bootstrap, "events", PARTITIONS, rate_per_partition=40, **{"enable.idempotence": False}
        ).start()
        try:
            time.sleep(2)
            for node in KILLED:
                killed = automqctl("broker", "kill", str(node), cluster_dir=cluster_dir)
                assert killed.returncode == 0, killed.stderr
            event = time.monotonic()
            # every partition takes writes again (the producer moves off a dead broker once
            # it is fenced) and keeps taking them on the 4 remaining shard stores
            ledger.wait_writable(set(range(PARTITIONS)), event, timeout_s=30)
            time.sleep(3)
            during = [a for a in ledger.snapshot() if a.sent_s > event]
            assert len(during) >= 40, len(during)
            # (no read-back while they are down: a write acked by 4 stores, 2 of them now
            # dead, whose other shards came too late has < 4 readable shards; readers wait, they
            # never skip it)
            for node in KILLED:
                back = automqctl("broker", "start", str(node), cluster_dir=cluster_dir)
                assert back.returncode == 0, back.stderr
            wait_all_unfenced(cluster_dir)
            # 2 brokers that serve none of the partitions paused (SIGSTOP): every partition
            # keeps taking acked writes meanwhile (usually at once; the bound leaves room for
            # a loaded machine, and a pause past the session timeout only fences the two)
            serving = set(leaders(bootstrap, "events").values())
            paused = [n for n in range(1, 7) if n not in serving][:2]
            pids = [LocalCluster(cluster_dir).running(f"broker-{n}") for n in paused]
            assert len(paused) == 2 and all(pids), (serving, pids)
            with faults.suspended(*pids):
                pause = time.monotonic()
                ledger.wait_writable(set(range(PARTITIONS)), pause, timeout_s=5)
            time.sleep(1)
        finally:
            ledger.stop()
        report = ledger.verify(timeout_s=30)
        assert report.failed_sends == 0, ledger.errors
        assert not report.missing, report
        assert not report.out_of_order_partitions
        # duplicates the design allows (at least once, as Kafka without idempotence): a batch
        # whose write won an offset but whose answer was lost (its broker was killed, or a
        # writer gave up on slow stores) is sent again by the client. Counted, bounded.
        assert len(report.duplicated) <= max(3, report.acked // 500), report.duplicated
        assert report.consumed == report.acked + len(report.duplicated)
        print(
            f"erasure e2e: {report.acked} acked, {len(during)} while 2 of 6 were down, "
            f"{len(report.duplicated)} duplicated by client retries"
        )
        # a kafka-python consumer group reads the sparse offsets too and commits them; a
        # second member of the group resumes after the commit (nothing is read twice)
        acked_at = {(a.partition, a.offset): a.value for a in ledger.snapshot()}
        first = group_read(bootstrap, "readers", report.consumed)
        assert len(first) == report.consumed
        assert all(acked_at.get(k, v) == v for k, v in first.items())
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(5):
            producer.produce("events", value=f"after-commit-{i}".encode(), partition=i % 3)
        assert producer.flush(30) == 0
        resumed = group_read(bootstrap, "readers", 5)
        assert sorted(resumed.values()) == [f"after-commit-{i}".encode() for i in range(5)]
        # the embedded writer (no broker on the write path): it reads the metadata from the
        # controllers and writes shards to the brokers' stores with the cluster secret
        secret = (cluster_dir / "controller-api.secret").read_text().strip()
        client = ControllerClient([c["address"] for c in status["controllers"]], api_secret=secret)
        follower = MetadataFollower(client)
        while follower.poll_once():
            pass
        with EmbeddedErasureProducer(lambda: follower.image, "events", 1, secret=secret) as sdk:
            offset = sdk.send([(b"sdk", b"from-the-embedded-writer")])
        sdk_read = group_read(bootstrap, "readers", 1)
        assert sdk_read == {(1, offset): b"from-the-embedded-writer"}
        # its own topic, whose seal delay (10 min) no repair pass can lose the race to: on
        # "events" the stores could drop the write (sealed after 10 s) before a slow pass
        create_topic(
            bootstrap,
            REPAIRS,
            1,
            configs={"automq.partition.mode": "erasure", "automq.erasure.seal.delay.ms": "600000"},
        )
        while follower.poll_once():
            pass
        four = write_with_two_stores_unreached_and_await_repair(follower, secret)
        assert group_read(bootstrap, "readers", 1, topic=REPAIRS) == {(0, four): b"acked-by-four"}
        sealing = time.monotonic()
        sealed = check_sealed(follower, secret, ledger, cluster_dir)
        print(f"erasure e2e: sealed and dropped checked in {time.monotonic() - sealing:.1f} s")
        # every broker restarts (kill -9): a new consumer from the beginning reads every
        # acked record at its acked offset, the sealed ones from the object store
        restart = time.monotonic()
        local = LocalCluster(cluster_dir)
        for node in range(1, 7):
            assert local.kill(f"broker-{node}"), node
        config = local.load()
        for node in range(1, 7):  # all at once (`broker start` waits for each in turn)
            local.start_broker(config, node)
        wait_all_unfenced(cluster_dir, timeout_s=60)
        everything = len(first) + 5 + 1
        after = group_read(bootstrap, "after-restart", everything)
        assert len(after) == everything
        assert all(after.get(k) == v for k, v in acked_at.items() if k[1] is not None)
        print(
            f"erasure e2e: all 6 brokers restarted and read back in {time.monotonic() - restart:.1f} s"
        )
        # retention: every sealed piece older than 1 s goes; the log start moves past it
        altered = automqctl(
            "topic", "alter", "events", "-c", "retention.ms=1000", cluster_dir=cluster_dir
        )
        assert altered.returncode == 0, altered.stderr
        deadline, trimmed = time.monotonic() + 20, False
        while not trimmed and time.monotonic() < deadline:
            time.sleep(0.5)
            while follower.poll_once():
                pass
            starts = {p: follower.image.streams[sid].start_offset for p, sid in sealed.items()}
            trimmed = all(starts[p] >= end for p, (_, end) in sealed_ends(follower).items())
        assert trimmed, (starts, sealed_ends(follower))
        earliest = KafkaConsumer(bootstrap_servers=bootstrap)
        try:
            tps = [TopicPartition("events", p) for p in range(PARTITIONS)]
            begins = earliest.beginning_offsets(tps)
        finally:
            earliest.close()
        for tp, begin in begins.items():
            assert begin >= starts[tp.partition] << 16, (tp, begin)
        print(
            f"erasure e2e: seal checks, restart and retention took {time.monotonic() - sealing:.1f} s"
        )


class _Unreachable:
    def __getattr__(self, name: str):
        def fail(*_: object) -> None:
            raise ConnectionRefusedError("out of this writer's reach")

        return fail


def write_with_two_stores_unreached_and_await_repair(
    follower: MetadataFollower, secret: str
) -> int:
    """A record written to the REPAIRS topic by an embedded writer that cannot reach 2 of
    its 6 stores (acked by exactly 4); the serving broker's repair pass gives those 2
    stores their shards (once the write is older than the 1 s repair delay; the topic's
    seal delay keeps it in the stores meanwhile). Returns its offset."""
    state = follower.image.topic_by_name(REPAIRS).partitions[0]
    unreached = list(state.shard_stores[-2:])

    def store_for(node: int):
        if node in unreached:
            return _Unreachable()
        return BrokerShardStore(node, lambda: follower.image, None, 2_000, secret)

    with EmbeddedErasureProducer(
        lambda: follower.image, REPAIRS, 0, secret=secret, store_for=store_for
    ) as sdk:
        offset = sdk.send([(b"sdk", b"acked-by-four")])
    repaired: set[int] = set()
    deadline = time.monotonic() + 60
    while len(repaired) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
        for index, node in enumerate(state.shard_stores):
            if node not in unreached or node in repaired:
                continue
            broker = follower.image.brokers[node]
            store = ShardStoreClient(f"{broker.host}:{broker.shard_store_port}", secret=secret)
            hole = classify(store.read(state.stream_id, offset), state.stream_id, offset, index)
            if hole.kind is HoleKind.SHARD:
                repaired.add(node)
    assert repaired == set(unreached), (unreached, repaired)
    return offset


def sealed_ends(follower: MetadataFollower) -> dict[int, tuple[int, int]]:
    """partition -> (stream id, sealed end in stream offsets; 0: nothing sealed)."""
    topic = follower.image.topic_by_name("events")
    out = {}
    for p, state in topic.partitions.items():
        stream = follower.image.streams[state.stream_id]
        out[p] = (state.stream_id, stream.end_offset if stream.ranges else 0)
    return out


def check_sealed(follower: MetadataFollower, secret: str, ledger, cluster_dir) -> dict[int, int]:
    """Wait until every partition has sealed records into object storage (the seal delay
    is the default 10 s, shorter than the test so far), the objects are in the bucket and
    all 6 shard stores dropped them; returns partition -> stream id."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        while follower.poll_once():
            pass
        ends = sealed_ends(follower)
        if all(end > 0 for _, end in ends.values()):
            break
        time.sleep(0.5)
    assert all(end > 0 for _, end in ends.values()), ends
    image = follower.image
    config = LocalCluster(cluster_dir).load()
    uris = ",".join(b.uri_with_credentials() for b in config.buckets)
    acked = [a for a in ledger.snapshot() if a.offset is not None]
    for p, (stream_id, end) in ends.items():
        objects = [o for o in image.stream_objects.values() if o.stream_id == stream_id]
        assert objects and max(o.end_offset for o in objects) == end
        with ObjectStorage(parse_bucket_uris(uris)) as bucket:
            for o in objects:
                meta = image.objects[o.object_id]
                size = bucket.head_object(meta.bucket_id, object_key(o.object_id))
                assert size == meta.size_bytes, (o, size)
        # some acked records are in the sealed range
        assert any(a.partition == p and a.offset >> 16 < end for a in acked), p
        for node in range(1, 7):
            broker = image.brokers[node]
            store = ShardStoreClient(f"{broker.host}:{broker.shard_store_port}", secret=secret)
            # the sealer tells every store; one that was busy is told on its next pass
            drop_deadline = time.monotonic() + 10
            while True:
                answer = store.read_range(stream_id, 0, end << 16, 10, 1 << 20)
                if answer.dropped_below >= end << 16 or time.monotonic() > drop_deadline:
                    break
                time.sleep(0.5)
            assert answer.dropped_below >= end << 16 and answer.holes == [], (p, node)
    return {p: sid for p, (sid, _) in ends.items()}
