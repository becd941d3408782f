"""Kafka records -> a table topic's rows -> Parquet files (runs in Spark executors).

Input: Arrow record batches of Spark's Kafka-source schema (`key`, `value`, `partition`,
`offset`, `timestamp`, `timestampType`, `headers`), made from Spark rows by
`source_batches` (the RDD's rows: `mapInArrow` would need pandas on every executor). Output:
Arrow tables of exactly the planned columns (`spec.plan_columns`), split by the table's
partition (one file holds one partition value, as Iceberg's `add_files` requires), written
as Parquet without field ids (the table's name mapping maps them).

Pure but for `write_parquet` (the file system it is given).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dataplane.tables import spec as ts

HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ARROW_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "headers": HEADERS_TYPE,
}
MAX_ROWS_PER_FILE = 1_000_000
# the Kafka-source columns a batch must carry
SOURCE_COLUMNS = ("key", "value", "partition", "offset", "timestamp", "timestampType", "headers")


SOURCE_SCHEMA = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("timestampType", pa.int32()),
        ("headers", HEADERS_TYPE),
    ]
)
# the Kafka-source columns as Spark hands them to `source_batches` (the timestamp as
# microseconds since the epoch: a Python datetime would be in the worker's local time)
SOURCE_SELECT = (
    "key",
    "value",
    "partition",
    "offset",
    "unix_micros(timestamp) AS timestamp",
    "timestampType",
    "headers",
)
BATCH_ROWS = 10_000


def source_batches(records: Iterable) -> Iterable[pa.RecordBatch]:
    """Spark rows of SOURCE_SELECT (tuples: key, value, partition, offset, timestamp in
    microseconds, timestampType, headers as (key, value) pairs) as Arrow batches of
    SOURCE_SCHEMA, BATCH_ROWS at a time."""
    chunk: list = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= BATCH_ROWS:
            yield _source_batch(chunk)
            chunk = []
    if chunk:
        yield _source_batch(chunk)


def _source_batch(chunk: list) -> pa.RecordBatch:
    columns = list(zip(*chunk))
    headers = [[{"key": h[0], "value": h[1]} for h in (hs or [])] for hs in columns[6]]
    arrays = [
        pa.array(columns[0], pa.binary()),
        pa.array(columns[1], pa.binary()),
        pa.array(columns[2], pa.int32()),
        pa.array(columns[3], pa.int64()),
        pa.array(columns[4], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(columns[5], pa.int32()),
        pa.array(headers, HEADERS_TYPE),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=SOURCE_SCHEMA)


def arrow_schema(columns: Mapping[str, str]) -> pa.Schema:
    """The Arrow schema of planned columns (every column nullable)."""
    return pa.schema([pa.field(name, ARROW_TYPES[kind]) for name, kind in columns.items()])


def _meta_arrays(batch: pa.RecordBatch) -> dict[str, pa.Array]:
    headers = batch.column("headers")
    if headers.type != HEADERS_TYPE:
        headers = headers.cast(HEADERS_TYPE)
    return {
        "_kafka_partition": batch.column("partition").cast(pa.int32()),
        "_kafka_offset": batch.column("offset").cast(pa.int64()),
        ts.TIMESTAMP_COLUMN: batch.column("timestamp").cast(ARROW_TYPES["timestamptz"]),
        "_kafka_timestamp_type": batch.column("timestampType").cast(pa.int32()),
        "_kafka_headers": headers,
    }


def infer_json_fields(spec: ts.TableTopicSpec, batches: Iterable[pa.RecordBatch]) -> dict:
    """The JSON fields of the batches' values and their merged types ({name: type});
    InvalidRecordError for a value that is not a JSON object."""
    fields: dict[str, str] = {}
    for batch in batches:
        parts = batch.column("partition").to_pylist()
        offsets = batch.column("offset").to_pylist()
        for part, offset, value in zip(parts, offsets, batch.column("value").to_pylist()):
            try:
                obj = ts.parse_json_object(spec.topic, part, offset, value)
            except ts.InvalidRecordError:
                if spec.errors_tolerance == "none":
                    raise
                continue  # left out of the table (counted when its rows are made)
            for name, item in (obj or {}).items():
                kind = ts.json_type_of(item)
                if kind is not None:
                    fields[name] = ts.merge_json_types(fields.get(name, kind), kind)
    return fields


@dataclass(frozen=True)
class ConvertedRows:
    """A batch's rows, and the records left out of them (errors tolerance `all`)."""

    rows: pa.Table
    skipped: int = 0
    first_skipped: str | None = None  # why the first one was left out


def table_rows(
    spec: ts.TableTopicSpec, columns: Mapping[str, str], batch: pa.RecordBatch
) -> pa.Table:
    """A batch of Kafka records as rows of the table (exactly `columns`, in order)."""
    return convert_batch(spec, columns, batch).rows


