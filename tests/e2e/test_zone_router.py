"""The zone router on a real cluster (3 brokers in 3 AZs, real confluent-kafka clients that
declare their AZ in `client.id`): each client is told and served only by brokers of its AZ,
produce through a proxy goes through the RouterChannel to the main, every acknowledged
record is consumed exactly once by a consumer in every AZ, the brokers' counters show no
cross-AZ client bytes, and a zone-route request with a fenced route epoch is refused with a
clear error and appends nothing."""

from __future__ import annotations

import json
import re
import socket
import time
import uuid
from collections import Counter

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests.support.ledger import automqctl, create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

AZS = ("az1", "az2", "az3")
TOPIC = "zone-routed"
PARTITIONS = 6
RECORDS_PER_AZ = 300


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("zone") / "cluster"
    # proxies read what mains committed: upload often so consumers see data quickly, but
    # not so often that a killed main's WAL is empty (the kill test needs Link Records)
    # a killed broker must stay down (failover, `broker start`): no supervisor
    with running_cluster(d, "--upload-interval-s", "2", "--no-supervise") as status:
        brokers = {b["node_id"]: b for b in status["brokers"]}
        yield {
            "dir": d,
            "bootstrap": status["bootstrap_servers"],
            "brokers": brokers,
            "by_az": {az: sorted(n for n, b in brokers.items() if b["az"] == az) for az in AZS},
        }


def _client(az: str) -> dict:
    return {"client.id": f"automq_type=e2e&automq_az={az}"}


def _bootstrap(cluster, az: str) -> str:
    return ",".join(cluster["brokers"][n]["address"] for n in cluster["by_az"][az])


def _zone_traffic(cluster) -> dict[int, dict]:
    out = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster["dir"])
    assert out.returncode == 0, out.stderr
    return {b["node_id"]: b["zone_traffic"] or {} for b in json.loads(out.stdout)["brokers"]}


def _route_epochs(cluster) -> dict:
    out = automqctl("cluster", "status", "--format", "json", cluster_dir=cluster["dir"])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["route_epoch"] or {"current_epoch": -1}


def _brokers_used(stats: dict, key: str) -> set[int]:
    """Node ids of the brokers librdkafka used: connected (UP) or serving partitions."""
    used = set()
    for b in stats.get("brokers", {}).values():
        if b.get("nodeid", -1) < 0:
            continue
        if (key == "up" and b.get("state") == "UP") or (key == "toppars" and b.get("toppars")):
            used.add(b["nodeid"])
    return used


