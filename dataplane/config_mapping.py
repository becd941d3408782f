"""AutoMQ's and Kafka's `server.properties` keys mapped onto this broker's settings (pure).

`automqctl cluster up --config FILE` and `automqctl node run --properties FILE` read a
properties file (`dataplane.config_properties`) and `--override key=value`, and
`map_properties` turns them into: the broker's settings (an overlay of `BrokerConfig`'s
tree), the buckets (`s3.data.buckets`, or seed 003's `s3.endpoint` / `s3.region` /
`s3.bucket` with `N@` parts, and their `KAFKA_S3_ACCESS_KEY` / `KAFKA_S3_SECRET_KEY`), the
WAL, the topic defaults (Kafka's broker-level synonyms such as `log.retention.ms`, stored as
cluster-wide dynamic broker configs) and the controller's settings. Every key it does not
use gives one warning line; a malformed or contradictory value raises `PropertiesError`
naming the key. `MAPPING_TABLE` is the table docs/configuration.md shows.

Layer: beside `dataplane.config` (whose models it fills).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import SecretStr, ValidationError

from controlplane import topic_configs
from controlplane.errors import ControllerError
from controlplane.listeners import (
    ListenerSpecError,
    parse_advertised_listeners,
    parse_listeners,
)
from dataplane.config import BrokerConfig
from dataplane.config_properties import (
    PropertiesError,
    parse_bool,
    parse_id_parts,
    parse_int,
    parse_size,
)
from dataplane.objectstore.bucket_uri import BucketURI, format_bucket_uris, parse_bucket_uris

Target = Literal["cluster", "node"]
ACCESS_KEY = "KAFKA_S3_ACCESS_KEY"
SECRET_KEY = "KAFKA_S3_SECRET_KEY"
SECRET_KEYS = frozenset({ACCESS_KEY, SECRET_KEY})

# key -> (BrokerConfig path, parser): settings of the broker itself
_SIZE, _INT, _BOOL = "size", "int", "bool"
BROKER_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "s3.wal.cache.size": (("storage", "log_cache_uploaded_bytes"), _SIZE),
    "s3.block.cache.size": (("storage", "block_cache_bytes"), _SIZE),
    "s3.wal.upload.threshold": (("storage", "upload_threshold_bytes"), _SIZE),
    "s3.wal.capacity": (("wal", "capacity_bytes"), _SIZE),
    "s3.stream.object.split.size": (("storage", "stream_split_bytes"), _SIZE),
    "s3.object.block.size": (("storage", "block_size_bytes"), _SIZE),
    "s3.stream.object.compaction.max.size.bytes": (("storage", "max_object_bytes"), _SIZE),
    "socket.request.max.bytes": (("max_request_bytes",), _SIZE),
    "num.partitions": (("num_partitions",), _INT),
    "auto.create.topics.enable": (("auto_create_topics_enable",), _BOOL),
    "log.retention.check.interval.ms": (("retention_check_interval_ms",), _INT),
    "broker.heartbeat.interval.ms": (("heartbeat_interval_ms",), _INT),
    "group.initial.rebalance.delay.ms": (("groups", "group_initial_rebalance_delay_ms"), _INT),
    "group.min.session.timeout.ms": (("groups", "group_min_session_timeout_ms"), _INT),
    "group.max.session.timeout.ms": (("groups", "group_max_session_timeout_ms"), _INT),
    "group.max.size": (("groups", "group_max_size"), _INT),
    "group.consumer.heartbeat.interval.ms": (
        ("groups", "consumer_heartbeat_interval_ms"),
        _INT,
    ),
    "group.consumer.session.timeout.ms": (("groups", "consumer_session_timeout_ms"), _INT),
    "group.consumer.max.size": (("groups", "consumer_max_size"), _INT),
    # share groups (KIP-932)
    "group.share.record.lock.duration.ms": (("share_groups", "record_lock_duration_ms"), _INT),
    "group.share.delivery.count.limit": (("share_groups", "delivery_count_limit"), _INT),
    "group.share.session.timeout.ms": (("share_groups", "session_timeout_ms"), _INT),
    "group.share.heartbeat.interval.ms": (("share_groups", "heartbeat_interval_ms"), _INT),
    "group.share.max.size": (("share_groups", "group_max_size"), _INT),
    "group.share.max.share.sessions": (("share_groups", "max_share_sessions"), _INT),
}
BANDWIDTH_KEY = "s3.network.baseline.bandwidth"
BANDWIDTH_PATHS = (
    ("object_store", "read_bandwidth_bytes_per_s"),
    ("object_store", "write_bandwidth_bytes_per_s"),
)
# Kafka's time keys in coarser units: (ms key, factor); the finer key wins, as in Kafka
COARSE_TIME_KEYS: dict[str, tuple[str, int]] = {
    "log.retention.minutes": ("log.retention.ms", 60_000),
    "log.retention.hours": ("log.retention.ms", 3_600_000),
    "log.roll.hours": ("log.roll.ms", 3_600_000),
    "log.roll.jitter.hours": ("log.roll.jitter.ms", 3_600_000),
}
# keys whose value here is fixed: (the value this broker behaves as, why)
FIXED_KEYS: dict[str, tuple[str, str]] = {
    "delete.topic.enable": ("true", "topics can always be deleted here"),
}
REPLICATION_KEYS = frozenset(
    {
        "default.replication.factor",
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "num.replica.fetchers",
        "replica.lag.time.max.ms",
    }
)
THREAD_KEYS = frozenset(
    {
        "num.network.threads",
        "num.io.threads",
        "num.recovery.threads.per.data.dir",
        "background.threads",
        "socket.send.buffer.bytes",
        "socket.receive.buffer.bytes",
        "queued.max.requests",
    }
)
# the node's identity and addresses: `node run` maps them, `cluster up` assigns its own
NODE_KEYS = frozenset(
    {
        "node.id",
        "broker.id",
        "broker.rack",
        "listeners",
        "advertised.listeners",
        "listener.security.protocol.map",
        "inter.broker.listener.name",
        "controller.listener.names",
        "log.dirs",
        "log.dir",
    }
)
# the quorum: the node file (`node run`) or `cluster up` says it
QUORUM_KEYS = frozenset(
    {
        "process.roles",
        "controller.quorum.voters",
        "controller.quorum.bootstrap.servers",
        "cluster.id",
        "metadata.log.dir",
    }
)
BUCKET_PART_KEYS = ("s3.endpoint", "s3.region", "s3.bucket")


@dataclass(frozen=True)
class KeyMapping:
    """One row of the mapping table: a key (or a family), where it goes, and a note."""

    key: str
    setting: str
    note: str = ""


def _mapping_table() -> tuple[KeyMapping, ...]:
    rows = [
        KeyMapping(
            "s3.data.buckets",
            "the buckets (`--bucket-uris`; `bucket_uris`)",
            "`0@s3://b?region=..&endpoint=..,1@s3://failover?..`; bucket 0 is the main one, "
            "bucket 1 the failover one",
        ),
        KeyMapping(
            "s3.endpoint, s3.region, s3.bucket",
            "the buckets, as `s3.data.buckets`",
            "seed 003's form: `main-bucket,1@failover-bucket` (a part without `N@` is "
            "bucket 0); not together with `s3.data.buckets`",
        ),
        KeyMapping("s3.path.style", "each bucket's `pathStyle`", "with `s3.bucket`"),
        KeyMapping(
            f"{ACCESS_KEY}, {SECRET_KEY}",
            "each bucket's `accessKey` / `secretKey`",
            "`main-ak,1@failover-ak`, in the file or the environment (AutoMQ's way); a file "
            "holding them must be readable by its owner only; when the file names no buckets "
            "they apply to the node file's (`node run`) or `--bucket-uris`'",
        ),
        KeyMapping(
            "s3.wal.path",
            "`wal.uri` and `wal.capacity_bytes` (`cluster up`: `--wal`, capacity)",
            "`0@file:///path?capacity=N` (or a bare path): a file WAL (`cluster up` keeps "
            "each broker's in its own directory); `0@s3://main-bucket`: the WAL in the main "
            "bucket (`--wal s3`); `iodepth`, `iops` are ignored",
        ),
        KeyMapping(
            "s3.ops.buckets",
            "ignored (warned)",
            "no operations data is uploaded: metrics are served on `/metrics`",
        ),
    ]
    return (*rows, *_broker_rows(), *_kafka_rows())


def _broker_rows() -> list[KeyMapping]:
    """The mapping table's rows of the broker's own settings."""
    notes = {
        "s3.wal.cache.size": "the log cache's records already uploaded (those not uploaded yet "
        "are bounded by the WAL's capacity); ",
        "s3.wal.upload.threshold": "at most a quarter of the WAL's capacity is used; ",
        "s3.stream.object.compaction.max.size.bytes": "the largest object an upload writes; ",
    }
    rows = [
        KeyMapping(
            key,
            f"`{'.'.join(path)}`",
            notes.get(key, "") + ("a size: bytes or 14G, 2GB, 512MiB" if kind == _SIZE else ""),
        )
        for key, (path, kind) in BROKER_KEYS.items()
    ]
    return [
        *rows,
        KeyMapping(
            BANDWIDTH_KEY,
            " and ".join(f"`{'.'.join(p)}`" for p in BANDWIDTH_PATHS),
            "the object storage traffic limit, each way",
        ),
    ]


def _kafka_rows() -> list[KeyMapping]:
    """The mapping table's rows of Kafka's node, quorum and topic keys."""
    rows = [
        KeyMapping(
            "node.id (broker.id), broker.rack, log.dirs",
            "`node_id`, `az`, `data_dir` (`node run`)",
            "`cluster up` numbers and places its nodes itself (warned); one log dir",
        ),
        KeyMapping(
            "listeners, listener.security.protocol.map, advertised.listeners, "
            "inter.broker.listener.name, controller.listener.names",
            "`listeners`, `advertised_listeners` (`node run`)",
            "the controller's listeners are left out; `cluster up` picks its ports (warned)",
        ),
        KeyMapping(
            "process.roles, controller.quorum.voters, controller.quorum.bootstrap.servers, "
            "cluster.id, metadata.log.dir",
            "ignored (warned)",
            "`cluster up` starts the quorum; `node run` reaches it as its node file says; "
            "`process.roles` must include broker",
        ),
        KeyMapping(
            "offsets.topic.num.partitions",
            "the controller's `coordinator_slots` (`cluster up`)",
            "fixed once the cluster exists",
        ),
        KeyMapping(
            ", ".join(sorted(topic_configs.BROKER_SYNONYMS)),
            "topic defaults: cluster-wide dynamic broker configs (`cluster up`)",
            "as `kafka-configs --entity-type brokers --entity-default` sets them; a topic's own "
            "config wins. `node run` warns (they are the cluster's, not a node's)",
        ),
        KeyMapping(
            ", ".join(COARSE_TIME_KEYS),
            "as their `.ms` key",
            "the `.ms` key wins when both are given, as in Kafka",
        ),
    ]
    rows += [
        KeyMapping(key, f"fixed: {value}", f"{why}; another value is ignored (warned)")
        for key, (value, why) in FIXED_KEYS.items()
    ]
    rows += [
        KeyMapping(
            ", ".join(sorted(REPLICATION_KEYS)),
            "ignored (warned)",
            "a partition is one stream in object storage: no replicas",
        ),
        KeyMapping(
            ", ".join(sorted(THREAD_KEYS)), "ignored (warned)", "the broker sizes these itself"
        ),
        KeyMapping("any other key", "ignored (warned)", ""),
    ]
    return rows


@dataclass(frozen=True)
class PropertiesMapping:
    """What a properties file says, in this broker's terms."""

    # an overlay of BrokerConfig's tree (nested dicts), validated
    settings: dict[str, Any] = field(default_factory=dict)
    # the buckets, `0@s3://..,1@s3://..`, without credentials (None: not given)
    bucket_uris: str | None = None
    # bucket id -> (access key, secret key) from KAFKA_S3_ACCESS_KEY / _SECRET_KEY or the URIs
    bucket_credentials: dict[int, tuple[str, str]] = field(default_factory=dict)
    # s3.wal.path names the main bucket: the WAL is objects there
    wal_in_bucket: bool = False
    # Kafka broker-level topic defaults (validated), for the cluster-wide dynamic configs
    topic_defaults: dict[str, str] = field(default_factory=dict)
    # ControllerSettings fields
    controller_settings: dict[str, Any] = field(default_factory=dict)
    # one line per key not used
    warnings: tuple[str, ...] = ()

    def bucket_uris_with_credentials(self) -> str | None:
        """The buckets with their credentials in the URIs (for the broker's 0600 config)."""
        if self.bucket_uris is None:
            return None
        uris = []
        for uri in parse_bucket_uris(self.bucket_uris):
            creds = self.bucket_credentials.get(uri.bucket_id)
            if creds:
                uri = uri.model_copy(
                    update={"access_key": SecretStr(creds[0]), "secret_key": SecretStr(creds[1])}
                )
            uris.append(uri)
        return format_bucket_uris(uris, redact=False)


