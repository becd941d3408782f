"""Kafka 3.9 behaviours librdkafka's own regression suite expects of a broker, with
confluent-kafka against `automqctl cluster up` (1 broker): a compacted topic fails only the
null-key records of a batch; LogAppendTime timestamps lie between the send and the ack; an
illegal topic name is refused within a second; offsets of a missing topic are refused."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("confluent_kafka")
from confluent_kafka import (  # noqa: E402
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient  # noqa: E402

from tests.support.ledger import create_topic, running_cluster  # noqa: E402

pytestmark = [pytest.mark.e2e]


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory):
    d = tmp_path_factory.mktemp("kafka39") / "cluster"
    with running_cluster(d, "--brokers", "1", "--controllers", "1") as status:
        yield status["bootstrap_servers"]


def _produce(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes, int]]):
    """(key, value, timestamp ms) each; returns the delivery reports' (error, message)."""
    reports: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
    for key, value, ts in messages:
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=0,
            timestamp=ts,
            on_delivery=lambda err, msg: reports.append((err, msg)),
        )
    assert producer.flush(30) == 0
    return reports


def test_a_compacted_topic_fails_only_the_null_key_records(bootstrap):
    create_topic(bootstrap, "k39-compact", 1, configs={"cleanup.policy": "compact"})
    # one batch (linger.ms) with two null keys: as librdkafka's own test 0011 expects of
    # Kafka, exactly those fail with INVALID_RECORD (the broker's record_errors) and the
    # others of the batch with librdkafka's _INVALID_DIFFERENT_RECORD
    reports = _produce(
        bootstrap,
        "k39-compact",
        [(b"a", b"1", 0), (None, b"2", 0), (b"c", b"3", 0), (None, b"4", 0)],
    )
    codes = {msg.value(): (err.code() if err is not None else None) for err, msg in reports}
    assert codes == {
        b"1": KafkaError._INVALID_DIFFERENT_RECORD,
        b"2": KafkaError.INVALID_RECORD,
        b"3": KafkaError._INVALID_DIFFERENT_RECORD,
        b"4": KafkaError.INVALID_RECORD,
    }
    # a batch whose records all have keys is stored
    ((err, _msg),) = _produce(bootstrap, "k39-compact", [(b"a", b"5", 0)])
    assert err is None


def test_log_append_time_lies_between_send_and_ack(bootstrap):
    create_topic(bootstrap, "k39-stamped", 1, configs={"message.timestamp.type": "LogAppendTime"})
    sent_ms = int(time.time() * 1000)
    reports = _produce(bootstrap, "k39-stamped", [(b"k", b"v", 1000)])
    acked_ms = int(time.time() * 1000)
    ((err, msg),) = reports
    assert err is None
    kind, ts = msg.timestamp()
    assert kind == 2 and sent_ms <= ts <= acked_ms  # TIMESTAMP_LOG_APPEND_TIME
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "k39-read", "auto.offset.reset": "earliest"}
    )
    try:
        consumer.assign([TopicPartition("k39-stamped", 0, 0)])
        got = consumer.poll(20)
        assert got is not None and got.error() is None
        assert got.timestamp() == (2, ts)
    finally:
        consumer.close()


def test_an_illegal_topic_name_is_refused_within_a_second(bootstrap):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    started = time.monotonic()
    md = admin.list_topics("bad name!", timeout=10)
    assert time.monotonic() - started < 1.0
    assert md.topics["bad name!"].error.code() == KafkaError.TOPIC_EXCEPTION


def test_offsets_of_a_missing_topic_are_refused(bootstrap):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "k39-commit"})
    try:
        try:
            result = consumer.commit(
                offsets=[TopicPartition("k39-no-such-topic", 0, 5)], asynchronous=False
            )
            errors = [tp.error.code() for tp in result if tp.error is not None]
        except KafkaException as exc:
            errors = [exc.args[0].code()]
        assert errors == [KafkaError.UNKNOWN_TOPIC_OR_PART]
    finally:
        consumer.close()