def convert_batch(
    spec: ts.TableTopicSpec, columns: Mapping[str, str], batch: pa.RecordBatch
) -> ConvertedRows:
    """A batch as rows of the table. A record that does not fit (json mode) is an
    InvalidRecordError under errors tolerance `none`, left out and counted under `all`."""
    if spec.schema_type == "raw":
        arrays: dict[str, pa.Array] = _meta_arrays(batch)
        arrays["key"] = batch.column("key").cast(pa.binary())
        arrays["value"] = batch.column("value").cast(pa.binary())
        return ConvertedRows(_table_of(columns, arrays))
    fields = [c for c in columns if c not in dict(spec.fixed_columns())]
    values: dict[str, list] = {c: [] for c in fields}
    keep: list[bool] = []
    first: str | None = None
    parts = batch.column("partition").to_pylist()
    offsets = batch.column("offset").to_pylist()
    for part, offset, value in zip(parts, offsets, batch.column("value").to_pylist()):
        try:
            row = _json_row(spec, columns, fields, part, offset, value)
        except ts.InvalidRecordError as exc:
            if spec.errors_tolerance == "none":
                raise
            keep.append(False)
            first = first or str(exc)
            continue
        keep.append(True)
        for name in fields:
            values[name].append(row[name])
    skipped = keep.count(False)
    if skipped:
        batch = batch.filter(pa.array(keep, type=pa.bool_()))
    arrays = _meta_arrays(batch)
    arrays[ts.KEY_COLUMN] = batch.column("key").cast(pa.binary())
    for name in fields:
        arrays[name] = pa.array(values[name], type=ARROW_TYPES[columns[name]])
    return ConvertedRows(_table_of(columns, arrays), skipped, first)


def _json_row(spec, columns, fields, part: int, offset: int, value) -> dict[str, object]:
    obj = ts.parse_json_object(spec.topic, part, offset, value) or {}
    unknown = set(obj) - set(fields)
    if unknown:  # inference saw every record it kept: only a changed input gets here
        raise ts.InvalidRecordError(
            spec.topic, part, offset, f"field(s) {sorted(unknown)} were not planned"
        )
    return {
        name: ts.column_value(spec.topic, part, offset, name, columns[name], obj.get(name))
        for name in fields
    }


def _table_of(columns: Mapping[str, str], arrays: Mapping[str, pa.Array]) -> pa.Table:
    schema = arrow_schema(columns)
    return pa.Table.from_arrays([arrays[name] for name in schema.names], schema=schema)


def partition_keys(spec: ts.TableTopicSpec, rows: pa.Table) -> pa.Array | None:
    """Each row's partition value (Iceberg's transform of `_kafka_timestamp`: hours, days,
    months or years since 1970), None for an unpartitioned table."""
    transform = spec.partition_transform
    if transform is None:
        return None
    stamp = rows.column(ts.TIMESTAMP_COLUMN)
    if transform in ("hour", "day"):
        micros = pc.cast(stamp, pa.int64())
        unit = 3_600_000_000 if transform == "hour" else 86_400_000_000
        # floor division (timestamps before 1970 are negative)
        return pc.floor(pc.divide(pc.cast(micros, pa.float64()), float(unit))).cast(pa.int64())
    years = pc.subtract(pc.year(stamp), 1970)
    if transform == "year":
        return years.cast(pa.int64())
    return pc.add(pc.multiply(years, 12), pc.subtract(pc.month(stamp), 1)).cast(pa.int64())


def split_by_partition(
    spec: ts.TableTopicSpec, rows: pa.Table
) -> list[tuple[int | None, pa.Table]]:
    """The rows grouped by partition value: [(value, rows)], values ascending."""
    keys = partition_keys(spec, rows)
    if keys is None:
        return [(None, rows)] if rows.num_rows else []
    out = []
    for value in sorted(set(keys.to_pylist())):
        out.append((value, rows.filter(pc.equal(keys, value))))
    return out


def write_parquet(
    filesystem, fs_directory: str, uri_directory: str, prefix: str, rows: pa.Table
) -> list[dict]:
    """Write `rows` under `fs_directory` (a path of `filesystem`; `uri_directory` is its
    URI) as Parquet files of at most MAX_ROWS_PER_FILE rows each, named
    `<prefix>-<uuid>.parquet`; [{path (URI), records}]."""
    if filesystem.type_name == "local":
        filesystem.create_dir(fs_directory, recursive=True)
    out = []
    for start in range(0, rows.num_rows, MAX_ROWS_PER_FILE):
        part = rows.slice(start, MAX_ROWS_PER_FILE)
        name = f"{prefix}-{uuid.uuid4().hex}.parquet"
        pq.write_table(
            part, f"{fs_directory.rstrip('/')}/{name}", filesystem=filesystem, compression="zstd"
        )
        out.append({"path": f"{uri_directory.rstrip('/')}/{name}", "records": part.num_rows})
    return out