def test_a_proxy_consumer_sees_records_long_before_the_mains_upload(tmp_path):
    """Snapshot reads: with mains uploading only every 60 s, a consumer in az2 (served by
    its proxy for the partitions led elsewhere) receives every record produced from az1
    and az3 within seconds of its ack, exactly once, at its offset: the proxy polls the
    mains for their Link Records and reads the data from the RouterChannels (a main's own
    channel for its AZ's producer). (First in the module: its own cluster is down before
    the shared one starts.)"""
    import threading

    from tests.support.ledger import leaders

    topic = "zone-snapshot"
    partitions = 3
    with running_cluster(tmp_path / "cluster", "--upload-interval-s", "60") as status:
        brokers = {b["node_id"]: b for b in status["brokers"]}
        boot = {az: ",".join(b["address"] for b in brokers.values() if b["az"] == az) for az in AZS}
        create_topic(status["bootstrap_servers"], topic, partitions)
        led_by = {
            p: brokers[n]["az"] for p, n in leaders(status["bootstrap_servers"], topic).items()
        }
        proxied = {p for p, az in led_by.items() if az != "az2"}
        assert proxied, led_by
        received: dict[bytes, list[tuple[int, int, float]]] = {}
        stop = threading.Event()
        ready = threading.Event()

        def fetching(stats: str) -> None:
            parts = json.loads(stats).get("topics", {}).get(topic, {}).get("partitions", {})
            active = {int(p) for p, v in parts.items() if v.get("fetch_state") == "active"}
            if active >= set(range(partitions)):
                ready.set()

        def consume() -> None:
            consumer = Consumer(
                {
                    "bootstrap.servers": boot["az2"],
                    **_client("az2"),
                    "group.id": f"zone-snap-{uuid.uuid4().hex[:6]}",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 100,
                    "statistics.interval.ms": 100,
                    "stats_cb": fetching,
                }
            )
            try:
                consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
                while not stop.is_set():
                    msg = consumer.poll(0.1)
                    if msg is None or msg.error() is not None:
                        continue
                    seen = (msg.partition(), msg.offset(), time.monotonic())
                    received.setdefault(msg.value(), []).append(seen)
            finally:
                consumer.close()

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        try:
            assert ready.wait(20)
            # the proxy polls the mains from its first fetch on: a main routes its own
            # AZ's produce through its RouterChannel only for partitions a proxy reads
            time.sleep(1)
            acked: dict[bytes, tuple[int, int, float]] = {}
            errors: list[str] = []
            for az in ("az1", "az3"):
                producer = Producer(
                    {
                        "bootstrap.servers": boot[az],
                        **_client(az),
                        "enable.idempotence": True,
                        "linger.ms": 5,
                    }
                )

                def on_delivery(err, msg):
                    if err is not None:
                        errors.append(str(err))
                    else:
                        acked[msg.value()] = (msg.partition(), msg.offset(), time.monotonic())

                for i in range(60):
                    value = f"{az}-{i}".encode()
                    producer.produce(
                        topic, value=value, partition=i % partitions, on_delivery=on_delivery
                    )
                    producer.poll(0.01)
                assert producer.flush(30) == 0
                del producer  # librdkafka's threads stop now, not after the cluster
            # two transactions from az1: the second's records lie past the first's markers,
            # which the mains hold without a link; the snapshots carry the markers inline,
            # so az2's read_committed consumer gets them long before the upload too
            txn = Producer(
                {
                    "bootstrap.servers": boot["az1"],
                    **_client("az1"),
                    "transactional.id": f"zone-snap-{uuid.uuid4().hex[:6]}",
                    "linger.ms": 5,
                }
            )
            txn.init_transactions(30)
            for n in range(2):
                txn_acked: dict[bytes, tuple[int, int]] = {}
                txn.begin_transaction()
                for i in range(30):
                    txn.produce(
                        topic,
                        value=f"txn{n}-{i}".encode(),
                        partition=i % partitions,
                        on_delivery=lambda err, msg, out=txn_acked: (
                            errors.append(str(err))
                            if err is not None
                            else out.__setitem__(msg.value(), (msg.partition(), msg.offset()))
                        ),
                    )
                txn.commit_transaction(30)
                committed_at = time.monotonic()  # readable (read_committed) from now on
                acked.update({v: (p, o, committed_at) for v, (p, o) in txn_acked.items()})
            del txn
            assert not errors, errors[:5]
            produced_in = _route_epochs({"dir": tmp_path / "cluster"})["current_epoch"]
            deadline = time.monotonic() + 15  # the mains upload after 60 s
            while time.monotonic() < deadline and not set(acked) <= set(received):
                time.sleep(0.1)
            time.sleep(0.5)  # a duplicate would arrive now
            # the forced ConfirmWAL commit: once the epoch of these links is fenced (route
            # epochs last 10 s), the mains upload them, long before their 60 s interval
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                epochs = _route_epochs({"dir": tmp_path / "cluster"})
                if epochs.get("committed_epoch", -1) >= produced_in:
                    break
                time.sleep(1)
            assert epochs.get("committed_epoch", -1) >= produced_in, (produced_in, epochs)
        finally:
            stop.set()
            thread.join(10)
    missing = set(acked) - set(received)
    assert not missing, f"{len(missing)} of {len(acked)} acked records not consumed in time"
    assert all(len(v) == 1 for v in received.values()), "duplicates"
    assert set(received) == set(acked)
    lag = {}
    for value, (partition, offset, acked_at) in acked.items():
        ((got_partition, got_offset, got_at),) = received[value]
        assert (got_partition, got_offset) == (partition, offset)
        lag[value] = got_at - acked_at
    proxied_lag = [lag[v] for v, (p, _, _) in acked.items() if p in proxied]
    assert proxied_lag and max(proxied_lag) < 5.0, max(proxied_lag)
    print(f"proxy-served records: {len(proxied_lag)}, ack -> receive max {max(proxied_lag):.2f} s")