def _put(settings: dict, path: tuple[str, ...], value: Any) -> None:
    node = settings
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value


def _endpoint(value: str) -> str:
    """An endpoint as AutoMQ's older keys give it: a bare host means https."""
    return value if "://" in value else f"https://{value}"


def _buckets_from_parts(props: Mapping[str, str]) -> list[BucketURI]:
    """Seed 003's s3.endpoint / s3.region / s3.bucket (with `N@` parts) as bucket URIs."""
    parts = {k: parse_id_parts(k, props[k]) for k in BUCKET_PART_KEYS if k in props}
    if "s3.bucket" not in parts:
        raise PropertiesError(f"{next(iter(parts))}: needs s3.bucket (the bucket names)")
    names = parts["s3.bucket"]
    path_style = (
        parse_bool("s3.path.style", props["s3.path.style"]) if ("s3.path.style" in props) else True
    )
    for key, by_id in parts.items():
        extra = sorted(set(by_id) - set(names))
        if extra:
            raise PropertiesError(f"{key}: bucket {extra[0]} has no name in s3.bucket")
    uris = []
    for bucket_id, name in sorted(names.items()):
        region = parts.get("s3.region", {}).get(bucket_id) or parts.get("s3.region", {}).get(0)
        endpoint = parts.get("s3.endpoint", {}).get(bucket_id)
        if endpoint is None and bucket_id != 0:
            endpoint = parts.get("s3.endpoint", {}).get(0)  # the main bucket's store
        try:
            uris.append(
                BucketURI(
                    bucket_id=bucket_id,
                    bucket=name,
                    region=region or "us-east-1",
                    endpoint=_endpoint(endpoint) if endpoint else None,
                    path_style=path_style,
                )
            )
        except ValidationError as exc:
            key = {"bucket": "s3.bucket", "endpoint": "s3.endpoint"}.get(
                str(exc.errors()[0]["loc"][0]), "s3.region"
            )
            raise PropertiesError(f"{key}: bucket {bucket_id}: {exc.errors()[0]['msg']}") from None
    return uris


