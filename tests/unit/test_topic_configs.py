"""Topic configs: the schema (Kafka 3.9's keys, types, ranges, enums, defaults) and the state
machine's create_topic / alter_topic_configs, where a refused entry changes nothing."""

from __future__ import annotations

import json

import pytest

from controlplane import topic_configs as tc
from controlplane.errors import ControllerError, ErrorCode
from controlplane.records import decode_record
from controlplane.state_machine import MetadataStateMachine

NOW = 1_000_000

# (key, value) pairs Kafka 3.9 refuses, each for a different validator
BAD_VALUES = [
    ("retention.ms", "banana"),
    ("retention.ms", "-2"),  # atLeast(-1)
    ("retention.ms", "1.5"),
    ("retention.ms", "9223372036854775808"),  # beyond a long
    ("max.message.bytes", "-1"),  # atLeast(0)
    ("max.message.bytes", "2147483648"),  # beyond an int
    ("cleanup.policy", "shred"),
    ("cleanup.policy", "compact,shred"),
    ("cleanup.policy", "delete,delete"),
    ("cleanup.policy", ""),
    ("compression.type", "brotli"),
    ("compression.gzip.level", "10"),
    ("compression.zstd.level", "23"),
    ("message.timestamp.type", "createtime"),  # case matters in Kafka's ValidString
    ("min.cleanable.dirty.ratio", "1.5"),
    ("min.cleanable.dirty.ratio", "nan"),
    ("min.cleanable.dirty.ratio", "-0.1"),
    ("min.cleanable.dirty.ratio", "half"),
    ("max.compaction.lag.ms", "0"),  # atLeast(1)
    ("min.compaction.lag.ms", "-1"),
    ("min.insync.replicas", "0"),
    ("segment.bytes", "13"),
    ("segment.ms", "0"),
    ("preallocate", "yes"),
    ("unclean.leader.election.enable", "1"),
    ("leader.replication.throttled.replicas", "0:1,x"),
    ("message.format.version", "banana"),
    ("remote.storage.enable", "true"),  # read-only: no remote tier here
    ("no.such.config", "1"),
]


def ok(result: dict) -> dict:
    assert "error" not in result, result
    return result["result"]


def error_of(result: dict) -> tuple[str, str]:
    assert "error" in result, result
    return result["error"]["code"], result["error"]["message"]


@pytest.fixture
def sm() -> MetadataStateMachine:
    machine = MetadataStateMachine()
    epoch = ok(
        machine.execute(
            "register_broker",
            {
                "node_id": 1,
                "az": "az1",
                "host": "127.0.0.1",
                "kafka_port": 9092,
                "incarnation_id": "i",
            },
            NOW,
        )
    )["node_epoch"]
    ok(machine.execute("broker_heartbeat", {"node_id": 1, "node_epoch": epoch}, NOW))
    return machine


def create(sm: MetadataStateMachine, name: str, configs: dict, topic_id: str = "t-1") -> dict:
    return sm.execute(
        "create_topic",
        {"name": name, "partitions": 1, "configs": configs, "topic_id": topic_id},
        NOW,
    )


def alter(sm: MetadataStateMachine, name: str, ops: list, replace: bool = False) -> dict:
    body = {"name": name, "ops": [{"key": k, "op": o, "value": v} for k, o, v in ops]}
    return sm.execute("alter_topic_configs", {**body, "replace": replace}, NOW)


def configs_of(sm: MetadataStateMachine, name: str) -> dict:
    return sm.image.topic_by_name(name).configs


# ---------------------------------------------------------------- the schema


def test_schema_follows_kafka_defaults_and_types():
    assert tc.SCHEMA["retention.ms"].default == "604800000"
    assert tc.SCHEMA["max.message.bytes"].default == "1048588"
    assert tc.SCHEMA["cleanup.policy"].type is tc.ConfigType.LIST
    assert tc.SCHEMA["min.cleanable.dirty.ratio"].type is tc.ConfigType.DOUBLE
    assert tc.SCHEMA["segment.bytes"].type is tc.ConfigType.INT
    assert tc.SCHEMA["flush.ms"].default == str(2**63 - 1)
    for spec in tc.SCHEMA.values():  # every default passes its own validator
        if not spec.read_only:
            tc.validate_value(spec.name, spec.default)


