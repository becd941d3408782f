"""What a table topic's Iceberg table is: its name, columns and partitioning (pure).

A topic with `automq.table.topic.enable=true` has one table, `<namespace>.<topic>` (a `.`
of the topic name becomes `_`). Columns:

* `raw` mode: `key`, `value` (binary) and the metadata columns;
* `json` mode: one column per top-level field of the JSON object values (boolean, long,
  double or string; a nested object or array is kept as its JSON text), `_kafka_key`
  (binary) and the metadata columns. A field seen for the first time becomes a new column
  (schema evolution); a column's type never changes once in the table.

Metadata columns (both modes): `_kafka_partition`, `_kafka_offset`, `_kafka_timestamp`
(timestamptz, microseconds), `_kafka_timestamp_type`, `_kafka_headers`. The table is
partitioned by `automq.table.topic.partition.by` on `_kafka_timestamp`.

Which offsets a table holds is recorded in every snapshot the sync job commits, in the
snapshot summary under OFFSETS_PROPERTY (JSON: partition -> end offset, exclusive), with
the topic id under TOPIC_ID_PROPERTY (a topic deleted and created again under the same
name is a different topic: its table is refused rather than mixed).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controlplane import topic_configs as tc

OFFSETS_PROPERTY = "automq.offsets"
TOPIC_ID_PROPERTY = "automq.topic-id"
RUN_ID_PROPERTY = "automq.run-id"
TIMESTAMP_COLUMN = "_kafka_timestamp"
KEY_COLUMN = "_kafka_key"
# (name, type) of the metadata columns, in table order; the types are `rows.ARROW_TYPES` keys
META_COLUMNS: tuple[tuple[str, str], ...] = (
    ("_kafka_partition", "int"),
    ("_kafka_offset", "long"),
    (TIMESTAMP_COLUMN, "timestamptz"),
    ("_kafka_timestamp_type", "int"),
    ("_kafka_headers", "headers"),
)
RAW_COLUMNS: tuple[tuple[str, str], ...] = (("key", "binary"), ("value", "binary"))
JSON_TYPES = ("boolean", "long", "double", "string")
TRANSFORMS = ("hour", "day", "month", "year")
MAX_JSON_COLUMNS = 1_000  # columns a json table may grow to (a run adding more fails)
_PARTITION_BY_RE = re.compile(tc.TABLE_PARTITION_BY_PATTERN)

# the sync job's environment variable holding librdkafka settings (JSON) for its one
# ListOffsets per run: what a cluster without a PLAINTEXT listener needs (SASL/TLS; the
# secrets come by the environment, never in job.json)
SYNC_KAFKA_CLIENT_ENV = "AUTOMQ_TABLE_SYNC_KAFKA"


class TableTopicError(ValueError):
    """A table topic's configuration or data the sync cannot use; the message says what."""


class InvalidRecordError(TableTopicError):
    """A record a json-mode table cannot hold (not a JSON object, a field of a type the
    column cannot take); names the topic, partition and offset."""

    def __init__(self, topic: str, partition: int, offset: int, why: str) -> None:
        super().__init__(f"record at offset {offset} of {topic}-{partition}: {why}")
        self.topic, self.partition, self.offset = topic, partition, offset


@dataclass(frozen=True)
class TableTopicSpec:
    """One table topic: its topic, table identifier, schema mode and partitioning."""

    topic: str
    topic_id: str
    namespace: str
    table_name: str
    schema_type: str  # "raw" | "json"
    partition_transform: str | None  # one of TRANSFORMS, None = unpartitioned
    partitions: tuple[int, ...]
    # "none": a record that does not fit stops the run; "all": it is left out, counted
    errors_tolerance: str = "none"

    @property
    def identifier(self) -> tuple[str, str]:
        """The table's identifier in the catalog (namespace, name)."""
        return (self.namespace, self.table_name)

    @property
    def full_name(self) -> str:
        return f"{self.namespace}.{self.table_name}"

    def fixed_columns(self) -> list[tuple[str, str]]:
        """The columns every table of this mode has (before any JSON field)."""
        own = list(RAW_COLUMNS) if self.schema_type == "raw" else [(KEY_COLUMN, "binary")]
        return own + list(META_COLUMNS)


def table_name_of(topic: str) -> str:
    """The table name of a topic: `.` (an identifier separator) becomes `_`."""
    return topic.replace(".", "_")


def partition_transform(value: str) -> str | None:
    """`[day(timestamp)]` -> "day"; `[]` or "" -> None; TableTopicError otherwise."""
    match = _PARTITION_BY_RE.fullmatch(value.strip())
    if match is None:
        raise TableTopicError(
            f"invalid {tc.TABLE_TOPIC_PARTITION_BY} {value!r}: use "
            "[hour|day|month|year(timestamp)] or []"
        )
    return match.group(2)


def is_table_topic(configs: Mapping[str, str]) -> bool:
    return tc.effective(configs, tc.TABLE_TOPIC_ENABLE).lower() == "true"


