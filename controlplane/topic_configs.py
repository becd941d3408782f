"""The topic-config schema: every Kafka topic config we accept, its type, range, default.

Follows Kafka 3.9's `TopicConfig` / `LogConfig` definitions (names, types, validators,
defaults), so a value Kafka refuses is refused here with a message that names the key, and
an unknown key is refused (Kafka's "Unknown topic config name"). The controller's state
machine validates with this module on every voter (`topics.create_topic`,
`topics.alter_topic_configs`); brokers use it to answer DescribeConfigs and to read a
topic's effective values (`effective_int`). Pure: no I/O, no project imports beyond errors.

Most keys are accepted and stored for compatibility only (segments, flushes, indexes and
replication have no meaning for a stream in object storage); which ones the broker enforces
is listed in `ENFORCED`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from controlplane.errors import ControllerError, ErrorCode

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
MAX_CONFIG_KEY_CHARS = 255
MAX_CONFIG_VALUE_CHARS = 32 * 1024  # a throttled-replicas list of a large topic fits
MAX_CONFIG_OPS = 1_000  # entries of one alter (the schema has ~40 keys)
MAX_LIST_ITEMS = 10_000


class ConfigType(Enum):
    """Kafka's `ConfigDef.Type`; the value is DescribeConfigs' `config_type` (v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8


class ConfigSource(Enum):
    """DescribeConfigs' `config_source` values we answer with."""

    TOPIC_CONFIG = 1  # DYNAMIC_TOPIC_CONFIG: set on the topic
    DYNAMIC_BROKER_CONFIG = 2  # set for one broker (kafka-configs --entity-name N)
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3  # set for every broker (--entity-default)
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


@dataclass(frozen=True)
class ConfigKey:
    """One topic config: type, validator arguments, Kafka's default, server synonym."""

    name: str
    type: ConfigType
    default: str
    doc: str
    min: float | None = None  # numeric range, inclusive (Kafka's atLeast / between)
    max: float | None = None
    choices: tuple[str, ...] = ()  # STRING: one of; LIST: every item one of
    read_only: bool = False  # refused by alters (why: see the key's doc)
    create_only: bool = False  # set when the topic is created, never changed by an alter
    synonym: str | None = None  # the broker config that supplies the default in Kafka
    pattern: str | None = None  # STRING: a regular expression the value must match
    pattern_hint: str = "not a valid version (e.g. 3.0-IV1)"  # the error when it does not
    list_validator: str | None = None  # LIST: "throttled_replicas"


_I = ConfigType.INT
_L = ConfigType.LONG
_D = ConfigType.DOUBLE
_B = ConfigType.BOOLEAN
_S = ConfigType.STRING
_LI = ConfigType.LIST
_NEVER = str(LONG_MAX)

PARTITION_MODE = "automq.partition.mode"
ERASURE_DATA_SHARDS = "automq.erasure.data.shards"
ERASURE_PARITY_SHARDS = "automq.erasure.parity.shards"
ERASURE_READ_DELAY_MS = "automq.erasure.read.delay.ms"
ERASURE_SEAL_DELAY_MS = "automq.erasure.seal.delay.ms"
# table topics (issue #29): AutoMQ's names; the Spark job `spark_jobs/table_sync.py` reads them
TABLE_TOPIC_ENABLE = "automq.table.topic.enable"
TABLE_TOPIC_SCHEMA_TYPE = "automq.table.topic.schema.type"
TABLE_TOPIC_NAMESPACE = "automq.table.topic.namespace"
TABLE_TOPIC_PARTITION_BY = "automq.table.topic.partition.by"
TABLE_TOPIC_ERRORS_TOLERANCE = "automq.table.topic.errors.tolerance"
# `[day(timestamp)]` (AutoMQ's list form), `day(timestamp)`, or `[]` / "" for none
TABLE_PARTITION_BY_PATTERN = r"^\[?\s*((hour|day|month|year)\(timestamp\))?\s*\]?$"

# Kafka 3.9: LogConfig.CONFIG (+ the deprecated keys 3.9 still accepts)
_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("cleanup.policy", _LI, "delete", "delete and/or compact old segments",
              choices=("delete", "compact"), synonym="log.cleanup.policy"),
    ConfigKey("compression.type", _S, "producer", "final compression of the topic's batches",
              choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
              synonym="compression.type"),
    ConfigKey("compression.gzip.level", _I, "-1", "gzip level (-1 = codec default)",
              min=-1, max=9, synonym="compression.gzip.level"),
    ConfigKey("compression.lz4.level", _I, "9", "lz4 level", min=1, max=17,
              synonym="compression.lz4.level"),
    ConfigKey("compression.zstd.level", _I, "3", "zstd level", min=-131072, max=22,
              synonym="compression.zstd.level"),
    ConfigKey("delete.retention.ms", _L, "86400000", "how long tombstones are kept",
              min=0, synonym="log.cleaner.delete.retention.ms"),
    ConfigKey("file.delete.delay.ms", _L, "60000", "delay before a deleted file goes",
              min=0, synonym="log.segment.delete.delay.ms"),
    ConfigKey("flush.messages", _L, _NEVER, "messages between forced flushes", min=1,
              synonym="log.flush.interval.messages"),
    ConfigKey("flush.ms", _L, _NEVER, "ms between forced flushes", min=0,
              synonym="log.flush.interval.ms"),
    ConfigKey("follower.replication.throttled.replicas", _LI, "",
              "replicas throttled on the follower side ('*' or partition:broker)",
              list_validator="throttled_replicas"),
    ConfigKey("index.interval.bytes", _I, "4096", "bytes between offset index entries",
              min=0, synonym="log.index.interval.bytes"),
    ConfigKey("leader.replication.throttled.replicas", _LI, "",
              "replicas throttled on the leader side ('*' or partition:broker)",
              list_validator="throttled_replicas"),
    ConfigKey("local.retention.bytes", _L, "-2", "local tier size limit (-2 = retention.bytes)",
              min=-2, synonym="log.local.retention.bytes"),
    ConfigKey("local.retention.ms", _L, "-2", "local tier time limit (-2 = retention.ms)",
              min=-2, synonym="log.local.retention.ms"),
    ConfigKey("max.compaction.lag.ms", _L, _NEVER, "longest a record stays uncompacted",
              min=1, synonym="log.cleaner.max.compaction.lag.ms"),
    ConfigKey("max.message.bytes", _I, "1048588",
              "largest record batch (bytes, with its 12-byte log overhead) a produce may "
              "append; enforced", min=0, synonym="message.max.bytes"),
    ConfigKey("message.downconversion.enable", _B, "true",
              "down-convert for old consumers (deprecated)",
              synonym="log.message.downconversion.enable"),
    ConfigKey("message.format.version", _S, "3.0-IV1", "message format (deprecated, ignored)",
              pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+){0,2}(-IV[0-9]+)?$",
              synonym="log.message.format.version"),
    ConfigKey("message.timestamp.after.max.ms", _L, _NEVER,
              "how far in the future a record's timestamp may be", min=0,
              synonym="log.message.timestamp.after.max.ms"),
    ConfigKey("message.timestamp.before.max.ms", _L, _NEVER,
              "how far in the past a record's timestamp may be", min=0,
              synonym="log.message.timestamp.before.max.ms"),
    ConfigKey("message.timestamp.difference.max.ms", _L, _NEVER,
              "timestamp skew allowed (deprecated)", min=0,
              synonym="log.message.timestamp.difference.max.ms"),
    ConfigKey("message.timestamp.type", _S, "CreateTime", "CreateTime or LogAppendTime",
              choices=("CreateTime", "LogAppendTime"), synonym="log.message.timestamp.type"),
    ConfigKey("min.cleanable.dirty.ratio", _D, "0.5", "dirty share that triggers compaction",
              min=0, max=1, synonym="log.cleaner.min.cleanable.ratio"),
    ConfigKey("min.compaction.lag.ms", _L, "0", "shortest a record stays uncompacted",
              min=0, synonym="log.cleaner.min.compaction.lag.ms"),
    ConfigKey("min.insync.replicas", _I, "1", "replicas that must ack acks=all", min=1,
              synonym="min.insync.replicas"),
    ConfigKey("preallocate", _B, "false", "preallocate segment files",
              synonym="log.preallocate"),
    # tiered storage: every partition's data already lives in object storage, so there is
    # no remote tier to switch on or off (Kafka with tiered storage disabled refuses too)
    ConfigKey("remote.log.copy.disable", _B, "false", "no remote tier here", read_only=True),
    ConfigKey("remote.log.delete.on.disable", _B, "false", "no remote tier here",
              read_only=True),
    ConfigKey("remote.storage.enable", _B, "false", "no remote tier here", read_only=True),
    ConfigKey("retention.bytes", _L, "-1", "size limit per partition (-1 = none)",
              synonym="log.retention.bytes"),
    ConfigKey("retention.ms", _L, "604800000", "time limit (-1 = none)", min=-1,
              synonym="log.retention.ms"),
    ConfigKey("segment.bytes", _I, "1073741824", "segment size", min=14,
              synonym="log.segment.bytes"),
    ConfigKey("segment.index.bytes", _I, "10485760", "offset index size", min=4,
              synonym="log.index.size.max.bytes"),
    ConfigKey("segment.jitter.ms", _L, "0", "segment roll jitter", min=0,
              synonym="log.roll.jitter.ms"),
    ConfigKey("segment.ms", _L, "604800000", "segment roll time", min=1,
              synonym="log.roll.ms"),
    ConfigKey("unclean.leader.election.enable", _B, "false", "elect out-of-sync replicas",
              synonym="unclean.leader.election.enable"),
    # leaderless erasure-coded partitions (issue #14): how a partition's records are kept is
    # fixed when the topic is created (the shard stores were placed for that code)
    ConfigKey(PARTITION_MODE, _S, "leader",
              "leader: one broker leads each partition (its stream); erasure: leaderless, "
              "records Reed-Solomon coded into data + parity shards on as many brokers",
              choices=("leader", "erasure"), create_only=True),
    ConfigKey(ERASURE_DATA_SHARDS, _I, "4", "erasure mode: data shards (a write needs them)",
              min=2, max=16, create_only=True),
    ConfigKey(ERASURE_PARITY_SHARDS, _I, "2",
              "erasure mode: parity shards (brokers that may fail or be slow)",
              min=1, max=15, create_only=True),
    ConfigKey(ERASURE_READ_DELAY_MS, _L, "500",
              "erasure mode: readers read behind the clock by this much (the high watermark)",
              min=0, max=600_000),
    ConfigKey(ERASURE_SEAL_DELAY_MS, _L, "10000",
              "erasure mode: records stay in the shard stores this long past the visible end "
              "before they are sealed into object storage (also the least time one sealed "
              "object spans)",
              min=100, max=86_400_000),
    ConfigKey(TABLE_TOPIC_ENABLE, _B, "false",
              "keep the topic's committed records as an Iceberg table (appended by the table "
              "sync job: `automqctl table sync`, or the compaction schedule)"),
    ConfigKey(TABLE_TOPIC_SCHEMA_TYPE, _S, "raw",
              "table topic columns: raw (key, value bytes) or json (the value's top-level JSON "
              "fields as columns, new fields added as new columns); both add _kafka_* columns",
              choices=("raw", "json")),
    ConfigKey(TABLE_TOPIC_NAMESPACE, _S, "default", "table topic: the Iceberg namespace",
              pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$",
              pattern_hint="letters, digits and _ (not first), at most 128"),
    ConfigKey(TABLE_TOPIC_PARTITION_BY, _S, "[day(timestamp)]",
              "table topic: the table's partitioning by the record timestamp: "
              "[hour|day|month|year(timestamp)], or [] for none (used when the table is "
              "created)", pattern=TABLE_PARTITION_BY_PATTERN,
              pattern_hint="use [hour|day|month|year(timestamp)] or []"),
    ConfigKey(TABLE_TOPIC_ERRORS_TOLERANCE, _S, "none",
              "table topic: a record that does not fit the table (json mode: a value that is "
              "not a JSON object, a field whose type its column cannot take): none stops the "
              "topic's sync at it, naming its offset; all leaves it out of the table, counted "
              "and named in the run's result",
              choices=("none", "all")),
)  # fmt: skip