def test_in_az_clients_mode_a_produce_without_an_az_skips_the_channel(tmp_path):
    """`cluster up --zone-router-channel-mode az_clients` (issue #32): a producer without an
    AZ is acknowledged by the main without a RouterChannel PUT (no new object under the
    main's channel prefix), while one of the main's AZ still goes through the channel. (Its
    own cluster, before the shared one starts.)"""
    from tests.support.ledger import leaders

    topic = "zone-az-clients"
    mode = ("--zone-router-channel-mode", "az_clients")
    with running_cluster(tmp_path / "cluster", "--upload-interval-s", "60", *mode) as status:
        brokers = {b["node_id"]: b for b in status["brokers"]}
        create_topic(status["bootstrap_servers"], topic, 1)
        main = leaders(status["bootstrap_servers"], topic)[0]
        prefix = f"router-channel/node-{main}/"
        where = {"dir": tmp_path / "cluster"}

        def channel_keys() -> set[str]:
            return {k for k in _channel_data_keys(where) if k.startswith(prefix)}

        def produce(client: dict, count: int) -> int:
            p = Producer({"bootstrap.servers": status["bootstrap_servers"], **client})
            acked = []
            for i in range(count):
                p.produce(topic, b"v%d" % i, partition=0, on_delivery=lambda e, m: acked.append(e))
            assert p.flush(30) == 0
            return sum(1 for e in acked if e is None)

        before = channel_keys()
        assert produce({"client.id": "no-az-producer"}, 20) == 20
        assert channel_keys() - before == set()  # acked with no channel PUT
        # the channel is in use for a client of the main's AZ (the check above is not idle)
        assert produce(_client(brokers[main]["az"]), 20) == 20
        assert channel_keys() - before