def _credentials(
    props: Mapping[str, str], env: Mapping[str, str], ids: list[int]
) -> dict[int, tuple[str, str]]:
    """Bucket id -> (access key, secret key) from KAFKA_S3_ACCESS_KEY / KAFKA_S3_SECRET_KEY
    (the file's or, AutoMQ's way, the environment's; both given must agree)."""
    given: dict[str, dict[int, str]] = {}
    for key in (ACCESS_KEY, SECRET_KEY):
        values = [v for v in (props.get(key), env.get(key)) if v]
        if len(values) == 2 and values[0] != values[1]:
            raise PropertiesError(f"{key}: the file and the environment give different values")
        if values:
            given[key] = parse_id_parts(key, values[0])
    if not given:
        return {}
    access, secret = given.get(ACCESS_KEY, {}), given.get(SECRET_KEY, {})
    if set(access) != set(secret):
        missing = sorted(set(access) ^ set(secret))[0]
        key = SECRET_KEY if missing in access else ACCESS_KEY
        raise PropertiesError(f"{key}: no value for bucket {missing} (give both keys for it)")
    unknown = sorted(set(access) - set(ids))
    if unknown:
        raise PropertiesError(f"{ACCESS_KEY}: bucket {unknown[0]} is not one of the buckets")
    return {i: (access[i], secret[i]) for i in access}


