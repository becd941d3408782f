"""`automqctl topic create|list|describe|alter|delete` over the Kafka protocol."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.table import Table

from cli.cluster_config import DEFAULT_CLUSTER_DIR, ClusterError
from cli.kafka_util import (
    check_reachable,
    client_error_text,
    kafka_python_security,
    librdkafka_security,
)
from cli.local_cluster import LocalCluster
from cli.output import OutputFormat, console, err_console, fail, print_data, waiting

app = typer.Typer(help="Manage topics (Kafka protocol).", no_args_is_help=True)

BootstrapOption = typer.Option(
    None, "--bootstrap-server", "-b", help="Kafka bootstrap servers (default: the local cluster's)"
)
DirOption = typer.Option(
    DEFAULT_CLUSTER_DIR,
    "--dir",
    envvar="AUTOMQ_CLUSTER_DIR",
    help="local cluster directory, used when --bootstrap-server is absent",
)
FormatOption = typer.Option(OutputFormat.table, "--format")
ControllersOption = typer.Option(
    None,
    "--controllers",
    help="controller API addresses host:port,... (default: the local cluster's), for the "
    "last retention/compaction times",
)
ADMIN_TIMEOUT_S = 30.0
MAX_CONFIG_ARGS = 1_000


def _bootstrap(bootstrap: str | None, dir: Path) -> str:
    if bootstrap:
        return bootstrap
    try:
        return LocalCluster(dir).load().bootstrap_servers()
    except ClusterError as exc:
        fail(f"{exc}; or pass --bootstrap-server")


CONNECT_TIMEOUT_S = 10.0


def _admin(bootstrap: str, dir: Path):
    from kafka import KafkaAdminClient

    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        with waiting(f"connecting to {bootstrap}"):
            check_reachable(bootstrap, timeout_s=5.0)  # a dead address fails at once
            return KafkaAdminClient(
                bootstrap_servers=bootstrap,
                client_id="automqctl",
                request_timeout_ms=30_000,
                bootstrap_timeout_ms=int(CONNECT_TIMEOUT_S * 1000),
                **kafka_python_security(_credentials(dir)),
            )
    except (ConnectionError, ValueError) as exc:
        fail(str(exc))
    except Exception as exc:  # the client raises several unrelated types for "unreachable"
        fail(f"cannot reach Kafka at {bootstrap}: {client_error_text(exc)}")


def _describe(admin, names: list[str] | None) -> list[dict]:
    described = admin.describe_topics(names) if names else admin.describe_topics()
    out = []
    for t in described:
        parts = sorted(t.get("partitions", []), key=lambda p: p["partition_index"])
        out.append(
            {
                "name": t["topic"] if "topic" in t else t.get("name"),
                "topic_id": str(t.get("topic_id", "")),
                "error_code": t.get("error_code", 0),
                "partitions": [
                    {
                        "partition": p["partition_index"],
                        "leader": p["leader_id"],
                        "leader_epoch": p.get("leader_epoch", -1),
                    }
                    for p in parts
                ],
            }
        )
    return out


def _add_partition_storage(bootstrap: str, topic: dict, dir: Path) -> None:
    """Each partition's log start offset, end offset (ListOffsets) and object-store bytes
    (DescribeLogDirs, from its leader); -1 where a broker could not say."""
    from kafka import KafkaAdminClient, TopicPartition
    from kafka.admin import OffsetSpec

    name = topic["name"]
    for p in topic["partitions"]:
        p.update(log_start_offset=-1, end_offset=-1, object_store_bytes=-1)
    by_index = {p["partition"]: p for p in topic["partitions"]}
    admin = KafkaAdminClient(
        bootstrap_servers=bootstrap,
        request_timeout_ms=15_000,
        **kafka_python_security(_credentials(dir)),
    )
    try:
        tps = [TopicPartition(name, i) for i in by_index]
        for key, spec in (
            ("log_start_offset", OffsetSpec.EARLIEST),
            ("end_offset", OffsetSpec.LATEST),
        ):
            found = admin.list_partition_offsets({tp: spec for tp in tps})
            for tp, o in found.items():
                by_index[tp.partition][key] = o.offset
        for broker in admin.describe_log_dirs(topic_partitions=[name]):
            for result in broker["log_dirs"]:
                for t in result["topics"]:
                    for part in t["partitions"]:
                        if part["partition_index"] in by_index:
                            by_index[part["partition_index"]]["object_store_bytes"] = part[
                                "partition_size"
                            ]
    except Exception as exc:  # noqa: BLE001 - the rest of describe is still useful
        err_console.print(f"partition offsets unavailable: {client_error_text(exc)}")
    finally:
        admin.close()


def _add_cleaning_times(topic: dict, dir: Path, controllers: str | None) -> None:
    """Each partition's last retention time (the last time its log start offset advanced:
    time/size retention or DeleteRecords), last log-cleaner run and cleaner checkpoint,
    from the controller's metadata (epoch ms; -1: never, or no controller reachable)."""
    from cli.options import controller_client
    from controlplane.client import ControllerUnavailableError
    from controlplane.errors import ControllerError
    from controlplane.image import MetadataImage

    for p in topic["partitions"]:
        p.update(last_retention_ms=-1, last_compaction_ms=-1, cleaned_offset=-1)
    if not controllers:
        try:
            LocalCluster(dir).load()
        except ClusterError:
            err_console.print("last retention/compaction times need --controllers host:port,...")
            return
    try:
        image = MetadataImage.model_validate(controller_client(dir, controllers).image())
    except (ControllerUnavailableError, ControllerError) as exc:
        err_console.print(f"last retention/compaction times unavailable: {exc}")
        return
    found = next((t for t in image.topics.values() if t.name == topic["name"]), None)
    for p in topic["partitions"]:
        part = found.partitions.get(p["partition"]) if found else None
        stream = image.streams.get(part.stream_id) if part else None
        if stream is not None:
            p.update(
                last_retention_ms=stream.trimmed_ms or -1,
                last_compaction_ms=stream.cleaned_ms or -1,
                cleaned_offset=stream.cleaned_offset if stream.cleaned_ms else -1,
            )