@pytest.mark.parametrize("key,value", BAD_VALUES)
def test_every_bad_value_is_invalid_config_naming_the_key(key, value):
    with pytest.raises(ControllerError) as info:
        tc.validate_new_topic_configs({key: value})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert key in info.value.message


@pytest.mark.parametrize(
    "key,value,stored",
    [
        ("cleanup.policy", "compact, delete", "compact,delete"),
        ("cleanup.policy", "delete,compact", "delete,compact"),
        ("retention.ms", " -1 ", "-1"),
        ("retention.bytes", "-5", "-5"),  # no validator in Kafka
        ("preallocate", "TRUE", "true"),
        ("min.cleanable.dirty.ratio", "0.25", "0.25"),
        ("compression.type", "zstd", "zstd"),
        ("message.timestamp.type", "LogAppendTime", "LogAppendTime"),
        ("leader.replication.throttled.replicas", "*", "*"),
        ("follower.replication.throttled.replicas", "0:1,1:2", "0:1,1:2"),
        ("message.format.version", "2.8-IV1", "2.8-IV1"),
        ("remote.storage.enable", "false", None),  # the fixed default: accepted, not stored
    ],
)
def test_good_values_are_stored_in_their_canonical_form(key, value, stored):
    out = tc.validate_new_topic_configs({key: value})
    assert out.get(key) == stored


def test_min_compaction_lag_above_max_is_refused():
    with pytest.raises(ControllerError) as info:
        tc.validate_new_topic_configs({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})
    assert info.value.code == ErrorCode.INVALID_CONFIG
    assert "min.compaction.lag.ms" in info.value.message


def test_apply_ops_append_subtract_on_lists_only():
    out = tc.apply_ops({}, [("cleanup.policy", "append", "compact")], replace=False)
    assert out == {"cleanup.policy": "delete,compact"}
    out = tc.apply_ops(out, [("cleanup.policy", "subtract", "delete")], replace=False)
    assert out == {"cleanup.policy": "compact"}
    with pytest.raises(ControllerError) as info:
        tc.apply_ops(out, [("cleanup.policy", "subtract", "compact")], replace=False)
    assert info.value.code == ErrorCode.INVALID_CONFIG  # an empty policy
    with pytest.raises(ControllerError) as info:
        tc.apply_ops({}, [("retention.ms", "append", "5")], replace=False)
    assert info.value.code == ErrorCode.INVALID_REQUEST


def test_apply_ops_refuses_duplicate_keys_and_null_sets():
    with pytest.raises(ControllerError) as info:
        tc.apply_ops({}, [("retention.ms", "set", "1"), ("retention.ms", "delete", None)], False)
    assert info.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(ControllerError) as info:
        tc.apply_ops({}, [("retention.ms", "set", None)], False)
    assert info.value.code == ErrorCode.INVALID_CONFIG and "retention.ms" in info.value.message


def test_describe_lists_every_key_with_source_and_synonyms():
    rows = {r.name: r for r in tc.describe({"retention.ms": "1000"})}
    assert set(tc.SCHEMA) <= set(rows)
    assert rows["retention.ms"].value == "1000"
    assert rows["retention.ms"].source is tc.ConfigSource.TOPIC_CONFIG
    assert rows["retention.ms"].synonyms[0] == (
        "retention.ms",
        "1000",
        tc.ConfigSource.TOPIC_CONFIG,
    )
    assert rows["retention.ms"].synonyms[1][0] == "log.retention.ms"
    assert rows["max.message.bytes"].value == "1048588"
    assert rows["max.message.bytes"].source is tc.ConfigSource.DEFAULT_CONFIG
    assert rows["remote.storage.enable"].read_only
    assert not rows["retention.ms"].read_only


def test_effective_int_falls_back_to_the_default_for_legacy_garbage():
    assert tc.effective_int({"max.message.bytes": "banana"}, "max.message.bytes") == 1048588
    assert tc.effective_int({"max.message.bytes": "1000"}, "max.message.bytes") == 1000


# ---------------------------------------------------------------- the state machine


