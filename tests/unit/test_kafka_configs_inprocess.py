"""AlterConfigs, IncrementalAlterConfigs, DescribeConfigs and CreateTopics' config checks
through the Kafka API layer with no server (in-process controller, real engine, moto S3),
and a topic's max.message.bytes enforced on produce as soon as it is altered."""

from __future__ import annotations

import asyncio

from kafka.protocol.admin import (
    AlterConfigsRequest,
    CreateTopicsRequest,
    DescribeConfigsRequest,
    IncrementalAlterConfigsRequest,
)

from dataplane.formats.kafka_errors import KafkaError
from tests.unit.test_kafka_apis_inprocess import batch, ctx, produce_req

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def incremental(name: str, entries: list, validate_only: bool = False, rtype: int = TOPIC):
    R = IncrementalAlterConfigsRequest
    return R[1](
        resources=[
            R.AlterConfigsResource(
                resource_type=rtype,
                resource_name=name,
                configs=[
                    R.AlterConfigsResource.AlterableConfig(name=k, config_operation=op, value=v)
                    for k, op, v in entries
                ],
            )
        ],
        validate_only=validate_only,
    )


def legacy(name: str, configs: dict, validate_only: bool = False):
    R = AlterConfigsRequest
    return R[1](
        resources=[
            R.AlterConfigsResource(
                resource_type=TOPIC,
                resource_name=name,
                configs=[
                    R.AlterConfigsResource.AlterableConfig(name=k, value=v)
                    for k, v in configs.items()
                ],
            )
        ],
        validate_only=validate_only,
    )


def describe_req(name: str, keys: list[str] | None = None, rtype: int = TOPIC):
    R = DescribeConfigsRequest
    return R[4](
        resources=[
            R.DescribeConfigsResource(
                resource_type=rtype, resource_name=name, configuration_keys=keys
            )
        ],
        include_synonyms=True,
        include_documentation=True,
    )


def create_req(name: str, configs: dict, validate_only: bool = False):
    R = CreateTopicsRequest
    T = R.CreatableTopic
    return R[7](
        topics=[
            T(
                name=name,
                num_partitions=1,
                replication_factor=1,
                assignments=[],
                configs=[T.CreatableTopicConfig(name=k, value=v) for k, v in configs.items()],
            )
        ],
        timeout_ms=5_000,
        validate_only=validate_only,
    )


def run(coro):
    return asyncio.run(coro)


def described(apis, name: str) -> dict:
    res = run(apis.topic_admin.describe_configs(describe_req(name), ctx(32, 4))).results[0]
    assert res.error_code == KafkaError.NONE, res
    return {c.name: c for c in res.configs}


def alter_result(response):
    [res] = response.responses
    return res.error_code, res.error_message


