"""The one table of Kafka error codes agrees with a real client's codes and retriable flags."""

from __future__ import annotations

import kafka.errors as client_errors

from dataplane.formats.kafka_errors import KafkaError


def _client_table() -> dict[int, type]:
    table = {}
    for name in dir(client_errors):
        cls = getattr(client_errors, name)
        if (
            isinstance(cls, type)
            and issubclass(cls, client_errors.BrokerResponseError)
            and isinstance(getattr(cls, "errno", None), int)
        ):
            table[cls.errno] = cls
    return table


def test_codes_and_retriable_flags_match_kafka_python():
    table = _client_table()
    checked = 0
    for err in KafkaError:
        cls = table.get(err.value)
        if cls is None:
            continue  # codes newer than the client library
        checked += 1
        assert err.retriable == bool(cls.retriable), err.name
    assert checked > 100
    assert KafkaError.NOT_LEADER_OR_FOLLOWER.retriable
    assert not KafkaError.TOPIC_AUTHORIZATION_FAILED.retriable
    assert KafkaError.from_code(9999) is KafkaError.UNKNOWN_SERVER_ERROR