@pytest.mark.parametrize("key,value", BAD_VALUES)
def test_create_topic_with_a_bad_config_changes_nothing(sm, key, value):
    before = (sm.image.fingerprint(), sm.next_offset)
    code, message = error_of(create(sm, "t", {"retention.ms": "1000", key: value}))
    assert code == "INVALID_CONFIG" and key in message
    assert (sm.image.fingerprint(), sm.next_offset) == before


@pytest.mark.parametrize("key,value", BAD_VALUES)
def test_alter_with_one_bad_entry_changes_nothing(sm, key, value):
    ok(create(sm, "t", {"retention.ms": "1000"}))
    before = (sm.image.fingerprint(), sm.next_offset)
    ops = [("delete.retention.ms", "set", "2000"), (key, "set", value)]
    code, message = error_of(alter(sm, "t", ops))
    assert code == "INVALID_CONFIG" and key in message
    assert (sm.image.fingerprint(), sm.next_offset) == before
    assert configs_of(sm, "t") == {"retention.ms": "1000"}


def test_alter_sets_and_deletes_atomically_and_keeps_partitions(sm):
    ok(create(sm, "t", {"retention.ms": "1000", "cleanup.policy": "compact"}))
    partitions = dict(sm.image.topic_by_name("t").partitions)
    result = ok(
        alter(
            sm,
            "t",
            [
                ("max.message.bytes", "set", "1000"),
                ("retention.ms", "delete", None),
                ("cleanup.policy", "append", "delete"),
            ],
        )
    )
    expected = {"max.message.bytes": "1000", "cleanup.policy": "compact,delete"}
    assert result["configs"] == expected
    assert result["metadata_offset"] == sm.next_offset - 1  # the topic record's offset
    assert configs_of(sm, "t") == expected
    assert sm.image.topic_by_name("t").partitions == partitions
    # one topic record in the log, which a follower replays to the same image
    assert decode_record(json.loads(sm.log[-1])).type == "topic"


def test_alter_replace_resets_keys_not_given(sm):
    ok(create(sm, "t", {"retention.ms": "1000", "cleanup.policy": "compact"}))
    ok(alter(sm, "t", [("max.message.bytes", "set", "5000")], replace=True))
    assert configs_of(sm, "t") == {"max.message.bytes": "5000"}


def test_alter_that_changes_nothing_writes_nothing(sm):
    ok(create(sm, "t", {"retention.ms": "1000"}))
    before = sm.next_offset
    ok(alter(sm, "t", [("retention.ms", "set", "1000"), ("segment.ms", "delete", None)]))
    assert sm.next_offset == before


def test_alter_of_an_unknown_topic(sm):
    assert error_of(alter(sm, "nope", [("retention.ms", "set", "1")]))[0] == "UNKNOWN_TOPIC"


def test_alter_body_limits_are_invalid_request(sm):
    ok(create(sm, "t", {}))
    too_long = "x" * (32 * 1024 + 1)
    assert error_of(alter(sm, "t", [("retention.ms", "set", too_long)]))[0] == "INVALID_REQUEST"
    body = {"name": "t", "ops": [{"key": "retention.ms", "op": "multiply", "value": "2"}]}
    assert error_of(sm.execute("alter_topic_configs", body, NOW))[0] == "INVALID_REQUEST"


def test_broker_settings_are_not_topic_configs():
    """The brokers' own dynamic settings (BROKER_SCHEMA) are refused on a topic: a topic
    created with one would store a key that does nothing and that no alter could remove."""
    for key in tc.BROKER_SCHEMA:
        with pytest.raises(ControllerError) as refused:
            tc.validate_new_topic_configs({key: tc.BROKER_SCHEMA[key].default})
        assert refused.value.code == ErrorCode.INVALID_CONFIG and key in refused.value.message
        # ... and stay broker configs
        assert tc.validate_broker_value(key, tc.BROKER_SCHEMA[key].default)
    # a value stored under older bounds falls through to the next layer, then the default
    rate = tc.ERASURE_REPAIR_RATE
    assert tc.broker_setting({rate: "131072"}, {rate: "1"}, rate) == "131072"
    assert tc.broker_setting({}, {rate: "1"}, rate) == tc.BROKER_SCHEMA[rate].default
