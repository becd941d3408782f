"""Commands whose modules are imported when they run, not when `automqctl` starts: a command
group lists them by name and loads one only when it is looked up (to run it, or for a
group's help), so `automqctl topic list` does not import the Kafka group protocol, the
controller's request models or Spark's job code for commands it does not run."""

from __future__ import annotations

import importlib
from difflib import get_close_matches
from typing import NamedTuple

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

# click's UsageError (a missing or unknown option, command or value) as typer's click has it:
# typer vendors click (typer._click) in newer versions, so take it from typer's BadParameter
USAGE_ERROR = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
_SUGGESTION = ". Did you mean "


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

    def resolve_command(self, ctx: typer.Context, args: list[str]):
        """As click's, with typer's "Did you mean ...?" for a mistyped name drawn from every
        command, loaded or not (typer's own looks only at the loaded ones)."""
        try:
            return super().resolve_command(ctx, args)
        except USAGE_ERROR as exc:
            matches = get_close_matches(args[0], self.list_commands(ctx)) if args else []
            if self.suggest_commands and matches and exc.message.startswith("No such command"):
                base = exc.message.split(_SUGGESTION, 1)[0].rstrip(".")
                exc.message = f"{base}{_SUGGESTION}{', '.join(repr(m) for m in matches)}?"
            raise

    def get_command(self, ctx: typer.Context, cmd_name: str) -> TyperCommand | TyperGroup | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            self.add_command(load_command(cmd_name, self.LAZY[cmd_name]), cmd_name)
        return super().get_command(ctx, cmd_name)
