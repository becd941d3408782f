"""Shared CLI output helpers: JSON/YAML for scripts, rich for people, errors without tracebacks."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from enum import Enum
from typing import NoReturn

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

# characters: the width of output that does not go to a terminal (a pipe, a file, CI, `watch`),
# so wide that no table is ever cut (a table is only as wide as its cells; text does not wrap)
UNBOUNDED_WIDTH = 100_000


def is_a_terminal(stream: object) -> bool:
    """Whether `stream` is a terminal (False for pipes, files and streams without a fd)."""
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):  # closed or detached
        return False


class FullWidthConsole(Console):
    """A rich Console that never truncates when its stream is not a terminal: its width is
    then UNBOUNDED_WIDTH (whatever COLUMNS or the terminal on stdin say); on a terminal it is
    the terminal's. Decided at each print (tests swap sys.stdout)."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if is_a_terminal(self.file):
            return size
        return ConsoleDimensions(UNBOUNDED_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)


console = FullWidthConsole()
err_console = FullWidthConsole(stderr=True)


class OutputFormat(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def print_yaml(data: object) -> None:
    import yaml

    # through JSON first: the same types and values as --format json (no Python tags)
    sys.stdout.write(
        yaml.safe_dump(json.loads(json.dumps(data)), sort_keys=False, default_flow_style=False)
    )


def print_data(data: object, format: OutputFormat) -> bool:
    """Print `data` as JSON or YAML for `--format json|yaml`; False for table (the caller
    prints its table)."""
    if format == OutputFormat.json:
        print_json(data)
        return True
    if format == OutputFormat.yaml:
        print_yaml(data)
        return True
    return False


def print_result(data: dict, format: OutputFormat, text: str) -> None:
    """The outcome of an action command: `text` for `--format table`, else `data` as JSON
    or YAML (so scripts never parse prose)."""
    if not print_data(data, format):
        console.print(text)


def one_line(text: str) -> str:
    """`text` on one line: newlines and runs of blanks become one space."""
    return " ".join(str(text).split())


def fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr, `error: ...`, printed literally (no rich markup is interpreted,
    no wrapping), then exit `code`."""
    err_console.print(
        f"[bold red]error:[/] {escape(one_line(message))}", soft_wrap=True, highlight=False
    )
    raise typer.Exit(code)


def warn(message: str) -> None:
    err_console.print(
        f"[yellow]note:[/] {escape(one_line(message))}", soft_wrap=True, highlight=False
    )


@contextlib.contextmanager
def waiting(what: str, format: OutputFormat = OutputFormat.table) -> Iterator[None]:
    """A spinner on stderr while the CLI waits, in table mode and on a terminal only."""
    if format != OutputFormat.table or not err_console.is_terminal:
        yield
        return
    with err_console.status(escape(what)):
        yield
