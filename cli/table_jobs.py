"""Table topics for a local cluster: the catalog config, the sync job's run and history,
and each table's state and lag (no Spark here; PyIceberg only when a table topic exists).

The job runs as its own process (`python -m spark_jobs.table_sync`), as compaction does;
its files live in `<cluster dir>/tables/`:

    catalog.json    the catalog (`automqctl table catalog`); absent: the embedded default,
                    a SQLite catalog `catalog.db` here, the warehouse in the first bucket
    job.json        the job config (no secrets); job.log the last run's stderr
    running.json    the run in progress; runs.jsonl the last MAX_RUNS results
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from cli import compaction_jobs
from cli.cluster_config import ClusterConfig
from cli.job_runs import JOB_TIMEOUT_S, MAX_RUNS, JobRuns
from cli.kafka_util import librdkafka_security
from cli.local_cluster import LocalCluster
from controlplane.client import ControllerClient
from controlplane.image import MetadataImage
from controlplane.requests import AlterTopicConfigsRequest, TopicConfigOp
from dataplane.objectstore import BucketURI
from dataplane.tables import spec as ts
from dataplane.tables.catalog import CatalogConfig, default_catalog_config


def tables_dir(cluster_dir: Path) -> Path:
    return Path(cluster_dir) / "tables"


def catalog_config(cluster_dir: Path, config: ClusterConfig) -> CatalogConfig:
    """The cluster's catalog: tables/catalog.json, else the embedded default."""
    path = tables_dir(cluster_dir) / "catalog.json"
    if path.exists():
        return CatalogConfig.model_validate_json(path.read_text())
    return default_catalog_config(cluster_dir, config.buckets[0].uri)


def save_catalog_config(cluster_dir: Path, catalog: CatalogConfig) -> None:
    path = tables_dir(cluster_dir) / "catalog.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(catalog.model_dump_json(indent=2))


def warehouse_credentials(config: ClusterConfig) -> dict[str, str]:
    """boto3-style keys of the warehouse bucket (the cluster's first bucket)."""
    bucket = config.buckets[0]
    if bucket.access_key:
        return {"aws_access_key_id": bucket.access_key, "aws_secret_access_key": bucket.secret_key}
    return BucketURI.parse(bucket.uri).credentials()


def image(config: ClusterConfig, timeout_s: float = 15.0) -> MetadataImage:
    client = _controller(config, timeout_s)
    raw = client.leader_get("/v1/image")
    if isinstance(raw, str):
        return MetadataImage.model_validate_json(raw)
    return MetadataImage.model_validate(raw)


def _controller(config: ClusterConfig, timeout_s: float = 15.0) -> ControllerClient:
    return config.controller_client(timeout_s=timeout_s, request_timeout_s=min(timeout_s, 10.0))


def set_table_enabled(config: ClusterConfig, topic: str, enabled: bool) -> None:
    """Set the topic's automq.table.topic.enable (the controller validates it)."""
    op = TopicConfigOp(key="automq.table.topic.enable", op="set", value=str(enabled).lower())
    _controller(config).alter_topic_configs(AlterTopicConfigsRequest(name=topic, ops=[op]))


def job_config(cluster_dir: Path, config: ClusterConfig, master: str, topics: list[str]) -> dict:
    """The sync job's config for this cluster (no secrets)."""
    return {
        "controllers": config.quorum_config().api_addresses(),
        "buckets": {b.bucket_id: b.uri for b in config.buckets},
        "warehouse_bucket_id": config.buckets[0].bucket_id,
        "catalog": catalog_config(cluster_dir, config).model_dump(),
        "master": master,
        "cluster_dir": str(Path(cluster_dir).resolve()),
        "topics": topics,
    }


def job_runs(cluster_dir: Path) -> JobRuns:
    """The sync job's running.json, runs.jsonl and job.log."""
    return JobRuns(tables_dir(cluster_dir), MAX_RUNS)


def run_sync(
    cluster_dir: Path,
    config: ClusterConfig,
    master: str,
    topics: list[str],
    trigger: str = "manual",
    on_event: Callable[[dict], None] | None = None,
    extra_env: dict[str, str] | None = None,
) -> tuple[dict, int]:
    """Run the sync job once to its end: (result, exit code); recorded in runs.jsonl."""
    tdir = tables_dir(cluster_dir)
    tdir.mkdir(parents=True, exist_ok=True)
    cfg_path = tdir / "job.json"
    cfg_path.write_text(json.dumps(job_config(cluster_dir, config, master, topics), indent=2))
    argv = [sys.executable, "-m", "spark_jobs.table_sync", "--config", str(cfg_path)]
    env = {
        **compaction_jobs.job_env(config),
        **kafka_client_env(cluster_dir, config),
        **(extra_env or {}),
    }
    runs = job_runs(cluster_dir)
    started = time.time()
    state = {"started": started, "trigger": trigger}
    result, code = runs.run_process(argv, env, state, on_event, timeout_s=JOB_TIMEOUT_S)
    if not result:
        result = {"error": runs.failure_text(code, max_chars=500)}
    runs.finish({"start": started, "trigger": trigger, "exit_code": code, **result})
    return result, code