def test_incremental_alter_then_describe_shows_the_change(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    sync()
    before = described(apis, "t")
    assert before["retention.ms"].value == "604800000"
    assert before["retention.ms"].config_source == 5  # DEFAULT_CONFIG
    assert before["max.message.bytes"].value == "1048588"
    assert not before["retention.ms"].read_only and before["remote.storage.enable"].read_only
    assert before["retention.ms"].config_type == 5  # LONG
    assert [s.name for s in before["retention.ms"].synonyms] == ["log.retention.ms"]

    entries = [
        ("retention.ms", SET, "1000"),
        ("max.message.bytes", SET, "2000"),
        ("cleanup.policy", APPEND, "compact"),
    ]
    assert alter_result(
        run(apis.topic_admin.incremental_alter_configs(incremental("t", entries), ctx(44, 1)))
    ) == (
        KafkaError.NONE,
        None,
    )
    after = described(apis, "t")
    assert after["retention.ms"].value == "1000" and after["retention.ms"].config_source == 1
    assert [(s.name, s.source) for s in after["retention.ms"].synonyms] == [
        ("retention.ms", 1),
        ("log.retention.ms", 5),
    ]
    assert after["max.message.bytes"].value == "2000"
    assert after["cleanup.policy"].value == "delete,compact"

    entries = [("retention.ms", DELETE, None), ("cleanup.policy", SUBTRACT, "delete")]
    run(apis.topic_admin.incremental_alter_configs(incremental("t", entries), ctx(44, 1)))
    after = described(apis, "t")
    assert after["retention.ms"].config_source == 5 and after["retention.ms"].value == "604800000"
    assert after["cleanup.policy"].value == "compact"


def test_bad_entries_are_invalid_config_and_change_nothing(broker):
    apis, controller, sync = broker
    controller.call(
        "create_topic", {"name": "t", "partitions": 1, "configs": {"retention.ms": "5"}}
    )
    sync()
    image = controller.machine.image
    before = image.fingerprint()
    for key, value in (
        ("retention.ms", "banana"),
        ("cleanup.policy", "shred"),
        ("no.such.config", "1"),
    ):
        entries = [("max.message.bytes", SET, "1000"), (key, SET, value)]
        code, message = alter_result(
            run(apis.topic_admin.incremental_alter_configs(incremental("t", entries), ctx(44, 1)))
        )
        assert code == KafkaError.INVALID_CONFIG and key in message
        code, message = alter_result(
            run(
                apis.topic_admin.alter_configs(
                    legacy("t", {"max.message.bytes": "1000", key: value}), ctx(33, 1)
                )
            )
        )
        assert code == KafkaError.INVALID_CONFIG and key in message
    assert controller.machine.image.fingerprint() == before
    assert described(apis, "t")["retention.ms"].value == "5"


def test_validate_only_changes_nothing(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    sync()
    offset = controller.machine.next_offset
    good = incremental("t", [("retention.ms", SET, "1000")], validate_only=True)
    assert (
        alter_result(run(apis.topic_admin.incremental_alter_configs(good, ctx(44, 1))))[0]
        == KafkaError.NONE
    )
    bad = legacy("t", {"retention.ms": "banana"}, validate_only=True)
    assert (
        alter_result(run(apis.topic_admin.alter_configs(bad, ctx(33, 1))))[0]
        == KafkaError.INVALID_CONFIG
    )
    assert controller.machine.next_offset == offset


def test_alter_configs_replaces_the_whole_set(broker):
    apis, controller, sync = broker
    controller.call(
        "create_topic",
        {"name": "t", "partitions": 1, "configs": {"retention.ms": "5", "segment.ms": "100"}},
    )
    sync()
    res = run(
        apis.topic_admin.alter_configs(legacy("t", {"max.message.bytes": "3000"}), ctx(33, 1))
    )
    assert alter_result(res)[0] == KafkaError.NONE
    assert controller.machine.image.topic_by_name("t").configs == {"max.message.bytes": "3000"}


def test_other_resources_and_unknown_topics(broker):
    apis, controller, sync = broker
    res = run(
        apis.topic_admin.incremental_alter_configs(
            incremental("1", [("x", SET, "1")], rtype=BROKER), ctx(44, 1)
        )
    )
    code, message = alter_result(res)
    assert code == KafkaError.INVALID_CONFIG and "broker config: x" in message
    res = run(
        apis.topic_admin.incremental_alter_configs(
            incremental("7", [("log.retention.ms", SET, "1")], rtype=BROKER), ctx(44, 1)
        )
    )
    code, message = alter_result(res)
    assert code == KafkaError.INVALID_REQUEST and "not registered" in message
    res = run(
        apis.topic_admin.incremental_alter_configs(
            incremental("nope", [("retention.ms", SET, "1")]), ctx(44, 1)
        )
    )
    assert alter_result(res)[0] == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    res = run(apis.topic_admin.describe_configs(describe_req("nope"), ctx(32, 4))).results[0]
    assert res.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    res = run(
        apis.topic_admin.describe_configs(describe_req("1", rtype=BROKER), ctx(32, 4))
    ).results[0]
    assert res.error_code == KafkaError.NONE and {c.name for c in res.configs} >= {"broker.id"}


def test_describe_filters_by_key(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    sync()
    res = run(
        apis.topic_admin.describe_configs(describe_req("t", ["retention.ms", "nope"]), ctx(32, 4))
    )
    assert [c.name for c in res.results[0].configs] == ["retention.ms"]


def test_create_topics_validates_configs_and_stores_nothing(broker):
    apis, controller, sync = broker
    before = controller.machine.image.fingerprint()
    for configs in ({"retention.ms": "banana"}, {"cleanup.policy": "shred"}, {"bogus": "1"}):
        for validate_only in (True, False):
            res = run(
                apis.topic_admin.create_topics(create_req("t", configs, validate_only), ctx(19, 7))
            )
            [topic] = res.topics
            assert topic.error_code == KafkaError.INVALID_CONFIG
            assert next(iter(configs)) in topic.error_message
    assert controller.machine.image.fingerprint() == before
    res = run(
        apis.topic_admin.create_topics(create_req("t", {"retention.ms": "1000"}, True), ctx(19, 7))
    )
    assert res.topics[0].error_code == KafkaError.NONE
    assert controller.machine.image.topic_by_name("t") is None  # validate_only
    res = run(apis.topic_admin.create_topics(create_req("t", {"retention.ms": "1000"}), ctx(19, 7)))
    [topic] = res.topics
    assert topic.error_code == KafkaError.NONE
    returned = {c.name: (c.value, c.config_source) for c in topic.configs}
    assert returned["retention.ms"] == ("1000", 1)
    assert returned["max.message.bytes"] == ("1048588", 5)


def test_max_message_bytes_is_enforced_after_an_alter_without_reopening(broker):
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    sync()
    plog = apis.partitions.get(controller.machine.image.topic_by_name("t").topic_id, 0)
    big = batch([b"x" * 5_000])

    def produce(records: bytes) -> int:
        res = run(apis.data.produce(produce_req("t", records), ctx(0, 9)))
        return res.responses[0].partition_responses[0].error_code

    assert produce(big) == KafkaError.NONE
    res = run(
        apis.topic_admin.incremental_alter_configs(
            incremental("t", [("max.message.bytes", SET, "1000")]), ctx(44, 1)
        )
    )
    assert alter_result(res)[0] == KafkaError.NONE
    hw = plog.high_watermark
    assert produce(big) == KafkaError.MESSAGE_TOO_LARGE
    assert produce(batch([b"small"])) == KafkaError.NONE
    assert plog.high_watermark == hw + 1  # the refused batch left nothing
    assert apis.partitions.get(plog.topic_id, 0) is plog  # the same open partition
    run(
        apis.topic_admin.incremental_alter_configs(
            incremental("t", [("max.message.bytes", DELETE, None)]), ctx(44, 1)
        )
    )
    assert produce(big) == KafkaError.NONE
    # the default (Kafka's 1048588) holds for a topic with no override
    assert produce(batch([b"y" * 1_100_000])) == KafkaError.MESSAGE_TOO_LARGE


def test_batches_up_to_the_produce_limit_are_stored_when_the_topic_allows_them(broker):
    """A topic whose max.message.bytes allows 8 MiB batches takes a 6 MiB batch (the WAL
    used to refuse records above 4 MiB, which reached the client as NOT_LEADER); a batch
    above the broker's per-partition produce limit is MESSAGE_TOO_LARGE, never NOT_LEADER."""
    apis, controller, sync = broker
    controller.call(
        "create_topic",
        {"name": "big", "partitions": 1, "configs": {"max.message.bytes": "104857600"}},
    )
    sync()
    plog = apis.partitions.get(controller.machine.image.topic_by_name("big").topic_id, 0)
    payload = bytes(range(256)) * (6 * 1024 * 4)  # 6 MiB, not compressible to nothing

    def produce(records: bytes) -> int:
        res = run(apis.data.produce(produce_req("big", records), ctx(0, 9)))
        return res.responses[0].partition_responses[0].error_code

    assert produce(batch([payload])) == KafkaError.NONE
    assert plog.high_watermark == 1
    assert payload in bytes(plog.read(0, 16 * 1024 * 1024))
    assert produce(batch([payload + payload])) == KafkaError.MESSAGE_TOO_LARGE
    assert plog.high_watermark == 1


def test_dynamic_broker_configs_supply_topic_defaults(broker):
    """kafka-configs --entity-type brokers --entity-default / --entity-name 1: the broker
    synonyms of topic configs become the defaults of topics without their own value, with
    the right source; a topic's own value still wins; bad values change nothing."""
    apis, controller, sync = broker
    controller.call("create_topic", {"name": "t", "partitions": 1})
    controller.call(
        "create_topic", {"name": "own", "partitions": 1, "configs": {"max.message.bytes": "9000"}}
    )
    sync()
    plog = apis.partitions.get(controller.machine.image.topic_by_name("t").topic_id, 0)

    def alter(resource: str, entries: list) -> tuple:
        return alter_result(
            run(
                apis.topic_admin.incremental_alter_configs(
                    incremental(resource, entries, rtype=BROKER), ctx(44, 1)
                )
            )
        )

    assert (
        alter("", [("message.max.bytes", SET, "3000"), ("log.retention.ms", SET, "5000")])[0]
        == KafkaError.NONE
    )
    rows = described(apis, "t")
    assert rows["max.message.bytes"].value == "3000"
    assert rows["max.message.bytes"].config_source == 3  # DYNAMIC_DEFAULT_BROKER_CONFIG
    assert rows["retention.ms"].value == "5000"
    assert described(apis, "own")["max.message.bytes"].value == "9000"  # the topic's own
    # the new default is enforced on produce, without reopening the partition
    res = run(apis.data.produce(produce_req("t", batch([b"x" * 5_000])), ctx(0, 9)))
    assert res.responses[0].partition_responses[0].error_code == KafkaError.MESSAGE_TOO_LARGE
    assert plog.configs()["retention.ms"] == "5000"

    # one broker's own value wins over the cluster default
    assert alter("1", [("message.max.bytes", SET, "8000")])[0] == KafkaError.NONE
    rows = described(apis, "t")
    assert (rows["max.message.bytes"].value, rows["max.message.bytes"].config_source) == (
        "8000",
        2,  # DYNAMIC_BROKER_CONFIG
    )
    res = run(apis.data.produce(produce_req("t", batch([b"x" * 5_000])), ctx(0, 9)))
    assert res.responses[0].partition_responses[0].error_code == KafkaError.NONE
    broker_rows = (
        run(apis.topic_admin.describe_configs(describe_req("1", rtype=BROKER), ctx(32, 4)))
        .results[0]
        .configs
    )
    by_name = {c.name: c for c in broker_rows}
    assert by_name["message.max.bytes"].value == "8000"
    assert by_name["log.retention.ms"].value == "5000"
    assert by_name["log.retention.ms"].config_source == 3

    # a bad value or an unknown key refuses the whole alter and stores nothing
    offset = controller.machine.image.offset
    code, message = alter(
        "", [("log.retention.ms", SET, "banana"), ("log.retention.bytes", SET, "1")]
    )
    assert code == KafkaError.INVALID_CONFIG and "log.retention.ms" in message
    assert controller.machine.image.offset == offset
    # deleting the defaults brings Kafka's back
    assert (
        alter("", [("log.retention.ms", DELETE, None), ("message.max.bytes", DELETE, None)])[0]
        == KafkaError.NONE
    )
    assert alter("1", [("message.max.bytes", DELETE, None)])[0] == KafkaError.NONE
    rows = described(apis, "t")
    assert (
        rows["max.message.bytes"].value == "1048588" and rows["retention.ms"].value == "604800000"
    )


def test_the_erasure_repair_settings_are_dynamic_broker_configs(broker):
    """kafka-configs --entity-type brokers sets the brokers' own settings (no topic's
    default): validated, described with value and source, deleted back to the default."""
    apis, controller, sync = broker

    def alter(resource: str, entries: list) -> tuple:
        return alter_result(
            run(
                apis.topic_admin.incremental_alter_configs(
                    incremental(resource, entries, rtype=BROKER), ctx(44, 1)
                )
            )
        )

    rate, enable = "automq.erasure.repair.rate.bytes.per.sec", "automq.erasure.repair.enable"
    assert described_broker(apis, "1")[rate] == str(8 * 1024 * 1024)
    assert alter("", [(rate, SET, "1048576")])[0] == KafkaError.NONE
    assert alter("1", [(enable, SET, "false")])[0] == KafkaError.NONE
    sync()
    rows = {
        c.name: c
        for c in run(apis.topic_admin.describe_configs(describe_req("1", rtype=BROKER), ctx(32, 4)))
        .results[0]
        .configs
    }
    assert (rows[rate].value, rows[rate].config_source) == ("1048576", 3)
    assert (rows[enable].value, rows[enable].config_source) == ("false", 2)
    # bad values refuse the whole alter and store nothing
    offset = controller.machine.image.offset
    for entries, named in (
        ([(rate, SET, "1")], rate),  # below the 64 KiB floor
        ([(enable, SET, "maybe")], enable),
        ([("automq.erasure.repair.delay.ms", SET, "-5")], "automq.erasure.repair.delay.ms"),
    ):
        code, message = alter("", entries)
        assert code == KafkaError.INVALID_CONFIG and named in message
    assert controller.machine.image.offset == offset
    assert alter("", [(rate, DELETE, None)])[0] == KafkaError.NONE
    assert alter("1", [(enable, DELETE, None)])[0] == KafkaError.NONE
    sync()
    back = described_broker(apis, "1")
    assert (back[rate], back[enable]) == (str(8 * 1024 * 1024), "true")


def test_describing_another_broker_shows_its_own_id_and_rack(broker):
    """`kafka-configs --describe --entity-type brokers --entity-name 2` asked of broker 1
    shows broker 2's id, rack and listeners, not the answering broker's."""
    apis, controller, sync = broker
    controller.call(
        "register_broker",
        {
            "node_id": 2,
            "az": "az2",
            "host": "127.0.0.2",
            "kafka_port": 9093,
            "incarnation_id": "unit-2",
        },
    )
    sync()
    other = described_broker(apis, "2")
    assert (other["broker.id"], other["broker.rack"]) == ("2", "az2")
    me = described_broker(apis, "1")
    assert (me["broker.id"], me["broker.rack"]) == ("1", "az1")


def described_broker(apis, node: str) -> dict[str, str | None]:
    res = run(
        apis.topic_admin.describe_configs(describe_req(node, rtype=BROKER), ctx(32, 4))
    ).results[0]
    assert res.error_code == KafkaError.NONE, res
    return {c.name: c.value for c in res.configs}
