"""automqctl: the operator toolkit. One module per command group."""

from __future__ import annotations

import typer

from cli import (
    balancer,
    broker,
    bucket_failover,
    cluster,
    compaction,
    controller,
    deploy,
    reassign,
    security,
    topic,
)
from cli.cost import cost
from cli.doctor import doctor
from cli.perf import perf

app = typer.Typer(
    help="Operate an S3-native, Kafka-compatible streaming cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("automqctl")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"automqctl {_version()}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="print the version and exit",
    ),
) -> None:
    """Operate an S3-native, Kafka-compatible streaming cluster."""


app.add_typer(cluster.app, name="cluster")
app.add_typer(topic.app, name="topic")
app.add_typer(broker.app, name="broker")
app.add_typer(controller.app, name="controller")
app.add_typer(reassign.app, name="reassign")
app.add_typer(balancer.app, name="balancer")
app.add_typer(bucket_failover.app, name="failover")
app.add_typer(security.user_app, name="user")
app.add_typer(security.acl_app, name="acl")
app.add_typer(compaction.app, name="compaction")
app.command(help="Load generator: throughput and latency percentiles (automq-perf-test style).")(
    perf
)
app.command(help="Cross-AZ traffic and its cost against Kafka (zone router counters).")(cost)
app.command(help="Check this machine's prerequisites (object store binary, Java for Spark).")(
    doctor
)

app.add_typer(deploy.node_app, name="node")


if __name__ == "__main__":
    app()
