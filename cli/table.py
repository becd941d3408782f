"""`automqctl table list|describe|sync|disable|catalog`: table topics as Iceberg tables.

A topic with `automq.table.topic.enable=true` is appended to its Iceberg table by the
Spark sync job (`spark_jobs/table_sync.py`; cli/table_jobs.py runs it): now with `table
sync`, or on the compaction schedule (`compaction schedule` syncs the table topics after
each compaction run). See docs/spark.md, "Table topics".
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from cli import table_jobs as jobs
from cli.compaction import MasterOption
from cli.options import DirOption, FormatOption, open_cluster
from cli.output import OutputFormat, console, fail, print_data, print_result
from controlplane.errors import ControllerError
from dataplane.objectstore.seaweed import SeaweedConfig
from dataplane.tables.catalog import CatalogConfig, embedded_rest_catalog_config
from dataplane.tables.spec import TableTopicError, select_table_topics

app = typer.Typer(help="Table topics: topics kept as Iceberg tables.", no_args_is_help=True)


def _states(dir: Path) -> list[dict]:
    cluster, config = open_cluster(dir)
    try:
        return jobs.table_states(cluster.dir, config)
    except ControllerError as exc:
        fail(f"cannot read the cluster's metadata: {exc.message}")


@app.command("list")
def list_(dir: Path = DirOption, format: OutputFormat = FormatOption) -> None:
    """Every table topic: its table, mode, lag (offsets behind the committed end)."""
    states = _states(dir)
    if print_data(states, format):
        return
    table = Table(title="table topics")
    for col in ("topic", "table", "mode", "partition by", "lag", "state"):
        table.add_column(col)
    for s in states:
        state = s.get("error") or ("synced" if s.get("exists") else "not synced yet")
        table.add_row(
            s["topic"],
            s["table"],
            s.get("schema_type", ""),
            str(s.get("partition_by") or "-"),
            str(s.get("lag", "?")),
            state,
        )
    console.print(table)


@app.command()
def describe(
    topic: str = typer.Argument(..., help="the table topic"),
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """A table topic's table: location, columns, partitioning, offsets held per partition."""
    states = {s["topic"]: s for s in _states(dir)}
    if topic not in states:
        fail(f"{topic!r} is not a table topic (or does not exist); see `automqctl table list`")
    state = states[topic]
    if print_data(state, format):
        return
    for key in ("topic", "table", "schema_type", "partition_by", "location", "snapshot_id"):
        console.print(f"{key}: {state.get(key)}")
    if state.get("error"):
        console.print(f"[red]error[/]: {state['error']}")
    parts = Table(title="offsets")
    for col in ("partition", "held (end)", "committed end", "lag"):
        parts.add_column(col)
    held = state.get("held", {})
    for p, end in state.get("committed_end", {}).items():
        have = held.get(p, 0)
        parts.add_row(p, str(have), str(end), str(max(end - have, 0)))
    console.print(parts)
    if state.get("columns"):
        console.print("columns: " + ", ".join(f"{k} {v}" for k, v in state["columns"].items()))


