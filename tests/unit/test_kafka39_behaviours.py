"""Kafka 3.9 behaviours librdkafka's regression suite checks on the broker, through the
in-process API layer (no server): compacted topics refuse null keys per record (KIP-467),
offsets of unknown topics are refused, illegal topic names, LogAppendTime, manual replica
assignments, broker configs Kafka accepts."""

from __future__ import annotations

import asyncio

from kafka.protocol.producer import ProduceRequest
from kafka.record.memory_records import MemoryRecordsBuilder

from dataplane.formats.kafka_errors import KafkaError
from tests.unit.test_kafka_apis_inprocess import ctx


def keyed_batch(keys: list[bytes | None], timestamp_ms: int = 1_700_000_000_000) -> bytes:
    builder = MemoryRecordsBuilder(magic=2, compression_type=0, batch_size=1 << 20)
    for i, key in enumerate(keys):
        builder.append(timestamp=timestamp_ms + i, key=key, value=b"v%d" % i, headers=[])
    builder.close()
    return bytes(builder.buffer())


def produce(topic: str, records_by_partition: dict[int, bytes], version: int = 9):
    parts = [
        ProduceRequest.TopicProduceData.PartitionProduceData(index=index, records=records)
        for index, records in records_by_partition.items()
    ]
    return ProduceRequest[version](
        transactional_id=None,
        acks=-1,
        timeout_ms=5_000,
        topic_data=[ProduceRequest.TopicProduceData(name=topic, partition_data=parts)],
    )


def test_null_keys_on_a_compacted_topic_fail_exactly_those_records(broker):
    apis, controller, sync = broker
    controller.call(
        "create_topic",
        {"name": "table", "partitions": 2, "configs": {"cleanup.policy": "compact"}},
    )
    sync()
    req = produce("table", {0: keyed_batch([b"a", None, b"c", None]), 1: keyed_batch([b"x"])})
    resp = asyncio.run(apis.data.produce(req, ctx(0, 9)))
    bad, good = resp.responses[0].partition_responses
    assert bad.error_code == KafkaError.INVALID_RECORD and bad.base_offset == -1
    assert [(e.batch_index, e.batch_index_error_message) for e in bad.record_errors] == [
        (1, "Compacted topic cannot accept message without key"),
        (3, "Compacted topic cannot accept message without key"),
    ]
    assert bad.error_message
    # the other partition of the same request is appended
    assert (good.error_code, good.base_offset, good.record_errors) == (KafkaError.NONE, 0, [])
    resp.encode()  # the response serializes (record_errors is a v8+ field)
    image = apis.data.broker.image_fn()
    topic = image.topic_by_name("table")
    assert apis.data.broker.routing.get(topic.topic_id, 0, "az1").high_watermark == 0


def test_null_keys_are_fine_on_a_delete_topic(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "events", "partitions": 1})
    sync()
    resp = asyncio.run(apis.data.produce(produce("events", {0: keyed_batch([None])}), ctx(0, 9)))
    part = resp.responses[0].partition_responses[0]
    assert (part.error_code, part.base_offset) == (KafkaError.NONE, 0)


def _commit_topics(T, P, partitions_by_topic: dict[str, list[int]]):
    return [
        T(
            name=name,
            partitions=[
                P(
                    partition_index=p,
                    committed_offset=5,
                    committed_leader_epoch=-1,
                    committed_metadata="",
                )
                for p in partitions
            ],
        )
        for name, partitions in partitions_by_topic.items()
    ]