def _map_buckets(
    props: Mapping[str, str], env: Mapping[str, str]
) -> tuple[list[BucketURI] | None, dict[int, tuple[str, str]]]:
    """The buckets and their credentials (None: no bucket key given)."""
    if "s3.data.buckets" in props:
        clash = [k for k in BUCKET_PART_KEYS if k in props]
        if clash:
            raise PropertiesError(
                f"{clash[0]}: give the buckets as s3.data.buckets or as "
                "s3.endpoint/s3.region/s3.bucket, not both"
            )
        try:
            uris = parse_bucket_uris(props["s3.data.buckets"])
        except ValueError as exc:
            raise PropertiesError(f"s3.data.buckets: {exc}") from None
    elif any(k in props for k in BUCKET_PART_KEYS):
        uris = _buckets_from_parts(props)
    else:
        # (the environment's keys may be meant for buckets named elsewhere: no error)
        key = next((k for k in (ACCESS_KEY, SECRET_KEY) if k in props), None)
        if key is not None:
            raise PropertiesError(f"{key}: no buckets given (s3.data.buckets)")
        return None, {}
    creds = _credentials(props, env, [u.bucket_id for u in uris])
    out = []
    for uri in uris:
        own = (
            (uri.access_key.get_secret_value(), uri.secret_key.get_secret_value())
            if uri.access_key is not None and uri.secret_key is not None
            else None
        )
        if own and uri.bucket_id in creds and creds[uri.bucket_id] != own:
            raise PropertiesError(
                f"{ACCESS_KEY}: bucket {uri.bucket_id}'s URI holds other credentials"
            )
        if own:
            creds[uri.bucket_id] = own
        out.append(uri.model_copy(update={"access_key": None, "secret_key": None}))
    return out, creds


