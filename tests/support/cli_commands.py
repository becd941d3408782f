"""The automqctl command tree as click sees it, for tests that check every command."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
import typer.main


def leaf_commands(app: typer.Typer) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every runnable command of `app` with its path (`("cluster", "up")`), looked up as
    click does when it runs one, so commands loaded on demand are included."""
    yield from _leaves(typer.main.get_command(app), ())


def _leaves(command: Any, path: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    if not hasattr(command, "list_commands"):  # a command, not a group
        yield path, command
        return
    ctx = typer.Context(command)
    for name in command.list_commands(ctx):
        sub = command.get_command(ctx, name)
        assert sub is not None, f"{' '.join((*path, name))} is listed but cannot be loaded"
        yield from _leaves(sub, (*path, name))
