"""The Iceberg catalog of table topics (PyIceberg): open it, create a topic's table, read
the offsets the table holds, commit a run's Parquet files.

A catalog is named by a URI (`CatalogConfig.uri`):

* `sqlite:///<path>` (or any SQLAlchemy URL): PyIceberg's SQL catalog; the embedded
  default is `<cluster dir>/tables/catalog.db`;
* `http(s)://...`: an Iceberg REST catalog; with `rest_signing_name` its requests are
  signed with AWS SigV4 by the warehouse's credentials (`s3tables`: AWS S3 Tables and the
  embedded store's own catalog, SeaweedFS's S3 Tables buckets).

The warehouse (where tables' metadata and data files go) is `s3://<bucket>/iceberg` of the
cluster's first bucket by default, reached at the bucket's endpoint with its credentials
(given to `open_catalog`, never stored in the config); a `file://` warehouse serves tests.

Exactly-once: a run's files are written first; `commit_files` adds them and the new end
offsets (in the snapshot summary) in ONE Iceberg commit, which PyIceberg makes conditional
on the table's current snapshot: a run that raced another (or re-reads a stale table)
fails its commit and changes nothing. Files of a run that never committed are never
referenced (orphans; harmless to readers).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from dataplane.objectstore import BucketURI
from dataplane.tables import spec as ts

CATALOG_NAME = "automq"
# PyIceberg retries a commit that lost a race by re-applying its append on the new snapshot:
# for the sync that would add a run's records on top of the run that won (duplicates). A
# table topic's table is kept at 0 retries: a raced commit fails, the next run starts again
# from the offsets the winner recorded.
NO_RETRIES = {"commit.retry.num-retries": "0"}
MAX_SNAPSHOTS_WALKED = 10_000  # ancestors searched for the last offsets summary


class CatalogConfig(BaseModel):
    """Where the table topics' catalog and warehouse are (no secrets)."""

    uri: str = Field(min_length=1, max_length=2048)
    warehouse: str = Field(min_length=1, max_length=2048)
    s3_endpoint: str | None = None  # the warehouse bucket's endpoint (None: AWS's)
    s3_region: str = "us-east-1"
    # a REST catalog whose requests are SigV4-signed for this service (None: unsigned)
    rest_signing_name: str | None = Field(default=None, pattern=r"^[a-z0-9-]{1,64}$")

    def kind(self) -> str:
        """ "rest" or "sql"."""
        return "rest" if self.uri.startswith(("http://", "https://")) else "sql"


def default_catalog_config(cluster_dir: Path, bucket_uri: str) -> CatalogConfig:
    """The embedded default: a SQLite catalog in the cluster directory, the warehouse in
    the cluster's bucket `bucket_uri` (an `<id>@s3://...` entry)."""
    bucket = BucketURI.parse(bucket_uri)
    db = (Path(cluster_dir).resolve() / "tables" / "catalog.db").as_posix()
    return CatalogConfig(
        uri=f"sqlite:///{db}",
        warehouse=f"s3://{bucket.bucket}/iceberg",
        s3_endpoint=bucket.endpoint,
        s3_region=bucket.region,
    )


def catalog_properties(config: CatalogConfig, credentials: Mapping[str, str]) -> dict:
    """PyIceberg catalog properties; `credentials` holds boto3-style keys
    (aws_access_key_id, aws_secret_access_key[, aws_session_token])."""
    props = {"uri": config.uri, "warehouse": config.warehouse, "s3.region": config.s3_region}
    if config.s3_endpoint:
        props["s3.endpoint"] = config.s3_endpoint
    props.update(_key_properties("s3", credentials))  # the warehouse's files
    if config.kind() == "rest" and config.rest_signing_name:
        props["rest.sigv4-enabled"] = "true"
        props["rest.signing-region"] = config.s3_region
        props["rest.signing-name"] = config.rest_signing_name
        props["client.region"] = config.s3_region
        props.update(_key_properties("client", credentials))  # the catalog's signatures
    return props