SCHEMA: dict[str, ConfigKey] = {k.name: k for k in _KEYS}

# dynamic broker configs that are no topic's default: settings of the broker itself, set with
# `kafka-configs --entity-type brokers` for every broker or one (as Kafka's replication
# throttle `leader.replication.throttled.rate`)
ERASURE_REPAIR_ENABLE = "automq.erasure.repair.enable"
ERASURE_REPAIR_RATE = "automq.erasure.repair.rate.bytes.per.sec"
ERASURE_REPAIR_DELAY_MS = "automq.erasure.repair.delay.ms"
_BROKER_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(ERASURE_REPAIR_ENABLE, _B, "true",
              "erasure mode: re-encode the missing shards of decided writes and fill them"),
    ConfigKey(ERASURE_REPAIR_RATE, _L, str(8 * 1024 * 1024),
              "erasure mode: most bytes of shards a broker's repairs write per second",
              min=64 * 1024, max=1024**3),
    ConfigKey(ERASURE_REPAIR_DELAY_MS, _L, "1000",
              "erasure mode: offsets younger than this are not repaired yet (the writer's "
              "own shards are still landing)", min=0, max=3_600_000),
)  # fmt: skip
BROKER_SCHEMA: dict[str, ConfigKey] = {k.name: k for k in _BROKER_KEYS}

