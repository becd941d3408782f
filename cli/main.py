"""automqctl: the operator toolkit. One module per command group."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import typer

from cli.lazy_commands import USAGE_ERROR, LazyCommand, LazyTyperGroup
from cli.output import fail, is_a_terminal

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


# The top-level commands, in the order the root help lists them. A command's module (and what
# it imports: the Kafka client, the request models, Spark's job code) is imported only when
# that command runs, so `automqctl topic list` does not pay for `perf` or `group`.
COMMANDS: dict[str, LazyCommand] = {
    "perf": LazyCommand(
        "cli.perf",
        "perf",
        "Load generator: throughput and latency percentiles (automq-perf-test style).",
    ),
    "cost": LazyCommand(
        "cli.cost", "cost", "Cross-AZ traffic and its cost against Kafka (zone router counters)."
    ),
    "doctor": LazyCommand(
        "cli.doctor",
        "doctor",
        "Check this machine's prerequisites (object store binary, Java for Spark).",
    ),
    "cluster": LazyCommand("cli.cluster", "app"),
    "topic": LazyCommand("cli.topic", "app"),
    "group": LazyCommand("cli.group", "app"),
    "broker": LazyCommand("cli.broker", "app"),
    "controller": LazyCommand("cli.controller", "app"),
    "reassign": LazyCommand("cli.reassign", "app"),
    "balancer": LazyCommand("cli.balancer", "app"),
    "failover": LazyCommand("cli.bucket_failover", "app"),
    "user": LazyCommand("cli.security", "user_app"),
    "acl": LazyCommand("cli.security", "acl_app"),
    "compaction": LazyCommand("cli.compaction", "app"),
    "table": LazyCommand("cli.table", "app"),
    "node": LazyCommand("cli.deploy", "node_app"),
}


class AutomqctlGroup(LazyTyperGroup):
    """The root command. Every command runs inside it, so these hold for all of them: a
    usage error (a missing or unknown option or argument, a bad value) is one line on
    stderr with exit code 2, and help printed to a pipe is wide enough to be whole."""

    LAZY = COMMANDS

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


if __name__ == "__main__":
    app()