@app.command()
def sync(
    dir: Path = DirOption,
    topic: list[str] = typer.Option([], "--topic", help="only this table topic (repeatable)"),
    master: str = MasterOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Append the newly committed records of the table topics to their tables now (exit 1
    when a topic failed: its table is unchanged)."""
    cluster, config = open_cluster(dir)
    if jobs.running_sync(cluster.dir):
        fail("a table sync is already running")
    if topic:  # bad names fail here: no job process, nothing written (job.json, runs.jsonl)
        try:
            select_table_topics(jobs.image(config), topic)
        except TableTopicError as exc:
            fail(f"table sync: {exc}")
        except ControllerError as exc:
            fail(f"cannot read the cluster's metadata: {exc.message}")
    result, code = jobs.run_sync(cluster.dir, config, master, topic)
    if "tables" not in result:
        fail(f"table sync {result.get('error', 'failed')} (log: {cluster.dir}/tables/job.log)")
    if print_data(result, format):
        raise typer.Exit(code)
    table = Table(title="table sync")
    for col in ("topic", "table", "appended", "new columns", "result"):
        table.add_column(col)
    for r in result["tables"]:
        outcome = r.get("error") or ("committed" if r.get("committed") else r.get("reason", ""))
        if r.get("skipped_invalid"):
            outcome += f"; {r['skipped_invalid']} record(s) not fitting left out"
        table.add_row(
            r["topic"],
            r.get("table", ""),
            str(r.get("appended", 0)),
            ", ".join(r.get("new_columns", [])),
            outcome,
        )
    console.print(table)
    raise typer.Exit(code)


@app.command()
def disable(
    topic: str = typer.Argument(..., help="the table topic"),
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Stop syncing a topic (automq.table.topic.enable=false); its table is kept."""
    _, config = open_cluster(dir)
    try:
        jobs.set_table_enabled(config, topic, False)
    except ControllerError as exc:
        fail(f"disabling table topic {topic!r} failed: {exc.message}")
    print_result(
        {"topic": topic, "enabled": False},
        format,
        f"table topic {topic} disabled (its table is kept; enable again with "
        f"`automqctl topic alter {topic} -c automq.table.topic.enable=true`)",
    )


@app.command()
def catalog(
    dir: Path = DirOption,
    uri: str | None = typer.Option(
        None, "--uri", help="sqlite:///path (SQL catalog) or http(s)://... (Iceberg REST)"
    ),
    warehouse: str | None = typer.Option(None, "--warehouse", help="s3://bucket/prefix"),
    s3_endpoint: str | None = typer.Option(None, "--s3-endpoint", help="the warehouse's S3"),
    rest_signing_name: str | None = typer.Option(
        None,
        "--rest-signing-name",
        help="sign the REST catalog's requests with AWS SigV4 for this service "
        "(s3tables: AWS S3 Tables; glue: AWS Glue) with the warehouse's credentials",
    ),
    embedded_rest: bool = typer.Option(
        False,
        "--embedded-rest",
        help="the embedded object store's own Iceberg REST catalog (SeaweedFS S3 Tables)",
    ),
    reset: bool = typer.Option(False, "--reset", help="back to the embedded default"),
    format: OutputFormat = FormatOption,
) -> None:
    """Show the table topics' catalog, or set it (a URI; the default is a SQLite catalog in
    the cluster directory with the warehouse in the cluster's bucket)."""
    cluster, config = open_cluster(dir)
    path = jobs.tables_dir(cluster.dir) / "catalog.json"
    if embedded_rest and (uri or warehouse or s3_endpoint or reset):
        fail(
            "--embedded-rest sets the whole catalog: not with --uri, --warehouse, "
            "--s3-endpoint or --reset"
        )
    if reset:
        path.unlink(missing_ok=True)
    current = jobs.catalog_config(cluster.dir, config)
    if embedded_rest:
        current = _embedded_rest_catalog(config)
        jobs.save_catalog_config(cluster.dir, current)
    elif uri or warehouse or s3_endpoint or rest_signing_name:
        changes = {
            "uri": uri,
            "warehouse": warehouse,
            "s3_endpoint": s3_endpoint,
            "rest_signing_name": rest_signing_name,
        }
        try:
            current = CatalogConfig.model_validate(
                {**current.model_dump(), **{k: v for k, v in changes.items() if v}}
            )
        except ValueError as exc:
            fail(f"invalid catalog: {str(exc).splitlines()[0]}")
        if not current.uri.startswith(("sqlite:///", "http://", "https://", "postgresql")):
            fail(f"invalid --uri {current.uri!r}: sqlite:///path, postgresql://... or http(s)://")
        jobs.save_catalog_config(cluster.dir, current)
    if not print_data({**current.model_dump(), "kind": current.kind()}, format):
        console.print(f"catalog: {current.uri} ({current.kind()})")
        console.print(f"warehouse: {current.warehouse} (endpoint {current.s3_endpoint or 'AWS'})")


def _embedded_rest_catalog(config) -> CatalogConfig:
    """The main embedded store's Iceberg REST catalog, or a clear error if it has none."""
    store = config.embedded_stores().get("s3")
    if not store:
        fail("--embedded-rest: this cluster has no embedded object store (--bucket-uris)")
    s3 = SeaweedConfig.from_json(store)
    endpoint = s3.iceberg_endpoint
    if endpoint is None or s3.table_bucket is None:
        fail(
            "--embedded-rest: this cluster's embedded store was created before it served an "
            "Iceberg REST catalog; give --uri of another REST catalog"
        )
    return embedded_rest_catalog_config(endpoint, s3.table_bucket, s3.endpoint)