def _map_wal(
    value: str, buckets: list[BucketURI] | None, target: Target, settings: dict
) -> tuple[bool, list[str]]:
    """s3.wal.path: (the WAL is in the main bucket, warnings)."""
    key = "s3.wal.path"
    text = value.strip()
    if "@" in text.split("://", 1)[0]:
        _, text = text.split("@", 1)
    if "://" not in text:
        text = "file://" + text  # AutoMQ's older bare path
    parts = urlsplit(text)
    if parts.scheme == "s3":
        main = buckets[0].bucket if buckets else None
        if parts.netloc != main:
            raise PropertiesError(
                f"{key}: an s3 WAL lives in the main data bucket here ({main or 'none given'})"
            )
        return True, []
    if parts.scheme != "file" or not parts.path.startswith("/"):
        raise PropertiesError(f"{key}: want 0@file:///abs/path?capacity=N or 0@s3://main-bucket")
    unused = []
    for name, val in (q.split("=", 1) for q in parts.query.split("&") if "=" in q):
        if name == "capacity":
            _put(settings, ("wal", "capacity_bytes"), parse_size(f"{key} capacity", val))
        else:
            unused.append(name)
    if target == "node":
        _put(settings, ("wal", "uri"), f"file://{parts.path}")
    else:
        unused.append("the path: cluster up keeps each broker's WAL in DIR/broker-N")
    return False, [f"{key}: ignored in part ({'; '.join(unused)})"] if unused else []


def _topic_default(key: str, value: str) -> str:
    try:
        return topic_configs.validate_broker_value(key, value.strip())
    except ControllerError as exc:
        raise PropertiesError(f"{key}: {exc.message}") from None


