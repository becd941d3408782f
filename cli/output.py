"""Shared CLI output helpers: JSON for scripts, rich for people, errors without tracebacks."""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import NoReturn

import typer
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


class OutputFormat(str, Enum):
    table = "table"
    json = "json"


def print_json(data: object) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def fail(message: str, code: int = 1) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)