def test_offset_commit_for_a_missing_topic_or_partition_is_refused_and_not_stored(broker):
    from kafka.protocol.consumer import OffsetCommitRequest

    from dataplane.kafka.groups.coordinator import GroupCoordinator
    from dataplane.kafka.groups.handlers import GroupHandlers, partition_in_image
    from dataplane.kafka.groups.offsets import InMemoryOffsetStore

    apis, controller, sync = broker
    controller.call("create_topic", {"name": "real", "partitions": 1})
    sync()
    store = InMemoryOffsetStore()
    groups = GroupHandlers(
        GroupCoordinator(),
        store,
        lambda g: True,
        partition_exists=lambda t, p: partition_in_image(apis.image_fn(), t, p),
    )
    T = OffsetCommitRequest.OffsetCommitRequestTopic
    req = OffsetCommitRequest[8](
        group_id="g",
        generation_id_or_member_epoch=-1,
        member_id="",
        group_instance_id=None,
        topics=_commit_topics(
            T, T.OffsetCommitRequestPartition, {"real": [0, 7], "no-such-topic": [0]}
        ),
    )
    resp = asyncio.run(groups.offset_commit(req, ctx(8, 8)))
    errors = {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}
    assert errors == {
        ("real", 0): KafkaError.NONE,
        ("real", 7): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        ("no-such-topic", 0): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert set(store.snapshot()["g"]) == {("real", 0)}


def test_txn_offset_commit_for_a_missing_topic_is_refused_and_not_stored(broker):
    from kafka.protocol.producer import TxnOffsetCommitRequest

    from dataplane.kafka.groups.coordinator import GroupCoordinator
    from dataplane.kafka.offset_store import KVOffsetStore
    from dataplane.kafka.txn.handlers import TxnHandlers

    apis, controller, sync = broker
    controller.call("create_topic", {"name": "real", "partitions": 1})
    sync()
    store = KVOffsetStore(controller, apis.image_fn, 1, apis.node_epoch_fn)
    txn = TxnHandlers(None, apis.image_fn, apis.partitions, GroupCoordinator(), store, lambda g: 1)
    T = TxnOffsetCommitRequest.TxnOffsetCommitRequestTopic
    req = TxnOffsetCommitRequest[3](
        transactional_id="t",
        group_id="g",
        producer_id=7,
        producer_epoch=0,
        generation_id=-1,
        member_id="",
        group_instance_id=None,
        topics=_commit_topics(
            T, T.TxnOffsetCommitRequestPartition, {"real": [0], "no-such-topic": [0]}
        ),
    )
    resp = asyncio.run(txn.txn_offset_commit(req, ctx(28, 3)))
    errors = {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}
    assert errors == {
        ("real", 0): KafkaError.NONE,
        ("no-such-topic", 0): KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert store.pending_partitions("g") == {("real", 0)}


def test_metadata_for_an_illegal_topic_name_is_invalid_topic_at_once(broker):
    import time

    from kafka.protocol.metadata import MetadataRequest

    apis, controller, sync = broker
    illegal = ["bad name", "x" * 250, "..", "tab\\there", ""]
    req = MetadataRequest[9](
        topics=[MetadataRequest.MetadataRequestTopic(name=n) for n in [*illegal, "fine.topic"]],
        allow_auto_topic_creation=True,
    )
    started = time.monotonic()
    resp = asyncio.run(apis.cluster.metadata(req, ctx(3, 9)))
    assert time.monotonic() - started < 1.0
    codes = {t.name: t.error_code for t in resp.topics}
    assert codes == {**{n: KafkaError.INVALID_TOPIC_EXCEPTION for n in illegal}, "fine.topic": 0}
    created = {t["name"] for t in controller.image()["topics"].values()}
    assert created == {"fine.topic"}


def test_log_append_time_topic_stamps_the_batch_and_answers_the_time(broker):
    import time

    from kafka.record.memory_records import MemoryRecords

    from tests.unit.test_kafka_apis_inprocess import fetch_req

    apis, controller, sync = broker
    controller.call(
        "create_topic",
        {
            "name": "stamped",
            "partitions": 1,
            "configs": {"message.timestamp.type": "LogAppendTime"},
        },
    )
    controller.call("create_topic", {"name": "created", "partitions": 1})
    sync()

    async def scenario():
        sent_ms = int(time.time() * 1000)
        stamped = await apis.data.produce(
            produce("stamped", {0: keyed_batch([b"a", b"b"], timestamp_ms=1000)}), ctx(0, 9)
        )
        acked_ms = int(time.time() * 1000)
        created = await apis.data.produce(
            produce("created", {0: keyed_batch([b"a"], timestamp_ms=1000)}), ctx(0, 9)
        )
        fetched = (await apis.data.fetch(fetch_req("stamped", 0), ctx(1, 12))).resolved()
        kept = (await apis.data.fetch(fetch_req("created", 0), ctx(1, 12))).resolved()
        return sent_ms, acked_ms, stamped, created, fetched, kept

    sent_ms, acked_ms, stamped, created, fetched, kept = asyncio.run(scenario())
    part = stamped.responses[0].partition_responses[0]
    assert part.error_code == KafkaError.NONE
    assert sent_ms <= part.log_append_time_ms <= acked_ms
    batch = MemoryRecords(bytes(fetched.responses[0].partitions[0].records)).next_batch()
    assert batch.validate_crc()
    assert [(r.timestamp, r.timestamp_type) for r in batch] == [(part.log_append_time_ms, 1)] * 2
    # a CreateTime topic keeps the producer's timestamp and answers -1
    assert created.responses[0].partition_responses[0].log_append_time_ms == -1
    batch = MemoryRecords(bytes(kept.responses[0].partitions[0].records)).next_batch()
    assert [(r.timestamp, r.timestamp_type) for r in batch] == [(1000, 0)]


def _create_with_assignment(apis, name: str, assignment: dict[int, list[int]], **counts):
    from kafka.protocol.admin import CreateTopicsRequest as C

    topic = C.CreatableTopic(
        name=name,
        num_partitions=counts.get("num_partitions", -1),
        replication_factor=counts.get("replication_factor", -1),
        assignments=[
            C.CreatableTopic.CreatableReplicaAssignment(partition_index=p, broker_ids=brokers)
            for p, brokers in assignment.items()
        ],
        configs=[],
    )
    req = C[5](topics=[topic], timeout_ms=5_000, validate_only=False)
    return asyncio.run(apis.topic_admin.create_topics(req, ctx(19, 5))).topics[0]


def test_create_topics_with_a_replica_assignment_creates_its_partitions(broker):
    apis, controller, sync = broker
    result = _create_with_assignment(apis, "assigned", {p: [1] for p in range(22)})
    assert (result.error_code, result.num_partitions) == (KafkaError.NONE, 22)
    assert len(apis.image_fn().topic_by_name("assigned").partitions) == 22


def test_create_topics_refuses_the_assignments_kafka_refuses(broker):
    apis, controller, sync = broker
    refused = {
        "both": ({0: [1]}, {"num_partitions": 3}, KafkaError.INVALID_REQUEST),
        "gap": ({0: [1], 2: [1]}, {}, KafkaError.INVALID_REPLICA_ASSIGNMENT),
        "empty": ({0: []}, {}, KafkaError.INVALID_REPLICA_ASSIGNMENT),
        "twice": ({0: [1, 1]}, {}, KafkaError.INVALID_REPLICA_ASSIGNMENT),
        "stranger": ({0: [1], 1: [9]}, {}, KafkaError.INVALID_REPLICA_ASSIGNMENT),
    }
    for name, (assignment, counts, error) in refused.items():
        result = _create_with_assignment(apis, name, assignment, **counts)
        assert (result.error_code, result.num_partitions) == (error, -1), name
        assert result.error_message
        assert apis.image_fn().topic_by_name(name) is None


def test_kafka_broker_configs_not_applied_here_are_stored_and_described(broker):
    from tests.unit.test_kafka_configs_inprocess import (
        BROKER,
        DELETE,
        SET,
        alter_result,
        describe_req,
        incremental,
        legacy,
    )

    apis, controller, sync = broker

    def alter(resource: str, entries: list) -> tuple:
        req = incremental(resource, entries, rtype=BROKER)
        return alter_result(
            asyncio.run(apis.topic_admin.incremental_alter_configs(req, ctx(44, 1)))
        )

    def described(resource: str) -> dict:
        req = describe_req(resource, rtype=BROKER)
        resp = asyncio.run(apis.topic_admin.describe_configs(req, ctx(32, 4)))
        return {c.name: c for c in resp.results[0].configs}

    relogin = "sasl.kerberos.min.time.before.relogin"
    assert alter("", [("background.threads", SET, "12")])[0] == KafkaError.NONE
    assert alter("1", [(relogin, SET, "58000"), ("ssl.key.password", SET, "s3")])[0] == 0
    rows = described("1")
    assert (rows["background.threads"].value, rows["background.threads"].config_source) == (
        "12",
        3,  # DYNAMIC_DEFAULT_BROKER_CONFIG
    )
    assert (rows[relogin].value, rows[relogin].config_source) == ("58000", 2)
    assert rows["ssl.key.password"].value is None and rows["ssl.key.password"].is_sensitive
    # Kafka's types still hold: a malformed value is refused and nothing is stored
    offset = controller.machine.image.offset
    code, message = alter("", [("background.threads", SET, "many")])
    assert code == KafkaError.INVALID_CONFIG and "background.threads" in message
    code, _ = alter("", [("background.threads", SET, "0")])
    assert code == KafkaError.INVALID_CONFIG
    # and so do the keys applied here, and unknown keys
    assert alter("", [("log.retention.ms", SET, "banana")])[0] == KafkaError.INVALID_CONFIG
    assert alter("", [("no.such.broker.key", SET, "1")])[0] == KafkaError.INVALID_CONFIG
    assert controller.machine.image.offset == offset
    # AlterConfigs (the legacy whole-set API) accepts them too; delete brings the default
    req = legacy("1", {"num.io.threads": "16"})
    req.resources[0].resource_type = BROKER
    resp = asyncio.run(apis.topic_admin.alter_configs(req, ctx(33, 1)))
    assert alter_result(resp)[0] == KafkaError.NONE
    assert described("1")["num.io.threads"].value == "16"
    assert alter("", [("background.threads", DELETE, None)])[0] == KafkaError.NONE
    assert "background.threads" not in described("1")


def test_a_static_member_restarting_within_its_session_gets_its_assignment_back() -> None:
    from dataplane.kafka.groups.state import GroupState
    from tests.unit.test_group_coordinator import make_coordinator, params

    async def scenario() -> None:
        coord = make_coordinator()
        joins = [
            asyncio.ensure_future(coord.join_group(params(group_instance_id=i, client_id=i)))
            for i in ("pod-a", "pod-b")
        ]
        a, b = await asyncio.gather(*joins)
        leader, follower = (a, b) if a.members else (b, a)
        assignments = {leader.member_id: b"for-leader", follower.member_id: b"for-follower"}
        synced = await asyncio.gather(
            coord.sync_group("g", 1, follower.member_id, follower_instance(follower, a)),
            coord.sync_group(
                "g", 1, leader.member_id, follower_instance(leader, a), assignments=assignments
            ),
        )
        assert [s.assignment for s in synced] == [b"for-follower", b"for-leader"]
        instance = follower_instance(follower, a)
        # the follower restarts: a new JoinGroup with its instance id and no member id
        again = await coord.join_group(params(group_instance_id=instance, client_id=instance))
        assert again.error_code == KafkaError.NONE and again.generation_id == 1
        assert again.member_id != follower.member_id and not again.skip_assignment
        assert coord.group_state("g") is GroupState.STABLE
        # no revocation elsewhere: the leader's heartbeat sees no rebalance
        assert await coord.heartbeat("g", 1, leader.member_id, None) == KafkaError.NONE
        got = await coord.sync_group("g", 1, again.member_id, instance)
        assert (got.error_code, got.assignment) == (KafkaError.NONE, b"for-follower")
        # the old incarnation is fenced
        stale = await coord.heartbeat("g", 1, follower.member_id, instance)
        assert stale == KafkaError.FENCED_INSTANCE_ID
        # a restart with other protocols rebalances the group
        changed = asyncio.ensure_future(
            coord.join_group(
                params(group_instance_id=instance, protocols=(("range", b"\x00\x01"),))
            )
        )
        await asyncio.sleep(0)
        assert coord.group_state("g") is GroupState.PREPARING_REBALANCE
        changed.cancel()
        coord.close()

    def follower_instance(result, a) -> str:
        return "pod-a" if result.member_id == a.member_id else "pod-b"

    asyncio.run(scenario())


def test_null_keys_checks_decode_the_batch_or_leave_an_unreadable_codec_alone():
    from kafka import codec

    from dataplane.formats.kafka_errors import InvalidRecordBatchError
    from dataplane.formats.record_batch import build_batch, null_key_records, parse_batches

    (plain,) = parse_batches(keyed_batch([None, b"k", None]))
    assert null_key_records(plain) == [0, 2]
    # a gzip batch is decompressed to be checked
    builder = MemoryRecordsBuilder(magic=2, compression_type=1, batch_size=1 << 20)
    builder.append(timestamp=1, key=None, value=b"v", headers=[])
    builder.close()
    (gzipped,) = parse_batches(bytes(builder.buffer()))
    assert null_key_records(gzipped) == [0]
    # records that do not decode: CORRUPT_MESSAGE; snappy without its library: unchecked
    for attributes in (1, 2):
        (bad,) = parse_batches(build_batch(b"\x00garbage", 1, attributes=attributes))
        if attributes == 2 and not codec.has_snappy():
            assert null_key_records(bad) == []
        else:
            try:
                null_key_records(bad)
                raise AssertionError("undecodable records were not refused")
            except InvalidRecordBatchError as exc:
                assert exc.error_code == KafkaError.CORRUPT_MESSAGE