def _key_properties(prefix: str, credentials: Mapping[str, str]) -> dict[str, str]:
    """PyIceberg's `<prefix>.access-key-id` etc. from boto3-style keys."""
    out = {}
    if credentials.get("aws_access_key_id"):
        out[f"{prefix}.access-key-id"] = credentials["aws_access_key_id"]
        out[f"{prefix}.secret-access-key"] = credentials["aws_secret_access_key"]
    if credentials.get("aws_session_token"):
        out[f"{prefix}.session-token"] = credentials["aws_session_token"]
    return out


def embedded_rest_catalog_config(
    iceberg_endpoint: str, table_bucket: str, s3_endpoint: str, s3_region: str = "us-east-1"
) -> CatalogConfig:
    """The embedded store's own Iceberg REST catalog (SeaweedFS serves one over its S3
    Tables bucket `table_bucket`, SigV4-signed like AWS S3 Tables)."""
    return CatalogConfig(
        uri=iceberg_endpoint,
        warehouse=f"s3://{table_bucket}",
        s3_endpoint=s3_endpoint,
        s3_region=s3_region,
        rest_signing_name="s3tables",
    )


def open_catalog(config: CatalogConfig, credentials: Mapping[str, str]):
    """The PyIceberg catalog of `config` (SQL: its tables are created if missing)."""
    props = catalog_properties(config, credentials)
    if config.kind() == "rest":
        from pyiceberg.catalog.rest import RestCatalog

        return RestCatalog(CATALOG_NAME, **props)
    from pyiceberg.catalog.sql import SqlCatalog

    if config.uri.startswith("sqlite:///"):
        Path(config.uri[len("sqlite:///") :]).parent.mkdir(parents=True, exist_ok=True)
    return SqlCatalog(CATALOG_NAME, **props)


def filesystem(location: str, config: CatalogConfig, credentials: Mapping[str, str]):
    """(pyarrow file system, path) of a table location: S3 at the warehouse's endpoint
    for s3://, the local file system for file:// or a plain path."""
    from pyarrow import fs

    parts = urlsplit(location)
    if parts.scheme in ("s3", "s3a"):
        endpoint = urlsplit(config.s3_endpoint) if config.s3_endpoint else None
        s3 = fs.S3FileSystem(
            access_key=credentials.get("aws_access_key_id"),
            secret_key=credentials.get("aws_secret_access_key"),
            session_token=credentials.get("aws_session_token"),
            region=config.s3_region,
            endpoint_override=endpoint.netloc if endpoint else None,
            scheme=endpoint.scheme if endpoint else "https",
            request_timeout=60,
            connect_timeout=5,
        )
        return s3, f"{parts.netloc}{parts.path}"
    if parts.scheme == "file":
        return fs.LocalFileSystem(), parts.path
    return fs.LocalFileSystem(), location


def _iceberg_type(kind: str):
    from pyiceberg import types as it

    simple = {
        "boolean": it.BooleanType,
        "int": it.IntegerType,
        "long": it.LongType,
        "double": it.DoubleType,
        "string": it.StringType,
        "binary": it.BinaryType,
        "timestamptz": it.TimestamptzType,
    }
    return simple[kind]()


def column_types(table) -> dict[str, str]:
    """The table's top-level columns as {name: spec type name} (`rows.ARROW_TYPES` keys;
    "headers" for a list column, "other" for a type the sync never writes)."""
    from pyiceberg import types as it

    names = {
        it.BooleanType: "boolean",
        it.IntegerType: "int",
        it.LongType: "long",
        it.DoubleType: "double",
        it.StringType: "string",
        it.BinaryType: "binary",
        it.TimestamptzType: "timestamptz",
        it.ListType: "headers",
    }
    return {f.name: names.get(type(f.field_type), "other") for f in table.schema().fields}


