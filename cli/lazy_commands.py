"""Commands whose modules are imported when they run, not when `automqctl` starts: a command
group lists them by name and loads one only when it is looked up (to run it, or for a
group's help), so `automqctl topic list` does not import the Kafka group protocol, the
controller's request models or Spark's job code for commands it does not run."""

from __future__ import annotations

import importlib
from typing import NamedTuple

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup


class LazyCommand(NamedTuple):
    """Where a command lives: `attribute` of `module` is a Typer app (a command group) or a
    function (one command; `help` is its help line, else the function's docstring)."""

    module: str
    attribute: str
    help: str | None = None


def load_command(name: str, where: LazyCommand) -> TyperCommand | TyperGroup:
    """The click command `name` that `where` points at, its module imported now."""
    target = getattr(importlib.import_module(where.module), where.attribute)
    if isinstance(target, typer.Typer):
        command: TyperCommand | TyperGroup = typer.main.get_group(target)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name=name, help=where.help)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyTyperGroup(TyperGroup):
    """A Typer group whose LAZY commands (set by a subclass) are listed after its own and
    loaded when first looked up. Not thread-safe: click resolves commands on one thread."""

    LAZY: dict[str, LazyCommand] = {}

    def list_commands(self, ctx: typer.Context) -> list[str]:
        own = [n for n in super().list_commands(ctx) if n not in self.LAZY]
        return [*own, *self.LAZY]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> TyperCommand | TyperGroup | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            self.add_command(load_command(cmd_name, self.LAZY[cmd_name]), cmd_name)
        return super().get_command(ctx, cmd_name)