def _map_node_keys(props: Mapping[str, str], settings: dict, default_host: str) -> list[str]:
    """`node run`: the node's id, AZ, data dir and listeners."""
    warnings: list[str] = []
    if "node.id" in props and "broker.id" in props and props["node.id"] != props["broker.id"]:
        raise PropertiesError("broker.id: differs from node.id")
    for key in ("node.id", "broker.id"):
        if key in props:
            settings["node_id"] = parse_int(key, props[key], minimum=0)
    if "broker.rack" in props:
        settings["az"] = props["broker.rack"].strip()
    dirs = [d.strip() for d in props.get("log.dirs", props.get("log.dir", "")).split(",")]
    dirs = [d for d in dirs if d]
    if len(dirs) > 1:
        raise PropertiesError("log.dirs: one directory here (the broker's WAL and shard store)")
    if dirs:
        settings["data_dir"] = dirs[0]
    if "listeners" in props:
        _map_listeners(props, settings, default_host)
    elif "advertised.listeners" in props:
        raise PropertiesError("advertised.listeners: needs listeners")
    roles = {r.strip() for r in props.get("process.roles", "broker").split(",") if r.strip()}
    if "broker" not in roles:
        raise PropertiesError("process.roles: node run --properties runs a broker")
    if "controller" in roles:
        warnings.append(
            "process.roles: the controller role ignored (controllers run from their node files)"
        )
    return warnings


def _map_listeners(props: Mapping[str, str], settings: dict, default_host: str) -> None:
    controller_names = {
        n.strip().upper() for n in props.get("controller.listener.names", "").split(",")
    }
    entries = [
        e.strip()
        for e in props["listeners"].split(",")
        if e.strip() and e.strip().split("://", 1)[0].upper() not in controller_names
    ]
    key = "listeners"
    try:
        endpoints = parse_listeners(
            ",".join(entries), props.get("listener.security.protocol.map"), default_host
        )
        inter = props.get("inter.broker.listener.name", "").strip()
        if inter:
            key = "inter.broker.listener.name"
            first = [e for e in endpoints if e.name == inter]
            if not first:
                raise ListenerSpecError(f"{inter} is not one of the listeners")
            endpoints = first + [e for e in endpoints if e.name != inter]
        settings["listeners"] = [e.model_dump() for e in endpoints]
        settings["host"] = endpoints[0].host
        settings["kafka_port"] = endpoints[0].port
        if "advertised.listeners" in props:
            key = "advertised.listeners"
            told = [
                e.strip()
                for e in props["advertised.listeners"].split(",")
                if e.strip() and e.strip().split("://", 1)[0].upper() not in controller_names
            ]
            advertised = parse_advertised_listeners(",".join(told), endpoints)
            settings["advertised_listeners"] = [e.model_dump() for e in advertised]
    except ListenerSpecError as exc:
        raise PropertiesError(f"{key}: {exc}") from None


def _settings_key(settings_path: tuple, keys: Mapping[tuple, str]) -> str:
    for length in range(len(settings_path), 0, -1):
        if settings_path[:length] in keys:
            return keys[settings_path[:length]]
    return ".".join(str(p) for p in settings_path)


def _validate_settings(settings: dict, where: Mapping[tuple, str]) -> None:
    """Refuse settings BrokerConfig refuses, naming the key that gave them."""
    placeholders = {
        "node_id": 0,
        "az": "az",
        "kafka_port": 0,
        "data_dir": Path("/data"),
        "controllers": ["c:1"],
    }
    try:
        BrokerConfig.model_validate({**placeholders, **settings})
    except ValidationError as exc:
        first = exc.errors()[0]
        key = _settings_key(tuple(first["loc"]), where)
        raise PropertiesError(f"{key}: {first['msg']}") from None