def _when(epoch_ms: int) -> str:
    if epoch_ms < 0:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def _parse_configs(items: list[str]) -> dict[str, str]:
    """`key=value` arguments of --config/-c, in order (a repeated key: the last wins)."""
    if len(items) > MAX_CONFIG_ARGS:
        fail(f"more than {MAX_CONFIG_ARGS} --config arguments")
    configs: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            fail(f"--config {item!r} must be key=value")
        k, v = item.split("=", 1)
        configs[k.strip()] = v
    return configs


def _confluent_admin(bootstrap: str, dir: Path):
    from confluent_kafka.admin import AdminClient

    return AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "client.id": "automqctl",
            **librdkafka_security(_credentials(dir)),
        }
    )


def _credentials(dir: Path) -> dict | None:
    """The admin's SASL login of the cluster in `dir` (None: a PLAINTEXT cluster)."""
    try:
        return LocalCluster(dir).client_security()
    except ClusterError as exc:
        fail(str(exc))


def _topic_configs(bootstrap: str, name: str, dir: Path) -> dict[str, dict]:
    """The topic's configs as DescribeConfigs answers them: value, source, read-only."""
    from confluent_kafka.admin import ConfigResource, ConfigSource, ResourceType

    known = {s.value for s in ConfigSource}
    resource = ConfigResource(ResourceType.TOPIC, name)
    admin = _confluent_admin(bootstrap, dir)  # referenced until the result: its handle must live
    try:
        entries = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    except Exception as exc:
        fail(f"describing the configs of topic {name!r} failed: {client_error_text(exc)}")
    out: dict[str, dict] = {}
    for key, entry in sorted(entries.items()):
        source = int(getattr(entry.source, "value", entry.source))  # an int in describe results
        out[key] = {
            "value": entry.value,
            "source": ConfigSource(source).name if source in known else str(source),
            "set_on_topic": source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
            "read_only": bool(entry.is_read_only),
        }
    return out