def create_table(catalog, spec: ts.TableTopicSpec, columns: Mapping[str, str]):
    """The topic's table, created (v2, partitioned by the spec's transform of
    `_kafka_timestamp`) if it does not exist; its namespace too."""
    from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError
    from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, YearTransform

    from dataplane.tables.rows import arrow_schema

    try:
        return catalog.load_table(spec.identifier)
    except Exception as exc:  # noqa: BLE001 - NoSuchTableError, or the catalog's own
        if type(exc).__name__ != "NoSuchTableError":
            raise
    try:
        catalog.create_namespace(spec.namespace)
    except NamespaceAlreadyExistsError:
        pass
    transforms = {
        "hour": HourTransform,
        "day": DayTransform,
        "month": MonthTransform,
        "year": YearTransform,
    }
    try:
        txn = catalog.create_table_transaction(
            spec.identifier,
            schema=arrow_schema(columns),
            properties={"format-version": "2", ts.TOPIC_ID_PROPERTY: spec.topic_id, **NO_RETRIES},
        )
        if spec.partition_transform:
            with txn.update_spec() as update:
                update.add_field(
                    ts.TIMESTAMP_COLUMN,
                    transforms[spec.partition_transform](),
                    f"{ts.TIMESTAMP_COLUMN}_{spec.partition_transform}",
                )
        txn.commit_transaction()
    except TableAlreadyExistsError:
        pass  # created meanwhile by another run
    return catalog.load_table(spec.identifier)


def held_offsets(table) -> tuple[dict[int, int], str | None]:
    """(partition -> end offset the table holds, the topic id they belong to) from the
    newest snapshot of the main branch's history that the sync committed; ({}, None) for a
    table no sync has committed to."""
    snapshot = table.current_snapshot()
    for _ in range(MAX_SNAPSHOTS_WALKED):
        if snapshot is None:
            break
        extra = snapshot.summary.additional_properties if snapshot.summary else {}
        if ts.OFFSETS_PROPERTY in extra:
            return ts.decode_offsets(extra[ts.OFFSETS_PROPERTY]), extra.get(ts.TOPIC_ID_PROPERTY)
        if snapshot.parent_snapshot_id is None:
            break
        snapshot = table.snapshot_by_id(snapshot.parent_snapshot_id)
    return {}, None


def commit_files(
    table,
    spec: ts.TableTopicSpec,
    new_columns: Mapping[str, str],
    paths: list[str],
    offsets: Mapping[int, int],
    run_id: str,
) -> int | None:
    """Add the run's files and its end offsets in ONE commit (new columns first, in the
    same commit); the new snapshot id. Refused (CommitFailedException, nothing changed)
    when the table moved since `table` was loaded (never retried: see NO_RETRIES)."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    summary = {
        ts.OFFSETS_PROPERTY: ts.encode_offsets(offsets),
        ts.TOPIC_ID_PROPERTY: spec.topic_id,
        ts.RUN_ID_PROPERTY: run_id,
    }
    if any(table.properties.get(k) != v for k, v in NO_RETRIES.items()):
        with table.transaction() as txn:  # a property changed by hand: back to no retries
            txn.set_properties(**NO_RETRIES)
    with table.transaction() as txn:
        if new_columns:
            with txn.update_schema() as update:
                added = Schema(
                    *[
                        NestedField(i + 1, name, _iceberg_type(kind), required=False)
                        for i, (name, kind) in enumerate(new_columns.items())
                    ]
                )
                update.union_by_name(added)
        if paths:
            txn.add_files(paths, snapshot_properties=summary, check_duplicate_files=False)
        else:  # offsets moved past records the table does not keep (aborted, markers)
            txn.append(_empty_rows(txn), snapshot_properties=summary)
    table.refresh()
    current = table.current_snapshot()
    return current.snapshot_id if current else None


def _empty_rows(txn):
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return schema_to_pyarrow(txn.table_metadata.schema()).empty_table()