class _Mapper:
    """One mapping run: the keys used so far, the settings and the warnings."""

    def __init__(self, props: Mapping[str, str], target: Target, env: Mapping[str, str]):
        self.props, self.target, self.env = props, target, env
        self.settings: dict[str, Any] = {}
        self.where: dict[tuple, str] = {}  # settings path -> the key that set it
        self.warnings: list[str] = []
        self.topic_defaults: dict[str, str] = {}
        self.controller_settings: dict[str, Any] = {}

    def warn(self, key: str, why: str) -> None:
        self.warnings.append(f"{key}: ignored ({why})")

    def broker_key(self, key: str, value: str) -> None:
        path, kind = BROKER_KEYS[key]
        parsed: int | bool
        if kind == _SIZE:
            parsed = parse_size(key, value)
        elif kind == _BOOL:
            parsed = parse_bool(key, value)
        else:
            parsed = parse_int(key, value)
        _put(self.settings, path, parsed)
        self.where[path] = key

    def bandwidth(self, key: str, value: str) -> None:
        rate = parse_size(key, value)
        for path in BANDWIDTH_PATHS:
            _put(self.settings, path, rate)
            self.where[path] = key

    def coarse_time(self, key: str, value: str) -> None:
        ms_key, factor = COARSE_TIME_KEYS[key]
        finer = [k for k, (m, _) in COARSE_TIME_KEYS.items() if m == ms_key]
        # the .ms key wins, then minutes over hours (Kafka's order)
        for winner in (ms_key, finer[0]):
            if (
                winner != key
                and winner in self.props
                and finer.index(key) >= (0 if winner == ms_key else 1)
            ):
                self.warn(key, f"{winner} is given too, and wins")
                return
        self.topic_default(ms_key, str(parse_int(key, value) * factor))

    def topic_default(self, key: str, value: str) -> None:
        checked = _topic_default(key, value)
        if self.target == "node":
            self.warn(
                key,
                "a cluster-wide topic default: set it once with kafka-configs.sh "
                "--entity-type brokers --entity-default",
            )
            return
        spec = topic_configs.SCHEMA[topic_configs.BROKER_SYNONYMS[key]]
        if checked != spec.default:  # the default needs no dynamic config
            self.topic_defaults[key] = checked

    def fixed(self, key: str, value: str) -> None:
        here, why = FIXED_KEYS[key]
        given = str(parse_bool(key, value)).lower() if here in ("true", "false") else value
        if given != here:
            self.warn(key, why)

    def coordinator_slots(self, key: str, value: str) -> None:
        slots = parse_int(key, value, minimum=1)
        if self.target == "node":
            self.warn(key, "the controllers' setting: cluster init writes it")
        elif slots > 1_000:
            raise PropertiesError(f"{key}: {slots} is above 1000")
        else:
            self.controller_settings["coordinator_slots"] = slots

    def other(self, key: str, value: str) -> None:
        """Keys of no setting here: a warning with the reason."""
        if key in REPLICATION_KEYS:
            parse_int(key, value)
            self.warn(key, "a partition is one stream in object storage: no replicas")
        elif key in THREAD_KEYS:
            self.warn(key, "the broker sizes its threads and buffers itself")
        elif key in QUORUM_KEYS or key in NODE_KEYS:
            if self.target == "cluster":
                self.warn(key, "cluster up places its controllers, brokers and ports itself")
            elif key in QUORUM_KEYS and key != "process.roles":
                self.warn(key, "the node file names the controllers")
        elif key == "s3.ops.buckets":
            try:
                parse_bucket_uris(value)
            except ValueError as exc:
                raise PropertiesError(f"{key}: {exc}") from None
            self.warn(key, "no operations data is uploaded: metrics are served on /metrics")
        elif key == "s3.path.style":
            if "s3.data.buckets" in self.props:
                self.warn(key, "s3.data.buckets' pathStyle parameter says it")
        elif key not in SECRET_KEYS and key not in BUCKET_PART_KEYS and key != "s3.data.buckets":
            self.warn(key, "no such setting here")

    def handler(self, key: str) -> Callable[[str, str], None]:
        if key in BROKER_KEYS:
            return self.broker_key
        if key == BANDWIDTH_KEY:
            return self.bandwidth
        if key in COARSE_TIME_KEYS:
            return self.coarse_time
        if key in topic_configs.BROKER_SYNONYMS:
            return self.topic_default
        if key in FIXED_KEYS:
            return self.fixed
        if key == "offsets.topic.num.partitions":
            return self.coordinator_slots
        return self.other

    def run(self, default_host: str) -> PropertiesMapping:
        buckets, creds = _map_buckets(self.props, self.env)
        wal_in_bucket = False
        if "s3.wal.path" in self.props:
            wal_in_bucket, notes = _map_wal(
                self.props["s3.wal.path"], buckets, self.target, self.settings
            )
            self.warnings += notes
            self.where[("wal",)] = "s3.wal.path"
        if self.target == "node":
            self.warnings += _map_node_keys(self.props, self.settings, default_host)
            for path, key in (
                (("node_id",), "node.id"),
                (("az",), "broker.rack"),
                (("data_dir",), "log.dirs"),
                (("listeners",), "listeners"),
                (("advertised_listeners",), "advertised.listeners"),
            ):
                self.where[path] = key
        for key, value in self.props.items():
            if key != "s3.wal.path":
                self.handler(key)(key, value)
        self._check_wal_capacity()
        _validate_settings(self.settings, self.where)
        return PropertiesMapping(
            settings=self.settings,
            bucket_uris=format_bucket_uris(buckets) if buckets else None,
            bucket_credentials=creds,
            wal_in_bucket=wal_in_bucket,
            topic_defaults=self.topic_defaults,
            controller_settings=self.controller_settings,
            warnings=tuple(self.warnings),
        )

    def _check_wal_capacity(self) -> None:
        """s3.wal.capacity and s3.wal.path's capacity must agree."""
        if "s3.wal.capacity" not in self.props or "capacity=" not in self.props.get(
            "s3.wal.path", ""
        ):
            return
        raw = self.props["s3.wal.path"].split("capacity=", 1)[1].split("&", 1)[0]
        if parse_size("s3.wal.path capacity", raw) != self.settings["wal"]["capacity_bytes"]:
            raise PropertiesError("s3.wal.capacity: differs from s3.wal.path's capacity")


