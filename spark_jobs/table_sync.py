"""The table sync job: append each table topic's newly committed records to its Iceberg
table, exactly once.

    python -m spark_jobs.table_sync --config table_job.json [--master local[*]] [--topic T]

`table_job.json` (SyncJobConfig) names the controllers, buckets and catalog (no secrets:
object-store keys come from the environment, as for compaction). stdout: one JSON line per
event (`{"event": "topic"|"result", ...}`); the last line is the result. Spark's logs go to
stderr.

Per table topic (`dataplane.tables.spec`), in order:

1. the table is created if missing (v2, its partition spec); the offsets it holds are read
   from its newest sync snapshot's summary (`catalog.held_offsets`);
2. the range of each partition is [held end (or the log start), the committed end]: only
   records already in objects (never a broker's WAL), and not past the last stable offset
   (an open transaction waits; the source would stop there), at most
   `max_records_per_partition`;
   records retention deleted before a sync reached them are counted (`skipped_retention`);
3. the records are read on the executors with the `automq` source (straight from the
   objects, read_committed: aborted records and markers are never rows); json mode infers the fields in one pass (a value that is not a JSON
   object fails the run, naming its partition and offset: nothing is committed);
4. the executors write Parquet files (one partition value each) straight to the warehouse;
5. the driver commits them with the new end offsets in ONE Iceberg commit
   (`catalog.commit_files`), conditional on the snapshot it read: a crash before it leaves
   the table as it was (the files are unreferenced), a re-run starts again from the same
   offsets, a run that raced another one fails its commit. No record is added twice or
   skipped.

Test hook: AUTOMQ_TABLE_SYNC_FAULT=before_commit makes the driver exit (code 17) after the
files are written, before the commit (a crash at the worst point).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from controlplane.client import ControllerClient
from controlplane.errors import ControllerError
from controlplane.image import MetadataImage
from dataplane.objectstore import BucketURI
from dataplane.tables import catalog as cat
from dataplane.tables import spec as ts
from spark_jobs.topic_source import stable
from spark_jobs.topic_source.plan import committed_end

FAULT_ENV = "AUTOMQ_TABLE_SYNC_FAULT"
KAFKA_CLIENT_ENV = ts.SYNC_KAFKA_CLIENT_ENV
FAULT_EXIT_CODE = 17
_RECORD_ERROR_RE = re.compile(r"(record at offset \d+ of .*?)(?:\n|$)")
Emit = Callable[[dict], None]


class SyncJobConfig(BaseModel):
    """What a sync run needs to reach the cluster and the catalog (no secrets)."""

    controllers: list[str] = Field(min_length=1)
    buckets: dict[int, str] = Field(min_length=1)  # bucket id -> URI without credentials
    catalog: cat.CatalogConfig
    warehouse_bucket_id: int = 0  # whose keys reach the warehouse
    master: str = "local[*]"
    cluster_dir: str | None = None  # the `automq` source's `cluster` option when set
    topics: list[str] = Field(default_factory=list)  # empty: every table topic
    max_records_per_partition: int = Field(default=5_000_000, ge=1, le=1_000_000_000)


def _image(client: ControllerClient) -> MetadataImage:
    raw = client.leader_get("/v1/image")
    if isinstance(raw, str):
        return MetadataImage.model_validate_json(raw)
    return MetadataImage.model_validate(raw)


def warehouse_credentials(config: SyncJobConfig) -> dict[str, str]:
    """boto3-style keys of the warehouse bucket (from the environment)."""
    uri = config.buckets.get(config.warehouse_bucket_id) or next(iter(config.buckets.values()))
    return BucketURI.parse(uri).credentials()


# the names' check, shared with `automqctl table sync` (dataplane/tables/spec.py)
select_specs = ts.select_table_topics


def offset_ranges(
    image: MetadataImage, spec: ts.TableTopicSpec, held: dict[int, int], max_records: int
) -> tuple[dict[int, int], dict[int, int], int]:
    """(starts, ends, records skipped by retention) of a run: per partition from the
    table's held end (or the log start, if higher) to the committed end (the end of the
    objects covering the stream contiguously: what the `automq` source reads)."""
    topic = image.topic_by_name(spec.topic)
    starts, ends, skipped = {}, {}, 0
    for partition, state in sorted(topic.partitions.items()):
        stream = image.streams.get(state.stream_id)
        log_start = stream.start_offset if stream else 0
        committed = committed_end(stream) if stream else 0
        have = held.get(partition, 0)
        if have > committed:
            raise ts.TableTopicError(
                f"table {spec.full_name} holds {spec.topic}-{partition} up to {have}, past "
                f"the partition's committed end {committed}"
            )
        start = max(have, log_start)
        skipped += start - have
        starts[partition] = start
        ends[partition] = min(committed, start + max_records)
    return starts, ends, skipped


def cap_at_stable(
    image: MetadataImage, spec: ts.TableTopicSpec, starts: dict[int, int], ends: dict[int, int]
) -> dict[int, int]:
    """Each end at most the partition's last stable offset (asked of the brokers now): the
    `automq` source stops a read_committed read there, so the ends the table records are
    exactly what was read; an open transaction's records wait for a later run."""
    wanted = [(spec.topic, p) for p in sorted(ends)]
    lso = stable.last_stable_offsets(kafka_client_config(image), wanted)
    out = {}
    for partition, end in ends.items():
        cap = lso.get((spec.topic, partition))
        out[partition] = end if cap is None or cap < 0 else max(starts[partition], min(end, cap))
    return out


