"""automqctl: the operator toolkit. One module per command group."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import typer
from typer.core import TyperGroup

from cli import (
    balancer,
    broker,
    bucket_failover,
    cluster,
    compaction,
    controller,
    deploy,
    group,
    reassign,
    security,
    table,
    topic,
)
from cli.cost import cost
from cli.doctor import doctor
from cli.output import fail, is_a_terminal
from cli.perf import perf

# click's UsageError (a missing or unknown option, a bad value) as typer's click has it: typer
# vendors click (typer._click) in newer versions, so take it from typer's public BadParameter
USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
USAGE_EXIT_CODE = 2  # click's, and POSIX tools': runtime errors exit 1
# characters: `--help` printed to a pipe is this wide (or COLUMNS, if wider), so option
# names, types and defaults are whole (typer's help is boxes as wide as the console)
HELP_WIDTH_IN_A_PIPE = 200


@contextlib.contextmanager
def _usage_errors_in_one_line() -> Iterator[None]:
    """A usage error raised inside becomes `error: MESSAGE Try 'COMMAND --help'.` on stderr
    and exit 2. A group called without a command (its help is already printed) passes."""
    try:
        yield
    except USAGE_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            raise
        message = exc.format_message().strip()
        if not message.endswith((".", "?", "!")):
            message += "."
        ctx = getattr(exc, "ctx", None)
        hint = f" Try '{ctx.command_path} --help'." if ctx is not None else ""
        fail(message + hint, code=USAGE_EXIT_CODE)


@contextlib.contextmanager
def _wide_help_in_a_pipe() -> Iterator[None]:
    """COLUMNS at least HELP_WIDTH_IN_A_PIPE while stdout is not a terminal: rich (typer's
    help) reads it when it builds its console. Restored after the command."""
    if is_a_terminal(sys.stdout):
        yield
        return
    before = os.environ.get("COLUMNS")
    width = max(int(before) if before and before.isdigit() else 0, HELP_WIDTH_IN_A_PIPE)
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = before


class AutomqctlGroup(TyperGroup):
    """The root command. Every command runs inside it, so these hold for all of them: a
    usage error (a missing or unknown option or argument, a bad value) is one line on
    stderr with exit code 2, and help printed to a pipe is wide enough to be whole."""

    def main(self, *args, **kwargs):
        with _wide_help_in_a_pipe():
            return super().main(*args, **kwargs)

    def make_context(self, *args, **kwargs):
        with _usage_errors_in_one_line():  # the root's own options (e.g. an unknown one)
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _usage_errors_in_one_line():  # subcommands parse their arguments in here
            return super().invoke(ctx)


app = typer.Typer(
    cls=AutomqctlGroup,
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
app.add_typer(group.app, name="group")
app.add_typer(broker.app, name="broker")
app.add_typer(controller.app, name="controller")
app.add_typer(reassign.app, name="reassign")
app.add_typer(balancer.app, name="balancer")
app.add_typer(bucket_failover.app, name="failover")
app.add_typer(security.user_app, name="user")
app.add_typer(security.acl_app, name="acl")
app.add_typer(compaction.app, name="compaction")
app.add_typer(table.app, name="table")
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