def with_known_buckets(
    props: Mapping[str, str], env: Mapping[str, str], bucket_uris: str | None
) -> dict[str, str]:
    """`props`, given to buckets named elsewhere (`--bucket-uris`, a node file): when they
    name no buckets but KAFKA_S3_ACCESS_KEY is given (in them or in `env`), `bucket_uris`
    becomes their s3.data.buckets, so the credentials apply to those buckets."""
    out = dict(props)
    names_buckets = "s3.data.buckets" in out or any(k in out for k in BUCKET_PART_KEYS)
    if bucket_uris and not names_buckets and any(k in out or k in env for k in SECRET_KEYS):
        out["s3.data.buckets"] = bucket_uris
    return out


def map_properties(
    props: Mapping[str, str],
    target: Target,
    env: Mapping[str, str] | None = None,
    default_host: str = "0.0.0.0",
) -> PropertiesMapping:
    """`props` (the file's keys with the overrides applied) in this broker's terms, for
    `cluster up` (target "cluster") or one broker (`node run`, target "node"); `env` the
    environment (KAFKA_S3_ACCESS_KEY / KAFKA_S3_SECRET_KEY, AutoMQ's way of passing them),
    `default_host` the host of a listener that names none. PropertiesError names the key
    of a malformed or contradictory value."""
    return _Mapper(props, target, env or {}).run(default_host)


def mapping_markdown() -> list[str]:
    """The mapping table's lines for docs/configuration.md."""
    lines = [
        "## AutoMQ's and Kafka's keys (`server.properties`)",
        "",
        "`automqctl cluster up --config server.properties` and `automqctl node run --config "
        "NODE.json --properties server.properties` read AutoMQ's and Kafka's broker keys "
        "(Java `.properties` syntax; `--override key=value` replaces a key, as AutoMQ's "
        "`kafka-server-start.sh` takes it). Each key is mapped as below; a key that is not "
        "used is named in one warning line on stderr; a malformed or contradictory value "
        "stops the command (exit 1) before anything starts, naming the key.",
        "",
        "| Key | Here | Note |",
        "|---|---|---|",
    ]
    lines += [f"| `{m.key}` | {m.setting} | {m.note} |" for m in MAPPING_TABLE]
    return lines + [""]


MAPPING_TABLE = _mapping_table()