@app.command()
def create(
    name: str,
    partitions: int = typer.Option(1, "--partitions", "-p", min=1, max=10_000),
    config: list[str] = typer.Option([], "--config", "-c", help="key=value, repeatable"),
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Create a topic."""
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError as ClientError

    configs = _parse_configs(config)
    admin = _admin(_bootstrap(bootstrap_server, dir), dir)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs)])
    except ClientError as exc:
        fail(f"creating topic {name!r} failed: {client_error_text(exc)}")
    finally:
        admin.close()
    result = {"name": name, "partitions": partitions, "created": True}
    if not print_data(result, format):
        console.print(f"created topic [bold]{name}[/] with {partitions} partitions")


@app.command("list")
def list_(
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """List topics."""
    admin = _admin(_bootstrap(bootstrap_server, dir), dir)
    try:
        topics = sorted(_describe(admin, None), key=lambda t: t["name"])
    except Exception as exc:  # kafka-python: KafkaError subclasses, timeouts, OSError
        fail(f"listing topics failed: {client_error_text(exc)}")
    finally:
        admin.close()
    if print_data(
        [{"name": t["name"], "partitions": len(t["partitions"])} for t in topics], format
    ):
        return
    table = Table(title="topics")
    table.add_column("name")
    table.add_column("partitions")
    for t in topics:
        table.add_row(t["name"], str(len(t["partitions"])))
    console.print(table)


@app.command()
def describe(
    name: str,
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
    controllers: str | None = ControllersOption,
) -> None:
    """Partitions of a topic with their leaders, offsets, object-store bytes and last
    retention/compaction times (UTC), and its configs (the table shows the ones set on
    the topic; --format json lists every config with its value in force)."""
    bootstrap = _bootstrap(bootstrap_server, dir)
    admin = _admin(bootstrap, dir)
    try:
        [topic] = _describe(admin, [name])
    except Exception as exc:  # kafka-python: KafkaError subclasses, timeouts, OSError
        fail(f"describing topic {name!r} failed: {client_error_text(exc)}")
    finally:
        admin.close()
    if topic["error_code"]:
        fail(f"topic {name!r} does not exist (error {topic['error_code']})")
    topic["configs"] = _topic_configs(bootstrap, name, dir)
    _add_partition_storage(bootstrap, topic, dir)
    _add_cleaning_times(topic, dir, controllers)
    if print_data(topic, format):
        return
    table = Table(title=f"topic {name} ({topic['topic_id']})")
    for col in (
        "partition",
        "leader",
        "leader epoch",
        "log start",
        "end",
        "object-store bytes",
        "last retention",
        "last compaction",
    ):
        table.add_column(col)
    for p in topic["partitions"]:
        table.add_row(
            *(
                str(p[k])
                for k in (
                    "partition",
                    "leader",
                    "leader_epoch",
                    "log_start_offset",
                    "end_offset",
                    "object_store_bytes",
                )
            ),
            _when(p["last_retention_ms"]),
            _when(p["last_compaction_ms"]),
        )
    console.print(table)
    overrides = {k: c for k, c in topic["configs"].items() if c["set_on_topic"]}
    configs = Table(title=f"configs set on {name}")
    configs.add_column("config")
    configs.add_column("value")
    for key, c in overrides.items():
        configs.add_row(key, str(c["value"]))
    if overrides:
        console.print(configs)
    defaults = len(topic["configs"]) - len(overrides)
    console.print(f"{defaults} other configs at their defaults (--format json lists them)")


@app.command()
def alter(
    name: str,
    config: list[str] = typer.Option([], "--config", "-c", help="key=value to set, repeatable"),
    delete_config: list[str] = typer.Option(
        [], "--delete-config", help="key to reset to its default, repeatable"
    ),
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Change a topic's configs (IncrementalAlterConfigs): all entries apply or none."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    sets = _parse_configs(config)
    deletes = sorted({k.strip() for k in delete_config})
    if not sets and not deletes:
        fail("nothing to change: give -c key=value and/or --delete-config key")
    if len(deletes) > MAX_CONFIG_ARGS:
        fail(f"more than {MAX_CONFIG_ARGS} --delete-config arguments")
    both = sorted(set(sets) & set(deletes))
    if both:
        fail(f"both set and deleted: {', '.join(both)}")
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sets.items()
    ] + [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in deletes]
    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
    admin = _confluent_admin(_bootstrap(bootstrap_server, dir), dir)
    try:
        admin.incremental_alter_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    except Exception as exc:
        fail(f"altering topic {name!r} failed: {client_error_text(exc)}")
    result = {"name": name, "set": sets, "deleted": deletes, "altered": True}
    if not print_data(result, format):
        changes = [f"{k}={v}" for k, v in sets.items()] + [f"-{k}" for k in deletes]
        console.print(f"altered topic [bold]{name}[/]: {', '.join(changes)}")


@app.command()
def delete(
    name: str,
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Delete a topic and its data."""
    from kafka.errors import KafkaError as ClientError

    admin = _admin(_bootstrap(bootstrap_server, dir), dir)
    try:
        admin.delete_topics([name])
    except ClientError as exc:
        fail(f"deleting topic {name!r} failed: {client_error_text(exc)}")
    finally:
        admin.close()
    if not print_data({"name": name, "deleted": True}, format):
        console.print(f"deleted topic [bold]{name}[/]")