# Kafka 3.9's dynamic broker configs that have no meaning here (threads, connection quotas,
# the log cleaner's tuning, listener security reloads, replication throttles): accepted and
# stored with their Kafka type checked, as Kafka accepts them (clients' test suites and
# operators' scripts set them), reported back by DescribeConfigs when set, applied to nothing
_STORED_BROKER_KEYS: tuple[ConfigKey, ...] = tuple(
    ConfigKey(name, kind, "", "Kafka broker config, stored only (not applied here)", min=lo)
    for name, kind, lo in (
        ("background.threads", _I, 1),
        ("num.io.threads", _I, 1),
        ("num.network.threads", _I, 1),
        ("num.replica.fetchers", _I, 1),
        ("num.recovery.threads.per.data.dir", _I, 1),
        ("log.cleaner.threads", _I, 0),
        ("log.cleaner.io.max.bytes.per.second", _D, None),
        ("log.cleaner.dedupe.buffer.size", _L, None),
        ("log.cleaner.io.buffer.size", _I, 0),
        ("log.cleaner.io.buffer.load.factor", _D, None),
        ("log.cleaner.backoff.ms", _L, 0),
        ("max.connections", _I, 0),
        ("max.connections.per.ip", _I, 0),
        ("max.connections.per.ip.overrides", _S, None),
        ("max.connection.creation.rate", _I, 0),
        ("metric.reporters", _LI, None),
        ("follower.replication.throttled.rate", _L, 0),
        ("leader.replication.throttled.rate", _L, 0),
        ("replica.alter.log.dirs.io.max.bytes.per.second", _L, 0),
        ("producer.id.expiration.ms", _I, 1),
        ("transaction.partition.verification.enable", _B, None),
        ("sasl.enabled.mechanisms", _LI, None),
        ("sasl.jaas.config", _S, None),
        ("sasl.kerberos.service.name", _S, None),
        ("sasl.kerberos.kinit.cmd", _S, None),
        ("sasl.kerberos.min.time.before.relogin", _L, None),
        ("sasl.kerberos.ticket.renew.jitter", _D, None),
        ("sasl.kerberos.ticket.renew.window.factor", _D, None),
        ("sasl.kerberos.principal.to.local.rules", _LI, None),
        ("sasl.login.refresh.window.factor", _D, None),
        ("sasl.login.refresh.window.jitter", _D, None),
        ("sasl.login.refresh.min.period.seconds", _I, 0),
        ("sasl.login.refresh.buffer.seconds", _I, 0),
        ("ssl.protocol", _S, None),
        ("ssl.enabled.protocols", _LI, None),
        ("ssl.cipher.suites", _LI, None),
        ("ssl.client.auth", _S, None),
        ("ssl.endpoint.identification.algorithm", _S, None),
        ("ssl.keystore.type", _S, None),
        ("ssl.keystore.location", _S, None),
        ("ssl.keystore.password", _S, None),
        ("ssl.key.password", _S, None),
        ("ssl.truststore.type", _S, None),
        ("ssl.truststore.location", _S, None),
        ("ssl.truststore.password", _S, None),
        ("ssl.keymanager.algorithm", _S, None),
        ("ssl.trustmanager.algorithm", _S, None),
    )
)
STORED_BROKER_SCHEMA: dict[str, ConfigKey] = {k.name: k for k in _STORED_BROKER_KEYS}
# described with a null value, as Kafka hides passwords
SENSITIVE_BROKER_KEYS = frozenset(
    {"sasl.jaas.config", "ssl.keystore.password", "ssl.key.password", "ssl.truststore.password"}
)
# keys the broker acts on today (the rest are stored and described only)
ENFORCED = frozenset({"max.message.bytes"})
_THROTTLED_ITEM = re.compile(r"^[0-9]+:[0-9]+$")