def spec_of(name: str, topic_id: str, configs: Mapping[str, str], partitions: Iterable[int]):
    """The TableTopicSpec of a topic from its configs (validated again: a stored value
    that no longer validates is a TableTopicError naming the key)."""
    schema_type = tc.effective(configs, tc.TABLE_TOPIC_SCHEMA_TYPE)
    if schema_type not in ("raw", "json"):
        raise TableTopicError(
            f"invalid {tc.TABLE_TOPIC_SCHEMA_TYPE} {schema_type!r} of topic {name}: raw or json"
        )
    namespace = tc.effective(configs, tc.TABLE_TOPIC_NAMESPACE)
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", namespace):
        raise TableTopicError(f"invalid {tc.TABLE_TOPIC_NAMESPACE} {namespace!r} of {name}")
    return TableTopicSpec(
        topic=name,
        topic_id=topic_id,
        namespace=namespace,
        table_name=table_name_of(name),
        schema_type=schema_type,
        partition_transform=partition_transform(tc.effective(configs, tc.TABLE_TOPIC_PARTITION_BY)),
        partitions=tuple(sorted(partitions)),
        errors_tolerance=_errors_tolerance(name, configs),
    )


def _errors_tolerance(name: str, configs: Mapping[str, str]) -> str:
    tolerance = tc.effective(configs, tc.TABLE_TOPIC_ERRORS_TOLERANCE)
    if tolerance not in ("none", "all"):
        raise TableTopicError(
            f"invalid {tc.TABLE_TOPIC_ERRORS_TOLERANCE} {tolerance!r} of topic {name}: none or all"
        )
    return tolerance


def table_topics(image) -> list[TableTopicSpec]:
    """The table topics of a metadata image (`MetadataImage`), by topic name."""
    out = []
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        if is_table_topic(topic.configs):
            out.append(spec_of(topic.name, topic.topic_id, topic.configs, topic.partitions))
    return out


def select_table_topics(image, names: list[str]) -> list[TableTopicSpec]:
    """The table topics to sync: every one, or those named (TableTopicError for a name
    that is no topic, or no table topic). The sync job and `automqctl table sync` (before
    it starts the job) both check names with it."""
    specs = table_topics(image)
    if not names:
        return specs
    by_name = {s.topic: s for s in specs}
    for name in names:
        if image.topic_by_name(name) is None:
            raise TableTopicError(f"topic {name!r} does not exist")
        if name not in by_name:
            raise TableTopicError(
                f"topic {name!r} is not a table topic (set automq.table.topic.enable=true)"
            )
    return [by_name[n] for n in names]


def encode_offsets(offsets: Mapping[int, int]) -> str:
    """A snapshot summary value: {"partition": end offset} (JSON, keys sorted)."""
    return json.dumps({str(p): int(o) for p, o in sorted(offsets.items())}, sort_keys=False)


def decode_offsets(text: str) -> dict[int, int]:
    """The inverse of `encode_offsets`; TableTopicError for a value it did not write."""
    try:
        raw = json.loads(text)
        return {int(p): int(o) for p, o in raw.items()}
    except (ValueError, TypeError, AttributeError):
        raise TableTopicError(f"unreadable {OFFSETS_PROPERTY} summary {text[:80]!r}") from None


# ------------------------------------------------------------------ JSON columns


def json_type_of(value: object) -> str | None:
    """The column type a JSON value asks for (None for null: it asks for nothing)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    return "string"  # a string, or a nested object/array kept as its JSON text


def merge_json_types(first: str, second: str) -> str:
    """Two types seen for one new field within a run: long and double make double; any
    other disagreement makes string (every value has a text)."""
    if first == second:
        return first
    if {first, second} == {"long", "double"}:
        return "double"
    return "string"


def parse_json_object(
    topic: str, partition: int, offset: int, value: bytes | None
) -> dict[str, object] | None:
    """A json-mode value as a dict (None for a null value: a tombstone keeps its row, with
    null fields); InvalidRecordError for anything but a JSON object."""
    if value is None:
        return None
    try:
        parsed = json.loads(bytes(value))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRecordError(topic, partition, offset, f"value is not JSON ({exc})") from None
    if not isinstance(parsed, dict):
        raise InvalidRecordError(
            topic, partition, offset, f"value is JSON {type(parsed).__name__}, not an object"
        )
    return parsed


def column_value(
    topic: str, partition: int, offset: int, field: str, column_type: str, value: object
) -> object:
    """A JSON field's value for a column of `column_type`; InvalidRecordError when the
    column cannot take it (a text in a long column, ...)."""
    if value is None:
        return None
    found = json_type_of(value)
    if column_type == "string":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if found == column_type:
        return value
    if column_type == "double" and found == "long":
        return float(value)
    raise InvalidRecordError(
        topic, partition, offset, f"field {field!r} is {found}, the table's column is {column_type}"
    )


def plan_columns(
    spec: TableTopicSpec, table_columns: Mapping[str, str], inferred: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """(every column of the run's files, in order; the new ones) for the table's current
    columns and a run's inferred JSON fields: a column already in the table keeps its type."""
    fixed = dict(spec.fixed_columns())
    clash = sorted(set(inferred) & set(fixed))
    if clash:
        raise TableTopicError(
            f"topic {spec.topic}: JSON field(s) {', '.join(clash)} clash with the table's "
            "own columns"
        )
    columns = dict(fixed)
    columns.update({k: v for k, v in table_columns.items() if k not in fixed})
    new = {k: v for k, v in inferred.items() if k not in columns}
    columns.update(new)
    if len(columns) - len(fixed) > MAX_JSON_COLUMNS:
        raise TableTopicError(
            f"topic {spec.topic}: more than {MAX_JSON_COLUMNS} JSON fields; not appended"
        )
    return columns, new
