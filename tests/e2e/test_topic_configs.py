"""Topic configs with real clients on a real cluster: confluent-kafka's
incremental_alter_configs and kafka-python's alter_configs change retention.ms and
max.message.bytes, DescribeConfigs shows it, a too-large record is refused, bad values are
INVALID_CONFIG and store nothing, and `automqctl topic alter|describe` do the same."""

from __future__ import annotations

import json
import uuid

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaError, KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from tests.support.ledger import automqctl, create_topic, running_cluster  # noqa: E402

BIG = 5_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("configs") / "cluster"
    with running_cluster(d) as status:
        yield {"dir": d, "bootstrap": status["bootstrap_servers"]}


def describe(admin: AdminClient, topic: str) -> dict:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    return admin.describe_configs([resource])[resource].result(30)


def incremental(admin: AdminClient, topic: str, **sets: str) -> None:
    entries = [
        ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for k, v in sets.items()
    ]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
    admin.incremental_alter_configs([resource])[resource].result(30)


def produce_one(bootstrap: str, topic: str, size: int):
    """Produce one record of `size` bytes; the delivery error (None when acked)."""
    result: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 20_000})
    producer.produce(topic, value=b"x" * size, on_delivery=lambda err, msg: result.append(err))
    assert producer.flush(30) == 0
    return result[0]


def test_alter_describe_enforce_and_refuse_with_real_clients(cluster):
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType
    from kafka.errors import MessageSizeTooLargeError

    bootstrap = cluster["bootstrap"]
    topic = f"cfg-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 1)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    before = describe(admin, topic)
    assert before["retention.ms"].value == "604800000"
    assert before["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert before["max.message.bytes"].value == "1048588"
    assert produce_one(bootstrap, topic, BIG) is None

    # confluent-kafka: IncrementalAlterConfigs
    incremental(admin, topic, retention_ms="3600000", max_message_bytes="1000")
    after = describe(admin, topic)
    assert after["retention.ms"].value == "3600000"
    assert after["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert after["max.message.bytes"].value == "1000"
    err = produce_one(bootstrap, topic, BIG)
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert produce_one(bootstrap, topic, 100) is None

    # kafka-python: AlterConfigs (the whole set) and IncrementalAlterConfigs
    kp = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        res = kp.alter_configs(
            [
                KpResource(
                    ConfigResourceType.TOPIC,
                    topic,
                    configs={"retention.ms": "7200000", "max.message.bytes": "1000"},
                )
            ],
            incremental=False,
        )
        assert res["topic"][topic] == "OK", res
        after = describe(admin, topic)
        assert after["retention.ms"].value == "7200000"
        assert after["max.message.bytes"].value == "1000"
        producer = KafkaProducer(bootstrap_servers=bootstrap, retries=0)
        try:
            with pytest.raises(MessageSizeTooLargeError):
                producer.send(topic, b"y" * BIG).get(timeout=30)
        finally:
            producer.close()

        # bad values: INVALID_CONFIG from both clients, nothing stored
        stored = {k: (e.value, e.source) for k, e in describe(admin, topic).items()}
        for key, value in (
            ("retention.ms", "banana"),
            ("cleanup.policy", "shred"),
            ("no.such.config", "1"),
        ):
            entries = [
                ConfigEntry("segment.ms", "1000", incremental_operation=AlterConfigOpType.SET),
                ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET),
            ]
            resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
            with pytest.raises(KafkaException) as info:
                admin.incremental_alter_configs([resource])[resource].result(30)
            assert info.value.args[0].code() == KafkaError.INVALID_CONFIG, info.value
            assert key in info.value.args[0].str()
            for inc in (True, False):
                res = kp.alter_configs(
                    [KpResource(ConfigResourceType.TOPIC, topic, configs={key: value})],
                    raise_on_unknown=False,
                    incremental=inc,
                )
                assert "InvalidConfigurationError" in res["topic"][topic], res
        assert {k: (e.value, e.source) for k, e in describe(admin, topic).items()} == stored
    finally:
        kp.close()

    # CreateTopics refuses the same values and creates nothing
    for key, value in (("retention.ms", "banana"), ("cleanup.policy", "shred"), ("bogus", "1")):
        name = f"bad-{uuid.uuid4().hex[:6]}"
        future = admin.create_topics([NewTopic(name, 1, 1, config={key: value})])[name]
        with pytest.raises(KafkaException) as info:
            future.result(30)
        assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
        assert name not in admin.list_topics(timeout=10).topics


def test_topic_alter_and_describe_cli(cluster):
    d = cluster["dir"]
    topic = f"cli-cfg-{uuid.uuid4().hex[:6]}"
    assert (
        automqctl("topic", "create", topic, "-c", "retention.ms=5000", cluster_dir=d).returncode
        == 0
    )
    res = automqctl(
        "topic", "alter", topic, "-c", "max.message.bytes=1000", "-c", "cleanup.policy=compact",
        "--delete-config", "retention.ms", cluster_dir=d,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr + res.stdout
    configs = json.loads(
        automqctl("topic", "describe", topic, "--format", "json", cluster_dir=d).stdout
    )["configs"]
    assert configs["max.message.bytes"] == {
        "value": "1000",
        "source": "DYNAMIC_TOPIC_CONFIG",
        "set_on_topic": True,
        "read_only": False,
    }
    assert configs["cleanup.policy"]["value"] == "compact"
    assert configs["retention.ms"]["value"] == "604800000"
    assert not configs["retention.ms"]["set_on_topic"]
    table = automqctl("topic", "describe", topic, cluster_dir=d)
    assert table.returncode == 0 and "max.message.bytes" in table.stdout
    bad = automqctl("topic", "alter", topic, "-c", "retention.ms=banana", cluster_dir=d)
    assert bad.returncode == 1 and "INVALID_CONFIG" in bad.stderr and "retention.ms" in bad.stderr
    again = json.loads(
        automqctl("topic", "describe", topic, "--format", "json", cluster_dir=d).stdout
    )["configs"]
    assert again == configs  # the refused alter left the topic as it was