def kafka_client_env(cluster_dir: Path, config: ClusterConfig) -> dict[str, str]:
    """For a secured cluster (SASL/TLS listeners), the admin's librdkafka settings for the
    job's ListOffsets, in its environment (they hold the password); empty otherwise (the job
    finds the PLAINTEXT listeners in the metadata)."""
    security = LocalCluster(cluster_dir).client_security()
    if not security:
        return {}
    settings = {"bootstrap.servers": config.bootstrap_servers(), **librdkafka_security(security)}
    return {ts.SYNC_KAFKA_CLIENT_ENV: json.dumps(settings)}


def last_runs(cluster_dir: Path, limit: int = 10) -> list[dict]:
    return job_runs(cluster_dir).last_runs(limit)


def running_sync(cluster_dir: Path) -> dict | None:
    return job_runs(cluster_dir).running()


def run_scheduled_sync(cluster_dir: Path, config: ClusterConfig, master: str) -> tuple[dict, int]:
    """The compaction scheduler's table step: a sync when some table topic exists and no
    sync runs; ({}, 0) otherwise."""
    if running_sync(cluster_dir) or not ts.table_topics(image(config)):
        return {}, 0
    return run_sync(cluster_dir, config, master, [], trigger="schedule")


def table_states(cluster_dir: Path, config: ClusterConfig, img: MetadataImage | None = None):
    """Every table topic's table: identifier, mode, offsets held, committed ends, lag
    (records' offsets behind the committed end), snapshot, columns; `error` when the
    catalog or table cannot be read."""
    img = img or image(config)
    specs = ts.table_topics(img)
    if not specs:
        return []
    from dataplane.tables import catalog as cat

    try:
        catalog = cat.open_catalog(
            catalog_config(cluster_dir, config), warehouse_credentials(config)
        )
    except Exception as exc:  # noqa: BLE001 - shown per table
        return [{"topic": s.topic, "table": s.full_name, "error": str(exc)[:300]} for s in specs]
    return [_table_state(catalog, img, spec) for spec in specs]


def _table_state(catalog, img: MetadataImage, spec: ts.TableTopicSpec) -> dict:
    from dataplane.tables import catalog as cat

    topic = img.topic_by_name(spec.topic)
    ends = {}
    for partition, state in sorted(topic.partitions.items()):
        stream = img.streams.get(state.stream_id)
        ends[partition] = stream.end_offset if stream else 0
    out = {
        "topic": spec.topic,
        "table": spec.full_name,
        "schema_type": spec.schema_type,
        "partition_by": spec.partition_transform,
        "committed_end": {str(p): e for p, e in ends.items()},
    }
    try:
        table = catalog.load_table(spec.identifier)
    except Exception as exc:  # noqa: BLE001 - NoSuchTableError: never synced
        if type(exc).__name__ != "NoSuchTableError":
            return {**out, "error": str(exc)[:300]}
        return {**out, "exists": False, "held": {}, "lag": sum(ends.values())}
    held, _ = cat.held_offsets(table)
    snapshot = table.current_snapshot()
    return {
        **out,
        "exists": True,
        "location": table.location(),
        "held": {str(p): o for p, o in sorted(held.items())},
        "lag": sum(max(e - held.get(p, 0), 0) for p, e in ends.items()),
        "snapshot_id": snapshot.snapshot_id if snapshot else None,
        "columns": cat.column_types(table),
        "partition_spec": str(table.spec()),
    }


def status_tables(cluster_dir: Path, config: ClusterConfig, timeout_s: float = 3.0) -> list:
    """`cluster status`'s tables: each table topic's table, lag and held offsets; one
    entry with `error` when the metadata or the catalog cannot be read."""
    try:
        states = table_states(cluster_dir, config, image(config, timeout_s))
    except Exception as exc:  # noqa: BLE001 - status reports, never fails on it
        return [{"error": f"table topics unknown: {str(exc)[:200]}"}]
    keys = ("topic", "table", "lag", "held", "committed_end", "exists", "error")
    return [{k: s[k] for k in keys if k in s} for s in states]