def kafka_client_config(image: MetadataImage) -> dict[str, str]:
    """librdkafka settings for the brokers: `KAFKA_CLIENT_ENV` when set (a secured
    cluster), else the brokers' PLAINTEXT listeners from the metadata."""
    return env_kafka_config() or {"bootstrap.servers": stable.bootstrap_from_image(image)}


def env_kafka_config() -> dict[str, str] | None:
    """The librdkafka settings `KAFKA_CLIENT_ENV` gives (None: not set); TableTopicError
    for a malformed value."""
    raw = os.environ.get(KAFKA_CLIENT_ENV)
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except ValueError:
        raise ts.TableTopicError(f"{KAFKA_CLIENT_ENV} is not JSON") from None
    if not isinstance(config, dict) or not config.get("bootstrap.servers"):
        raise ts.TableTopicError(f"{KAFKA_CLIENT_ENV} needs an object with bootstrap.servers")
    return {str(k): str(v) for k, v in config.items()}


def read_records(spark, config: SyncJobConfig, spec: ts.TableTopicSpec, starts, ends):
    """The records of the ranges as a DataFrame of Spark's Kafka-source schema: the
    `automq` source (spark_jobs/topic_source), read_committed, straight from the objects."""
    from spark_jobs import topic_source

    topic_source.register(spark)
    # every partition named (one left out would be read from earliest to latest)
    offsets = {spec.topic: {str(p): s for p, s in starts.items()}}
    endings = {spec.topic: {str(p): ends[p] for p in starts}}
    reader = (
        spark.read.format("automq")
        .option("cluster", config.cluster_dir or ",".join(config.controllers))
        .option("topic", spec.topic)
        .option("startingOffsets", json.dumps(offsets))
        .option("endingOffsets", json.dumps(endings))
    )
    if not config.cluster_dir:
        reader = reader.option("buckets", json.dumps(config.buckets))
    # the source's own ListOffsets, given as Spark's Kafka source takes them (kafka.*)
    for key, value in (env_kafka_config() or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load()


def infer_fields(df, spec: ts.TableTopicSpec) -> dict[str, str]:
    """json mode: every field of the values and its type (one pass on the executors)."""
    from dataplane.tables import rows

    def infer(records):
        found = rows.infer_json_fields(spec, rows.source_batches(records))
        return list(found.items())

    merged: dict[str, str] = {}
    source = df.selectExpr(*rows.SOURCE_SELECT).rdd
    for name, kind in source.mapPartitions(infer).collect():
        merged[name] = ts.merge_json_types(merged.get(name, kind), kind)
    return dict(sorted(merged.items()))


def write_files(
    df, spec: ts.TableTopicSpec, columns: dict[str, str], location: str, config: SyncJobConfig
) -> list[dict]:
    """The executors write the rows as Parquet under the table's data directory; the
    files' [{path, records}], and per task that left records out (errors tolerance `all`)
    one {"skipped": n, "first_skipped": why}."""
    from dataplane.tables import rows

    catalog_config = config.catalog
    run_prefix = uuid.uuid4().hex[:12]
    data_uri = location.rstrip("/") + "/data"
    sync_config = config

    def write(records):
        import pyarrow as pa

        converted = [rows.convert_batch(spec, columns, b) for b in rows.source_batches(records)]
        tables = [c.rows for c in converted if c.rows.num_rows]
        written: list[dict] = []
        skipped = sum(c.skipped for c in converted)
        if skipped:
            first = next(c.first_skipped for c in converted if c.first_skipped)
            written.append({"skipped": skipped, "first_skipped": first})
        if tables:
            creds = warehouse_credentials(sync_config)
            filesystem, fs_dir = cat.filesystem(data_uri, catalog_config, creds)
            merged = pa.concat_tables(tables)
            for value, part in rows.split_by_partition(spec, merged):
                prefix = f"{run_prefix}-{'all' if value is None else value}"
                written += rows.write_parquet(filesystem, fs_dir, data_uri, prefix, part)
        return written

    return df.selectExpr(*rows.SOURCE_SELECT).rdd.mapPartitions(write).collect()


def record_error(exc: BaseException) -> str | None:
    """The 'record at offset N of topic-p: ...' text inside a Spark task failure."""
    match = _RECORD_ERROR_RE.search(str(exc))
    return match.group(1).strip() if match else None


def write_run(spark, config, spec: ts.TableTopicSpec, table, starts, ends, timing: dict):
    """Read the ranges and write their rows as Parquet: (columns, new columns, files); no
    files when every range is empty (the offsets still move: retention passed them)."""
    if all(starts[p] >= ends[p] for p in starts):
        columns, new = ts.plan_columns(spec, cat.column_types(table), {})
        return columns, new, []
    started = time.monotonic()
    df = read_records(spark, config, spec, starts, ends)
    inferred = {}
    if spec.schema_type == "json":
        df = df.persist()
        inferred = infer_fields(df, spec)
    columns, new = ts.plan_columns(spec, cat.column_types(table), inferred)
    inferred_at = time.monotonic()
    try:
        files = write_files(df, spec, columns, table.location(), config)
    finally:
        if spec.schema_type == "json":
            df.unpersist()
    timing["infer_s"] = round(inferred_at - started, 3)
    timing["write_s"] = round(time.monotonic() - inferred_at, 3)
    return columns, new, files


def sync_topic(spark, config, catalog, image, spec: ts.TableTopicSpec, emit: Emit) -> dict:
    """One table topic's run: read, write, commit (see the module docstring)."""
    started = time.monotonic()
    table = cat.create_table(catalog, spec, dict(spec.fixed_columns()))
    held, topic_id = cat.held_offsets(table)
    if topic_id is not None and topic_id != spec.topic_id:
        raise ts.TableTopicError(
            f"table {spec.full_name} holds records of an earlier topic {spec.topic} (topic id "
            f"{topic_id}, now {spec.topic_id}): drop or rename the table first"
        )
    starts, ends, skipped = offset_ranges(image, spec, held, config.max_records_per_partition)
    ends = cap_at_stable(image, spec, starts, ends)
    out = {"topic": spec.topic, "table": spec.full_name, "skipped_retention": skipped}
    if all(starts[p] >= ends[p] for p in starts) and skipped == 0:
        return {**out, "appended": 0, "committed": False, "reason": "up to date"}
    timing: dict = {}
    _columns, new, written = write_run(spark, config, spec, table, starts, ends, timing)
    files = [f for f in written if "path" in f]
    left_out = [f for f in written if "skipped" in f]
    if left_out:
        out["skipped_invalid"] = sum(f["skipped"] for f in left_out)
        out["first_skipped_invalid"] = min(f["first_skipped"] for f in left_out)
        emit({"event": "skipped_invalid", "topic": spec.topic, **out})
    appended = sum(f["records"] for f in files)
    emit({"event": "written", "topic": spec.topic, "files": len(files), "records": appended})
    if os.environ.get(FAULT_ENV) == "before_commit":
        print(f"error: {FAULT_ENV}=before_commit: exiting before the commit", file=sys.stderr)
        os._exit(FAULT_EXIT_CODE)
    offsets = {**held, **ends}
    commit_started = time.monotonic()
    snapshot_id = cat.commit_files(
        table, spec, new, [f["path"] for f in files], offsets, uuid.uuid4().hex
    )
    timing["commit_s"] = round(time.monotonic() - commit_started, 3)
    return {
        **out,
        "appended": appended,
        "files": len(files),
        "new_columns": sorted(new),
        "offsets": {str(p): o for p, o in sorted(offsets.items())},
        "snapshot_id": snapshot_id,
        "committed": True,
        "duration_s": round(time.monotonic() - started, 3),
        **timing,
    }


def run(config: SyncJobConfig, emit: Emit, spark=None) -> dict:
    """Sync every selected table topic; each topic commits on its own (a failed topic
    changes nothing of its table and does not stop the others)."""
    started = time.monotonic()
    client = ControllerClient(config.controllers)
    image = _image(client)
    specs = select_specs(image, config.topics)
    results: list[dict] = []
    if specs:
        catalog = cat.open_catalog(config.catalog, warehouse_credentials(config))
        spark_started = time.monotonic()
        spark = spark or _spark_session(config.master)
        emit({"event": "spark_started", "seconds": round(time.monotonic() - spark_started, 3)})
        for spec in specs:
            try:
                result = sync_topic(spark, config, catalog, image, spec, emit)
            except Exception as exc:  # noqa: BLE001 - reported per topic, the others go on
                why = record_error(exc) or f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                result = {"topic": spec.topic, "committed": False, "error": why[:500]}
            emit({"event": "topic", **result})
            results.append(result)
    failed = [r["topic"] for r in results if r.get("error")]
    return {
        "tables": results,
        "failed": failed,
        "appended": sum(r.get("appended", 0) for r in results),
        "duration_s": round(time.monotonic() - started, 3),
        "master": config.master,
    }


def _spark_session(master: str):
    from pyspark.sql import SparkSession

    from spark_jobs.compact import spark_context

    spark_context(master, "automq-table-sync")
    return SparkSession.builder.getOrCreate()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Append table topics to their Iceberg tables")
    parser.add_argument("--config", required=True, help="job config JSON (SyncJobConfig)")
    parser.add_argument("--master", help="Spark master (default: the config's)")
    parser.add_argument("--topic", action="append", default=[], help="only this topic")
    args = parser.parse_args(argv)
    try:
        config = SyncJobConfig.model_validate_json(Path(args.config).read_text())
    except (OSError, ValueError) as exc:
        print(f"error: bad job config {args.config}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    if args.master:
        config.master = args.master
    if args.topic:
        config.topics = args.topic

    def emit(event: dict) -> None:
        print(json.dumps(event), flush=True)

    try:
        result = run(config, emit)
    except ControllerError as exc:
        print(f"error: controller: {exc.message}", file=sys.stderr)
        return 1
    except ts.TableTopicError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # one line for the operator; Spark's log is above on stderr
        print(f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", file=sys.stderr)
        return 1
    emit({"event": "result", **result})
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