def test_clients_stay_in_their_az_and_every_acked_record_is_consumed_once(cluster):
    create_topic(cluster["bootstrap"], TOPIC, PARTITIONS)
    all_ids = sorted(cluster["brokers"])
    # a client without an AZ sees the real leaders, spread over the brokers
    md = AdminClient({"bootstrap.servers": cluster["bootstrap"]}).list_topics(TOPIC, timeout=10)
    real = {p.id: p.leader for p in md.topics[TOPIC].partitions.values()}
    assert len(set(real.values())) > 1 and sorted(md.brokers) == all_ids
    # a client of an AZ is told every leader (and the broker list) is in its AZ
    for az in AZS:
        admin = AdminClient({"bootstrap.servers": _bootstrap(cluster, az), **_client(az)})
        md = admin.list_topics(TOPIC, timeout=10)
        mine = set(cluster["by_az"][az])
        assert {p.leader for p in md.topics[TOPIC].partitions.values()} <= mine
        assert all(set(p.replicas) <= mine for p in md.topics[TOPIC].partitions.values())
        assert set(md.brokers) <= mine

    acked: dict[bytes, tuple[int, int]] = {}
    errors: list[str] = []
    used: dict[str, set[int]] = {}
    for az in AZS:
        stats: list[dict] = []
        producer = Producer(
            {
                "bootstrap.servers": _bootstrap(cluster, az),
                **_client(az),
                "enable.idempotence": True,
                "linger.ms": 5,
                "statistics.interval.ms": 200,
                "stats_cb": lambda s, out=stats: out.append(json.loads(s)),
            }
        )

        def on_delivery(err, msg):
            if err is not None:
                errors.append(str(err))
            else:
                acked[msg.value()] = (msg.partition(), msg.offset())

        for i in range(RECORDS_PER_AZ):
            producer.produce(
                TOPIC, value=f"{az}-{i}".encode(), partition=i % PARTITIONS, on_delivery=on_delivery
            )
            if i % 50 == 0:
                producer.poll(0)
        assert producer.flush(60) == 0
        time.sleep(0.3)
        producer.poll(0.3)  # one more statistics callback
        used[az] = set().union(*(_brokers_used(s, "up") for s in stats))
        assert used[az] and used[az] <= set(cluster["by_az"][az]), (az, used[az])
    assert not errors, errors[:5]
    assert len(acked) == RECORDS_PER_AZ * len(AZS)

    # a consumer in every AZ reads every acknowledged record exactly once, at its offset
    for az in AZS:
        stats = []
        consumer = Consumer(
            {
                "bootstrap.servers": _bootstrap(cluster, az),
                **_client(az),
                "group.id": f"zone-{az}-{uuid.uuid4().hex[:6]}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                "statistics.interval.ms": 200,
                "stats_cb": lambda s, out=stats: out.append(json.loads(s)),
            }
        )
        seen: Counter = Counter()
        at: dict[bytes, tuple[int, int]] = {}
        try:
            consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(at) < len(acked):
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue
                seen[msg.value()] += 1
                at[msg.value()] = (msg.partition(), msg.offset())
            consumer.poll(0.3)
        finally:
            consumer.close()
        assert at == acked, f"{az}: {len(set(acked) - set(at))} acked records not consumed"
        assert max(seen.values()) == 1, f"{az}: duplicates"
        fetched_from = set().union(*(_brokers_used(s, "toppars") for s in stats))
        assert fetched_from and fetched_from <= set(cluster["by_az"][az]), (az, fetched_from)

    # consumer groups of kafka-python (az1) and aiokafka (az3), each in a group whose
    # coordinator is in another AZ: reached through the coordinator's proxy in their AZ
    for az, consume in (("az1", _kafka_python_group), ("az3", _aiokafka_group)):
        group = _group_coordinated_outside(cluster, az)
        at, seen, nodes = consume(cluster, az, group, len(acked))
        assert at == acked, f"{consume.__name__}: {len(set(acked) - set(at))} not consumed"
        assert max(seen.values()) == 1, f"{consume.__name__}: duplicates"
        assert nodes and nodes <= set(cluster["by_az"][az]), (consume.__name__, az, nodes)

    # the brokers' own counters (reported with heartbeats): no client byte crossed an AZ;
    # proxies wrote to their RouterChannels and read committed data from object storage
    deadline = time.monotonic() + 10
    while True:
        traffic = _zone_traffic(cluster)
        sums = Counter()
        for counters in traffic.values():
            sums.update(counters)
        if sums["consumed_bytes"] > 0 and sums["produced_bytes"] > 0:
            break
        assert time.monotonic() < deadline, traffic
        time.sleep(0.5)
    total = sums.__getitem__
    assert total("produced_cross_az_bytes") == 0 and total("consumed_cross_az_bytes") == 0
    assert total("produced_same_az_bytes") == total("produced_bytes")
    assert total("proxy_read_bytes") > 0 and total("wal_data_bytes") > total("produced_bytes")
    out = automqctl("cost", "--format", "json", cluster_dir=cluster["dir"])
    assert out.returncode == 0, out.stderr
    cost = json.loads(out.stdout)
    assert cost["produced_bytes"] >= total("produced_bytes") > 0
    assert cost["cross_az_bytes"] == 0
    # what does cross AZs is the brokers' own small requests (zone routes, snapshot polls,
    # forwarded coordinator requests): counted and priced, no record data in them
    assert cost["broker_cross_az_bytes"] >= total("broker_cross_az_bytes") > 0
    # priced (rounded to 6 decimals: the test's few KB cost less than $0.000001)
    price = cost["broker_cross_az_bytes"] / 1e9 * cost["price_per_gb_usd"]
    assert cost["cross_az_cost_usd"] == round(price, 6)
    assert cost["kafka_cross_az_cost_usd"] > 0 and cost["object_store_put_bytes"] > 0
    # no double write: routed data is in a RouterChannel once, the main's WAL keeps only
    # Link Records (writing it again would be >= 1.67 with 2/3 of the data routed)
    assert cost["produced_bytes"] < cost["wal_data_bytes"] < 1.5 * cost["produced_bytes"]
    print("zone router cost:", json.dumps(cost))