def _invalid(key: str, value: str | None, why: str) -> ControllerError:
    shown = value if value is None or len(value) <= 64 else value[:64] + "..."
    return ControllerError(
        ErrorCode.INVALID_CONFIG, f"Invalid value {shown!r} for configuration {key}: {why}"
    )


def _split_list(value: str) -> list[str]:
    """Kafka's LIST parsing: comma-separated, items trimmed; "" is the empty list."""
    if not value.strip():
        return []
    return [item.strip() for item in value.split(",")]


def _check_range(spec: ConfigKey, value: str, number: float) -> None:
    if spec.min is not None and number < spec.min:
        raise _invalid(spec.name, value, f"Value must be at least {_num(spec.min)}")
    if spec.max is not None and number > spec.max:
        raise _invalid(spec.name, value, f"Value must be no more than {_num(spec.max)}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def validate_value(key: str, value: str | None) -> str:
    """The value to store for topic config `key` (trimmed), or INVALID_CONFIG naming the
    key and why."""
    spec = SCHEMA.get(key)
    if spec is None:
        raise ControllerError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {key}")
    return _validate(spec, key, value)


def _validate(spec: ConfigKey, key: str, value: str | None) -> str:
    """`value` checked against `spec` (a topic key's or a broker setting's)."""
    if value is None:
        raise _invalid(key, value, "a value is required (null is not supported)")
    if len(value) > MAX_CONFIG_VALUE_CHARS:
        raise _invalid(key, value, f"longer than {MAX_CONFIG_VALUE_CHARS} characters")
    text = value.strip()
    if spec.type in (ConfigType.INT, ConfigType.LONG):
        lo, hi = (INT_MIN, INT_MAX) if spec.type is ConfigType.INT else (LONG_MIN, LONG_MAX)
        kind = "an int" if spec.type is ConfigType.INT else "a long"
        # Java's parseInt/parseLong: optional sign and decimal digits only
        if not re.fullmatch(r"[+-]?[0-9]{1,20}", text):
            raise _invalid(key, value, f"Expected value to be {kind} number")
        number = int(text)
        if not lo <= number <= hi:
            raise _invalid(key, value, f"Expected value to be {kind} number (out of range)")
        _check_range(spec, value, number)
    elif spec.type is ConfigType.DOUBLE:
        try:
            number = float(text)
        except ValueError:
            raise _invalid(key, value, "Expected value to be a double number") from None
        if not math.isfinite(number):
            raise _invalid(key, value, "Expected value to be a finite double number")
        _check_range(spec, value, number)
    elif spec.type is ConfigType.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise _invalid(key, value, "Expected value to be either true or false")
        text = text.lower()
    elif spec.type is ConfigType.STRING:
        if spec.choices and text not in spec.choices:
            raise _invalid(key, value, f"String must be one of: {', '.join(spec.choices)}")
        if spec.pattern and not re.fullmatch(spec.pattern, text):
            raise _invalid(key, value, spec.pattern_hint)
    elif spec.type is ConfigType.LIST:
        items = _split_list(text)
        if len(items) > MAX_LIST_ITEMS:
            raise _invalid(key, value, f"more than {MAX_LIST_ITEMS} items")
        if len(set(items)) != len(items):
            raise _invalid(key, value, "the list has duplicate items")
        if spec.choices:
            if not items:
                raise _invalid(key, value, f"must be one or more of: {', '.join(spec.choices)}")
            for item in items:
                if item not in spec.choices:
                    raise _invalid(
                        key, value, f"Invalid value {item} (must be in {', '.join(spec.choices)})"
                    )
        if spec.list_validator == "throttled_replicas":
            if items != ["*"] and not all(_THROTTLED_ITEM.match(i) for i in items):
                raise _invalid(
                    key,
                    value,
                    "must be the wildcard (*) or a list of partitionId:brokerId entries",
                )
        text = ",".join(items)
    return text


def _cross_checks(configs: Mapping[str, str]) -> None:
    """Kafka's LogConfig.validateValues: rules between keys, on the effective values."""
    min_lag = int(effective(configs, "min.compaction.lag.ms"))
    max_lag = int(effective(configs, "max.compaction.lag.ms"))
    if min_lag > max_lag:
        raise ControllerError(
            ErrorCode.INVALID_CONFIG,
            f"conflict topic config setting min.compaction.lag.ms ({min_lag}) > "
            f"max.compaction.lag.ms ({max_lag})",
        )
    policies = [p.strip() for p in effective(configs, "cleanup.policy").split(",")]
    if effective(configs, PARTITION_MODE) == "erasure" and "compact" in policies:
        # sealed erasure-coded records are not rewritten by the log cleaner
        raise ControllerError(
            ErrorCode.INVALID_CONFIG,
            "cleanup.policy=compact is not supported on erasure-coded topics "
            f"({PARTITION_MODE}=erasure)",
        )
    data = int(effective(configs, ERASURE_DATA_SHARDS))
    parity = int(effective(configs, ERASURE_PARITY_SHARDS))
    if data <= parity:
        # two writes may only never both win an offset when 2 x data > data + parity
        raise ControllerError(
            ErrorCode.INVALID_CONFIG,
            f"{ERASURE_DATA_SHARDS} ({data}) must be greater than "
            f"{ERASURE_PARITY_SHARDS} ({parity})",
        )


def validate_new_topic_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """A new topic's configs, validated (each key, then the rules between keys)."""
    if len(configs) > len(SCHEMA):
        raise ControllerError(ErrorCode.INVALID_CONFIG, f"more than {len(SCHEMA)} configs")
    out: dict[str, str] = {}
    for key, value in configs.items():
        spec = SCHEMA.get(key)
        if spec is not None and spec.read_only:
            # a new topic may state the default (tools copy a described topic), nothing else
            if validate_value(key, value) != spec.default:
                raise _invalid(key, value, "read-only: " + spec.doc)
            continue
        out[key] = validate_value(key, value)
    _cross_checks(out)
    return out


OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = "set", "delete", "append", "subtract"


def apply_ops(
    current: Mapping[str, str], ops: Iterable[tuple[str, str, str | None]], replace: bool
) -> dict[str, str]:
    """The topic's configs after `ops` ((key, op, value) in order), all validated: a bad
    entry raises and nothing applies. `replace` (AlterConfigs): keys the ops do not set go
    back to their default. APPEND/SUBTRACT work on LIST keys only (Kafka: INVALID_REQUEST).
    """
    ops = list(ops)
    if len(ops) > MAX_CONFIG_OPS:
        raise ControllerError(ErrorCode.INVALID_REQUEST, f"more than {MAX_CONFIG_OPS} configs")
    seen: set[str] = set()
    for key, _op, _value in ops:
        if key in seen:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST, f"Error due to duplicate config keys: {key}"
            )
        seen.add(key)
    # keys stored before validation existed stay as they are unless an op names them
    result = {} if replace else dict(current)
    if replace:  # a key fixed at creation keeps its value when an alter resets the rest
        result.update({k: v for k, v in current.items() if k in SCHEMA and SCHEMA[k].create_only})
    for key, op, value in ops:
        spec = SCHEMA.get(key)
        if spec is None:
            raise ControllerError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {key}")
        if spec.read_only:
            if op == OP_SET and validate_value(key, value) == spec.default:
                continue  # stating the default of a fixed key changes nothing
            if op != OP_DELETE:
                raise _invalid(key, value, "read-only: " + spec.doc)
        if spec.create_only:
            if op == OP_SET and validate_value(key, value) == effective(current, key):
                continue  # stating the value in force changes nothing
            raise _invalid(key, value, "can only be set when the topic is created")
        if op == OP_SET:
            result[key] = validate_value(key, value)
        elif op == OP_DELETE:
            result.pop(key, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            if spec.type is not ConfigType.LIST:
                raise ControllerError(
                    ErrorCode.INVALID_REQUEST,
                    f"Config value {op} is not allowed for config key: {key}",
                )
            if value is None:
                raise _invalid(key, value, "a value is required (null is not supported)")
            items = _split_list(result.get(key, spec.default))
            given = _split_list(value)
            if op == OP_APPEND:
                items += [i for i in given if i not in items]
            else:
                items = [i for i in items if i not in given]
            result[key] = validate_value(key, ",".join(items))
        else:
            raise ControllerError(ErrorCode.INVALID_REQUEST, f"unknown config operation {op!r}")
    _cross_checks(result)
    return result


# ------------------------------------------------------------ dynamic broker configs
# Kafka's cluster-wide dynamic configs that supply topic defaults: each topic key's broker
# synonym (`log.retention.ms` for `retention.ms`, ...), set for every broker (resource "")
# or for one broker (its id); a topic's own value wins, then the broker's, then the default.
BROKER_SYNONYMS: dict[str, str] = {k.synonym: k.name for k in _KEYS if k.synonym}


def validate_broker_value(key: str, value: str | None) -> str:
    """The value to store for broker config `key`, validated as its topic key is (or as
    the broker setting it is, or as Kafka types a stored-only Kafka broker config)."""
    if key in BROKER_SCHEMA:
        return _validate(BROKER_SCHEMA[key], key, value)
    if key in STORED_BROKER_SCHEMA:
        return _validate(STORED_BROKER_SCHEMA[key], key, value)
    topic_key = BROKER_SYNONYMS.get(key)
    if topic_key is None or SCHEMA[topic_key].read_only:
        raise ControllerError(
            ErrorCode.INVALID_CONFIG,
            f"Unknown or not dynamically updatable broker config: {key} (dynamic broker "
            "configs are the topic defaults: "
            + ", ".join(sorted(BROKER_SYNONYMS))
            + "; and "
            + ", ".join(sorted(BROKER_SCHEMA))
            + ")",
        )
    try:
        return validate_value(topic_key, value)
    except ControllerError as exc:
        raise ControllerError(
            exc.code, exc.message.replace(f"configuration {topic_key}:", f"configuration {key}:")
        ) from None


def apply_broker_ops(
    current: Mapping[str, str], ops: Iterable[tuple[str, str, str | None]], replace: bool
) -> dict[str, str]:
    """One broker resource's dynamic configs after `ops` (set/delete; all or nothing)."""
    ops = list(ops)
    if len(ops) > MAX_CONFIG_OPS:
        raise ControllerError(ErrorCode.INVALID_REQUEST, f"more than {MAX_CONFIG_OPS} configs")
    if len({k for k, _, _ in ops}) != len(ops):
        raise ControllerError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    result = {} if replace else dict(current)
    for key, op, value in ops:
        if op == OP_SET:
            result[key] = validate_broker_value(key, value)
        elif op == OP_DELETE:
            dynamic = (
                key in BROKER_SCHEMA
                or key in STORED_BROKER_SCHEMA
                or (key in BROKER_SYNONYMS and not SCHEMA[BROKER_SYNONYMS[key]].read_only)
            )
            if not dynamic:
                validate_broker_value(key, None)  # raises: not a dynamic broker config
            result.pop(key, None)
        else:
            raise ControllerError(
                ErrorCode.INVALID_REQUEST,
                f"Config value {op} is not allowed for config key: {key}",
            )
    return result


def with_broker_defaults(
    configs: Mapping[str, str], cluster: Mapping[str, str], node: Mapping[str, str]
) -> dict[str, str]:
    """A topic's configs in force on a broker: its own, else the broker's dynamic value
    (this broker's, then the cluster default), as topic keys."""
    out = {BROKER_SYNONYMS[k]: v for k, v in cluster.items() if k in BROKER_SYNONYMS}
    out.update({BROKER_SYNONYMS[k]: v for k, v in node.items() if k in BROKER_SYNONYMS})
    out.update(configs)
    return out


def broker_setting(cluster: Mapping[str, str], node: Mapping[str, str], key: str) -> str:
    """A broker setting (BROKER_SCHEMA) in force: this broker's dynamic value, else the
    cluster-wide one, else the default; a stored value that no longer validates counts as
    the default."""
    spec = BROKER_SCHEMA[key]
    for layer in (node, cluster):
        if key in layer:
            try:
                return _validate(spec, key, layer[key])
            except ControllerError:
                continue  # stored under older bounds: the next layer, else the default
    return spec.default


def describe_broker_settings(
    cluster: Mapping[str, str], node: Mapping[str, str]
) -> list[DescribedConfig]:
    """The broker settings (BROKER_SCHEMA) with their values in force and sources."""
    rows = []
    for spec in _BROKER_KEYS:
        layers: list[tuple[str, str | None, ConfigSource]] = []
        if spec.name in node:
            layers.append((spec.name, node[spec.name], ConfigSource.DYNAMIC_BROKER_CONFIG))
        if spec.name in cluster:
            layers.append(
                (spec.name, cluster[spec.name], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
            )
        layers.append((spec.name, spec.default, ConfigSource.DEFAULT_CONFIG))
        rows.append(
            DescribedConfig(
                name=spec.name,
                value=layers[0][1],
                source=layers[0][2],
                read_only=False,
                config_type=spec.type.value,
                doc=spec.doc,
                synonyms=tuple(layers),
            )
        )
    return rows


def describe_stored_broker_keys(
    cluster: Mapping[str, str], node: Mapping[str, str]
) -> list[DescribedConfig]:
    """The stored-only Kafka broker configs (STORED_BROKER_SCHEMA) set on this broker or
    cluster-wide, with their value in force (passwords hidden) and sources."""
    rows = []
    for spec in _STORED_BROKER_KEYS:
        layers: list[tuple[str, str | None, ConfigSource]] = []
        hidden = spec.name in SENSITIVE_BROKER_KEYS
        for layer, source in (
            (node, ConfigSource.DYNAMIC_BROKER_CONFIG),
            (cluster, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
        ):
            if spec.name in layer:
                layers.append((spec.name, None if hidden else layer[spec.name], source))
        if layers:
            rows.append(
                DescribedConfig(
                    name=spec.name,
                    value=layers[0][1],
                    source=layers[0][2],
                    read_only=False,
                    config_type=spec.type.value,
                    doc=spec.doc,
                    synonyms=tuple(layers),
                )
            )
    return rows


def effective(configs: Mapping[str, str], key: str) -> str:
    """The value in force: the topic's own, else the default."""
    value = configs.get(key)
    return value if value is not None else SCHEMA[key].default


def effective_int(configs: Mapping[str, str], key: str) -> int:
    """An INT/LONG key's value in force; a stored value that does not parse (stored before
    validation existed) counts as the default."""
    try:
        return int(effective(configs, key))
    except ValueError:
        return int(SCHEMA[key].default)


@dataclass(frozen=True)
class DescribedConfig:
    """One row of DescribeConfigs for a topic."""

    name: str
    value: str | None
    source: ConfigSource
    read_only: bool
    config_type: int  # ConfigType value, 0 for a stored key the schema does not know
    doc: str | None
    synonyms: tuple[tuple[str, str | None, ConfigSource], ...]


def describe(
    configs: Mapping[str, str],
    cluster: Mapping[str, str] | None = None,
    node: Mapping[str, str] | None = None,
) -> list[DescribedConfig]:
    """Every schema key with its value in force and where it comes from (the topic, this
    broker's dynamic config, the cluster-wide one, Kafka's default), plus any stored key the
    schema does not know (stored before validation existed), sorted by name."""
    cluster, node = cluster or {}, node or {}
    rows: list[DescribedConfig] = []
    for spec in _KEYS:
        layers: list[tuple[str, str | None, ConfigSource]] = []
        if spec.name in configs:
            layers.append((spec.name, configs[spec.name], ConfigSource.TOPIC_CONFIG))
        if spec.synonym:
            if spec.synonym in node:
                layers.append(
                    (spec.synonym, node[spec.synonym], ConfigSource.DYNAMIC_BROKER_CONFIG)
                )
            if spec.synonym in cluster:
                layers.append(
                    (
                        spec.synonym,
                        cluster[spec.synonym],
                        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG,
                    )
                )
            layers.append((spec.synonym, spec.default, ConfigSource.DEFAULT_CONFIG))
        value, source = (
            (layers[0][1], layers[0][2]) if layers else (spec.default, ConfigSource.DEFAULT_CONFIG)
        )
        rows.append(
            DescribedConfig(
                name=spec.name,
                value=value,
                source=source,
                read_only=spec.read_only,
                config_type=spec.type.value,
                doc=spec.doc,
                synonyms=tuple(layers),
            )
        )
    for key in configs:
        if key not in SCHEMA:
            rows.append(
                DescribedConfig(
                    key,
                    configs[key],
                    ConfigSource.TOPIC_CONFIG,
                    False,
                    0,
                    None,
                    ((key, configs[key], ConfigSource.TOPIC_CONFIG),),
                )
            )
    return sorted(rows, key=lambda r: r.name)
