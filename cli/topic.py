"""`automqctl topic create|list|describe|delete` over the Kafka protocol."""

from __future__ import annotations

import logging
from pathlib import Path

import typer
from rich.table import Table

from cli.kafka_util import check_reachable, client_error_text
from cli.output import OutputFormat, console, fail, print_data, waiting
from cli.processes import DEFAULT_CLUSTER_DIR, ClusterError, LocalCluster

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


def _bootstrap(bootstrap: str | None, dir: Path) -> str:
    if bootstrap:
        return bootstrap
    try:
        return LocalCluster(dir).load().bootstrap_servers()
    except ClusterError as exc:
        fail(f"{exc}; or pass --bootstrap-server")


CONNECT_TIMEOUT_S = 10.0


def _admin(bootstrap: str):
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

    configs = {}
    for item in config:
        if "=" not in item:
            fail(f"--config {item!r} must be key=value")
        k, v = item.split("=", 1)
        configs[k] = v
    admin = _admin(_bootstrap(bootstrap_server, dir))
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
    admin = _admin(_bootstrap(bootstrap_server, dir))
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
) -> None:
    """Partitions of a topic with their leaders."""
    admin = _admin(_bootstrap(bootstrap_server, dir))
    try:
        [topic] = _describe(admin, [name])
    except Exception as exc:  # kafka-python: KafkaError subclasses, timeouts, OSError
        fail(f"describing topic {name!r} failed: {client_error_text(exc)}")
    finally:
        admin.close()
    if topic["error_code"]:
        fail(f"topic {name!r} does not exist (error {topic['error_code']})")
    if print_data(topic, format):
        return
    table = Table(title=f"topic {name} ({topic['topic_id']})")
    for col in ("partition", "leader", "leader epoch"):
        table.add_column(col)
    for p in topic["partitions"]:
        table.add_row(str(p["partition"]), str(p["leader"]), str(p["leader_epoch"]))
    console.print(table)


@app.command()
def delete(
    name: str,
    bootstrap_server: str | None = BootstrapOption,
    dir: Path = DirOption,
    format: OutputFormat = FormatOption,
) -> None:
    """Delete a topic and its data."""
    from kafka.errors import KafkaError as ClientError

    admin = _admin(_bootstrap(bootstrap_server, dir))
    try:
        admin.delete_topics([name])
    except ClientError as exc:
        fail(f"deleting topic {name!r} failed: {client_error_text(exc)}")
    finally:
        admin.close()
    if not print_data({"name": name, "deleted": True}, format):
        console.print(f"deleted topic [bold]{name}[/]")