def _group_coordinated_outside(cluster, az: str) -> str:
    """A new group id whose coordinator (as a client without an AZ is told) is not in `az`."""
    admin = AdminClient({"bootstrap.servers": cluster["bootstrap"]})
    for _ in range(64):
        group = f"zone-{az}-{uuid.uuid4().hex[:6]}"
        described = admin.describe_consumer_groups([group])[group].result(10)
        if described.coordinator.id not in cluster["by_az"][az]:
            return group
    raise AssertionError(f"every group tried is coordinated in {az}")


def _node_ids(keys) -> set[int]:
    """Broker ids of a client's connections (kafka-python: id or 'coordinator-<id>';
    aiokafka: (id, group)); bootstrap connections (to the AZ's brokers) left out."""
    out = set()
    for key in keys:
        key = key[0] if isinstance(key, tuple) else key
        if isinstance(key, int):
            out.add(key)
        elif isinstance(key, str) and key.startswith("coordinator-"):
            out.add(int(key.removeprefix("coordinator-")))
    return out


def _kafka_python_group(cluster, az: str, group: str, count: int):
    """A kafka-python consumer group member of `az` reads `count` records of TOPIC and
    commits: (value -> (partition, offset), value counts, brokers it connected to)."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(
        TOPIC,
        bootstrap_servers=_bootstrap(cluster, az),
        client_id=f"automq_az={az}",
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    at: dict[bytes, tuple[int, int]] = {}
    seen: Counter = Counter()
    nodes: set[int] = set()
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and len(at) < count:
            for records in consumer.poll(timeout_ms=200).values():
                for r in records:
                    seen[r.value] += 1
                    at[r.value] = (r.partition, r.offset)
            nodes |= _node_ids(consumer._manager._conns)
        consumer.commit()  # OffsetCommit through the coordinator's proxy
        nodes |= _node_ids(consumer._manager._conns)
    finally:
        consumer.close()
    return at, seen, nodes


def _aiokafka_group(cluster, az: str, group: str, count: int):
    """`_kafka_python_group` with aiokafka."""
    import asyncio

    from aiokafka import AIOKafkaConsumer

    async def run():
        consumer = AIOKafkaConsumer(
            TOPIC,
            bootstrap_servers=_bootstrap(cluster, az),
            client_id=f"automq_az={az}",
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        at: dict[bytes, tuple[int, int]] = {}
        seen: Counter = Counter()
        nodes: set[int] = set()
        await consumer.start()
        try:
            deadline = time.monotonic() + 45
            while time.monotonic() < deadline and len(at) < count:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    for r in records:
                        seen[r.value] += 1
                        at[r.value] = (r.partition, r.offset)
                nodes |= _node_ids(consumer._client._conns)
            await consumer.commit()
            nodes |= _node_ids(consumer._client._conns)
        finally:
            await consumer.stop()
        return at, seen, nodes

    return asyncio.run(run())


def _zone_route(address: str, **fields):
    from dataplane.kafka.interbroker import roundtrip
    from dataplane.zonerouter.protocol import ZONE_ROUTE_KEY, ZoneRouteRequest

    host, port = address.rsplit(":", 1)
    req = ZoneRouteRequest[0](**fields)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        return roundtrip(sock, req, ZONE_ROUTE_KEY, 0)


def test_zone_route_with_a_fenced_epoch_or_a_bad_channel_is_refused(cluster):
    topic = "zone-bad-input"
    create_topic(cluster["bootstrap"], topic, 1)
    admin = AdminClient({"bootstrap.servers": cluster["bootstrap"]})
    main = admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader
    tid = admin.describe_topics(TopicCollection([topic]))[topic].result(10).topic_id
    mask = 2**64 - 1
    topic_id = uuid.UUID(
        int=((tid.get_most_significant_bits() & mask) << 64)
        | (tid.get_least_significant_bits() & mask)
    )
    proxy = next(n for n in cluster["brokers"] if n != main)
    base = {
        "source_node_id": proxy,
        "channel_bucket_id": 0,
        "channel_prefix": f"router-channel/node-{proxy}",
        "channel_offset": 0,
        "topic_id": topic_id,
        "partition": 0,
        "timeout_ms": 5000,
    }
    address = cluster["brokers"][main]["address"]
    # the controller bumps the route epoch (at once, then every 10 s): the previous is fenced
    deadline = time.monotonic() + 15
    while (epochs := _route_epochs(cluster))["current_epoch"] < 1:
        assert time.monotonic() < deadline, epochs
        time.sleep(0.2)
    fenced, current = epochs["fenced_epoch"], epochs["current_epoch"]
    assert fenced == current - 1 >= 0
    resp = _zone_route(address, route_epoch=fenced, **base)
    assert resp.error_code != 0 and f"route epoch {fenced} is fenced" in resp.error_message
    # (the next epoch: valid even if the controller bumps meanwhile)
    current += 1
    # a channel that is not the source node's own is never read
    resp = _zone_route(address, route_epoch=current, **{**base, "channel_prefix": "wal/node-1"})
    assert resp.error_code != 0 and "no RouterChannel" in resp.error_message
    # an offset where no record starts
    resp = _zone_route(address, route_epoch=current, **{**base, "channel_offset": 10**12})
    assert resp.error_code != 0 and "bad channel offset" in resp.error_message
    # nothing was appended
    consumer = Consumer({"bootstrap.servers": cluster["bootstrap"], "group.id": "zone-bad"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    assert (low, high) == (0, 0)


def _channel_data_keys(cluster) -> set[str]:
    """The RouterChannels' data objects in the bucket (every broker's channel prefix)."""
    from cli.local_cluster import LocalCluster
    from dataplane.objectstore import ObjectStorage, parse_bucket_uris
    from dataplane.s3stream.wal.object_format import parse_data_key

    config = LocalCluster(cluster["dir"]).load()
    uris = ",".join(b.uri_with_credentials() for b in config.buckets)
    with ObjectStorage(parse_bucket_uris(uris)) as bucket:
        keys = bucket.list_keys(0, "router-channel/")
    # router-channel/node-<id>/data/<writer>/<start>-<end>
    return {k for k in keys if parse_data_key("/".join(k.split("/")[:2]), k) is not None}


def test_transactions_timestamps_and_delete_records_through_a_proxy(cluster):
    """A transactional producer in az1 (through its proxy, to mains in every AZ) commits a
    transaction, aborts one, commits another and leaves one open; a read_committed consumer
    in az2 (served by its proxy for the partitions led elsewhere: the proxy's snapshots
    carry the mains' last stable offsets and aborted transactions) gets exactly the
    committed records, once, and only from az2's brokers. Through az2's proxy, ListOffsets
    by timestamp answers what the main answers and DeleteRecords moves the main's log
    start. The RouterChannels' objects written meanwhile are deleted once committed."""
    from tests.support.ledger import leaders

    topic = f"zone-txn-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    led = leaders(cluster["bootstrap"], topic)
    proxied = sorted(p for p, n in led.items() if n not in cluster["by_az"]["az2"])
    assert proxied, led
    producer = Producer(
        {
            "bootstrap.servers": _bootstrap(cluster, "az1"),
            **_client("az1"),
            "transactional.id": f"zone-txn-{uuid.uuid4().hex[:6]}",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(30)
    committed: set[bytes] = set()
    channel_keys: set[str] = set()
    for name, commit in (("first", True), ("aborted", False), ("second", True), ("open", None)):
        producer.begin_transaction()
        for i in range(10 * PARTITIONS):
            producer.produce(topic, value=f"{name}-{i}".encode(), partition=i % PARTITIONS)
        assert producer.flush(30) == 0  # acked: in the mains' logs, decided or not
        # the channel objects just written (kept until the mains' uploads, every 2 s)
        channel_keys |= _channel_data_keys(cluster)
        if commit is True:
            producer.commit_transaction(30)
            committed |= {f"{name}-{i}".encode() for i in range(10 * PARTITIONS)}
        elif commit is False:
            producer.abort_transaction(30)
    assert channel_keys  # az1's produce went through its RouterChannel
    stats: list[dict] = []
    consumer = Consumer(
        {
            "bootstrap.servers": _bootstrap(cluster, "az2"),
            **_client("az2"),
            "group.id": f"zone-txn-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "statistics.interval.ms": 200,
            "stats_cb": lambda s: stats.append(json.loads(s)),
        }
    )
    seen: Counter = Counter()
    first_at: dict[int, tuple[int, int]] = {}  # partition -> (offset, timestamp) of its first
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and set(seen) < committed:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            seen[msg.value()] += 1
            first_at.setdefault(msg.partition(), (msg.offset(), msg.timestamp()[1]))
        end = time.monotonic() + 1.5  # an open or aborted record would come now
        while time.monotonic() < end:
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                seen[msg.value()] += 1
    finally:
        consumer.close()
    leaked = sorted(v for v in seen if v not in committed)
    assert not leaked, f"read_committed got {len(leaked)} open/aborted records: {leaked[:5]}"
    assert set(seen) == committed, f"{len(committed - set(seen))} committed records missing"
    assert max(seen.values()) == 1, "duplicates"
    fetched_from = set().union(*(_brokers_used(s, "toppars") for s in stats))
    assert fetched_from and fetched_from <= set(cluster["by_az"]["az2"]), fetched_from
    producer.abort_transaction(30)
    del producer

    # ListOffsets by timestamp through az2's proxy: the main's answer
    p = proxied[0]
    offset, timestamp = first_at[p]
    direct = Consumer({"bootstrap.servers": cluster["bootstrap"], "group.id": "zone-direct"})
    via_proxy = Consumer(
        {"bootstrap.servers": _bootstrap(cluster, "az2"), **_client("az2"), "group.id": "zone-az2"}
    )
    try:
        # (one lookup per request: librdkafka answers a partition asked twice with errors)
        def lookup(consumer, ts: int) -> int:
            (found,) = consumer.offsets_for_times([TopicPartition(topic, p, ts)], timeout=10)
            assert found.error is None, found.error
            return found.offset

        for ts, expected in ((timestamp, offset), (2**50, -1)):
            from_main, from_proxy = lookup(direct, ts), lookup(via_proxy, ts)
            assert from_proxy == from_main == expected, (ts, from_proxy, from_main)
        # DeleteRecords through az2's proxy: forwarded to the main
        admin = AdminClient({"bootstrap.servers": _bootstrap(cluster, "az2"), **_client("az2")})
        (deleted,) = admin.delete_records([TopicPartition(topic, p, offset + 3)]).values()
        assert deleted.result(30).low_watermark == offset + 3
        low, _ = direct.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
        assert low == offset + 3
    finally:
        direct.close()
        via_proxy.close()

    # RouterChannel objects are deleted once their data is committed by the mains (the
    # route epoch they were written in is then committed too)
    deadline = time.monotonic() + 40
    while (left := channel_keys & _channel_data_keys(cluster)) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"{len(left)} of {len(channel_keys)} channel objects not deleted: {left}"


def test_kill_9_of_a_main_loses_no_record_acked_through_a_proxy(cluster):
    """A producer in az1 writes through its proxy (its AZ's broker) to mains in az2/az3; the
    main of some partitions is killed -9: its WAL held only Link Records to the proxy's
    RouterChannel; the failover reads the data back from the channel and every acked record
    is consumed exactly once. (Last in the module: it leaves the killed broker restarted.)"""
    from tests.e2e.test_elastic import assert_ledger_exact
    from tests.support.ledger import AckLedger, leaders

    topic = f"zone-kill-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    az1 = cluster["by_az"]["az1"]
    ledger = AckLedger(
        _bootstrap(cluster, "az1"), topic, PARTITIONS, rate_per_partition=40, **_client("az1")
    ).start()
    try:
        time.sleep(3)
        led = leaders(cluster["bootstrap"], topic)
        victim = max(
            (n for n in cluster["brokers"] if n not in az1),
            key=lambda n: sum(1 for v in led.values() if v == n),
        )
        moved = {p for p, leader in led.items() if leader == victim}
        assert moved
        killed = automqctl("broker", "kill", str(victim), cluster_dir=cluster["dir"])
        assert killed.returncode == 0, killed.stderr
        event = time.monotonic()
        ledger.wait_writable(moved, event, timeout_s=60)
        pattern = re.compile(rf"WAL failover of node {victim} done in \S+: (\d+) records read")
        deadline = time.monotonic() + 30
        while True:
            logs = "".join(p.read_text() for p in (cluster["dir"] / "logs").glob("broker-*.log"))
            found = pattern.search(logs)
            if found:
                break
            assert time.monotonic() < deadline, "no broker finished the WAL failover"
            time.sleep(0.3)
        time.sleep(1)
    finally:
        ledger.stop()
        automqctl("broker", "start", str(victim), cluster_dir=cluster["dir"])
    assert_ledger_exact(ledger)
    # all the victim's data came through the proxy: what its WAL held not yet uploaded was
    # Link Records, resolved from the proxy's RouterChannel by the failover
    print(f"kill -9 of main {victim}: {found.group(0)}")
    assert int(found.group(1)) > 0, found.group(0)


def test_kill_9_of_a_proxy_loses_no_acked_record(cluster):
    """The proxy of az1's producer (az1's only broker) is killed -9 mid-run and restarted:
    its in-flight requests' answers are lost (the producer retries, idempotently, through
    the restarted proxy, which claims its RouterChannel with a new node epoch); every acked
    record is consumed exactly once."""
    from tests.e2e.test_elastic import assert_ledger_exact, wait_all_active
    from tests.support.ledger import AckLedger

    wait_all_active(cluster)
    topic = f"zone-proxy-kill-{uuid.uuid4().hex[:6]}"
    create_topic(cluster["bootstrap"], topic, PARTITIONS)
    (proxy,) = cluster["by_az"]["az1"]
    ledger = AckLedger(
        _bootstrap(cluster, "az1"), topic, PARTITIONS, rate_per_partition=40, **_client("az1")
    ).start()
    try:
        time.sleep(3)
        killed = automqctl("broker", "kill", str(proxy), cluster_dir=cluster["dir"])
        assert killed.returncode == 0, killed.stderr
        event = time.monotonic()
        time.sleep(1)
        started = automqctl("broker", "start", str(proxy), cluster_dir=cluster["dir"])
        assert started.returncode == 0, started.stderr
        ledger.wait_writable(set(range(PARTITIONS)), event, timeout_s=60)
        time.sleep(1)
    finally:
        ledger.stop()
    assert_ledger_exact(ledger)


def test_the_committed_route_epoch_follows_the_brokers(cluster):
    """Every broker reports the route epoch up to which its routed data is committed; the
    controller's minimum (the committed epoch) advances behind the fenced one."""
    deadline = time.monotonic() + 40
    first = _route_epochs(cluster)
    while True:
        epochs = _route_epochs(cluster)
        if epochs["committed_epoch"] > max(first["committed_epoch"], 0):
            break
        assert time.monotonic() < deadline, (first, epochs)
        time.sleep(0.5)
    assert epochs["committed_epoch"] <= epochs["fenced_epoch"] < epochs["current_epoch"]
