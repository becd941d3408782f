"""Shared CLI output helpers: JSON/YAML for scripts, rich for people, errors without tracebacks."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from enum import Enum
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console()
err_console = Console(stderr=True)


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
