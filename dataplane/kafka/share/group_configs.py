"""Group configs of share groups (KIP-932; Kafka's GROUP config resource, type 32):
`share.record.lock.duration.ms`, `share.delivery.count.limit`, `share.auto.offset.reset`,
`share.session.timeout.ms`, `share.heartbeat.interval.ms`, `share.isolation.level`
(read_uncommitted only). Set with IncrementalAlterConfigs / AlterConfigs, read with
DescribeConfigs (`kafka-configs --entity-type groups`, confluent-kafka's
`ResourceType.GROUP`); a key not set falls back to the broker's `share_groups` config.

Stored in the controller KV as one JSON document per group (`group-configs/<group>`), read
from the metadata image. A share-partition takes the lock duration at each acquisition and
the delivery count limit and offset reset when it is loaded.

Pure except `alter`, which blocks on the controller (call it on the I/O pool).
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from controlplane.calls import ControllerCalls, build_request
from controlplane.errors import ControllerError
from controlplane.requests import PutKVRequest
from dataplane.formats.kafka_errors import KafkaError

from .partitions import ShareSettings

RESOURCE_GROUP = 32
KEY_PREFIX = "group-configs/"
VISIBLE_WAIT_S = 10.0
MAX_GROUP_ID_LENGTH = 255


class GroupConfigSource(enum.Enum):
    """DescribeConfigs' config_source for group configs (Kafka's numbering)."""

    DEFAULT_CONFIG = 5
    DYNAMIC_GROUP_CONFIG = 8


@dataclass(frozen=True)
class _Key:
    name: str
    kind: str  # "int" | "enum"
    low: int = 0
    high: int = 0
    choices: tuple[str, ...] = ()
    doc: str = ""


_KEYS = {
    k.name: k
    for k in (
        _Key(
            "share.record.lock.duration.ms",
            "int",
            1_000,
            3_600_000,
            doc="how long a delivered record stays locked to its consumer",
        ),
        _Key("share.delivery.count.limit", "int", 2, 10, doc="deliveries before archiving"),
        _Key(
            "share.auto.offset.reset",
            "enum",
            choices=("latest", "earliest"),
            doc="where the group starts a partition it never read",
        ),
        _Key("share.session.timeout.ms", "int", 1_000, 1_800_000, doc="member session timeout"),
        _Key("share.heartbeat.interval.ms", "int", 100, 60_000, doc="member heartbeat interval"),
        _Key(
            "share.isolation.level",
            "enum",
            choices=("read_uncommitted",),
            doc="records of open and aborted transactions are delivered",
        ),
    )
}
_INT_TYPE, _STRING_TYPE = 3, 2  # DescribeConfigs config_type


@dataclass(frozen=True)
class GroupConfigRow:
    """One DescribeConfigs row of a group (the attributes topic rows have)."""

    name: str
    value: str | None
    source: GroupConfigSource
    read_only: bool
    config_type: int
    doc: str | None
    synonyms: tuple = ()


def stored(image: Any, group_id: str) -> dict[str, str]:
    """The group configs set on `group_id` (from the image)."""
    raw = image.kv.get(KEY_PREFIX + group_id)
    if not raw:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return {k: str(v) for k, v in doc.items() if k in _KEYS} if isinstance(doc, dict) else {}


def settings_for(image: Any, group_id: str, defaults: ShareSettings) -> ShareSettings:
    """The share-partition settings of `group_id`: its group configs over `defaults`."""
    configs = stored(image, group_id)
    out = defaults
    if "share.record.lock.duration.ms" in configs:
        out = replace(out, record_lock_duration_ms=int(configs["share.record.lock.duration.ms"]))
    if "share.delivery.count.limit" in configs:
        out = replace(out, delivery_count_limit=int(configs["share.delivery.count.limit"]))
    if "share.auto.offset.reset" in configs:
        out = replace(out, auto_offset_reset=configs["share.auto.offset.reset"])
    return out


def describe(image: Any, group_id: str, defaults: ShareSettings) -> list[GroupConfigRow]:
    """Every share group config of `group_id` with its value in force and source."""
    configs = stored(image, group_id)
    default_values = {
        "share.record.lock.duration.ms": str(defaults.record_lock_duration_ms),
        "share.delivery.count.limit": str(defaults.delivery_count_limit),
        "share.auto.offset.reset": defaults.auto_offset_reset,
        "share.session.timeout.ms": "45000",
        "share.heartbeat.interval.ms": "5000",
        "share.isolation.level": "read_uncommitted",
    }
    rows = []
    for name, key in sorted(_KEYS.items()):
        is_set = name in configs
        rows.append(
            GroupConfigRow(
                name=name,
                value=configs[name] if is_set else default_values[name],
                source=GroupConfigSource.DYNAMIC_GROUP_CONFIG
                if is_set
                else GroupConfigSource.DEFAULT_CONFIG,
                read_only=False,
                config_type=_INT_TYPE if key.kind == "int" else _STRING_TYPE,
                doc=key.doc,
            )
        )
    return rows


def validate_ops(current: dict[str, str], ops: list[dict]) -> dict[str, str]:
    """The group's configs after `ops` ({"key", "op": set|delete, "value"}); ValueError
    naming the first bad key or value (nothing is changed then)."""
    out = dict(current)
    for op in ops:
        key, kind, value = op["key"], op["op"], op.get("value")
        spec = _KEYS.get(key)
        if spec is None:
            raise ValueError(f"unknown group config {key!r} (served: {', '.join(sorted(_KEYS))})")
        if kind == "delete":
            out.pop(key, None)
            continue
        if kind != "set":
            raise ValueError(f"{key} is not a list: {kind} is not allowed")
        if spec.kind == "int":
            try:
                number = int(str(value))
            except ValueError:
                raise ValueError(f"{key}={value!r} is not an integer") from None
            if not spec.low <= number <= spec.high:
                raise ValueError(f"{key}={number} is outside [{spec.low}, {spec.high}]")
            out[key] = str(number)
        else:
            if value not in spec.choices:
                raise ValueError(f"{key}={value!r} is not one of {', '.join(spec.choices)}")
            out[key] = str(value)
    return out


def alter(
    controller: ControllerCalls,
    image_fn: Callable[[], Any],
    group_id: str,
    ops: list[dict],
    replace_all: bool,
    validate_only: bool,
) -> tuple[KafkaError, str | None]:
    """Apply `ops` to `group_id`'s configs (AlterConfigs: `replace_all`), stored in the
    controller KV; returns once this broker's image shows them. Blocking."""
    if not group_id or len(group_id) > MAX_GROUP_ID_LENGTH:
        return KafkaError.INVALID_REQUEST, "a group config needs a group id of 1-255 characters"
    current = {} if replace_all else stored(image_fn(), group_id)
    try:
        configs = validate_ops(current, ops)
    except ValueError as exc:
        return KafkaError.INVALID_CONFIG, str(exc)
    if validate_only:
        return KafkaError.NONE, None
    value = json.dumps(configs, sort_keys=True) if configs else None
    key = KEY_PREFIX + group_id
    try:
        controller.send(build_request(PutKVRequest, key=key, value=value))
    except ControllerError as exc:
        return KafkaError.UNKNOWN_SERVER_ERROR, exc.message
    deadline = time.monotonic() + VISIBLE_WAIT_S
    while image_fn().kv.get(key) != value and time.monotonic() < deadline:
        time.sleep(0.01)
    return KafkaError.NONE, None
